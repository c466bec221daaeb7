"""``serve --upload``'s resumable uploads against a hostile client, on both loops.

What it cannot do: append at another offset (409, the right offset), past the announced length
(400) or the size limit (413), reach another path's, another user's or a made-up token's upload
(404), hold more than its share of uploads in progress, in number or in bytes, announced or not
(507), stop another's request without its credentials, see or fetch the partial files and records
(never served, listed or uploaded to, dotfiles shown or not), write from another site's page, or
land an upload outside the root through a directory swapped for a symlink. An upload with no
progress past its expiry is removed (sooner if nothing was ever sent to it), one still moving
never; a stale request for an upload is stopped by the client's new one.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ..support.raw_http import read_response
from ..support.resumable import (
    TUS,
    V8,
    append_to,
    ask,
    field,
    head_of,
    partial_of,
    policy_of,
    request,
    size_of,
    tus_metadata,
    until_size,
)
from ..support.serve import serve_site
from ..support.uploads import left

pytest.importorskip("httptools")

from aiosendfile._serve import _auth, _partial, _resumable


async def test_a_new_request_for_an_upload_stops_the_stale_one_writing_it(public: Path) -> None:
    """A client resuming while its old connection still looks alive to the server (a NAT's timeout,
    a phone changing networks): the old request is stopped, what it wrote stays."""
    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 200000"))
        where_to = field(made, "Location")
        reader, writer = await site.open()  # (stalls after 50,000 bytes)
        writer.write(append_to(where_to, "0", "?1", length=200_000) + b"a" * 50_000)
        partial = public / "sub" / f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"
        for _ in range(200):
            if partial.stat().st_size == 50_000:
                break
            await asyncio.sleep(0.05)
        status = await ask(site, head_of(where_to), "HEAD")
        assert field(status, "Upload-Offset") == "50000"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # (the stale one was closed)
        writer.close()
        rest = append_to(where_to, "50000", "?1", body=b"b" * 150_000)
        assert (await ask(site, rest)).status == 201
    assert (public / "sub" / "f").read_bytes() == b"a" * 50_000 + b"b" * 150_000


async def test_appends_that_do_not_fit_are_refused_and_change_nothing(public: Path) -> None:
    async with serve_site(public, upload=True, max_upload_size=1000) as site:
        assert (
            await ask(site, request("PUT", "/sub/x", "Upload-Complete: ?0", "Upload-Length: 1001"))
        ).status == 413
        made = await ask(
            site, request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 10", body=b"12345")
        )
        where_to = field(made, "Location")
        patch = ("PATCH", where_to, "Content-Type: application/partial-upload")
        wrong = await ask(site, request(*patch, "Upload-Offset: 3", "Upload-Complete: ?0", body=b"zz"))
        assert wrong.status == 409
        assert (field(wrong, "Upload-Offset"), field(wrong, "Upload-Complete")) == ("5", "?0")
        past = await ask(site, request(*patch, "Upload-Offset: 5", "Upload-Complete: ?0", body=b"123456"))
        assert past.status == 400  # (past the length announced)
        short = await ask(site, request(*patch, "Upload-Offset: 5", "Upload-Complete: ?1", body=b"12"))
        assert short.status == 400  # (ends before it)
        other = await ask(
            site, request(*patch, "Upload-Offset: 5", "Upload-Complete: ?0", "Upload-Length: 11")
        )
        assert other.status == 400  # (another length)
        chunked = (
            f"PATCH {where_to} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: application/partial-upload\r\nUpload-Offset: 5\r\nUpload-Complete: ?0\r\n\r\n"
            "8\r\n12345678\r\n0\r\n\r\n"
        ).encode()
        assert (await ask(site, chunked)).status == 400  # (its bytes past the length are not written)
        moved = where_to.replace("/sub/f", "/sub/g")
        assert (
            await ask(
                site,
                request(
                    *patch[:1], moved, *patch[2:], "Upload-Offset: 5", "Upload-Complete: ?1", body=b"67890"
                ),
            )
        ).status == 404
        forged = where_to[:-32] + "B" * 32
        assert (await ask(site, head_of(forged), "HEAD")).status == 404
        status = await ask(site, head_of(where_to), "HEAD")
        assert field(status, "Upload-Offset") == "5"
        done = await ask(site, request(*patch, "Upload-Offset: 5", "Upload-Complete: ?1", body=b"67890"))
        assert done.status == 201
    assert (public / "sub" / "f").read_bytes() == b"1234567890"
    assert left(public / "sub") == ["f"]


async def test_each_client_holds_a_bounded_share_of_uploads_in_progress(public: Path) -> None:
    async with serve_site(public, upload=True, max_partial_uploads=2, max_partial_size=1000) as site:
        made = [
            await ask(site, request("PUT", f"/sub/{n}", "Upload-Complete: ?0", "Upload-Length: 400"))
            for n in range(3)
        ]
        assert [m.status for m in made] == [201, 201, 507]
        big = await ask(site, request("PUT", "/sub/big", "Upload-Complete: ?0", "Upload-Length: 700"))
        assert big.status == 507
        cancel = f"DELETE {field(made[0], 'Location')} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
        assert (await ask(site, cancel)).status == 204
        again = await ask(site, request("PUT", "/sub/again", "Upload-Complete: ?0", "Upload-Length: 600"))
        assert again.status == 201
    assert sum(name.endswith(".partial") for name in left(public / "sub")) == 2


async def test_an_upload_with_no_progress_expires(public: Path) -> None:
    async with serve_site(public, upload=True, upload_expiry=1.0) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"abc"))
        where_to = field(made, "Location")
        assert (await ask(site, head_of(where_to), "HEAD")).status == 204
        for _ in range(100):  # (the server looks for expired uploads four times an expiry)
            if not (public / ".upload-state" / f"{_resumable.id_of(where_to[-32:].encode())}.json").exists():
                break
            await asyncio.sleep(0.05)
        assert (await ask(site, head_of(where_to), "HEAD")).status == 404
    made_by_hand = _partial.Store(policy_of(public), False, _partial.Limits(1.0, 16, 1 << 30, None))
    assert made_by_hand.sweep() == 0
    assert left(public / "sub") == []
    assert left(public / ".upload-state") == []


async def test_uploads_in_progress_are_never_served_listed_or_written(public: Path) -> None:
    async with serve_site(public, upload=True, show_index=True, show_dotfiles=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"secret"))
        upload_id = _resumable.id_of(field(made, "Location")[-32:].encode())
        for path in (
            f"/sub/.upload-{upload_id}.partial",
            f"/.upload-state/{upload_id}.json",
            "/.upload-state/",
        ):
            assert (await ask(site, f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())).status == 404
        listing = await ask(site, b"GET /sub/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert b".upload-" not in listing.body
        listing = await ask(site, b"GET /?tar HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert b".upload-" not in listing.body
        assert b"secret" not in listing.body
        put = await ask(site, request("PUT", f"/sub/.upload-{upload_id}.partial", body=b"x"))
        assert put.status == 404
        assert (public / "sub" / f".upload-{upload_id}.partial").read_bytes() == b"secret"


async def test_a_directory_swapped_for_a_symlink_gets_nothing(public: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"abc"))
        where_to = field(made, "Location")
        shutil.move(str(public / "sub"), str(tmp_path / "moved"))
        shutil.copytree(tmp_path / "moved", outside, dirs_exist_ok=True)  # (its partial file too)
        (public / "sub").symlink_to(outside)
        rest = append_to(where_to, "3", "?1", body=b"def")
        assert (await ask(site, rest)).status == 404
    assert not (outside / "f").exists()


async def test_with_passwords_an_upload_is_its_users_alone(public: Path) -> None:
    users = dict(_auth.parse_entry(entry) for entry in ("bob:pw", "eve:pw2"))

    def basic(user: str, password: str) -> str:
        return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    async with serve_site(public, upload=True, auth=tuple(users.items()), public_read=True) as site:
        made = await ask(
            site, request("PUT", "/sub/f", "Upload-Complete: ?0", basic("bob", "pw"), body=b"ab")
        )
        assert made.status == 201
        where_to = field(made, "Location")
        assert (await ask(site, head_of(where_to), "HEAD")).status == 401  # (even with public reads)
        assert (await ask(site, head_of(where_to, basic("eve", "pw2")), "HEAD")).status == 404
        assert (await ask(site, head_of(where_to, basic("bob", "pw")), "HEAD")).status == 204
        patch = (
            "PATCH",
            where_to,
            "Content-Type: application/partial-upload",
            "Upload-Offset: 2",
            "Upload-Complete: ?1",
        )
        assert (await ask(site, request(*patch, basic("eve", "pw2"), body=b"c"))).status == 404
        assert (await ask(site, request(*patch, basic("bob", "pw"), body=b"c"))).status == 201
    assert (public / "sub" / "f").read_bytes() == b"abc"


async def test_another_sites_page_cannot_append(public: Path) -> None:
    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"ab"))
        patch = request(
            "PATCH",
            field(made, "Location"),
            "Content-Type: application/partial-upload",
            "Upload-Offset: 2",
            "Upload-Complete: ?1",
            "Sec-Fetch-Site: cross-site",
            body=b"c",
        )
        assert (await ask(site, patch)).status == 403
        assert not (public / "sub" / "f").exists()


# -- from a review: each of these failed before its fix ---------------------------------------------


async def _stalled_append(
    site: Any, where_to: str, offset: int, complete: str, *fields: str, length: int, sent: bytes = b""
) -> Any:
    """An IETF append announcing *length* bytes that sends *sent* and stalls (its writer)."""
    _reader, writer = await site.open()
    writer.write(append_to(where_to, str(offset), complete, *fields, length=length) + sent)
    await writer.drain()
    return writer


async def test_an_upload_still_moving_does_not_expire(public: Path) -> None:
    """An upload whose requests keep being cut, each longer than the expiry, is progress all along.
    (The expiry leaves the offset asked after the cut its own margin: with 1 s, a CI machine
    running two lanes answered it past the expiry, the upload rightly gone.)"""
    async with serve_site(public, upload=True, upload_expiry=2.0) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 9000"))
        where_to = field(made, "Location")
        writer = await _stalled_append(site, where_to, 0, "?1", length=9000)
        for n in range(8):  # (4 s of a request sending a little every half second)
            writer.write(b"x" * 500)
            await writer.drain()
            await until_size(partial_of(public, where_to), 500 * (n + 1))
            await asyncio.sleep(0.5)
        writer.transport.abort()
        status = await ask(site, head_of(where_to), "HEAD")
        assert status.status == 204
        assert field(status, "Upload-Offset") == "4000"


async def test_a_length_told_in_a_cut_request_is_kept(public: Path) -> None:
    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0"))
        where_to = field(made, "Location")
        writer = await _stalled_append(site, where_to, 0, "?0", "Upload-Length: 10", length=10, sent=b"abc")
        await until_size(partial_of(public, where_to), 3)
        writer.transport.abort()
        status = await ask(site, head_of(where_to), "HEAD")
        assert field(status, "Upload-Length") == "10"
        other = append_to(where_to, "3", "?0", "Upload-Length: 50", body=b"d")
        assert (await ask(site, other)).status == 400


async def test_uploads_of_no_announced_length_count_against_their_owners_bytes(public: Path) -> None:
    async with serve_site(public, upload=True, max_partial_size=1000, max_partial_uploads=3) as site:
        addresses = [
            field(await ask(site, request("PUT", f"/sub/{n}", "Upload-Complete: ?0")), "Location")
            for n in range(2)
        ]
        patch = ("Content-Type: application/partial-upload", "Upload-Offset: 0", "Upload-Complete: ?0")
        assert (await ask(site, request("PATCH", addresses[0], *patch, body=b"a" * 600))).status == 204
        assert (await ask(site, request("PATCH", addresses[1], *patch, body=b"b" * 600))).status == 507
        chunked = (
            f"PATCH {addresses[1]} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: application/partial-upload\r\nUpload-Offset: 0\r\nUpload-Complete: ?0\r\n\r\n"
            "258\r\n" + "b" * 600 + "\r\n0\r\n\r\n"
        ).encode()
        assert (await ask(site, chunked)).status == 507
    assert sum(size_of(public / "sub" / n) for n in left(public / "sub")) <= 1000


@pytest.mark.parametrize("how", ["spliced", "with-the-head", "tus-deferred", "chunked-together"])
async def test_creations_with_a_body_share_their_owners_bytes(public: Path, how: str) -> None:
    """Creations that bring a body (an IETF draft's with no length told, tus's with its length
    deferred) count against the bytes their owner's other uploads hold, whether the body is
    spliced to the file or read with the head, and two under way at once cannot both take the
    same room: 90,000 bytes each, 100,000 allowed, only one is made."""
    body = b"a" * 90_000
    if how == "tus-deferred":
        offsets = "Content-Type: application/offset+octet-stream"
        fields: tuple[str, ...] = (TUS, "Upload-Defer-Length: 1", offsets)
        method, path = "POST", "/sub/"
    else:
        fields, method, path = ("Upload-Complete: ?0",), "PUT", "/sub/{n}"
    async with serve_site(public, upload=True, max_partial_size=100_000, max_partial_uploads=4) as site:

        async def create(n: int, together: asyncio.Event | None = None) -> int:
            reader, writer = await site.open()
            try:
                target = path.format(n=n)
                named = (*fields, tus_metadata(f"t{n}")) if how == "tus-deferred" else fields
                if how == "chunked-together":
                    head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                    writer.write((head + "".join(f + "\r\n" for f in named) + "\r\n").encode())
                    writer.write(b"%x\r\n%s\r\n" % (1000, body[:1000]))
                    await writer.drain()
                    assert together is not None
                    together.set() if n else await together.wait()
                    await asyncio.sleep(0.2)  # (both under way)
                    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - 1000, body[1000:]))
                elif how == "with-the-head":
                    writer.write(request(method, target, *named, body=body))
                else:
                    writer.write(request(method, target, *named, length=len(body)))
                    await writer.drain()
                    await asyncio.sleep(0.05)  # (the body after the head: spliced where it can be)
                    writer.write(body)
                return (await read_response(reader)).status
            finally:
                writer.close()

        if how == "chunked-together":
            together = asyncio.Event()
            statuses = sorted(await asyncio.gather(create(0, together), create(1, together)))
        else:
            statuses = [await create(0), await create(1)]
        assert statuses[0] == 201
        assert statuses[1] == 507
    held = sum(size_of(public / "sub" / n) for n in left(public / "sub"))
    assert held <= 100_000


async def test_each_address_has_its_own_share_without_a_log_or_passwords(public: Path) -> None:
    async with serve_site(public, upload=True, max_partial_uploads=1) as site:

        async def make(address: str, name: str) -> int:
            reader, writer = await site.open(local_addr=(address, 0))
            try:
                writer.write(request("PUT", f"/sub/{name}", "Upload-Complete: ?0"))
                return (await read_response(reader)).status
            finally:
                writer.close()

        assert await make("127.0.0.1", "a") == 201
        assert await make("127.0.0.1", "b") == 507
        assert await make("127.0.0.2", "c") == 201


async def test_a_request_without_the_uploads_credentials_stops_nothing(public: Path) -> None:
    users = tuple(_auth.parse_entry(entry) for entry in ("bob:pw", "eve:pw2"))
    bob = "Authorization: Basic " + base64.b64encode(b"bob:pw").decode()
    eve = "Authorization: Basic " + base64.b64encode(b"eve:pw2").decode()
    async with serve_site(public, upload=True, auth=users) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", bob))
        where_to = field(made, "Location")
        reader, writer = await site.open()
        writer.write(append_to(where_to, "0", "?1", bob, length=200_000) + b"a" * 100_000)
        await until_size(partial_of(public, where_to), 100_000)
        assert (await ask(site, head_of(where_to, eve), "HEAD")).status == 404
        bad = append_to(where_to, "100000", "?1", eve, body=b"e")
        assert (await ask(site, bad)).status == 404
        writer.write(b"a" * 100_000)  # (bob's request was never stopped)
        assert (await read_response(reader)).status == 201
        writer.close()
    assert (public / "sub" / "f").read_bytes() == b"a" * 200_000


async def test_answers_carry_what_each_protocol_asks(public: Path) -> None:
    log = io.StringIO()
    async with serve_site(public, upload=True, access_log=log) as site:
        old = await ask(site, request("POST", "/sub/", "Tus-Resumable: 0.2.2", "Upload-Length: 1"))
        assert old.status == 412
        assert field(old, "Tus-Version") == "1.0.0"
        unknown = request(
            "PATCH",
            "/sub/f?upload=" + "C" * 32,
            TUS,
            "Content-Type: application/offset+octet-stream",
            "Upload-Offset: 0",
            body=b"x",
        )
        missing = await ask(site, unknown)
        assert missing.status == 404
        assert field(missing, "Tus-Resumable") == "1.0.0"
        chunked = (
            "POST /sub/ HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            f"{TUS}\r\nUpload-Length: 3\r\n{tus_metadata('t')}\r\nContent-Type: text/plain\r\n\r\n"
            "3\r\nabc\r\n0\r\n\r\n"
        ).encode()
        assert (await ask(site, chunked)).status == 415
        made = await ask(site, request("PUT", "/sub/done", "Upload-Complete: ?0", body=b"ab"))
        where_to = field(made, "Location")
        rest = append_to(where_to, "2", "?1", body=b"c")
        assert (await ask(site, rest)).status == 201
        status = await ask(site, head_of(where_to), "HEAD")
        assert field(status, "Upload-Complete") == "?1"
        assert field(status, "Upload-Limit") == "min-size=0"
    lines = log.getvalue()
    assert "upload=[token]" in lines
    assert where_to[-32:] not in lines
    assert not (public / "sub" / "t").exists()


async def test_an_upload_nothing_was_sent_to_goes_sooner(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A made-up upload (its creation, then nothing) holds a record for ``KEEP_EMPTY``, not a day;
    one that got bytes keeps its whole expiry."""
    async with serve_site(public, upload=True) as site:
        empty = field(
            await ask(site, request("PUT", "/sub/e", "Upload-Complete: ?0", "Upload-Length: 5")),
            "Location",
        )  # (a length announced, nothing sent: still a made-up upload)
        fed = field(
            await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"x")),
            "Location",
        )
        monkeypatch.setattr(_partial, "KEEP_EMPTY", 0.2)
        await asyncio.sleep(0.5)
        store = _partial.Store(policy_of(public), False, _partial.Limits(86400.0, 16, 1 << 30, None))
        assert await asyncio.to_thread(store.sweep) == 1
        assert (await ask(site, head_of(empty), "HEAD")).status == 404
        assert (await ask(site, head_of(fed), "HEAD")).status == 204


