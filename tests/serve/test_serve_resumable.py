"""``serve --upload``'s resumable uploads (the IETF draft, interop version 8; tus 1.0), on both loops.

Each protocol's steps byte-exact over TCP, TLS and a Unix socket (creation, the 104 with the upload's
address, HEAD for the offset, PATCH, DELETE, OPTIONS; tus's deferred length and creation with a
body), and what resumes: a creation cut mid-body, a client killed mid-PATCH (another process), a
server killed mid-upload and started again. What a hostile client cannot do: append at another
offset (409, the right offset), past the announced length (400) or the size limit (413), reach
another path's, another user's or a made-up token's upload (404), hold more than its share of
uploads in progress (507), see or fetch the partial files and records (never served, listed or
uploaded to, dotfiles shown or not), or land an upload outside the root through a directory
swapped for a symlink. An upload with no progress past its expiry is removed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..support.processes import Server
from ..support.raw_http import Response, read_response
from ..support.serve import serve_site

pytest.importorskip("httptools")

from aiosendfile._serve import _auth, _partial, _resumable
from aiosendfile._serve._resumable import ask_of, tus_filename, upload_fields

V8 = "Upload-Draft-Interop-Version: 8"
TUS = "Tus-Resumable: 1.0.0"


def _request(method: str, path: str, *fields: str, body: bytes = b"", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {size}\r\n"
    return (head + "".join(f + "\r\n" for f in fields) + "\r\n").encode() + body


def _patch(
    where: str, offset: str, complete: str, *fields: str, body: bytes = b"", length: int | None = None
) -> bytes:
    """An IETF append to the upload at *where*."""
    return _request(
        "PATCH",
        where,
        "Content-Type: application/partial-upload",
        f"Upload-Offset: {offset}",
        f"Upload-Complete: {complete}",
        *fields,
        body=body,
        length=length,
    )


def _head(path: str, *fields: str) -> bytes:
    lines = "".join(f + "\r\n" for f in fields)
    return f"HEAD {path} HTTP/1.1\r\nHost: localhost\r\n{lines}\r\n".encode()


async def _ask(site: Any, data: bytes, method: str = "GET") -> Response:
    """One request on a connection of its own, and its final answer (1xx answers skipped)."""
    reader, writer = await site.open()
    try:
        writer.write(data)
        while True:
            answer = await read_response(reader, method)
            if answer.status >= 200:
                return answer
    finally:
        writer.close()


def _field(answer: Response, name: str) -> str:
    return answer.headers[name.lower()]


def _left(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# -- the rules, without sockets -------------------------------------------------------------------


def _fields(*pairs: str) -> dict[bytes, bytes]:
    return upload_fields([tuple(p.encode().split(b": ", 1)) for p in pairs])  # type: ignore[misc]


TOKEN = "A" * 32


@pytest.mark.parametrize(
    ("method", "directory", "query", "fields", "ctype", "step", "bad"),
    [
        ("PUT", False, "", ["Upload-Complete: ?0"], None, "create", 0),
        ("POST", False, "", ["Upload-Complete: ?1", "Upload-Length: 5"], None, "create", 0),
        ("PUT", False, "", ["Upload-Complete: yes"], None, "create", 400),
        ("PUT", False, "", ["Upload-Complete: ?0", "Upload-Offset: 7"], None, "create", 400),
        ("PUT", False, "", [], None, None, 0),  # a plain PUT
        ("PUT", True, "", ["Upload-Complete: ?0"], None, None, 0),  # a directory: not an upload's
        ("POST", True, "", [TUS, "Upload-Length: 5"], None, "create", 0),
        ("POST", True, "", [TUS, "Upload-Defer-Length: 1"], None, "create", 0),
        ("POST", True, "", [TUS], None, "create", 400),  # (no length, none deferred)
        ("POST", True, "", [TUS, "Upload-Defer-Length: 2"], None, "create", 400),
        ("POST", True, "", ["Tus-Resumable: 0.2.2", "Upload-Length: 5"], None, "create", 412),
        ("POST", True, "", [], None, None, 0),  # a form post
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: 0", "Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            0,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: 0", "Upload-Complete: ?1"],
            b"text/plain",
            "append",
            415,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            400,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: -1", "Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            400,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: 1" + "0" * 15, "Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            400,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            [TUS, "Upload-Offset: 3"],
            b"application/offset+octet-stream",
            "append",
            0,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            [TUS, "Upload-Offset: 3"],
            b"application/partial-upload",
            "append",
            415,
        ),
        (
            "PATCH",
            False,
            "upload=short",
            [TUS, "Upload-Offset: 3"],
            b"application/offset+octet-stream",
            None,
            0,
        ),
        (
            "PATCH",
            False,
            "",
            ["Upload-Offset: 0", "Upload-Complete: ?1"],
            b"application/partial-upload",
            None,
            0,
        ),
        ("HEAD", False, f"x=1&upload={TOKEN}", [], None, "status", 0),
        ("HEAD", False, f"upload={TOKEN}x", [], None, None, 0),
        ("DELETE", False, f"upload={TOKEN}", [TUS], None, "cancel", 0),
        ("GET", False, f"upload={TOKEN}", [], None, None, 0),
        ("OPTIONS", True, "", [], None, "options", 0),
    ],
)
def test_what_a_request_asks(
    method: str,
    directory: bool,
    query: str,
    fields: list[str],
    ctype: bytes | None,
    step: str | None,
    bad: int,
) -> None:
    ask = ask_of(method.encode(), directory, query.encode(), _fields(*fields), ctype)
    assert (ask and ask.step) == step
    if ask is not None:
        assert ask.bad == bad


def test_tus_metadata_is_read_strictly() -> None:
    name = base64.b64encode("été.txt".encode()).decode()
    assert tus_filename(f"kind,filename {name}".encode()) == "été.txt"
    assert tus_filename(b"kind") is None
    for bad in (b"filename !!!", b"filename YQ==,filename Yg==", b"filename " + base64.b64encode(b"\xff")):
        with pytest.raises(ValueError, match="Upload-Metadata"):
            tus_filename(bad)


def test_tokens_are_unguessable_and_filed_by_a_hash() -> None:
    tokens = {_resumable.new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    token = next(iter(tokens))
    assert len(token) == 32
    assert _resumable.token_of(b"upload=" + token) == token
    assert token.decode() not in _resumable.id_of(token)


# -- the IETF draft -------------------------------------------------------------------------------


@pytest.fixture(params=["tcp", "tls", "unix"])
def where(
    request: pytest.FixtureRequest,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
    tmp_path: Path,
) -> dict[str, Any]:
    """``serve_site``'s keyword arguments for a TCP, TLS or Unix socket."""
    if request.param == "unix":
        return {"unix_path": str(tmp_path / "s.sock")}
    return {"server_ctx": tls_server_ctx, "client_ctx": tls_client_ctx} if request.param == "tls" else {}


