"""``serve --upload --auth``: what a hostile web does to passwords, uploads and pages (issue 49).

Each case is a probe an attacker ran against the tree before it: the lockout broken by overflow
or walked around by pipelining and by the memo of heads, the password thread's queue flooded,
``.gz``/``.br`` siblings replacing what browsers get, cross-site writes, DNS rebinding, stored
script, uploads landing outside the root through a swapped directory, names that spoof, the
request after a 507 lost, 405 before 401, the thread writer's socket check. In this loop (both
loops, TCP and TLS where the transport matters) and against ``serve`` in its own process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from ..support.processes import Server
from ..support.raw_http import Response, SocketResponses, read_response
from ..support.serve import serve_site
from ..support.uploads import left

pytest.importorskip("httptools")
pytest.importorskip("python_multipart")

from aiosendfile._serve import _auth
from aiosendfile._serve._auth import ALLOWED, BUSY, MISSING, Gate, TrustedProxies, address_key
from aiosendfile._serve._rules import HostRule, runs_script, same_origin
from aiosendfile._serve._upload import bad_name

FAST_LOG_N = 4
BOUNDARY = "----hostileBoundary"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def clear_users(**clear: str) -> tuple[tuple[bytes, _auth.Secret], ...]:
    return tuple(_auth.parse_entry(f"{u}:{p}") for u, p in clear.items())


def hashed_users(**clear: str) -> tuple[tuple[bytes, _auth.Secret], ...]:
    return tuple(
        _auth.parse_entry(f"{u}:{_auth.hash_password(p, log_n=FAST_LOG_N)}") for u, p in clear.items()
    )


def get(path: str, *extra: str, method: str = "GET", host: str = "x") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(e + "\r\n" for e in extra) + "\r\n"
    ).encode()


def put(path: str, body: bytes, *extra: str, host: str = "x") -> bytes:
    head = f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(e + "\r\n" for e in extra) + "\r\n").encode() + body


def form(path: str, files: dict[str, bytes], *extra: str) -> bytes:
    body = (
        b"".join(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n\r\n'.encode()
            + data
            + b"\r\n"
            for name, data in files.items()
        )
        + f"--{BOUNDARY}--\r\n".encode()
    )
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {len(body)}\r\n" + "".join(e + "\r\n" for e in extra) + "\r\n"
    )
    return head.encode() + body


def _open_paths() -> set[str]:
    """What this process's descriptors name (the engine's pool opens an upload's directory)."""
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            names.add(os.readlink(f"/proc/self/fd/{fd}"))
    return names


async def exchange(site: Any, data: bytes, method: bytes = b"GET") -> Response:
    reader, writer = await site.open()
    try:
        writer.write(data)
        return await read_response(reader, method)
    finally:
        writer.close()


# -- the lockout --------------------------------------------------------------------------------


def test_thousands_of_failures_neither_break_the_lockout_nor_grow_its_count() -> None:
    """The probe: 1,029 failures raised OverflowError in every later check of that address."""
    gate = Gate(dict(clear_users(bob="pw")))
    bad = basic("bob", "bad").encode()
    for n in range(2000):
        gate.record(bad, False, "a", float(n))
    assert gate.failures["a"][0] == _auth.COUNT_MAX
    assert gate.locked_for("a", 1999.0) == pytest.approx(_auth.LOCK_MAX)
    assert gate.check(b"GET", basic("bob", "pw").encode(), "a", 1999.5) == pytest.approx(_auth.LOCK_MAX - 0.5)
    assert gate.check(b"GET", basic("bob", "pw").encode(), "a", 1999.0 + _auth.LOCK_MAX) == ALLOWED