async def test_an_owners_share_counts_a_request_under_way(public: Path) -> None:
    """An upload of no known length being appended to holds what its request may bring: a new
    upload cannot take the same room meanwhile (the owner would hold more than its share, and
    every later append of either would be refused, the one that completes it included)."""
    async with serve_site(public, upload=True, max_partial_size=100, max_partial_uploads=4) as site:
        first = field(await ask(site, request("PUT", "/sub/a", "Upload-Complete: ?0")), "Location")
        reader, writer = await site.open()
        writer.write(append_to(first, "0", "?0", length=90) + b"x" * 10)  # (?0: its length still unknown)
        await until_size(partial_of(public, first), 10)
        second = await ask(site, request("PUT", "/sub/b", "Upload-Complete: ?0", "Upload-Length: 90"))
        assert second.status == 507
        writer.write(b"x" * 80)
        assert (await read_response(reader)).status == 204
        writer.close()
        assert (await ask(site, append_to(first, "90", "?1"))).status == 201  # (completed: its room is free)
        again = await ask(site, request("PUT", "/sub/b", "Upload-Complete: ?0", "Upload-Length: 90"))
        assert again.status == 201
    assert (public / "sub" / "a").read_bytes() == b"x" * 90


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_a_whole_upload_that_no_interim_answer_can_place_is_a_plain_put(
    public: Path, version: str
) -> None:
    """``Upload-Complete: ?1`` with no ``104`` possible (no interop version 8, or HTTP/1.0): the
    client can never learn the upload's address, so the server ignores the field, as the draft
    lets it, and the body is a plain ``PUT``'s. It was made a resumable upload: refused 507 over
    the partial uploads' share where a plain ``PUT`` lands, and a cut one left a partial file
    nobody could reach, counted against its owner for the whole expiry."""
    body = b"b" * 3000
    async with serve_site(public, upload=True, max_partial_size=1000) as site:
        fields = ("Upload-Complete: ?1", V8) if version == "1.0" else ("Upload-Complete: ?1",)
        whole = request("PUT", "/sub/whole.bin", *fields, body=body)
        answer = await ask(site, whole.replace(b"HTTP/1.1", b"HTTP/" + version.encode(), 1))
        assert answer.status == 201, answer
        assert (public / "sub" / "whole.bin").read_bytes() == body
        _, writer = await site.open()
        writer.write(request("PUT", "/sub/cut.bin", "Upload-Complete: ?1", length=len(body)) + body[:500])
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()
        await asyncio.sleep(0.1)
    assert left(public / "sub") == ["whole.bin"]  # (no partial file, hidden or not)
    registry = public / ".upload-state"
    assert not registry.exists() or not [n for n in left(registry) if n.endswith(".json")], left(registry)