async def test_an_upload_made_then_appended_lands_byte_exact(public: Path, where: dict[str, Any]) -> None:
    data = os.urandom(3 * 2**20 + 11)
    async with serve_site(public, upload=True, **where) as site:
        made = await _ask(
            site,
            _request(
                "PUT", "/sub/big.bin", "Upload-Complete: ?0", f"Upload-Length: {len(data)}", body=data[:1000]
            ),
        )
        assert made.status == 201
        assert _field(made, "Upload-Complete") == "?0"
        assert _field(made, "Upload-Offset") == "1000"
        where_to = _field(made, "Location")
        assert where_to.startswith("/sub/big.bin?upload=")
        assert _left(public / "sub") == [f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"]

        status = await _ask(site, _head(where_to, V8), "HEAD")
        assert status.status == 204
        assert (_field(status, "Upload-Offset"), _field(status, "Upload-Complete")) == ("1000", "?0")
        assert _field(status, "Upload-Length") == str(len(data))
        assert _field(status, "Cache-Control") == "no-store"
        assert _field(status, "Upload-Limit").startswith("max-age=")

        middle = _patch(where_to, "1000", "?0", body=data[1000 : 2**20])
        answer = await _ask(site, middle)
        assert answer.status == 204
        assert _field(answer, "Upload-Offset") == str(2**20)
        assert not (public / "sub" / "big.bin").exists()  # (whole, or not at all)

        last = _patch(where_to, f"{2**20}", "?1", body=data[2**20 :])
        answer = await _ask(site, last)
        assert answer.status == 201
        assert _field(answer, "Upload-Complete") == "?1"
        assert (public / "sub" / "big.bin").read_bytes() == data
        assert _left(public / "sub") == ["big.bin"]

        status = await _ask(site, _head(where_to, V8), "HEAD")  # (a client that lost that answer)
        assert (_field(status, "Upload-Complete"), _field(status, "Upload-Offset")) == ("?1", str(len(data)))
        again = _request(
            "PATCH",
            where_to,
            "Content-Type: application/partial-upload",
            f"Upload-Offset: {len(data)}",
            "Upload-Complete: ?1",
        )
        assert (await _ask(site, again)).status == 201  # its answer again; nothing changes
        assert (public / "sub" / "big.bin").read_bytes() == data


async def test_a_creation_with_all_of_it_is_a_put_and_an_empty_one_an_empty_file(public: Path) -> None:
    async with serve_site(public, upload=True) as site:
        answer = await _ask(site, _request("PUT", "/sub/whole", "Upload-Complete: ?1", body=b"all of it"))
        assert answer.status == 201
        assert _field(answer, "Upload-Complete") == "?1"
        answer = await _ask(site, _request("PUT", "/sub/empty", "Upload-Complete: ?1", V8))
        assert answer.status == 201
        answer = await _ask(site, _request("PUT", "/sub/whole", "Upload-Complete: ?1", body=b"x"))
        assert answer.status == 409  # (a file has that name: as a PUT)
    assert (public / "sub" / "whole").read_bytes() == b"all of it"
    assert (public / "sub" / "empty").read_bytes() == b""
    assert _left(public / "sub") == ["empty", "whole"]


async def test_a_creation_cut_mid_body_resumes_from_the_104s_address(
    public: Path, where: dict[str, Any]
) -> None:
    data = os.urandom(2**20)
    async with serve_site(public, upload=True, **where) as site:
        reader, writer = await site.open()
        writer.write(_request("PUT", "/sub/cut.bin", "Upload-Complete: ?1", V8, length=len(data)))
        early = await read_response(reader)
        assert early.status == 104
        assert _field(early, "Upload-Draft-Interop-Version") == "8"
        where_to = _field(early, "Location")
        partial = public / "sub" / f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"
        writer.write(data[:300_000])
        await writer.drain()
        for _ in range(200):  # (until the server has it all on disk)
            if partial.stat().st_size == 300_000:
                break
            await asyncio.sleep(0.05)
        writer.transport.abort()  # the connection drops

        status = await _ask(site, _head(where_to, V8), "HEAD")
        assert _field(status, "Upload-Offset") == "300000"
        rest = _patch(where_to, "300000", "?1", V8, body=data[300_000:])
        assert (await _ask(site, rest)).status == 201
    assert (public / "sub" / "cut.bin").read_bytes() == data
    assert _left(public / "sub") == ["cut.bin"]


async def test_a_new_request_for_an_upload_stops_the_stale_one_writing_it(public: Path) -> None:
    """A client resuming while its old connection still looks alive to the server (a NAT's timeout,
    a phone changing networks): the old request is stopped, what it wrote stays."""
    async with serve_site(public, upload=True) as site:
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 200000"))
        where_to = _field(made, "Location")
        reader, writer = await site.open()  # (stalls after 50,000 bytes)
        writer.write(_patch(where_to, "0", "?1", length=200_000) + b"a" * 50_000)
        partial = public / "sub" / f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"
        for _ in range(200):
            if partial.stat().st_size == 50_000:
                break
            await asyncio.sleep(0.05)
        status = await _ask(site, _head(where_to), "HEAD")
        assert _field(status, "Upload-Offset") == "50000"
        assert await asyncio.wait_for(reader.read(), 10) == b""  # (the stale one was closed)
        writer.close()
        rest = _patch(where_to, "50000", "?1", body=b"b" * 150_000)
        assert (await _ask(site, rest)).status == 201
    assert (public / "sub" / "f").read_bytes() == b"a" * 50_000 + b"b" * 150_000


async def test_appends_that_do_not_fit_are_refused_and_change_nothing(public: Path) -> None:
    async with serve_site(public, upload=True, max_upload_size=1000) as site:
        assert (
            await _ask(site, _request("PUT", "/sub/x", "Upload-Complete: ?0", "Upload-Length: 1001"))
        ).status == 413
        made = await _ask(
            site, _request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 10", body=b"12345")
        )
        where_to = _field(made, "Location")
        patch = ("PATCH", where_to, "Content-Type: application/partial-upload")
        wrong = await _ask(site, _request(*patch, "Upload-Offset: 3", "Upload-Complete: ?0", body=b"zz"))
        assert wrong.status == 409
        assert (_field(wrong, "Upload-Offset"), _field(wrong, "Upload-Complete")) == ("5", "?0")
        past = await _ask(site, _request(*patch, "Upload-Offset: 5", "Upload-Complete: ?0", body=b"123456"))
        assert past.status == 400  # (past the length announced)
        short = await _ask(site, _request(*patch, "Upload-Offset: 5", "Upload-Complete: ?1", body=b"12"))
        assert short.status == 400  # (ends before it)
        other = await _ask(
            site, _request(*patch, "Upload-Offset: 5", "Upload-Complete: ?0", "Upload-Length: 11")
        )
        assert other.status == 400  # (another length)
        chunked = (
            f"PATCH {where_to} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: application/partial-upload\r\nUpload-Offset: 5\r\nUpload-Complete: ?0\r\n\r\n"
            "8\r\n12345678\r\n0\r\n\r\n"
        ).encode()
        assert (await _ask(site, chunked)).status == 400  # (its bytes past the length are not written)
        moved = where_to.replace("/sub/f", "/sub/g")
        assert (
            await _ask(
                site,
                _request(
                    *patch[:1], moved, *patch[2:], "Upload-Offset: 5", "Upload-Complete: ?1", body=b"67890"
                ),
            )
        ).status == 404
        forged = where_to[:-32] + "B" * 32
        assert (await _ask(site, _head(forged), "HEAD")).status == 404
        status = await _ask(site, _head(where_to), "HEAD")
        assert _field(status, "Upload-Offset") == "5"
        done = await _ask(site, _request(*patch, "Upload-Offset: 5", "Upload-Complete: ?1", body=b"67890"))
        assert done.status == 201
    assert (public / "sub" / "f").read_bytes() == b"1234567890"
    assert _left(public / "sub") == ["f"]


async def test_each_client_holds_a_bounded_share_of_uploads_in_progress(public: Path) -> None:
    async with serve_site(public, upload=True, max_partial_uploads=2, max_partial_size=1000) as site:
        made = [
            await _ask(site, _request("PUT", f"/sub/{n}", "Upload-Complete: ?0", "Upload-Length: 400"))
            for n in range(3)
        ]
        assert [m.status for m in made] == [201, 201, 507]
        big = await _ask(site, _request("PUT", "/sub/big", "Upload-Complete: ?0", "Upload-Length: 700"))
        assert big.status == 507
        cancel = f"DELETE {_field(made[0], 'Location')} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
        assert (await _ask(site, cancel)).status == 204
        again = await _ask(site, _request("PUT", "/sub/again", "Upload-Complete: ?0", "Upload-Length: 600"))
        assert again.status == 201
    assert sum(name.endswith(".partial") for name in _left(public / "sub")) == 2


async def test_an_upload_with_no_progress_expires(public: Path) -> None:
    async with serve_site(public, upload=True, upload_expiry=1.0) as site:
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"abc"))
        where_to = _field(made, "Location")
        assert (await _ask(site, _head(where_to), "HEAD")).status == 204
        for _ in range(100):  # (the server looks for expired uploads four times an expiry)
            if not (public / ".upload-state" / f"{_resumable.id_of(where_to[-32:].encode())}.json").exists():
                break
            await asyncio.sleep(0.05)
        assert (await _ask(site, _head(where_to), "HEAD")).status == 404
    made_by_hand = _partial.Store(_policy_of(public), False, _partial.Limits(1.0, 16, 1 << 30, None))
    assert made_by_hand.sweep() == 0
    assert _left(public / "sub") == []
    assert _left(public / ".upload-state") == []