def test_the_password_threads_queue_is_bounded_per_address_and_in_all() -> None:
    """Beyond QUEUE_PER_ADDRESS values of one address: 429 at once; beyond QUEUE_MAX: 503."""
    release = threading.Event()

    class Held(Gate):
        def verify(self, value: bytes) -> bool:
            release.wait(10)
            return False

    gate = Held(dict(hashed_users(alice="s3cret")))
    try:
        jobs = [
            gate.verify_later(basic("alice", f"guess{n}").encode(), "a")
            for n in range(_auth.QUEUE_PER_ADDRESS)
        ]
        assert all(not isinstance(job, float) for job in jobs)
        # the same value again shares the check; a new one is refused now
        assert gate.verify_later(basic("alice", "guess0").encode(), "a") is jobs[0]
        assert gate.verify_later(basic("alice", "another").encode(), "a") == 1.0
        for n in range(_auth.QUEUE_MAX - _auth.QUEUE_PER_ADDRESS):
            assert not isinstance(gate.verify_later(basic("alice", "x").encode(), f"k{n}"), float)
        assert gate.verify_later(basic("alice", "x").encode(), "one-more") == BUSY
        release.set()
        assert [job.result(10) for job in jobs if not isinstance(job, float)] == [MISSING, MISSING]
    finally:
        release.set()
        gate.close()


def test_a_value_judged_in_the_thread_meets_the_lock_the_failures_before_it_set() -> None:
    gate = Gate(dict(hashed_users(alice="s3cret")))
    try:
        right = basic("alice", "s3cret").encode()
        for n in range(_auth.FREE_FAILURES):
            gate.record(f"bad{n}".encode(), False, "a", gate.clock())
        assert gate.check(b"GET", right, "a", gate.clock()) > 0  # locked: no hash at all
        gate.failures.clear()
        job = gate.verify_later(right, "a")
        assert not isinstance(job, float)
        assert job.result(10) == ALLOWED
    finally:
        gate.close()


def test_clients_are_keyed_by_address_an_ipv6_one_by_its_64() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")


def test_a_trusted_proxy_names_the_client_and_no_one_else_does() -> None:
    proxies = TrustedProxies(("10.0.0.0/8", "::1"))
    assert proxies.trusts("10.1.2.3")
    assert proxies.trusts("::1")
    assert not proxies.trusts("192.0.2.1")
    # (the rightmost hop the proxies did not add: what a client wrote before it is not believed)
    assert proxies.client(b"6.6.6.6, 192.0.2.1, 10.0.0.2") == "192.0.2.1"
    assert proxies.client(b"[2001:db8::1]:4711") == "2001:db8::1"
    assert proxies.client(b"unknown") is None
    assert proxies.client(b"10.0.0.1") is None


def test_one_accounts_password_does_not_reset_the_lock_for_guesses_at_another() -> None:
    gate = Gate(dict(clear_users(mallory="mine", admin="secret")))
    own = basic("mallory", "mine").encode()
    for n in range(_auth.FREE_FAILURES - 1):
        assert gate.check(b"GET", basic("admin", f"guess{n}").encode(), "a", 0.0) == MISSING
    assert gate.check(b"GET", own, "a", 0.0) == ALLOWED
    assert gate.check(b"GET", b"basic  " + own[6:], "a", 0.0) == ALLOWED  # (a variant: not kept)
    assert list(gate.verified) == [own]
    assert gate.check(b"GET", basic("admin", "guess").encode(), "a", 0.0) == MISSING
    assert gate.check(b"GET", basic("admin", "secret").encode(), "a", 0.1) > 0  # locked


async def test_behind_a_trusted_proxy_the_lock_keys_on_its_x_forwarded_for(public: Path) -> None:
    """Only ``X-Forwarded-For`` names the client (a ``Forwarded`` the client wrote is not read),
    and only from the trusted proxy's connections."""
    right = "Authorization: " + basic("bob", "pw")
    async with serve_site(public, auth=clear_users(bob="pw"), trusted_proxies=("127.0.0.1",)) as site:
        for n in range(_auth.FREE_FAILURES):
            answer = await exchange(
                site, get("/a-file", "X-Forwarded-For: 192.0.2.1", f"Authorization: {basic('bob', str(n))}")
            )
            assert answer.status == 401
        assert (await exchange(site, get("/a-file", "X-Forwarded-For: 192.0.2.1", right))).status == 429
        spoofed = get("/a-file", "Forwarded: for=198.51.100.7", "X-Forwarded-For: 6.6.6.6, 192.0.2.1", right)
        assert (await exchange(site, spoofed)).status == 429
        assert (await exchange(site, get("/a-file", "X-Forwarded-For: 192.0.2.2", right))).status == 200
        assert (await exchange(site, get("/a-file", right))).status == 200  # (the proxy itself)