@pytest.mark.parametrize("step", ["append", "offset"])
async def test_an_upload_another_worker_removes_as_it_is_resumed_stays_removed(
    public: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Another worker's ``DELETE`` between this worker's open of the partial file and its lock (free
    then: nothing held it): the append or the offset asked is 404, as it would be a moment later, and
    the upload's record is not made again (it was, holding its owner's share until it expired)."""
    from aiosendfile._serve import _partial_upload

    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 10"))
        where_to = field(made, "Location")
        other = _partial.Store(policy_of(public), False, _partial.Limits(86400.0, 16, 1 << 30, None))
        taken = _partial.lock

        def removed_first(fd: int) -> None:
            with other.registry(exclusive=True) as reg:
                ((upload_id, record),) = other._records(reg)
                other.forget(reg, upload_id, record)
            taken(fd)

        monkeypatch.setattr(_partial_upload if step == "append" else _partial, "lock", removed_first)
        if step == "append":
            answer = await ask(site, append_to(where_to, "0", "?0", body=b"x" * 5))
        else:
            answer = await ask(site, head_of(where_to), "HEAD")
        monkeypatch.undo()
        assert answer.status == 404
        assert list((public / _partial.REGISTRY).iterdir()) == []
        assert not partial_of(public, where_to).exists()
        assert (await ask(site, head_of(where_to), "HEAD")).status == 404


async def test_an_upload_another_worker_completes_as_it_is_resumed_stays_complete(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker completes the upload between this worker's open of the partial file and its
    lock: an empty append is answered as one to a complete upload (410, where it landed), and the
    upload stays complete (its record was removed as its name was found taken: 409)."""
    from aiosendfile._serve import _partial_upload

    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 10"))
        where_to = field(made, "Location")
        other = _partial.Store(policy_of(public), False, _partial.Limits(86400.0, 16, 1 << 30, None))
        partial, landed = partial_of(public, where_to), public / "sub" / "f"
        taken = _partial.lock

        def completed_first(fd: int) -> None:
            partial.write_bytes(b"y" * 10)
            os.link(partial, landed)
            partial.unlink()
            with other.registry(exclusive=True) as reg:
                ((upload_id, record),) = other._records(reg)
                record.update(length=10, size=10, done=201)
                other.save(reg, upload_id, record)
            taken(fd)

        monkeypatch.setattr(_partial_upload, "lock", completed_first)
        answer = await ask(site, append_to(where_to, "10", "?1"))
        monkeypatch.undo()
        assert (answer.status, field(answer, "Location")) == (410, "/sub/f")
        status = await ask(site, head_of(where_to), "HEAD")
        assert (field(status, "Upload-Complete"), field(status, "Upload-Offset")) == ("?1", "10")
    assert landed.read_bytes() == b"y" * 10


