"""The native ``serve`` engine over HTTP: the plugin's tables, then HTTP/1.1 as the RFCs and nginx do it.

The engine runs in the test's loop (both loops, over TCP and TLS; a Unix socket where it
matters), mounted at "/" as ``serve`` mounts it. The first half runs the plugin's tables and
checks (tests/support/static_cases.py, which tests/aiohttp/test_aiohttp_plugin.py runs too: full files,
HEAD, content types, conditional requests, single and multiple ranges, If-Range, pre-compressed
siblings, hostile paths, symlinks, directories) on the plugin's own fixture tree, with an
aiohttp client; ``make_door`` makes this module's door. The second half is the protocol's own:
keep-alive, pipelining, HTTP/1.0, ``Connection: close``, 405 with ``Allow``, ``Expect:
100-continue``, a body on ``GET``, absolute-form targets, decoding once, the query, limits
(400/414/431 then close), the header and keep-alive timeouts, ``Date``; written raw on a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import os
import random
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from aiosendfile import _platform

from ..support import raw_http
from ..support.files import pattern
from ..support.raw_http import Blob, Response, parse_response, read_response, split_responses, without_date
from ..support.serve import ServeSite, serve_site
from ..support.static_cases import BIG, SMALL, DoorClient, StaticCases, build_tree, door_session

pytest.importorskip("aiosendfile._serve._server")


@dataclass
class Client(DoorClient):
    """A native site and an aiohttp session to it (no decompression, no redirects)."""

    site: ServeSite
    session: ClientSession
    mount: str = ""  # serve mounts at "/"

    @property
    def root(self) -> Path:
        return self.site.public

    @property
    def tls(self) -> bool:
        return self.site.tls

    def url(self, path: str) -> str:
        return self.site.url(path)

    async def fetch(self, data: bytes) -> Response:
        return await self.site.fetch(data)


@pytest.fixture(params=[False, True], ids=["tcp", "tls"])
async def make_door(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
) -> AsyncIterator[Callable[..., Any]]:
    """``await make_door(**config)``: the plugin's tree served by the engine (config → ``ServeConfig``)."""
    tls: bool = request.param
    build_tree(tmp_path)
    async with contextlib.AsyncExitStack() as stack:

        async def make(**config: Any) -> Client:
            s = await stack.enter_async_context(
                serve_site(
                    tmp_path / "public",
                    server_ctx=tls_server_ctx if tls else None,
                    client_ctx=tls_client_ctx,
                    **config,
                )
            )
            session = door_session(tls_client_ctx if tls else None)
            stack.push_async_callback(session.close)
            return Client(s, session)

        yield make


# -- the plugin's tables (tests/support/static_cases.py) -------------------------------------------------


class TestStaticCases(StaticCases):
    """Full files, HEAD, content types, conditional requests, ranges, If-Range, pre-compressed
    siblings, path safety, directories and symlinks, through ``make_door`` (mounted at /)."""

    def check_a_304(self, headers: Any) -> None:
        assert "Content-Length" not in headers


# -- directories and symlinks ------------------------------------------------------------------------


async def test_the_url_cannot_climb_out_even_following_symlinks(make_door: Any) -> None:
    s = await make_door(follow_symlinks=True)
    assert (await s.raw("/../secret.txt"))[0] in (400, 404)


async def test_a_directory_redirect_keeps_the_query(make_door: Any) -> None:
    status, headers, _ = await (await make_door()).get("/dir?x=1&y=2")
    assert (status, headers["Location"].rsplit("/", 2)[-2:]) == (301, ["dir", "?x=1&y=2"])


async def test_fifo_and_missing_are_404_not_a_hang(make_door: Any) -> None:
    s = await make_door()
    assert (await s.get("/fifo"))[0] in (403, 404)
    assert (await s.get("/small.txt"))[2] == pattern(SMALL)


# -- HTTP/1.1: connections ---------------------------------------------------------------------------------


def req(target: bytes, *headers: bytes, method: bytes = b"GET", version: bytes = b"HTTP/1.1") -> bytes:
    return (
        method
        + b" "
        + target
        + b" "
        + version
        + b"\r\nHost: localhost\r\n"
        + b"".join(h + b"\r\n" for h in headers)
        + b"\r\n"
    )


async def read_to_eof(reader: asyncio.StreamReader, timeout: float = 20) -> bytes:
    """Everything until the connection ends (EOF or reset); TimeoutError if it has not in *timeout*."""
    return await asyncio.wait_for(raw_http.read_to_eof(reader), timeout)