@pytest.mark.parametrize("users", [clear_users, hashed_users], ids=["clear", "hashed"])
async def test_pipelined_guesses_meet_the_lock_and_the_right_password_does_not_pass(
    public: Path, site_kwargs: dict[str, Any], users: Any
) -> None:
    """The probe: 30 wrong guesses and the right one in one write were 30 x 401, then 200."""
    guesses = [get("/a-file", "Authorization: " + basic("bob", f"guess{n}")) for n in range(30)]
    right = get("/a-file", "Authorization: " + basic("bob", "pw"))
    async with serve_site(public, auth=users(bob="pw"), **site_kwargs) as site:
        reader, writer = await site.open()
        try:
            writer.write(b"".join(guesses) + right)
            statuses = [(await read_response(reader)).status for _ in range(31)]
        finally:
            writer.close()
    assert statuses[: _auth.FREE_FAILURES] == [401] * _auth.FREE_FAILURES
    assert set(statuses[_auth.FREE_FAILURES :]) == {429}


async def test_a_remembered_head_with_the_right_password_waits_out_the_lock(public: Path) -> None:
    """A read allowed before is memoised (the heads memo, the answers memo): replayed while its
    address is locked out, it is 429 too."""
    right = get("/a-file", "Authorization: " + basic("bob", "pw"))
    async with serve_site(public, auth=clear_users(bob="pw")) as site:
        reader, writer = await site.open()
        try:
            for _ in range(3):  # (learnt: answered from the memos from now on)
                writer.write(right)
                assert (await read_response(reader)).status == 200
            for n in range(_auth.FREE_FAILURES):
                writer.write(get("/a-file", "Authorization: " + basic("bob", f"guess{n}")))
                assert (await read_response(reader)).status == 401
            writer.write(right)
            assert (await read_response(reader)).status == 429
        finally:
            writer.close()


def test_a_flood_of_guesses_from_many_connections_is_answered_429_not_401(public: Path) -> None:
    """The probe, in its own process: connections of pipelined guesses against a hashed user
    (1,570 guesses from 10 connections were all answered 401 before); every
    guess past the free ones is 429 (none judged after the lock), and the server still answers
    (no empty reply), the right password included."""
    hashed = _auth.hash_password("pw", log_n=FAST_LOG_N)
    server = Server(str(public), "--port", "0", "--auth", f"bob:{hashed}")
    try:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        counts: dict[int, int] = {}
        for c in range(7):
            data = b"".join(
                get("/a-file", "Authorization: " + basic("bob", f"g{c}-{n}"), host="127.0.0.1")
                for n in range(150)
            )
            with socket.create_connection(("127.0.0.1", port), timeout=20) as client:
                client.sendall(data)
                got = b""
                while got.count(b"HTTP/1.1 ") < 150:
                    chunk = client.recv(65536)
                    assert chunk, "the server closed the connection"
                    got += chunk
            for found in re.findall(rb"HTTP/1\.1 (\d{3}) ", got):
                counts[int(found)] = counts.get(int(found), 0) + 1
        assert counts == {401: _auth.FREE_FAILURES, 429: 7 * 150 - _auth.FREE_FAILURES}
        code, headers, _ = server.get("/a-file", Authorization=basic("bob", "pw"))
        assert code == 429
        assert int(headers["Retry-After"]) >= 1
    finally:
        server.close()


async def test_expect_100_continue_on_a_method_not_allowed_asks_the_password_first(public: Path) -> None:
    async with serve_site(public, auth=clear_users(bob="pw"), upload=True) as site:
        expect = "Expect: 100-continue"
        answer = await exchange(site, get("/a-file", expect, "Content-Length: 5", method="DELETE"))
        assert answer.status == 401
        answer = await exchange(
            site,
            get(
                "/a-file", expect, "Content-Length: 5", "Authorization: " + basic("bob", "pw"), method="PATCH"
            ),
        )
        assert answer.status == 405
        assert b"\r\nAllow: GET,HEAD,POST,PUT\r\n" in answer.raw