def _policy_of(public: Path) -> Any:
    from aiosendfile._static._fs import directory_policy

    return directory_policy(public)


async def test_uploads_in_progress_are_never_served_listed_or_written(public: Path) -> None:
    async with serve_site(public, upload=True, show_index=True, show_dotfiles=True) as site:
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"secret"))
        upload_id = _resumable.id_of(_field(made, "Location")[-32:].encode())
        for path in (
            f"/sub/.upload-{upload_id}.partial",
            f"/.upload-state/{upload_id}.json",
            "/.upload-state/",
        ):
            assert (
                await _ask(site, f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            ).status == 404
        listing = await _ask(site, b"GET /sub/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert b".upload-" not in listing.body
        listing = await _ask(site, b"GET /?tar HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert b".upload-" not in listing.body
        assert b"secret" not in listing.body
        put = await _ask(site, _request("PUT", f"/sub/.upload-{upload_id}.partial", body=b"x"))
        assert put.status == 404
        assert (public / "sub" / f".upload-{upload_id}.partial").read_bytes() == b"secret"


async def test_a_directory_swapped_for_a_symlink_gets_nothing(public: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with serve_site(public, upload=True) as site:
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"abc"))
        where_to = _field(made, "Location")
        shutil.move(str(public / "sub"), str(tmp_path / "moved"))
        shutil.copytree(tmp_path / "moved", outside, dirs_exist_ok=True)  # (its partial file too)
        (public / "sub").symlink_to(outside)
        rest = _patch(where_to, "3", "?1", body=b"def")
        assert (await _ask(site, rest)).status == 404
    assert not (outside / "f").exists()


async def test_with_passwords_an_upload_is_its_users_alone(public: Path) -> None:
    users = dict(_auth.parse_entry(entry) for entry in ("bob:pw", "eve:pw2"))

    def basic(user: str, password: str) -> str:
        return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    async with serve_site(public, upload=True, auth=tuple(users.items()), public_read=True) as site:
        made = await _ask(
            site, _request("PUT", "/sub/f", "Upload-Complete: ?0", basic("bob", "pw"), body=b"ab")
        )
        assert made.status == 201
        where_to = _field(made, "Location")
        assert (await _ask(site, _head(where_to), "HEAD")).status == 401  # (even with public reads)
        assert (await _ask(site, _head(where_to, basic("eve", "pw2")), "HEAD")).status == 404
        assert (await _ask(site, _head(where_to, basic("bob", "pw")), "HEAD")).status == 204
        patch = (
            "PATCH",
            where_to,
            "Content-Type: application/partial-upload",
            "Upload-Offset: 2",
            "Upload-Complete: ?1",
        )
        assert (await _ask(site, _request(*patch, basic("eve", "pw2"), body=b"c"))).status == 404
        assert (await _ask(site, _request(*patch, basic("bob", "pw"), body=b"c"))).status == 201
    assert (public / "sub" / "f").read_bytes() == b"abc"


async def test_another_sites_page_cannot_append(public: Path) -> None:
    async with serve_site(public, upload=True) as site:
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"ab"))
        patch = _request(
            "PATCH",
            _field(made, "Location"),
            "Content-Type: application/partial-upload",
            "Upload-Offset: 2",
            "Upload-Complete: ?1",
            "Sec-Fetch-Site: cross-site",
            body=b"c",
        )
        assert (await _ask(site, patch)).status == 403
        assert not (public / "sub" / "f").exists()