async def closed(reader: asyncio.StreamReader, timeout: float = 20) -> bool:
    """The server closed the connection (EOF or reset) within *timeout*, and sent nothing more."""
    return await read_to_eof(reader, timeout) == b""  # it returns once the connection ended


async def test_keep_alive_answers_many_requests_on_one_connection(make_door: Any) -> None:
    s = await make_door()
    reader, writer = await s.site.open()
    try:
        for name, data in [("small.txt", pattern(SMALL)), ("big.bin", pattern(BIG))] * 3:
            writer.write(req(f"/{name}".encode()))
            r = await read_response(reader)
            assert (r.status, Blob(r.body)) == (200, Blob(data))
            assert r.header("connection") in (None, "keep-alive")
        writer.write(req(b"/small.txt", b"Connection: close"))
        r = await read_response(reader)
        assert (r.status, r.header("connection")) == (200, "close")
        assert await closed(reader)
    finally:
        writer.close()


PIPELINE: list[tuple[bytes, bytes]] = [  # (method, request)
    (b"GET", req(b"/small.txt")),
    (b"GET", req(b"/big.bin")),  # sendfile between two inline answers
    (b"HEAD", req(b"/big.bin", method=b"HEAD")),
    (b"GET", req(b"/missing")),
    (b"GET", req(b"/big.bin", b"Range: bytes=0-9,100-199")),
    (b"GET", req(b"/dir")),
    (b"POST", req(b"/small.txt", b"Content-Length: 3", method=b"POST") + b"abc"),
    (b"GET", req(b"/doc.txt", b"Accept-Encoding: gzip")),
    (b"GET", req(b"/big.bin", b"Range: bytes=5-")),
    (b"GET", req(b"/small.txt", b"Connection: close")),
]


def _boundaryless(r: Response) -> bytes:
    raw = r.raw
    ctype = r.header("content-type") or ""
    if "boundary=" in ctype:
        raw = raw.replace(ctype.split("boundary=", 1)[1].encode(), b"BOUNDARY")
    return without_date(raw)


async def test_pipelined_requests_are_answered_in_order_byte_exact(make_door: Any) -> None:
    """All in one write (and one byte at a time) vs one by one: the same bytes, in order."""
    s = await make_door()
    one_by_one = []
    reader, writer = await s.site.open()
    for method, data in PIPELINE:
        writer.write(data)
        one_by_one.append(await read_response(reader, method))
    assert await closed(reader)
    writer.close()
    methods = [m for m, _ in PIPELINE]
    for how in ("one write", "byte by byte"):
        reader, writer = await s.site.open()
        stream = b"".join(d for _, d in PIPELINE)
        if how == "one write":
            writer.write(stream)
        else:
            for i in range(len(stream)):
                writer.write(stream[i : i + 1])
                if i % 50 == 0:
                    await writer.drain()
        got = await read_to_eof(reader)
        writer.close()
        answers, rest = split_responses(got, methods)
        assert rest == b"", (how, rest[:200])
        assert [Blob(_boundaryless(a)) for a in answers] == [Blob(_boundaryless(a)) for a in one_by_one], how
    statuses = [a.status for a in one_by_one]
    assert statuses == [200, 200, 200, 404, 206, 301, 405, 200, 206, 200]


async def test_http10_closes_unless_keep_alive_is_asked(make_door: Any) -> None:
    s = await make_door()
    reader, writer = await s.site.open()
    writer.write(req(b"/small.txt", version=b"HTTP/1.0"))
    got = await read_to_eof(reader)
    writer.close()
    r = parse_response(got)
    assert (r.status, r.body) == (200, pattern(SMALL))
    assert got.startswith(b"HTTP/1.")
    assert int(r.header("content-length") or -1) == SMALL
    reader, writer = await s.site.open()
    try:
        for _ in range(2):
            writer.write(req(b"/small.txt", b"Connection: keep-alive", version=b"HTTP/1.0"))
            r = await read_response(reader)
            assert (r.status, r.body) == (200, pattern(SMALL))
            assert (r.header("connection") or "").lower() == "keep-alive"
    finally:
        writer.close()