# -- what uploads may not change ----------------------------------------------------------------------


@pytest.mark.parametrize("overwrite", [False, True])
async def test_an_upload_cannot_become_what_another_name_serves(public: Path, overwrite: bool) -> None:
    """The probe: PUT index.html.gz (409 for index.html itself) was 201, and from then on every
    browser asking for / with gzip got the uploaded bytes."""
    (public / "index.html").write_bytes(b"<p>the site</p>")
    async with serve_site(public, upload=True, overwrite=overwrite) as site:
        for name in ("index.html.gz", "index.html.br", "index.html.GZ"):
            assert (await exchange(site, put("/" + name, b"\x1f\x8bevil"))).status == 409
        answer = await exchange(site, form("/", {"index.html.gz": b"\x1f\x8bevil"}))
        assert answer.status == 409
        answer = await exchange(site, get("/", "Accept-Encoding: gzip, br"))
        assert answer.raw.endswith(b"<p>the site</p>")
    assert left(public) == ["a-file", "index.html", "sub"]


async def test_a_file_whose_compressed_copy_exists_is_409_or_replaces_it_whole(public: Path) -> None:
    (public / "sub" / "app.js").write_bytes(b"old();")
    (public / "sub" / "app.js.gz").write_bytes(b"\x1f\x8bold")
    (public / "sub" / "new.js.br").write_bytes(b"stale")
    async with serve_site(public, upload=True) as site:
        assert (await exchange(site, put("/sub/new.js", b"new();"))).status == 409
        assert (await exchange(site, form("/sub/", {"new.js": b"new();"}))).status == 409
    async with serve_site(public, upload=True, overwrite=True) as site:
        assert (await exchange(site, put("/sub/app.js", b"new();"))).status == 204
        assert (await exchange(site, put("/sub/new.js", b"new();"))).status == 201
        answer = await exchange(site, get("/sub/app.js", "Accept-Encoding: gzip, br"))
        assert answer.raw.endswith(b"\r\n\r\nnew();")
    assert left(public / "sub") == ["app.js", "new.js"]


@pytest.mark.parametrize("char", ["\u202e", "\u2067", "\u0085", "\u009b", "\u200b", "\ufeff", "\u2028"])
async def test_names_that_spoof_are_refused_by_put_and_forms(public: Path, char: str) -> None:
    name = f"evil{char}gnp.exe"
    assert bad_name(name)
    assert not bad_name("café ☕ 日本.txt")
    async with serve_site(public, upload=True) as site:
        assert (await exchange(site, put("/sub/" + urllib.parse.quote(name), b"x"))).status == 403
        assert (await exchange(site, form("/sub/", {name: b"x"}))).status == 403
    assert left(public / "sub") == []


async def test_a_form_cannot_make_a_well_known_directory_below_the_root(public: Path) -> None:
    async with serve_site(public, upload=True) as site:
        assert (await exchange(site, put("/sub/.well-known", b"x"))).status == 404
        assert (await exchange(site, form("/sub/", {".well-known": b"x"}))).status == 403
        assert (await exchange(site, form("/", {".hidden": b"x"}))).status == 403
    assert left(public / "sub") == []


