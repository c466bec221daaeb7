"""The aiohttp plugin: FileResponse and static(), on both loops, over TCP and TLS.

HTTP semantics (validators, conditional requests, ranges, multipart, HEAD,
pre-compressed variants), path safety, and zero-copy under both loops. The cases the native
engine answers alike (tests/serve/test_serve_http.py) are tables and checks in
tests/support/static_cases.py: this module's door is ``make_door`` (the plugin mounted at /static).
"""

from __future__ import annotations

import asyncio
import io
import os
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, TCPConnector, web
from aiohttp.test_utils import TestServer
from yarl import URL

import aiosendfile.aiohttp as sf

from ..support.fds import open_fds
from ..support.files import SlowDisk, pattern
from ..support.raw_http import Response, parse_response, raw_async
from ..support.static_cases import BIG, SMALL, DoorClient, StaticCases, build_tree, door_session
from ..support.waiting import until_set


@dataclass
class Site(DoorClient):
    """The plugin mounted at /static (and FileResponse at /direct/{name}) in an Application."""

    root: Path
    server: TestServer
    session: ClientSession
    ctx: ssl.SSLContext | None  # the client's, over TLS
    mount: str = "/static"

    @property
    def tls(self) -> bool:
        return self.ctx is not None

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def fetch(self, data: bytes) -> Response:
        assert self.server.port is not None  # started
        return parse_response(await raw_async(self.server.host, self.server.port, data, self.ctx))


@pytest.fixture(params=[False, True], ids=["tcp", "tls"])
async def make_door(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
) -> AsyncIterator[Callable[..., Any]]:
    tls: bool = request.param
    build_tree(tmp_path)
    opened: list[Site] = []

    async def make(**static_kwargs: Any) -> Site:
        app = web.Application()
        app.add_routes([sf.static("/static", tmp_path / "public", **static_kwargs)])

        async def direct(request: web.Request) -> web.StreamResponse:
            return sf.FileResponse(tmp_path / "public" / request.match_info["name"])

        app.router.add_get("/direct/{name}", direct)
        server = TestServer(app, scheme="https" if tls else "http")
        await server.start_server(ssl=tls_server_ctx if tls else None)
        ctx = tls_client_ctx if tls else None
        made = Site(tmp_path / "public", server, door_session(ctx), ctx)
        opened.append(made)
        return made

    yield make
    for s in opened:
        await s.session.close()
        await s.server.close()


# -- the cases both doors answer alike (tables and tests: tests/support/static_cases.py) -------------


class TestStaticCases(StaticCases):
    """Full files, HEAD, content types, conditional requests, ranges, If-Range, pre-compressed
    siblings, path safety, directories and symlinks, through ``make_door`` (mounted at /static)."""


async def test_direct_file_response(make_door: Any) -> None:
    s = await make_door()
    status, _, body = await s.get("/direct/big.bin")
    assert (status, body) == (200, pattern(BIG))
    assert (await s.get("/direct/missing"))[0] == 404


async def test_no_vary_when_precompressed_is_off(make_door: Any) -> None:
    """Vary whenever pre-compressed variants are on (as nginx's gzip_vary), none when off."""
    off = await make_door(precompressed=False)
    status, headers, body = await off.get("/static/doc.txt", **{"Accept-Encoding": "gzip"})
    assert (status, body) == (200, (off.root / "doc.txt").read_bytes())
    assert "Vary" not in headers
    assert "Content-Encoding" not in headers


async def test_a_target_outside_the_mount_never_escapes(make_door: Any) -> None:
    s = await make_door()
    status, raw = await s.raw("/../secret.txt")
    assert status in (400, 403, 404), status
    assert b"TOP SECRET" not in raw


# -- directories and symlinks ------------------------------------------------------------------------


async def test_the_url_cannot_climb_out_even_following_symlinks(make_door: Any) -> None:
    s = await make_door(follow_symlinks=True)
    assert (await s.raw("/static/../secret.txt"))[0] == 404


async def test_a_directory_redirect_keeps_the_query(make_door: Any) -> None:
    status, headers, _ = await (await make_door()).get("/static/dir?x=1&y=2")
    assert (status, headers["Location"].split("/static/", 1)[1]) == (301, "dir/?x=1&y=2")


async def test_append_version(make_door: Any) -> None:
    s = await make_door(append_version=True)
    resource = next(r for r in s.server.app.router.resources() if isinstance(r, sf.StaticResource))
    url = resource.url_for(filename="small.txt")
    assert url.query.get("v")
    status, _, body = await s.get(str(url))
    assert (status, body) == (200, pattern(SMALL))