@pytest.mark.parametrize("method", [b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"])
async def test_other_methods_are_405_with_allow(make_door: Any, method: bytes) -> None:
    s = await make_door()
    r = await s.site.fetch(req(b"/small.txt", b"Content-Length: 0", b"Connection: close", method=method))
    assert r.status == 405
    assert (r.header("allow") or "").replace(" ", "") == "GET,HEAD"
    assert r.body == b"405: Method Not Allowed"


async def test_expect_100_continue(make_door: Any) -> None:
    """A 100 first and then the answer, or the answer at once; the body never becomes a request."""
    s = await make_door()
    reader, writer = await s.site.open()
    try:
        writer.write(req(b"/small.txt", b"Expect: 100-continue", b"Content-Length: 5"))
        first = await read_response(reader)
        if first.raw.startswith(b"HTTP/1.1 100"):
            writer.write(b"hello")
            first = await read_response(reader)
        else:
            writer.write(b"hello")
        r = first
        assert (r.status, r.body) == (200, pattern(SMALL))
        writer.write(req(b"/small.txt", b"Connection: close"))
        rest = await read_to_eof(reader)
        if rest:  # or the server closed after an unread body: also correct
            r = parse_response(rest)
            assert (r.status, r.body) == (200, pattern(SMALL))
    finally:
        writer.close()


@pytest.mark.parametrize(
    "body",
    [b"Content-Length: 11\r\n\r\nGET / HTTP/", b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
    ids=["length", "chunked"],
)
async def test_a_body_on_get_is_read_and_discarded(make_door: Any, body: bytes) -> None:
    s = await make_door()
    reader, writer = await s.site.open()
    try:
        writer.write(
            b"GET /small.txt HTTP/1.1\r\nHost: x\r\n" + body + req(b"/big.bin", b"Connection: close")
        )
        got = await read_to_eof(reader)
        answers, rest = split_responses(got, [b"GET", b"GET"])
        assert rest == b""
        first = answers[0]
        assert (first.status, first.body) == (200, pattern(SMALL))
        if len(answers) == 2:  # the body was read and discarded (not closing is also allowed)
            second = answers[1]
            assert (second.status, Blob(second.body)) == (200, Blob(pattern(BIG)))
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"http://localhost/small.txt", pattern(SMALL)),  # absolute-form
        (b"http://localhost:1/small.txt?q=1", pattern(SMALL)),
        (b"/small.txt?x=../../secret.txt", pattern(SMALL)),  # the query is not the path
        (b"/space%20name.txt", b"spaced"),  # decoded once ...
        (b"/%252e%252e", b"literal percent name"),  # ... and only once
        (b"/%73mall.txt", pattern(SMALL)),
    ],
)
async def test_targets_decode_once_and_ignore_the_query(
    make_door: Any, target: bytes, expected: bytes
) -> None:
    s = await make_door()
    r = await s.site.fetch(req(target, b"Connection: close"))
    assert (r.status, r.body) == (200, expected)


@pytest.mark.parametrize(
    ("request_", "statuses"),
    [
        (b"GARBAGE\r\n\r\n", (400,)),
        (b"GET /small.txt HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", (400,)),
        (b"GET /small.txt HTTP/9.9\r\nHost: x\r\n\r\n", (505,)),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", (414,)),
        (b"GET /small.txt HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", (431,)),
        (b"GET /small.txt HTTP/1.1\r\nHost: x\r\n" + b"X-Many: a\r\n" * 10_000 + b"\r\n", (431,)),
        (b"GET /small.txt HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", (400,)),
        (b"GET /small.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", (400,)),
    ],
    ids=[
        "garbage",
        "bad-header",
        "version",
        "long-url",
        "big-header",
        "many-headers",
        "neg-length",
        "two-lengths",
    ],
)
async def test_malformed_requests_get_their_status_then_close(
    make_door: Any, request_: bytes, statuses: tuple[int, ...]
) -> None:
    """400, 414, 431: one answer, then the connection ends; a pipelined request after it is never answered."""
    s = await make_door()
    reader, writer = await s.site.open()
    try:
        writer.write(request_ + req(b"/small.txt"))
        got = await read_to_eof(reader)
    finally:
        writer.close()
    answers, rest = split_responses(got, [b"GET", b"GET"])
    assert len(answers) == 1, got[:500]
    assert rest == b"", rest[:200]
    r = answers[0]
    assert r.status in statuses, r.raw[:300]
    assert (r.header("connection") or "close").lower() == "close"
    assert (await s.get("/small.txt"))[2] == pattern(SMALL)  # the server is fine


async def test_date_header(make_door: Any) -> None:
    s = await make_door()
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    for path in ("/small.txt", "/big.bin", "/missing"):
        _, headers, _ = await s.get(path)
        date = email.utils.parsedate_to_datetime(headers["Date"])
        assert headers["Date"].endswith(" GMT"), headers["Date"]
        assert date >= before - datetime.timedelta(seconds=1), (path, headers["Date"])
        assert len(headers.getall("Date")) == 1