# -- cross-site writes, rebinding, stored script ----------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        ("Origin: https://evil.example",),
        ("Origin: null",),
        ("Sec-Fetch-Site: cross-site", "Origin: https://evil.example"),
        ("Sec-Fetch-Site: same-site",),
        ("Sec-Fetch-Site: cross-site",),
        ("Origin: http://x", "Origin: https://evil.example"),
    ],
)
async def test_a_write_from_another_sites_page_is_403(
    public: Path, site_kwargs: dict[str, Any], headers: tuple[str, ...]
) -> None:
    """The probe: a form POST with ``Origin: https://evil.example`` was 303, with or without
    ``--auth`` (a browser sends cached Basic credentials with it)."""
    auth = "Authorization: " + basic("bob", "pw")
    async with serve_site(public, upload=True, auth=clear_users(bob="pw"), **site_kwargs) as site:
        assert (await exchange(site, form("/sub/", {"f": b"x"}, auth, *headers))).status == 403
        assert (await exchange(site, put("/sub/g", b"x", auth, *headers))).status == 403
        # the same from the server's own pages, and from a client that is no browser
        ok = await exchange(
            site, put("/sub/h", b"x", auth, "Origin: http://x", "Sec-Fetch-Site: same-origin")
        )
        assert ok.status == 201
        assert (await exchange(site, put("/sub/i", b"x", auth, "Origin: http://x"))).status == 201
        assert (await exchange(site, form("/sub/", {"j": b"x"}, auth))).status == 303
    assert left(public / "sub") == ["h", "i", "j"]


def test_the_rules_on_host_and_origin() -> None:
    rule = HostRule(("0.0.0.0", "files.example.org", ".lan.example"), this_machine=False)
    for ok in (
        b"127.0.0.1:8000",
        b"[::1]:8000",
        b"localhost:8000",
        b"app.localhost",
        b"files.example.org",
        b"FILES.example.org.:443",
        b"lan.example",
        b"nas.lan.example",
        b"10.0.0.5",
        None,
    ):
        assert rule.allows(ok), ok
    for bad in (b"evil.example", b"files.example.org.evil.example", b"evil-lan.example", b"", b"a b", b"x"):
        assert not rule.allows(bad), bad
    assert HostRule(("*",), this_machine=False).allows(b"anything")
    assert not HostRule(("*.", "", "*.."), this_machine=False).allows(b"evil.example")  # (no "any")
    assert same_origin(None, None, b"x")
    assert same_origin(b"http://x:8000", None, b"x:8000")
    assert same_origin(b"https://x", None, b"x:443")
    assert not same_origin(b"http://x:8001", None, b"x:8000")
    assert not same_origin(b"null", None, b"x")
    assert same_origin(b"https://evil.example", b"same-origin", b"x")  # (the browser's word first)
    assert not same_origin(None, b"same-site", b"x")
    for kind in ("text/html; charset=utf-8", "image/svg+xml", "application/atom+xml", "text/xml"):
        assert runs_script(kind)
    assert not runs_script("text/plain")