async def test_behind_a_path_prefix_the_address_keeps_it(public: Path) -> None:
    async with serve_site(public, upload=True, path_prefix="/files") as site:
        made = await _ask(site, _request("PUT", "/files/sub/f", "Upload-Complete: ?0", body=b"ab"))
        where_to = _field(made, "Location")
        assert where_to.startswith("/files/sub/f?upload=")
        rest = _patch(where_to, "2", "?1", body=b"c")
        assert (await _ask(site, rest)).status == 201
    assert (public / "sub" / "f").read_bytes() == b"abc"


# -- tus 1.0 ---------------------------------------------------------------------------------------


def _metadata(name: str) -> str:
    return f"Upload-Metadata: filename {base64.b64encode(name.encode()).decode()},private"


async def test_tus_creation_appends_deferred_length_and_termination(
    public: Path, where: dict[str, Any]
) -> None:
    data = os.urandom(700_000)
    async with serve_site(public, upload=True, max_upload_size=10**6, **where) as site:
        options = await _ask(site, b"OPTIONS /sub/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert options.status == 204
        assert _field(options, "Tus-Version") == "1.0.0"
        assert _field(options, "Tus-Max-Size") == "1000000"
        assert "creation-defer-length" in _field(options, "Tus-Extension")

        made = await _ask(
            site, _request("POST", "/sub/", TUS, f"Upload-Length: {len(data)}", _metadata("été.bin"))
        )
        assert made.status == 201
        assert _field(made, "Tus-Resumable") == "1.0.0"
        where_to = _field(made, "Location")
        assert where_to.startswith("/sub/%C3%A9t%C3%A9.bin?upload=")
        assert _field(made, "Upload-Expires").endswith(" GMT")
        patch = ("PATCH", where_to, TUS, "Content-Type: application/offset+octet-stream")
        first = await _ask(site, _request(*patch, "Upload-Offset: 0", body=data[:300_000]))
        assert first.status == 204
        assert _field(first, "Upload-Offset") == "300000"
        status = await _ask(site, _head(where_to, TUS), "HEAD")
        assert status.status == 200
        assert (_field(status, "Upload-Offset"), _field(status, "Upload-Length")) == (
            "300000",
            str(len(data)),
        )
        assert _field(status, "Upload-Metadata").startswith("filename ")
        assert (await _ask(site, _request(*patch, "Upload-Offset: 1", body=b"x"))).status == 409
        last = await _ask(site, _request(*patch, "Upload-Offset: 300000", body=data[300_000:]))
        assert last.status == 204
        assert _field(last, "Upload-Offset") == str(len(data))
        assert (public / "sub" / "été.bin").read_bytes() == data

        deferred = await _ask(
            site, _request("POST", "/sub/", TUS, "Upload-Defer-Length: 1", _metadata("later"))
        )
        later = _field(deferred, "Location")
        status = await _ask(site, _head(later, TUS), "HEAD")
        assert _field(status, "Upload-Defer-Length") == "1"
        patch = ("PATCH", later, TUS, "Content-Type: application/offset+octet-stream")
        assert (await _ask(site, _request(*patch, "Upload-Offset: 0", body=b"abc"))).status == 204
        assert not (public / "sub" / "later").exists()
        assert (
            await _ask(site, _request(*patch, "Upload-Offset: 3", "Upload-Length: 5", body=b"de"))
        ).status == 204
        assert (public / "sub" / "later").read_bytes() == b"abcde"

        with_body = await _ask(
            site,
            _request(
                "POST",
                "/sub/",
                TUS,
                "Upload-Length: 6",
                _metadata("gone"),
                "Content-Type: application/offset+octet-stream",
                body=b"abc",
            ),
        )
        assert with_body.status == 201
        assert _field(with_body, "Upload-Offset") == "3"
        gone = _field(with_body, "Location")
        cancel = f"DELETE {gone} HTTP/1.1\r\nHost: localhost\r\n{TUS}\r\n\r\n".encode()
        assert (await _ask(site, cancel)).status == 204
        assert (await _ask(site, _head(gone, TUS), "HEAD")).status == 404

        assert (
            await _ask(
                site, _request("POST", "/sub/", "Tus-Resumable: 0.2", "Upload-Length: 1", _metadata("a"))
            )
        ).status == 412
        assert (
            await _ask(site, _request("POST", "/sub/", TUS, "Upload-Length: 1"))
        ).status == 400  # (no name)
        assert (
            await _ask(site, _request("POST", "/sub/", TUS, "Upload-Length: 1", _metadata("a/b")))
        ).status == 403
        too_big = _request("POST", "/sub/", TUS, "Upload-Length: 1000001", _metadata("big"))
        assert (await _ask(site, too_big)).status == 413
    assert _left(public / "sub") == ["later", "été.bin"]


# -- other processes: a killed client, a killed server ----------------------------------------------

_CLIENT = """
import socket, sys, time
port, path, total = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(("PATCH %s HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Length: %d\\r\\n"
           "Content-Type: application/partial-upload\\r\\nUpload-Offset: 0\\r\\n"
           "Upload-Complete: ?1\\r\\n\\r\\n" % (path, total)).encode())
s.sendall(b"k" * 400000)
print("sent", flush=True)
time.sleep(60)
"""


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1].strip("/"))