async def test_an_upload_landed_before_its_record_says_so_takes_nothing_more(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request that completes an upload lets its lock go as it gives the file its name, and
    notes the record done just after: a request of another worker that took the lock between found
    a record "not done", and appended into the file now landed under its name. It waits, and is
    answered as an append to a complete upload (400 with content); the landed file is untouched."""
    import threading

    from aiosendfile._serve import _partial_upload

    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"y" * 10))
        where_to = field(made, "Location")
        other = _partial.Store(policy_of(public), False, _partial.Limits(86400.0, 16, 1 << 30, None))
        partial, landed = partial_of(public, where_to), public / "sub" / "f"
        taken = _partial.lock

        def noted_done() -> None:
            with other.registry(exclusive=True) as reg:
                ((upload_id, record),) = other._records(reg)
                record.update(length=10, size=10, done=201)
                other.save(reg, upload_id, record)

        def landed_not_yet_noted(fd: int) -> None:
            monkeypatch.setattr(_partial_upload, "lock", taken)  # (once)
            os.link(partial, landed)
            partial.unlink()
            threading.Timer(0.2, noted_done).start()
            taken(fd)

        monkeypatch.setattr(_partial_upload, "lock", landed_not_yet_noted)
        answer = await ask(site, append_to(where_to, "10", "?0", body=b"Z" * 5))
        monkeypatch.undo()
        assert (answer.status, field(answer, "Upload-Complete")) == (400, "?1")
    assert landed.read_bytes() == b"y" * 10


async def test_a_tus_upload_whose_metadata_no_record_could_hold_is_refused(public: Path) -> None:
    """tus allows any bytes in a metadata key, and several ``Upload-Metadata`` fields are one list:
    a creation whose record would be too large to read back was answered 201, then lost (404),
    never counted against its owner's share nor expired. Refused now as header fields too large
    (431), with nothing left behind; the bounds still hold for the owner's next upload."""
    async with serve_site(public, upload=True, max_partial_uploads=1) as site:
        # (a field's bound is 8,190 bytes, a head's 16,384: two fields of 7,000 bytes of \xff, each
        # of which a JSON record spells in six)
        keys = [b",".join(b"\xff" * 46 + b"%d%03d" % (f, k) for k in range(137)) for f in range(2)]
        huge = b"\r\nUpload-Metadata: ".join([tus_metadata("big.bin").encode(), *keys])
        creation = request("POST", "/sub/", TUS, "Upload-Length: 3", "Upload-Metadata: HUGE")
        for _ in range(2):
            made = await ask(site, creation.replace(b"Upload-Metadata: HUGE", huge))
            assert made.status == 431
        assert left(public / "sub") == []
        state = public / _partial.REGISTRY
        assert not state.exists() or [p for p in state.iterdir() if p.suffix == ".json"] == []
        kept = await ask(site, request("POST", "/sub/", TUS, "Upload-Length: 3", tus_metadata("a.bin")))
        assert kept.status == 201
        other = await ask(site, request("POST", "/sub/", TUS, "Upload-Length: 3", tus_metadata("b.bin")))
        assert other.status == 507  # (one upload in progress at most: the first is counted)


@pytest.mark.parametrize(
    "where_from", ["Sec-Fetch-Site: cross-site", "Origin: http://evil.example", "Origin: null"]
)
async def test_another_sites_page_cannot_cancel_an_upload(public: Path, where_from: str) -> None:
    """A ``DELETE`` is a write as ``PUT`` is (Go's ``CrossOriginProtection`` refuses every unsafe
    method): another site's page that learned an upload's address cannot cancel it."""
    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"ab"))
        where_to = field(made, "Location")
        cancel = f"DELETE {where_to} HTTP/1.1\r\nHost: localhost\r\n{where_from}\r\n\r\n".encode()
        assert (await ask(site, cancel)).status == 403
        assert field(await ask(site, head_of(where_to), "HEAD"), "Upload-Offset") == "2"
        same = f"DELETE {where_to} HTTP/1.1\r\nHost: localhost\r\nSec-Fetch-Site: same-origin\r\n\r\n"
        assert (await ask(site, same.encode())).status == 204


async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_share(public: Path) -> None:
    """``--trusted-proxy`` keys uploads' shares on the client the proxy names, as the docs say.
    Without a password or an access log the proxies were not taken at all (the command line
    refused the option, the API dropped it): every client behind the proxy shared one share."""
    async with serve_site(public, upload=True, max_partial_uploads=1, trusted_proxies=("127.0.0.1",)) as site:

        async def create(name: str, client: str) -> int:
            made = await ask(
                site,
                request(
                    "PUT", f"/sub/{name}", "Upload-Complete: ?0", f"X-Forwarded-For: {client}", body=b"a"
                ),
            )
            return made.status

        assert await create("a", "192.0.2.1") == 201
        assert await create("b", "192.0.2.2") == 201  # (another client: its own share)
        assert await create("c", "192.0.2.1") == 507  # (the first one's share is taken)