async def test_a_host_the_server_does_not_go_by_is_421(public: Path) -> None:
    async with serve_site(public, upload=True, hosts=HostRule(("127.0.0.1",), this_machine=False)) as site:
        for host in (b"evil.example", b"evil.example:%d" % site.port):
            answer = await exchange(site, b"GET /a-file HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
            assert answer.status == 421
            answer = await exchange(site, put("/sub/x", b"x", host=host.decode()))
            assert answer.status == 421
        answer = await exchange(site, b"GET /a-file HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % site.port)
        assert answer.status == 200
        answer = await exchange(site, b"GET /a-file HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert answer.status == 200
    assert left(public / "sub") == []


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_serve_answers_421_to_a_rebinding_page_unless_the_name_is_allowed(
    public: Path, loop_name: str
) -> None:
    """The probe, in its own process: on loopback without --auth, ``Host: evil.example`` was
    served, posted and PUT to (201)."""
    server = Server(str(public), "--port", "0", "--upload", "--loop", loop_name)
    try:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))

        def ask(data: bytes) -> Response:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(data)
                return SocketResponses(client).next()

        assert ask(b"GET /a-file HTTP/1.1\r\nHost: evil.example\r\n\r\n").status == 421
        assert ask(put("/sub/x", b"x", host="evil.example")).status == 421
        assert ask(b"GET /a-file HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % port).status == 200
        assert ask(b"GET /a-file HTTP/1.1\r\nHost: %s\r\n\r\n" % socket.gethostname().encode()).status == 200
    finally:
        server.close()
    assert left(public / "sub") == []
    server = Server(str(public), "--port", "0", "--allow-host", "files.example", "--loop", loop_name)
    try:
        code, _, _ = server.get("/a-file", Host="files.example")
        assert code == 200
        code, _, _ = server.get("/a-file", Host="evil.example")
        assert code == 421
    finally:
        server.close()


async def test_every_answer_says_nosniff_and_uploaded_script_runs_sandboxed(
    public: Path, site_kwargs: dict[str, Any]
) -> None:
    """The probe: an uploaded ``pwn.html`` or ``pwn.svg`` was served inline, no nosniff, no CSP."""
    async with serve_site(public, upload=True, show_index=True, **site_kwargs) as site:
        for name in ("pwn.html", "pwn.svg", "pwn.xml"):
            assert (await exchange(site, put("/sub/" + name, b"<script>alert(1)</script>"))).status == 201
        for name in ("pwn.html", "pwn.svg", "pwn.xml"):
            for _ in range(2):  # (the first sight, then from the memos)
                answer = await exchange(site, get("/sub/" + name))
                assert b"\r\nX-Content-Type-Options: nosniff\r\n" in answer.raw
                assert b"\r\nContent-Security-Policy: sandbox\r\n" in answer.raw
        answer = await exchange(site, get("/a-file"))
        assert b"\r\nX-Content-Type-Options: nosniff\r\n" in answer.raw
        assert b"Content-Security-Policy" not in answer.raw
        answer = await exchange(site, get("/nowhere"))
        assert answer.status == 404
        assert b"\r\nX-Content-Type-Options: nosniff\r\n" in answer.raw
        page = await exchange(site, get("/sub/"))
        assert b"\r\nContent-Security-Policy: default-src 'none'; script-src 'sha256-" in page.raw
        assert b"frame-ancestors 'none'" in page.raw
    async with serve_site(public, **site_kwargs) as site:  # (without --upload: no sandbox)
        answer = await exchange(site, get("/sub/pwn.html"))
        assert b"\r\nX-Content-Type-Options: nosniff\r\n" in answer.raw
        assert b"Content-Security-Policy" not in answer.raw


def test_the_listing_policy_allows_exactly_its_own_style_and_script() -> None:
    import hashlib

    from aiosendfile._static import _listing

    page = _listing.listing_html(b"/", True, [], False, upload_form=True).decode()
    policy = _listing.LISTING_POLICY[True]
    (script,) = re.findall(r"<script>(.*?)</script>", page, re.S)
    (style,) = re.findall(r"<style>(.*?)</style>", page, re.S)
    for text in (script, style):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy
    assert "unsafe-inline" not in policy
    assert "<script>" not in _listing.listing_html(b"/", True, [], False).decode()
    assert "script-src" not in _listing.LISTING_POLICY[False]


# -- where uploads land ---------------------------------------------------------------------------


async def test_a_directory_swapped_for_a_symlink_mid_body_cannot_send_a_put_out_of_the_root(
    public: Path, tmp_path: Path
) -> None:
    """The probe: ``sub`` swapped for a symlink to a directory outside the root while the body
    was in flight: 201, and the file landed there."""
    outside = tmp_path / "outside"
    outside.mkdir()
    body = os.urandom(2 * 2**20)
    async with serve_site(public, upload=True) as site:
        reader, writer = await site.open()
        try:
            whole = put("/sub/evil", body)
            writer.write(whole[: len(whole) - len(body) + 1000])
            await writer.drain()
            for _ in range(100):  # (its directory opened, its temporary file made)
                await asyncio.sleep(0.02)
                if str(public / "sub") in _open_paths():
                    break
            os.rename(public / "sub", public / "sub-old")
            os.symlink(outside, public / "sub")
            writer.write(whole[len(whole) - len(body) + 1000 :])
            answer = await read_response(reader)
        finally:
            writer.close()
    assert os.listdir(outside) == []
    if answer.status == 201:
        assert (public / "sub-old" / "evil").read_bytes() == body


async def test_a_directory_swapped_for_a_symlink_mid_form_cannot_send_a_part_out_of_the_root(
    public: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    data = form("/sub/", {"first": b"1" * 300_000, "second": b"2" * 300_000})
    cut = data.index(b'filename="second"')
    async with serve_site(public, upload=True) as site:
        reader, writer = await site.open()
        try:
            writer.write(data[:cut])
            await writer.drain()
            for _ in range(200):
                await asyncio.sleep(0.02)
                if "first" in os.listdir(public / "sub"):
                    break
            os.rename(public / "sub", public / "sub-old")
            os.symlink(outside, public / "sub")
            writer.write(data[cut:])
            answer = await read_response(reader)
        finally:
            writer.close()
    assert os.listdir(outside) == []
    assert answer.status == 303
    assert sorted(os.listdir(public / "sub-old")) == ["first", "second"]


def test_without_proc_a_name_swapped_after_its_open_is_not_believed(
    public: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(macOS/BSD: no ``/proc/self/fd``.) The realpath of the name is believed only while it
    names what was opened."""
    from aiosendfile._static import _fs

    readlink = os.readlink

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith("/proc/self/fd/"):
            raise FileNotFoundError(path)
        return readlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", no_proc)
    inside = os.open(public / "sub", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _fs.opened_inside(inside, str(public / "sub"), str(public))
    finally:
        os.close(inside)
    # opened through a symlink out of the root, then the name made a real directory again
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, public / "link")
    fd = os.open(public / "link", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.unlink(public / "link")
        os.mkdir(public / "link")
        assert not _fs.opened_inside(fd, str(public / "link"), str(public))
    finally:
        os.close(fd)


async def test_the_request_after_a_507_is_answered(small_disk: Path) -> None:
    """The probe: after a zero-copy PUT answered 507, a GET on the same connection got nothing
    until the keep-alive timeout."""
    (small_disk / "here").write_bytes(b"still here")
    async with serve_site(small_disk, upload=True) as site:
        reader, writer = await site.open()
        try:
            writer.write(put("/too-big", os.urandom(3 * 2**20)) + get("/here"))
            assert (await read_response(reader, timeout=20)).status == 507
            answer = await read_response(reader, timeout=10)
            assert answer.status == 200
            assert answer.raw.endswith(b"still here")
        finally:
            writer.close()
    assert sorted(os.listdir(small_disk)) == ["here"]


# -- the thread writer -------------------------------------------------------------------------------


def test_the_thread_writer_writes_only_to_the_socket_it_was_given(tmp_path: Path) -> None:
    from aiosendfile._asgi._thread_send import ThreadSocket, ThreadWrite

    path = tmp_path / "f"
    path.write_bytes(b"data")
    fd = os.open(path, os.O_RDONLY)
    left_sock, right_sock = socket.socketpair()
    try:
        with pytest.raises(TypeError):
            ThreadSocket(fd)  # (not a socket)
        sock = ThreadSocket(left_sock.fileno())
        sock.identity = (sock.identity[0] + 1, sock.identity[1])  # (the same inode on another device)
        write = ThreadWrite(sock)
        assert write.write(b"head", fd, 0, 4) is False
        assert not write.attempted
    finally:
        os.close(fd)
        left_sock.close()
        right_sock.close()


def test_a_thread_write_claims_the_response_until_released() -> None:
    """While a request's thread may write, uvicorn must not start another response (its 500 on
    a cancelled request would land inside the stream): the claim holds until released."""
    import weakref

    from aiosendfile._asgi._thread_send import ThreadSocket
    from aiosendfile._asgi._uvicorn import ThreadResponse, _ConnectionSocket

    class Transport:
        def is_closing(self) -> bool:
            return False

        def get_write_buffer_size(self) -> int:
            return 0

    class Cycle:
        response_started = False
        disconnected = False
        keep_alive = True

        def __init__(self) -> None:
            self.scope = {"method": "GET"}
            self.transport = Transport()

    a, b = socket.socketpair()
    try:
        cycle = Cycle()
        connection = _ConnectionSocket()
        connection.sock = ThreadSocket(a.fileno())
        response = ThreadResponse.open(weakref.ref(cycle), connection)
        assert response is not None
        assert cycle.response_started
        assert ThreadResponse.open(weakref.ref(cycle), connection) is None
        response.release()
        assert not cycle.response_started
    finally:
        a.close()
        b.close()