def _http(port: int, data: bytes) -> tuple[int, dict[str, str]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    head = got.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    fields = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(head[0].split()[1]), fields


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_upload_survives_a_killed_client_and_a_killed_server(public: Path, loop: str) -> None:
    total = 1_000_000
    server = Server(str(public), "--port", "0", "--upload", "--loop", loop)
    try:
        port = _port(server)
        status, fields = _http(
            port, _request("PUT", "/sub/f", "Upload-Complete: ?0", f"Upload-Length: {total}")
        )
        assert status == 201
        where_to = fields["location"]
        client = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, str(port), where_to, str(total)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None
        assert client.stdout.readline() == "sent\n"
        partial = public / "sub" / f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"
        deadline = time.monotonic() + 20
        while partial.stat().st_size < 400_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partial.stat().st_size == 400_000
        client.kill()  # the client dies mid-PATCH
        client.wait()
        client.stdout.close()
        status, fields = _http(port, _head(where_to))
        assert (status, fields["upload-offset"]) == (204, "400000")
        server.proc.send_signal(signal.SIGKILL)  # then the server
        server.proc.wait()
    finally:
        server.close()
    server = Server(str(public), "--port", "0", "--upload", "--loop", loop)
    try:
        port = _port(server)
        status, fields = _http(port, _head(where_to))
        assert (status, fields["upload-offset"]) == (204, "400000")
        rest = _patch(where_to, "400000", "?1", body=b"r" * (total - 400_000))
        assert _http(port, rest)[0] == 201
    finally:
        server.close()
    assert (public / "sub" / "f").read_bytes() == b"k" * 400_000 + b"r" * (total - 400_000)
    with contextlib.suppress(FileNotFoundError):
        assert [n for n in _left(public / "sub") if n.endswith(".partial")] == []


def test_the_parts_of_an_upload_may_reach_different_workers(public: Path) -> None:
    """With ``--workers 2`` each part goes on a new connection, which either worker may accept:
    the store is on disk, shared."""
    server = Server(str(public), "--port", "0", "--upload", "--workers", "2")
    try:
        port = _port(server)
        status, fields = _http(port, _request("PUT", "/sub/w", "Upload-Complete: ?0", "Upload-Length: 20000"))
        assert status == 201
        where_to = fields["location"]
        for n in range(20):
            complete = "?1" if n == 19 else "?0"
            part = _request(
                "PATCH",
                where_to,
                "Content-Type: application/partial-upload",
                f"Upload-Offset: {n * 1000}",
                f"Upload-Complete: {complete}",
                body=bytes([65 + n]) * 1000,
            )
            assert _http(port, part)[0] == (201 if n == 19 else 204)
    finally:
        server.close()
    assert (public / "sub" / "w").read_bytes() == b"".join(bytes([65 + n]) * 1000 for n in range(20))


# -- from a review: each of these failed before its fix ---------------------------------------------


async def _stalled_patch(
    site: Any, where_to: str, offset: int, *fields: str, length: int, sent: bytes
) -> Any:
    """A PATCH announcing *length* bytes that sends *sent* and stalls (the writer is returned)."""
    _reader, writer = await site.open()
    writer.write(
        _request(
            "PATCH",
            where_to,
            "Content-Type: application/partial-upload",
            f"Upload-Offset: {offset}",
            *fields,
            length=length,
        )
        + sent
    )
    await writer.drain()
    return writer


def _size_of(path: Path) -> int:
    return path.stat().st_size if path.exists() else -1


async def _until_size(partial: Path, size: int) -> None:
    for _ in range(200):
        if _size_of(partial) == size:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{partial} never held {size} bytes")


def _partial_of(public: Path, where_to: str) -> Path:
    return public / "sub" / f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"


async def test_an_upload_still_moving_does_not_expire(public: Path) -> None:
    """An upload whose requests keep being cut, each longer than the expiry, is progress all along."""
    async with serve_site(public, upload=True, upload_expiry=1.0) as site:
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", "Upload-Length: 9000"))
        where_to = _field(made, "Location")
        writer = await _stalled_patch(site, where_to, 0, "Upload-Complete: ?1", length=9000, sent=b"")
        for n in range(6):  # (3 s of a request sending a little every half second)
            writer.write(b"x" * 500)
            await writer.drain()
            await _until_size(_partial_of(public, where_to), 500 * (n + 1))
            await asyncio.sleep(0.5)
        writer.transport.abort()
        status = await _ask(site, _head(where_to), "HEAD")
        assert status.status == 204
        assert _field(status, "Upload-Offset") == "3000"


async def test_a_length_told_in_a_cut_request_is_kept(public: Path) -> None:
    async with serve_site(public, upload=True) as site:
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0"))
        where_to = _field(made, "Location")
        writer = await _stalled_patch(
            site, where_to, 0, "Upload-Complete: ?0", "Upload-Length: 10", length=10, sent=b"abc"
        )
        await _until_size(_partial_of(public, where_to), 3)
        writer.transport.abort()
        status = await _ask(site, _head(where_to), "HEAD")
        assert _field(status, "Upload-Length") == "10"
        other = _patch(where_to, "3", "?0", "Upload-Length: 50", body=b"d")
        assert (await _ask(site, other)).status == 400


async def test_uploads_of_no_announced_length_count_against_their_owners_bytes(public: Path) -> None:
    async with serve_site(public, upload=True, max_partial_size=1000, max_partial_uploads=3) as site:
        addresses = [
            _field(await _ask(site, _request("PUT", f"/sub/{n}", "Upload-Complete: ?0")), "Location")
            for n in range(2)
        ]
        patch = ("Content-Type: application/partial-upload", "Upload-Offset: 0", "Upload-Complete: ?0")
        assert (await _ask(site, _request("PATCH", addresses[0], *patch, body=b"a" * 600))).status == 204
        assert (await _ask(site, _request("PATCH", addresses[1], *patch, body=b"b" * 600))).status == 507
        chunked = (
            f"PATCH {addresses[1]} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            "Content-Type: application/partial-upload\r\nUpload-Offset: 0\r\nUpload-Complete: ?0\r\n\r\n"
            "258\r\n" + "b" * 600 + "\r\n0\r\n\r\n"
        ).encode()
        assert (await _ask(site, chunked)).status == 507
    assert sum(_size_of(public / "sub" / n) for n in _left(public / "sub")) <= 1000


async def test_each_address_has_its_own_share_without_a_log_or_passwords(public: Path) -> None:
    async with serve_site(public, upload=True, max_partial_uploads=1) as site:

        async def make(address: str, name: str) -> int:
            reader, writer = await site.open(local_addr=(address, 0))
            try:
                writer.write(_request("PUT", f"/sub/{name}", "Upload-Complete: ?0"))
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
        made = await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", bob))
        where_to = _field(made, "Location")
        reader, writer = await site.open()
        writer.write(_patch(where_to, "0", "?1", bob, length=200_000) + b"a" * 100_000)
        await _until_size(_partial_of(public, where_to), 100_000)
        assert (await _ask(site, _head(where_to, eve), "HEAD")).status == 404
        bad = _patch(where_to, "100000", "?1", eve, body=b"e")
        assert (await _ask(site, bad)).status == 404
        writer.write(b"a" * 100_000)  # (bob's request was never stopped)
        assert (await read_response(reader)).status == 201
        writer.close()
    assert (public / "sub" / "f").read_bytes() == b"a" * 200_000


async def test_answers_carry_what_each_protocol_asks(public: Path) -> None:
    log = io.StringIO()
    async with serve_site(public, upload=True, access_log=log) as site:
        old = await _ask(site, _request("POST", "/sub/", "Tus-Resumable: 0.2.2", "Upload-Length: 1"))
        assert old.status == 412
        assert _field(old, "Tus-Version") == "1.0.0"
        unknown = _request(
            "PATCH",
            "/sub/f?upload=" + "C" * 32,
            TUS,
            "Content-Type: application/offset+octet-stream",
            "Upload-Offset: 0",
            body=b"x",
        )
        missing = await _ask(site, unknown)
        assert missing.status == 404
        assert _field(missing, "Tus-Resumable") == "1.0.0"
        chunked = (
            "POST /sub/ HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            f"{TUS}\r\nUpload-Length: 3\r\n{_metadata('t')}\r\nContent-Type: text/plain\r\n\r\n"
            "3\r\nabc\r\n0\r\n\r\n"
        ).encode()
        assert (await _ask(site, chunked)).status == 415
        made = await _ask(site, _request("PUT", "/sub/done", "Upload-Complete: ?0", body=b"ab"))
        where_to = _field(made, "Location")
        rest = _patch(where_to, "2", "?1", body=b"c")
        assert (await _ask(site, rest)).status == 201
        status = await _ask(site, _head(where_to), "HEAD")
        assert _field(status, "Upload-Complete") == "?1"
        assert _field(status, "Upload-Limit") == "min-size=0"
    lines = log.getvalue()
    assert "upload=[token]" in lines
    assert where_to[-32:] not in lines
    assert not (public / "sub" / "t").exists()


# -- a real tus client --------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tuspy_uploads_and_resumes_into_serve(public: Path, tmp_path: Path, loop: str) -> None:
    """tus's own Python client (tuspy): an upload in 256 KiB chunks, and one stopped after a chunk
    and resumed by a new uploader from its address, each byte-exact."""
    client_module = pytest.importorskip("tusclient.client")
    data = os.urandom(1_000_003)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    server = Server(str(public), "--port", "0", "--upload", "--loop", loop)
    try:
        client = client_module.TusClient(server.url + "sub/")
        chunk = 256 * 1024
        with source.open("rb") as stream:  # (given a path, tuspy leaves the file open)
            whole = client.uploader(file_stream=stream, chunk_size=chunk, metadata={"filename": "whole.bin"})
            whole.upload()
        with source.open("rb") as stream:
            named = {"filename": "resumed.bin"}
            first = client.uploader(file_stream=stream, chunk_size=chunk, metadata=named)
            first.upload_chunk()
            assert first.offset == chunk
        assert not (public / "sub" / "resumed.bin").exists()
        with source.open("rb") as stream:
            again = client.uploader(file_stream=stream, chunk_size=chunk, url=first.url)
            assert again.offset == chunk  # (asked of the server)
            again.upload()
    finally:
        server.close()
    assert (public / "sub" / "whole.bin").read_bytes() == data
    assert (public / "sub" / "resumed.bin").read_bytes() == data
    assert _left(public / "sub") == ["resumed.bin", "whole.bin"]


async def test_a_tus_creation_with_no_body_needs_no_length_field(public: Path) -> None:
    """``curl -X POST`` sends neither ``Content-Length`` nor ``Transfer-Encoding``: no body."""
    async with serve_site(public, upload=True) as site:
        bare = (
            f"POST /sub/ HTTP/1.1\r\nHost: localhost\r\n{TUS}\r\nUpload-Length: 2\r\n{_metadata('n')}\r\n\r\n"
        )
        made = await _ask(site, bare.encode())
        assert made.status == 201


async def test_an_upload_nothing_was_sent_to_goes_sooner(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A made-up upload (its creation, then nothing) holds a record for ``KEEP_EMPTY``, not a day;
    one that got bytes keeps its whole expiry."""
    async with serve_site(public, upload=True) as site:
        empty = _field(
            await _ask(site, _request("PUT", "/sub/e", "Upload-Complete: ?0", "Upload-Length: 5")), "Location"
        )  # (a length announced, nothing sent: still a made-up upload)
        fed = _field(
            await _ask(site, _request("PUT", "/sub/f", "Upload-Complete: ?0", body=b"x")), "Location"
        )
        monkeypatch.setattr(_partial, "KEEP_EMPTY", 0.2)
        await asyncio.sleep(0.5)
        store = _partial.Store(_policy_of(public), False, _partial.Limits(86400.0, 16, 1 << 30, None))
        assert await asyncio.to_thread(store.sweep) == 1
        assert (await _ask(site, _head(empty), "HEAD")).status == 404
        assert (await _ask(site, _head(fed), "HEAD")).status == 204


async def test_an_owners_share_counts_a_request_under_way(public: Path) -> None:
    """An upload of no known length being appended to holds what its request may bring: a new
    upload cannot take the same room meanwhile (the owner would hold more than its share, and
    every later append of either would be refused, the one that completes it included)."""
    async with serve_site(public, upload=True, max_partial_size=100, max_partial_uploads=4) as site:
        first = _field(await _ask(site, _request("PUT", "/sub/a", "Upload-Complete: ?0")), "Location")
        reader, writer = await site.open()
        writer.write(_patch(first, "0", "?0", length=90) + b"x" * 10)  # (?0: its length still unknown)
        await _until_size(_partial_of(public, first), 10)
        second = await _ask(site, _request("PUT", "/sub/b", "Upload-Complete: ?0", "Upload-Length: 90"))
        assert second.status == 507
        writer.write(b"x" * 80)
        assert (await read_response(reader)).status == 204
        writer.close()
        assert (await _ask(site, _patch(first, "90", "?1"))).status == 201  # (completed: its room is free)
        again = await _ask(site, _request("PUT", "/sub/b", "Upload-Complete: ?0", "Upload-Length: 90"))
        assert again.status == 201
    assert (public / "sub" / "a").read_bytes() == b"x" * 90