async def test_compression_middleware_is_honoured(
    tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """A middleware that enables compression gets a correctly compressed, framed body."""
    build_tree(tmp_path)

    @web.middleware
    async def compress(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        response.enable_compression()
        return response

    app = web.Application(middlewares=[compress])
    app.add_routes([sf.static("/static", tmp_path / "public")])
    server = TestServer(app)
    await server.start_server()
    try:
        async with ClientSession() as session:  # decompresses for us
            for name in ("big.bin", "small.txt", "doc.txt"):
                async with session.get(server.make_url(f"/static/{name}")) as resp:
                    assert resp.status == 200
                    assert await resp.read() == (tmp_path / "public" / name).read_bytes(), name
            # The .gz sibling is already compressed: served as is, not compressed twice.
            async with session.get(
                server.make_url("/static/doc.txt"), headers={"Accept-Encoding": "gzip"}
            ) as resp:
                assert resp.headers["Content-Encoding"] == "gzip"
                assert await resp.read() == (tmp_path / "public" / "doc.txt").read_bytes()
    finally:
        await server.close()


async def test_save_upload(
    tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """Content-Length and chunked bodies land byte-exact; too large is 413; both loops, TCP and TLS."""
    results: dict[str, Any] = {}

    async def upload(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            n = await sf.save_upload(request, tmp_path / name, max_size=8 * 2**20)
        except web.HTTPRequestEntityTooLarge:
            raise
        results[name] = n
        return web.Response(text=str(n))

    app = web.Application()
    app.router.add_put("/up/{name}", upload)
    for tls in (False, True):
        server = TestServer(app, scheme="https" if tls else "http")
        await server.start_server(ssl=tls_server_ctx if tls else None)
        try:
            async with ClientSession(connector=TCPConnector(ssl=tls_client_ctx if tls else False)) as session:
                body = pattern(5 * 2**20 + 1, seed=8)
                async with session.put(server.make_url("/up/fixed"), data=io.BytesIO(body)) as resp:
                    assert (resp.status, await resp.text()) == (200, str(len(body)))
                assert (tmp_path / "fixed").read_bytes() == body

                async def chunks(body: bytes = body) -> Any:
                    for i in range(0, len(body), 300_000):
                        yield body[i : i + 300_000]

                async with session.put(server.make_url("/up/chunked"), data=chunks()) as resp:
                    assert resp.status == 200
                assert (tmp_path / "chunked").read_bytes() == body
                async with session.put(
                    server.make_url("/up/big"), data=io.BytesIO(b"x" * (9 * 2**20))
                ) as resp:
                    assert resp.status == 413
                assert not (tmp_path / "big").exists()
        finally:
            await server.close()


# -- the hot small-file cache ---------------------------------------------------------------


@pytest.fixture
def fresh_hot_files() -> Any:
    from aiosendfile._static import _hot

    _hot.hot_files.clear()
    yield _hot.hot_files
    _hot.hot_files.clear()


async def test_hot_file_is_served_without_opening_it(
    make_door: Any, fresh_hot_files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await make_door()
    assert (await s.get("/static/small.txt"))[2] == pattern(SMALL)
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    status, headers, body = await s.get("/static/small.txt")
    assert (status, body) == (200, pattern(SMALL))
    assert headers["ETag"]
    assert headers["Last-Modified"]
    assert headers["Content-Length"] == str(SMALL)
    assert not [p for p in opened if p.endswith("small.txt")]
    # Ranges and conditionals are answered from the cached bytes too.
    status, headers, body = await s.get("/static/small.txt", Range="bytes=10-19")
    assert (status, body, headers["Content-Range"]) == (206, pattern(SMALL)[10:20], f"bytes 10-19/{SMALL}")
    status, _, body = await s.get("/static/small.txt", **{"If-None-Match": headers["ETag"]})
    assert (status, body) == (304, b"")
    assert not [p for p in opened if p.endswith("small.txt")]


async def test_hot_file_changed_in_place_is_seen_at_once(make_door: Any, fresh_hot_files: Any) -> None:
    """Same size, mtime put back: ctime still changes, so the new bytes are served."""
    s = await make_door()
    path = s.root / "small.txt"
    assert (await s.get("/static/small.txt"))[2] == pattern(SMALL)
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(b"X" * 10)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (await s.get("/static/small.txt"))[2] == b"X" * 10 + pattern(SMALL)[10:]


async def test_hot_file_replaced_by_rename_or_symlink(make_door: Any, fresh_hot_files: Any) -> None:
    s = await make_door()
    pub = s.root
    assert (await s.get("/static/small.txt"))[2] == pattern(SMALL)
    (pub / "new.txt").write_bytes(b"N" * SMALL)
    os.replace(pub / "new.txt", pub / "small.txt")
    assert (await s.get("/static/small.txt"))[2] == b"N" * SMALL
    # Swapped for a symlink pointing out of the root: never served, though it was cached.
    (pub / "small.txt").unlink()
    (pub / "small.txt").symlink_to(pub.parent / "secret.txt")
    status, _, body = await s.get("/static/small.txt")
    assert status == 404
    assert b"SECRET" not in body
    (pub / "small.txt").unlink()
    assert (await s.get("/static/small.txt"))[0] == 404


async def test_hot_cache_can_be_turned_off(make_door: Any, fresh_hot_files: Any) -> None:
    s = await make_door(hot_cache=False)
    assert (await s.get("/static/small.txt"))[2] == pattern(SMALL)
    assert fresh_hot_files._entries == {}


async def test_hot_plain_requests_answer_as_fileresponse_does(
    make_door: Any, fresh_hot_files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The static handler's hot path (aiohttp's plain Response from the cached bytes) gives the
    same status, headers (all but Date) and body as FileResponse, and is taken only for plain
    GET/HEAD of a hot file."""
    from aiosendfile._aiohttp import _static

    hot, cold = await make_door(), await make_door(hot_cache=False)
    full: list[str] = []
    real = _static.StaticResource._file_response

    def counting(self: Any, path: str, *hints: Any) -> Any:
        full.append(os.path.basename(path))
        return real(self, path, *hints)

    monkeypatch.setattr(_static.StaticResource, "_file_response", counting)
    cases: list[tuple[str, str, dict[str, str], bool]] = [  # method, name, headers, takes the hot path
        ("GET", "small.txt", {}, True),
        ("HEAD", "small.txt", {}, True),
        ("GET", "empty.txt", {}, False),  # empty files are not cached
        ("GET", "archive.tar.gz", {}, True),
        ("GET", "page.html", {"Accept-Encoding": "identity"}, True),
        # Its .gz is a symlink out of the root: only the full path sees it as absent.
        ("GET", "page.html", {"Accept-Encoding": "gzip, br"}, False),
        ("GET", "doc.txt", {"Accept-Encoding": "identity"}, True),
        ("GET", "doc.txt", {"Accept-Encoding": "gzip"}, False),  # a sibling to serve
        ("GET", "small.txt", {"Range": "bytes=1-5"}, False),
        ("GET", "small.txt", {"If-None-Match": "*"}, False),
        ("GET", "small.txt", {"If-Modified-Since": "Sun, 06 Nov 1994 08:49:37 GMT"}, False),
        ("GET", "big.bin", {}, False),  # above the inline limit: never cached
    ]
    for method, name, headers, fast in cases:
        await hot.get(f"/static/{name}", method, **headers)  # fills the cache
        full.clear()
        answers = []
        for s in (hot, cold):
            status, got, body = await s.get(f"/static/{name}", method, **headers)
            answers.append((status, sorted((k, v) for k, v in got.items() if k != "Date"), body))
        assert answers[0] == answers[1], (method, name, headers)
        assert full.count(name) == (1 if fast else 2), (method, name, headers)  # cold: always the full path
    assert answers[0][0] == 200


async def test_siblings_are_looked_up_once_per_request(
    make_door: Any, fresh_hot_files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hot file whose accepted .gz sibling exists: the hot path's lookup of the siblings is
    handed to the full path, not repeated (one stat per admitted encoding)."""
    from aiosendfile._static import _fs

    s = await make_door()
    await s.get("/static/doc.txt", **{"Accept-Encoding": "identity"})  # doc.txt is now hot
    looked_up: list[str] = []
    real = _fs._is_file

    def counting(path: str) -> bool:
        looked_up.append(path)
        return real(path)

    monkeypatch.setattr(_fs, "_is_file", counting)
    status, headers, body = await s.get("/static/doc.txt", **{"Accept-Encoding": "gzip"})
    assert (status, headers["Content-Encoding"]) == (200, "gzip")
    assert body == (s.root / "doc.txt.gz").read_bytes()
    assert [os.path.basename(p) for p in looked_up] == ["doc.txt.gz"]


def test_hot_files_are_bounded() -> None:
    from aiosendfile._static._hot import ENTRY_OVERHEAD, HotFiles

    def st(size: int, ino: int) -> Any:
        return os.stat_result((0o100644, ino, 1, 1, 0, 0, size, 0, 0, 0))

    from aiosendfile._static._hot import identity as _identity

    cache = HotFiles(max_entries=2, max_bytes=16 * 100)
    cache.put("/a", None, _identity(st(10, 1)), b"a" * 10)
    cache.put("/b", None, _identity(st(10, 2)), b"b" * 10)
    assert cache.get("/a", None, st(10, 1)) == b"a" * 10  # /a is now the most recent
    cache.put("/c", None, _identity(st(10, 3)), b"c" * 10)
    assert cache.get("/b", None, st(10, 2)) is None  # the least recently used went out
    assert cache.get("/a", None, st(10, 1)) == b"a" * 10
    assert cache.get("/a", "/root", st(10, 1)) is None  # checked under another root: not the same entry
    assert cache.get("/a", None, st(10, 9)) is None  # another inode: dropped
    assert cache.get("/a", None, st(10, 1)) is None
    cache.put("/big", None, _identity(st(101, 4)), b"x" * 101)  # over max_bytes / 16: never kept
    assert cache.get("/big", None, st(101, 4)) is None
    cache.put("/short", None, _identity(st(10, 5)), b"x" * 9)  # bytes that do not match the stat: never kept
    assert cache.get("/short", None, st(9, 5)) is None
    assert cache._bytes == sum(len(e.body) + len(e.path) + ENTRY_OVERHEAD for e in cache._entries.values())


# -- StaticResource.handle: the same answers without an Application (on aiohttp's web.Server) ----


async def test_low_level_handle_answers_as_the_application_does(tmp_path: Path) -> None:
    """``StaticResource.handle`` on aiohttp's ``web.Server``: same statuses,
    headers that matter and bodies as the resource mounted in an ``Application``, for files,
    directories, ranges, conditionals, bad methods, ``Expect`` and hostile spellings."""
    from aiohttp.test_utils import RawTestServer

    from aiosendfile._aiohttp._static import StaticResource

    build_tree(tmp_path)
    app = web.Application()
    app.add_routes([sf.static("/", tmp_path / "public")])
    mounted = TestServer(app)
    bare = RawTestServer(StaticResource("", tmp_path / "public").handle)  # "/" as the router spells it
    await mounted.start_server()
    await bare.start_server()
    cases: list[tuple[str, str, dict[str, str]]] = [
        ("GET", "/small.txt", {}),
        ("HEAD", "/big.bin", {}),
        ("GET", "/big.bin", {"Range": "bytes=5-99,-7"}),
        ("GET", "/small.txt", {"Range": "bytes=9999999-"}),
        ("GET", "/doc.txt", {"Accept-Encoding": "gzip"}),
        ("GET", "/small.txt", {"If-None-Match": "*"}),
        ("GET", "/small.txt", {"Expect": "100-continue"}),
        ("POST", "/small.txt", {}),
        ("DELETE", "/nothing-here", {}),
        ("GET", "/missing", {}),
        ("GET", "/dir", {}),
        ("GET", "/dir/", {}),
        ("GET", "/noindex/", {}),
        ("GET", "/escape", {}),
        ("GET", "/outdir/secret.txt", {}),
        ("GET", "/space%20name.txt", {}),
        ("GET", "/%2e%2e/secret.txt", {}),
        ("GET", "/%252e%252e", {}),
        ("GET", "/..%2fsecret.txt", {}),
        ("GET", "//etc/passwd", {}),
        ("GET", "/a/../../secret.txt", {}),
        ("GET", "/fifo", {}),
    ]
    try:
        async with ClientSession(auto_decompress=False) as session:
            for method, target, headers in cases:
                answers = []
                for server in (mounted, bare):
                    url = URL(str(server.make_url("/"))).with_path(target, encoded=True)
                    async with session.request(method, url, headers=headers, allow_redirects=False) as resp:
                        body = await resp.read()
                        kept = {
                            k: resp.headers.get(k)
                            for k in ("Allow", "Location", "Content-Range", "Content-Length", "ETag", "Vary")
                        }
                        if resp.content_type.startswith("multipart/"):  # random boundaries differ
                            boundary = resp.headers["Content-Type"].partition("boundary=")[2]
                            body = body.replace(boundary.encode(), b"BOUNDARY")
                        answers.append((resp.status, kept, body if resp.status < 300 else b""))
                assert answers[0] == answers[1], (method, target, headers)
                assert answers[0][0] != 500, (method, target)
    finally:
        await bare.close()
        await mounted.close()


@pytest.mark.parametrize("stage", ["open", "write"])
async def test_save_upload_cancelled_while_a_thread_works(tmp_path: Path, stage: str) -> None:
    """Cancelled while the pool opens the file or writes a chunk: the thread's work finishes
    first, the file is closed (no fd leaks), and it holds exactly the chunks written."""

    class Body:
        def __init__(self) -> None:
            self.chunks = [b"a" * 1000, b"b" * 1000]

        async def readany(self) -> bytes:
            if self.chunks:
                return self.chunks.pop(0)
            await asyncio.sleep(3600)  # the client goes quiet
            return b""

    class Request:
        content_length = None
        content = Body()

    before = open_fds()
    slow = (lambda fn: True) if stage == "open" else (lambda fn: fn.__name__ == "write")
    with SlowDisk(2, 0.3, slow) as pool:
        task = asyncio.create_task(sf.save_upload(Request(), tmp_path / "up.bin", executor=pool))  # type: ignore[arg-type]
        await until_set(pool.started)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert open_fds() == before
    assert (tmp_path / "up.bin").read_bytes() == (b"" if stage == "open" else b"a" * 1000)