# -- timeouts --------------------------------------------------------------------------------------------


async def test_a_request_head_that_never_ends_is_closed_at_the_header_timeout(make_door: Any) -> None:
    """A head that never ends, and a connection that never sends a byte: both closed (408 or not)."""
    s = await make_door(header_timeout=0.5)
    slow, silent = await s.site.open(), await s.site.open()
    try:
        slow[1].write(b"GET /small.txt HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        got = await asyncio.gather(read_to_eof(slow[0]), read_to_eof(silent[0]))
        for answer in got:
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
    finally:
        slow[1].close()
        silent[1].close()


async def test_an_idle_keep_alive_connection_is_closed_at_the_keepalive_timeout(make_door: Any) -> None:
    s = await make_door(keepalive_timeout=0.5)
    reader, writer = await s.site.open()
    try:
        writer.write(req(b"/small.txt"))
        r = await read_response(reader)
        assert (r.status, r.body) == (200, pattern(SMALL))
        assert await closed(reader, timeout=20)
    finally:
        writer.close()


async def test_a_slow_but_steady_client_is_not_cut_while_it_downloads(make_door: Any) -> None:
    """The header timeout covers the request head only: a long download outlives it."""
    s = await make_door(header_timeout=0.3, keepalive_timeout=0.3)
    reader, writer = await s.site.open()
    try:
        writer.write(req(b"/big.bin"))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        got = b""
        while len(got) < BIG:
            got += await reader.read(256 * 1024)
            await asyncio.sleep(0.05)  # ~0.6 s in all: past both timeouts
        assert Blob(got) == Blob(pattern(BIG))
    finally:
        writer.close()


# -- a Unix socket ------------------------------------------------------------------------------------------


async def test_over_a_unix_socket(tmp_path: Path) -> None:
    build_tree(tmp_path)
    async with serve_site(tmp_path / "public", unix_path=str(tmp_path / "s.sock")) as s:
        reader, writer = await s.open()
        try:
            for name, data in [("big.bin", pattern(BIG)), ("small.txt", pattern(SMALL))]:
                writer.write(req(f"/{name}".encode()))
                r = await read_response(reader)
                assert (r.status, Blob(r.body)) == (200, Blob(data))
        finally:
            writer.close()
        assert _platform.counters.bytes == BIG


# -- the hot cache and the engine's memo of hot answers ---------------------------------------------------


async def test_hot_file_changed_in_place_is_seen_at_once(make_door: Any) -> None:
    """Same size, mtime put back: ctime still changes, so the memoised answer is not served again."""
    s = await make_door()
    path = s.root / "small.txt"
    for _ in range(3):  # hot, then memoised
        assert (await s.get("/small.txt"))[2] == pattern(SMALL)
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(b"X" * 10)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (await s.get("/small.txt"))[2] == b"X" * 10 + pattern(SMALL)[10:]


async def test_hot_file_replaced_by_rename_or_symlink(make_door: Any) -> None:
    s = await make_door()
    pub = s.root
    for _ in range(3):
        assert (await s.get("/small.txt"))[2] == pattern(SMALL)
    (pub / "new.txt").write_bytes(b"N" * SMALL)
    os.replace(pub / "new.txt", pub / "small.txt")
    assert (await s.get("/small.txt"))[2] == b"N" * SMALL
    assert (await s.get("/small.txt"))[2] == b"N" * SMALL
    # Swapped for a symlink out of the root: never served, though its answer was memoised.
    (pub / "small.txt").unlink()
    (pub / "small.txt").symlink_to(pub.parent / "secret.txt")
    for _ in range(2):
        status, _, body = await s.get("/small.txt")
        assert status == 404
        assert b"SECRET" not in body
    (pub / "small.txt").unlink()
    assert (await s.get("/small.txt"))[0] == 404
    # A directory swapped in under a hot file's name: its 301, not the old bytes.
    (pub / "small.txt").mkdir()
    assert (await s.get("/small.txt"))[0] == 301


async def test_memoised_answer_keeps_head_and_conditionals_right(make_door: Any) -> None:
    s = await make_door()
    for _ in range(3):
        status, headers, body = await s.get("/small.txt")
    assert (status, body) == (200, pattern(SMALL))
    status, head_headers, body = await s.get("/small.txt", method="HEAD")
    assert (status, body, head_headers["Content-Length"]) == (200, b"", str(SMALL))
    assert (await s.get("/small.txt", **{"If-None-Match": headers["ETag"]}))[:3:2] == (304, b"")
    assert (await s.get("/small.txt", Range="bytes=0-0"))[::2] == (206, pattern(SMALL)[:1])
    # Two spellings of one file: each answered right.
    assert (await s.get("/%73mall.txt"))[::2] == (200, pattern(SMALL))
    assert (await s.get("/./small.txt"))[::2] == (200, pattern(SMALL))


async def test_pipelined_requests_for_paths_never_seen_keep_their_order(make_door: Any) -> None:
    """Paths seen for the first time are decided off the loop (the cold pool); pipelined between
    paths answered inline, every answer still comes in request order."""
    s = await make_door()
    fresh = s.root / "fresh"
    fresh.mkdir()
    sizes = [0, 1, 700, 4096, 65_536, 65_537, 200_000, 10, 1_000_003, 3]
    for i, size in enumerate(sizes):
        (fresh / f"f{i}.bin").write_bytes(pattern(size, seed=i))
    await s.get("/small.txt")  # /small.txt is now hot and recent: answered inline
    methods, stream, expected = [], b"", []
    for i, size in enumerate(sizes):
        method = b"HEAD" if i == 7 else b"GET"
        for target, body, status in (
            (f"/fresh/f{i}.bin".encode(), pattern(size, seed=i), 200),
            (b"/small.txt", pattern(SMALL), 200),
            (f"/fresh/nope{i}".encode(), None, 404),
        ):
            methods.append(method)
            stream += req(target, method=method)
            expected.append((status, None if body is None else Blob(b"" if method == b"HEAD" else body)))
    stream += req(b"/small.txt", b"Connection: close")
    methods.append(b"GET")
    expected.append((200, Blob(pattern(SMALL))))
    reader, writer = await s.site.open()
    writer.write(stream)
    got = await read_to_eof(reader)
    writer.close()
    answers, rest = split_responses(got, methods)
    assert rest == b""
    seen = [(r.status, None if r.status == 404 else Blob(r.body)) for r in answers]
    assert seen == expected


async def test_a_fragment_in_the_target_is_not_part_of_the_path(make_door: Any) -> None:
    """A client should not send a fragment; one that does means the path before it (nginx: 200)."""
    s = await make_door()
    r = await s.site.fetch(req(b"/small.txt#frag", b"Connection: close"))
    assert (r.status, r.body) == (200, pattern(SMALL))


@pytest.mark.parametrize(
    "head",
    [b"GET /small.txt HTTP/1.1\r\n", b"GET /small.txt HTTP/1.1\r\nHost: a\r\nHost: b\r\n"],
    ids=["no-host", "two-hosts"],
)
async def test_a_http11_request_needs_exactly_one_host(make_door: Any, head: bytes) -> None:
    """RFC 9112 §3.2: 400 to an HTTP/1.1 request without Host or with more than one (nginx does)."""
    s = await make_door()
    r = await s.site.fetch(head + b"Connection: close\r\n\r\n")
    assert r.status == 400
    ok = await s.site.fetch(b"GET /small.txt HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs no Host
    assert (ok.status, ok.body) == (200, pattern(SMALL))


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_pipelines_of_the_golden_requests_are_answered_as_one_at_a_time(
    tmp_path: Path, seed: int, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """Random runs of the golden requests (keep-alive: cold first sights, hot memo, file bodies,
    errors, redirects, refused methods) pipelined in one write (TLS for one seed) while every path
    is new, then sent one at a time on another connection: the same answers (but Date, boundaries)."""
    from ..support.static_requests import build_tree as golden_tree
    from ..support.static_requests import requests as golden_requests

    public = golden_tree(tmp_path)
    rng = random.Random(seed)
    table = [raw.replace(b"Connection: close\r\n", b"") for _, raw in golden_requests("default", b"")]
    picked = [rng.choice(table) for _ in range(60)] + [req(b"/a.txt", b"Connection: close")]
    methods = [raw.split(b" ", 1)[0] for raw in picked]
    tls = seed % 2 == 0
    async with serve_site(
        public, server_ctx=tls_server_ctx if tls else None, client_ctx=tls_client_ctx
    ) as site:
        reader, writer = await site.open()  # first: every path a first sight (the cold pool)
        writer.write(b"".join(picked))
        got = await read_to_eof(reader)
        writer.close()
        reader, writer = await site.open()
        reference = []
        for method, raw in zip(methods, picked, strict=True):
            writer.write(raw)
            reference.append(await read_response(reader, method))
        writer.close()
    answers, rest = split_responses(got, methods)
    assert rest == b""
    assert [Blob(_boundaryless(a)) for a in answers] == [Blob(_boundaryless(a)) for a in reference]
