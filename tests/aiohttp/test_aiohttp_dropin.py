"""FileResponse as a drop-in for aiohttp's: where it must answer as aiohttp's class does.

* A client gone before ``prepare()`` gets ``ConnectionResetError("Connection lost")``.
* Cold reads go to the cold-read pool, never the loop's default executor.
* A pre-compressed sibling that cannot be opened counts as absent (nginx's
  ``gzip_static``); without a static root a symlinked sibling does too (aiohttp).
* What aiohttp's own tests check through its internals (mocked ``Path``, ``_sendfile_fallback``,
  ``_send_headers_immediately``; ``tests/host_suites/aiohttp_suite.py`` lists them), checked
  here through the public API, against aiohttp's class where the test can run it.

Every test runs on both loops (conftest).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import os
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, ClientTimeout, web
from yarl import URL

import aiosendfile
import aiosendfile.aiohttp as sf
from aiosendfile import _options, _platform
from aiosendfile._static import _fs, _hot

from ..support.connections import Connector
from ..support.files import SlowDisk, pattern
from ..support.waiting import until_set

SMALL = 4096  # inline: leaves with the headers
BIG = 2 * 2**20 + 7  # above the inline limit: through aiosendfile.sendfile


@pytest.fixture(autouse=True)
def _fresh_hot_files() -> Any:
    _hot.hot_files.clear()
    yield
    _hot.hot_files.clear()


class Server:
    """An app served as ``web.run_app`` serves it (aiohttp's TestServer cancels handlers whose
    client left; run_app, by default, does not)."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner, self.host, self.port = runner, "127.0.0.1", port

    def make_url(self, path: str) -> URL:
        return URL(f"http://{self.host}:{self.port}{path}")


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    """Start an app (its routes added by the test)."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> Server:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return Server(runner, runner.addresses[0][1])

    yield start
    for runner in runners:
        await runner.cleanup()


async def _get(server: Server, path: str, **headers: str) -> tuple[int, Any, bytes]:
    # The timeout only turns a hang into a failure; nothing here is timed.
    async with (
        ClientSession(timeout=ClientTimeout(total=60), auto_decompress=False) as session,
        session.get(server.make_url(path), headers=headers) as resp,
    ):
        return resp.status, resp.headers, await resp.read()


# -- a client gone before prepare() ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "headers", "kwargs", "compress"),
    [
        ("small.txt", {}, {}, False),  # a hot file: from memory
        ("small.txt", {}, {"hot_cache": False}, False),  # read and written with the headers
        ("big.bin", {}, {}, False),  # zero-copy
        ("big.bin", {"Range": "bytes=10-99,1000-1999"}, {}, False),  # multipart
        ("big.bin", {}, {}, True),  # through aiohttp's writer, which compresses
    ],
    ids=["hot", "inline", "sendfile", "multipart", "compressed"],
)
async def test_client_gone_before_prepare_is_connection_lost(
    tmp_path: Path, serve: Any, name: str, headers: dict[str, str], kwargs: dict[str, Any], compress: bool
) -> None:
    """The client disconnects while the handler works, before it prepares the FileResponse:
    prepare() raises ConnectionResetError("Connection lost"), as aiohttp's FileResponse does,
    whatever path the body would have taken. (aiohttp does not cancel handlers on disconnect.)"""
    (tmp_path / "small.txt").write_bytes(pattern(SMALL))
    (tmp_path / "big.bin").write_bytes(pattern(BIG))
    if kwargs.get("hot_cache", True):
        _hot.hot_files.put(
            str(tmp_path / name),
            None,
            _hot.identity(os.stat(tmp_path / name)),
            (tmp_path / name).read_bytes(),
        )
    arrived = asyncio.Event()
    outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.StreamResponse:
        arrived.set()
        deadline = time.monotonic() + 30
        while request.transport is not None:  # until aiohttp has seen the connection go
            assert time.monotonic() < deadline, "the server never saw the client go"
            await asyncio.sleep(0.01)
        response = sf.FileResponse(tmp_path / name, **kwargs)
        if compress:
            response.enable_compression()
        try:
            await response.prepare(request)
        except BaseException as exc:
            outcome.set_result(exc)
            raise
        outcome.set_result(None)
        return response

    app = web.Application()
    app.router.add_get("/{name}", handler)
    server = await serve(app)
    _, writer = await asyncio.open_connection(server.host, server.port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"GET /{name} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n{extra}\r\n".encode())
    await arrived.wait()
    writer.transport.abort()
    error = await asyncio.wait_for(outcome, 60)  # a hang guard, not a timed assert
    assert type(error) is ConnectionResetError, repr(error)
    assert str(error) == "Connection lost"


# -- cold reads in the cold-read pool ---------------------------------------------------------


@pytest.fixture
async def blocked_default_executor() -> AsyncIterator[None]:
    """The loop's default executor, with its one thread held: anything run there never runs."""
    release = threading.Event()
    executor = ThreadPoolExecutor(1)
    executor.submit(release.wait)
    asyncio.get_running_loop().set_default_executor(executor)
    yield
    release.set()
    executor.shutdown(wait=True)


@pytest.fixture
def cold_disk(monkeypatch: pytest.MonkeyPatch) -> SlowDisk:
    """Every page is cold (the cache probe never reads), and the cold-read pool is a slow disk."""
    monkeypatch.setattr(_platform, "pread_cached", lambda fd, size, offset: None)
    pool = SlowDisk(2, 0.02)
    monkeypatch.setattr(_options._cold_pool, "pool", pool)  # what default_cold_executor() hands out
    yield pool
    pool.shutdown(wait=True)


@pytest.mark.parametrize(
    ("name", "headers", "compress"),
    [
        ("small.txt", {}, False),  # read whole, written with the headers
        ("big.bin", {"Range": "bytes=1000-50999"}, False),  # an inline range of a big file
        ("big.bin", {"Range": "bytes=0-9,2000-2999"}, False),  # multipart, inline parts
        ("small.txt", {}, True),  # through aiohttp's writer (compression)
        ("mid.bin", {}, True),  # the same, in several chunks
    ],
    ids=["small", "range", "multipart", "compressed-small", "compressed-chunks"],
)
async def test_cold_reads_never_use_the_default_executor(
    tmp_path: Path,
    serve: Any,
    blocked_default_executor: None,
    cold_disk: SlowDisk,
    name: str,
    headers: dict[str, str],
    compress: bool,
) -> None:
    """A cold file is read in the cold-read pool: with the loop's default executor stuck
    (as when other run_in_executor users fill it), it is still served, byte-exact.

    (aiohttp compresses chunks over 4 KiB in the default executor itself: the compressed
    cases are read in 4 KiB chunks, so only our reads are under test.)"""
    sizes = {"small.txt": SMALL, "mid.bin": 10 * 4096 + 5, "big.bin": BIG}
    for file, size in sizes.items():
        (tmp_path / file).write_bytes(pattern(size))

    @web.middleware
    async def compression(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        response.enable_compression()
        return response

    async def direct(request: web.Request) -> web.StreamResponse:
        return sf.FileResponse(tmp_path / request.match_info["name"], chunk_size=4096)

    app = web.Application(middlewares=[compression] if compress else [])
    app.add_routes([sf.static("/static", tmp_path)])
    app.router.add_get("/direct/{name}", direct)
    server = await serve(app)
    url = f"/direct/{name}" if compress else f"/static/{name}"
    async with (
        ClientSession(timeout=ClientTimeout(total=60)) as session,  # decompresses for us
        session.get(server.make_url(url), headers=headers) as resp,
    ):
        body = await resp.read()
        status = resp.status
    data = pattern(sizes[name])
    if "Range" not in headers:
        assert (status, body) == (200, data)
    elif "," not in headers["Range"]:
        assert (status, body) == (206, data[1000:51000])
    else:
        assert status == 206
        assert data[0:10] in body
        assert data[2000:3000] in body
    assert cold_disk.started.is_set()  # the reads went to the cold-read pool


@pytest.mark.parametrize("kind", ["tls"])
async def test_cold_fallback_reads_use_the_cold_pool(
    tmp_path: Path, connect: Connector, blocked_default_executor: None, cold_disk: SlowDisk
) -> None:
    """The userspace fallback (a file sent over TLS) reads cold chunks through the same
    helper, in the same pool."""
    path = tmp_path / "big.bin"
    path.write_bytes(pattern(BIG))
    conn = await connect()
    with open(path, "rb") as f:
        sending = asyncio.ensure_future(aiosendfile.sendfile(conn.writer, f))
        got = await conn.read_exactly(BIG)
        assert await sending == BIG
    assert got == pattern(BIG)
    assert cold_disk.started.is_set()


# -- pre-compressed siblings that cannot be opened --------------------------------------------


def _unreadable_as_for_a_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``os.open`` and ``os.stat`` refuse with EACCES as the kernel does for a user without
    CAP_DAC_OVERRIDE: opening a file or directory whose mode grants no read bit, or reaching
    anything through a directory whose mode grants no search bit. Tests run as root, which the
    kernel lets read anything; the chmod itself is real, and decides."""
    if os.geteuid() != 0:
        return  # the kernel refuses by itself
    real_open, real_stat = os.open, os.stat

    def refused(path: Any) -> PermissionError:
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))

    def unsearchable_on_the_way(path: Any) -> bool:
        for parent in Path(os.path.abspath(path)).parents:
            with contextlib.suppress(OSError):
                if not real_stat(parent).st_mode & 0o111:
                    return True
        return False

    def open_as_a_user(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if kwargs.get("dir_fd") is None and not isinstance(path, int):
            if unsearchable_on_the_way(path):
                raise refused(path)
            try:
                mode = real_stat(path).st_mode
            except OSError:
                mode = 0o644
            if (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) and not mode & 0o444:
                raise refused(path)
        return real_open(path, flags, *args, **kwargs)

    def stat_as_a_user(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if kwargs.get("dir_fd") is None and not isinstance(path, int) and unsearchable_on_the_way(path):
            raise refused(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_as_a_user)
    monkeypatch.setattr(os, "stat", stat_as_a_user)


def _tree(root: Path) -> None:
    for name, size in (("c.txt", SMALL), ("big.txt", BIG)):
        (root / name).write_bytes(pattern(size))
        (root / f"{name}.gz").write_bytes(gzip.compress(b"the compressed variant"))


@pytest.mark.parametrize("name", ["c.txt", "big.txt"])
@pytest.mark.parametrize("route", ["static-hot", "static-cold", "direct"])
async def test_unreadable_sibling_falls_back_to_the_file(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch, name: str, route: str
) -> None:
    """``c.txt.gz`` chmod 000: ``GET /c.txt`` with ``Accept-Encoding: gzip`` serves c.txt
    (200, no Content-Encoding, still ``Vary``), as nginx's gzip_static does; it was a 403.
    Through the static handler (hot cache on and off) and a handler's own FileResponse; small
    (inline or hot) and big (zero-copy) files."""
    _tree(tmp_path)
    app = web.Application()
    app.add_routes([sf.static("/static", tmp_path, hot_cache=route == "static-hot")])

    async def direct(request: web.Request) -> web.StreamResponse:
        return sf.FileResponse(tmp_path / request.match_info["name"])

    app.router.add_get("/direct/{name}", direct)
    server = await serve(app)
    url = f"/direct/{name}" if route == "direct" else f"/static/{name}"
    status, headers, body = await _get(server, url, **{"Accept-Encoding": "gzip"})
    assert (status, headers.get("Content-Encoding")) == (200, "gzip")  # readable: served
    plain = await _get(server, url, **{"Accept-Encoding": "identity"})  # now hot, if small and on
    assert plain[2] == (tmp_path / name).read_bytes()

    os.chmod(tmp_path / f"{name}.gz", 0)
    _unreadable_as_for_a_user(monkeypatch)
    for _ in range(2):  # and again, on the same path
        status, headers, body = await _get(server, url, **{"Accept-Encoding": "gzip"})
        assert status == 200
        assert "Content-Encoding" not in headers
        assert body == (tmp_path / name).read_bytes()
        assert "Accept-Encoding" in headers.getall("Vary", [])


@pytest.mark.parametrize("kind", ["directory", "fifo", "dangling", "socket"])
@pytest.mark.parametrize("route", ["static", "direct"])
async def test_sibling_that_is_not_a_file_is_absent(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch, kind: str, route: str
) -> None:
    """A sibling that is a directory, FIFO, socket or dangling symlink counts as absent, also
    when it was a file at the lookup and is something else at the open (a race)."""
    (tmp_path / "c.txt").write_bytes(pattern(SMALL))
    sibling = tmp_path / "c.txt.gz"
    holder = None
    if kind == "directory":
        sibling.mkdir()
    elif kind == "fifo":
        os.mkfifo(sibling)
    elif kind == "dangling":
        sibling.symlink_to(tmp_path / "missing")
    else:
        holder = socket.socket(socket.AF_UNIX)
        holder.bind(str(sibling))
    app = web.Application()
    app.add_routes([sf.static("/static", tmp_path)])

    async def direct(request: web.Request) -> web.StreamResponse:
        return sf.FileResponse(tmp_path / "c.txt")

    app.router.add_get("/direct", direct)
    server = await serve(app)
    url = "/direct" if route == "direct" else "/static/c.txt"
    try:
        for race in (False, True):
            if race:  # the lookup saw a regular file; by the open it is not one
                monkeypatch.setattr(_fs, "_is_file", lambda path: True)
            status, headers, body = await _get(server, url, **{"Accept-Encoding": "gzip"})
            assert (status, body) == (200, pattern(SMALL)), race
            assert "Content-Encoding" not in headers
    finally:
        if holder is not None:
            holder.close()


async def test_symlinked_sibling_without_a_root_is_absent(tmp_path: Path, serve: Any) -> None:
    """``FileResponse(path)`` in a handler has no root to contain a sibling: a symlinked
    ``.gz`` (pointing anywhere) is not served, as aiohttp's class ignores it; a symlinked file
    named by the handler itself is served. With a static root, containment decides."""
    (tmp_path / "www").mkdir()
    (tmp_path / "private.txt").write_bytes(gzip.compress(b"private"))
    (tmp_path / "www" / "c.txt").write_bytes(b"public")
    (tmp_path / "www" / "c.txt.gz").symlink_to(tmp_path / "private.txt")
    (tmp_path / "www" / "link.txt").symlink_to(tmp_path / "www" / "c.txt")

    async def direct(request: web.Request) -> web.StreamResponse:
        return sf.FileResponse(tmp_path / "www" / request.match_info["name"])

    app = web.Application()
    app.router.add_get("/direct/{name}", direct)
    server = await serve(app)
    status, headers, body = await _get(server, "/direct/c.txt", **{"Accept-Encoding": "gzip"})
    assert (status, body) == (200, b"public")
    assert "Content-Encoding" not in headers
    assert (await _get(server, "/direct/link.txt"))[::2] == (200, b"public")


async def test_socket_file_is_forbidden(tmp_path: Path, serve: Any) -> None:
    """A socket is a special file: 403, as a FIFO or a device (its open fails with ENXIO)."""
    holder = socket.socket(socket.AF_UNIX)
    holder.bind(str(tmp_path / "s.sock"))
    os.mkfifo(tmp_path / "fifo")
    app = web.Application()
    app.add_routes([sf.static("/static", tmp_path)])
    server = await serve(app)
    try:
        assert (await _get(server, "/static/s.sock"))[0] == 403
        assert (await _get(server, "/static/fifo"))[0] == 403
    finally:
        holder.close()


# -- the cold-read helper, cancelled ------------------------------------------------------------


@pytest.mark.parametrize("stage", ["running", "queued"])
async def test_cancelled_cold_read_leaves_no_thread_on_the_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """A read a thread already runs is waited for before the cancellation goes on (the caller
    closes the fd next, and the number may be reused at once); a read still queued is dropped."""
    from aiosendfile._coldread import read_range

    path = tmp_path / "f.bin"
    path.write_bytes(pattern(SMALL))
    monkeypatch.setattr(_platform, "pread_cached", lambda fd, size, offset: None)  # always cold
    reads: list[str] = []
    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        reads.append("started")
        data = real_pread(fd, size, offset)
        reads.append("finished")
        return data

    monkeypatch.setattr(os, "pread", pread)
    release = threading.Event()
    with SlowDisk(1, 0.2, slow=lambda fn: fn is pread) as pool:
        if stage == "queued":
            pool.submit(release.wait)  # the pool's one thread is busy
        with open(path, "rb") as f:
            task = asyncio.ensure_future(read_range(f.fileno(), SMALL, 0, pool))
            if stage == "running":
                await until_set(pool.started)
            else:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert reads == (["started", "finished"] if stage == "running" else [])
        release.set()
    assert reads == (["started", "finished"] if stage == "running" else [])  # never ran later


# -- the status the handler asked for ----------------------------------------------------------


@pytest.mark.parametrize("response_class", [web.FileResponse, sf.FileResponse], ids=["aiohttp", "ours"])
@pytest.mark.parametrize("name", ["small.txt", "big.bin"])
async def test_the_callers_status_answers_a_whole_file(
    tmp_path: Path, serve: Any, response_class: type, name: str
) -> None:
    """``FileResponse(path, status=203)``: the whole file is answered with 203, as aiohttp's
    class answers it; a range still gets 206 and a matching ``If-None-Match`` 304."""
    body = pattern(SMALL if name == "small.txt" else BIG)
    (tmp_path / name).write_bytes(body)

    async def handler(request: web.Request) -> web.StreamResponse:
        return response_class(tmp_path / name, status=203)

    app = web.Application()
    app.router.add_get("/f", handler)
    server = await serve(app)
    status, headers, got = await _get(server, "/f")
    assert (status, got) == (203, body)
    status, _, got = await _get(server, "/f", Range="bytes=0-9")
    assert (status, got) == (206, body[:10])
    status, _, got = await _get(server, "/f", **{"If-None-Match": headers["ETag"]})
    assert (status, got) == (304, b"")


# -- what aiohttp's tests check through its internals, through the public API ----------------
# (aiohttp_suite.INTERNALS names each of aiohttp's tests and the test here that stands for it.)

BOTH_CLASSES = pytest.mark.parametrize(
    "response_class", [web.FileResponse, sf.FileResponse], ids=["aiohttp", "ours"]
)


@BOTH_CLASSES
@pytest.mark.parametrize("accept", ["GZip", None])
@pytest.mark.parametrize("sibling", [True, False], ids=["gz", "no-gz"])
async def test_a_handlers_file_response_picks_the_gz_sibling_by_accept_encoding(
    tmp_path: Path, serve: Any, response_class: type, accept: str | None, sibling: bool
) -> None:
    """``logo.png.gz`` is sent (``Content-Encoding: gzip``) only when it exists and the request
    accepts gzip (a header's case does not matter); otherwise ``logo.png`` itself."""
    (tmp_path / "logo.png").write_bytes(b"the plain file")
    compressed = gzip.compress(b"the plain file")
    if sibling:
        (tmp_path / "logo.png.gz").write_bytes(compressed)

    async def handler(request: web.Request) -> web.StreamResponse:
        return response_class(tmp_path / "logo.png")

    app = web.Application()
    app.router.add_get("/logo.png", handler)
    server = await serve(app)
    headers = {"Accept-Encoding": accept} if accept else {"Accept-Encoding": "identity"}
    status, got_headers, body = await _get(server, "/logo.png", **headers)
    if sibling and accept:
        assert (status, got_headers.get("Content-Encoding"), body) == (200, "gzip", compressed)
    else:
        assert (status, got_headers.get("Content-Encoding"), body) == (200, None, b"the plain file")


@pytest.mark.parametrize("name", ["small.txt", "big.bin"])
async def test_the_headers_are_out_when_prepare_returns(tmp_path: Path, serve: Any, name: str) -> None:
    """A handler that prepares a ``FileResponse`` and then waits: its client has the headers
    (and here the whole body) while the handler still runs, as with any ``StreamResponse``; the
    handler then returns it, prepared, as a ``StreamResponse`` is returned. (aiohttp 3.14.5's own
    class prepares again there, opening the file anew and leaking its descriptor.)"""
    body = pattern(SMALL if name == "small.txt" else BIG)
    (tmp_path / name).write_bytes(body)
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        response = sf.FileResponse(tmp_path / name)
        await response.prepare(request)
        await release.wait()
        return response

    app = web.Application()
    app.router.add_get("/f", handler)
    server = await serve(app)
    try:
        async with (
            ClientSession(timeout=ClientTimeout(total=60)) as session,
            session.get(server.make_url("/f")) as resp,
        ):
            assert resp.status == 200
            assert await resp.read() == body
            assert not release.is_set()
    finally:
        release.set()


@BOTH_CLASSES
@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest.mark.parametrize(("header", "span"), [("bytes=0-99", (0, 100)), ("bytes=10-109", (10, 110))])
async def test_a_range_shorter_than_a_chunk_sends_exactly_its_bytes(
    tmp_path: Path,
    response_class: type,
    tls: bool,
    header: str,
    span: tuple[int, int],
    tls_server_ctx: Any,
    tls_client_ctx: Any,
) -> None:
    """``chunk_size=64`` and a 100-byte range of a 150-byte file, through the copy path (TLS, and
    ours with ``inline_limit=0``) and zero-copy: the range's bytes, not a chunk more."""
    data = b"A" * 100 + b"B" * 50
    (tmp_path / "f.bin").write_bytes(data)
    extra = {"inline_limit": 0, "hot_cache": False} if response_class is sf.FileResponse else {}

    async def handler(request: web.Request) -> web.StreamResponse:
        return response_class(tmp_path / "f.bin", chunk_size=64, **extra)

    app = web.Application()
    app.router.add_get("/f", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls_server_ctx if tls else None)
        await site.start()
        url = f"{'https' if tls else 'http'}://127.0.0.1:{runner.addresses[0][1]}/f"
        async with (
            ClientSession(timeout=ClientTimeout(total=60)) as session,
            session.get(url, headers={"Range": header}, ssl=tls_client_ctx if tls else False) as resp,
        ):
            start, stop = span
            assert resp.status == 206
            assert resp.headers["Content-Range"] == f"bytes {start}-{stop - 1}/150"
            assert await resp.read() == data[start:stop]
    finally:
        await runner.cleanup()


async def test_what_the_server_may_not_read_is_forbidden(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file without read permission, a directory without read permission (with listings on)
    and anything under a directory without search permission: 403, as aiohttp answers; what
    the server may read beside them is served, and listed."""
    (tmp_path / "my_readable.txt").write_text("info")
    (tmp_path / "my_file.txt").write_text("secret")
    (tmp_path / "my_file.txt").chmod(0o200)
    (tmp_path / "my_dir").mkdir()
    (tmp_path / "my_dir" / "inside.txt").write_text("inside")
    (tmp_path / "my_dir").chmod(0o300)  # no read: cannot be listed
    (tmp_path / "my_tunnel").mkdir()
    (tmp_path / "my_tunnel" / "inside.txt").write_text("inside")
    (tmp_path / "my_tunnel").chmod(0o600)  # no search: nothing under it can be reached
    _unreadable_as_for_a_user(monkeypatch)
    app = web.Application()
    sf.add_static(app.router, "/", tmp_path, show_index=True)
    server = await serve(app)
    try:
        assert (await _get(server, "/my_readable.txt"))[::2] == (200, b"info")
        assert (await _get(server, "/my_file.txt"))[0] == 403
        assert (await _get(server, "/my_dir/"))[0] == 403
        assert (await _get(server, "/my_tunnel/inside.txt"))[0] == 403
        status, _, page = await _get(server, "/")
        assert status == 200
        assert b"my_readable.txt" in page
    finally:
        for name in ("my_dir", "my_tunnel"):
            (tmp_path / name).chmod(0o700)


@pytest.mark.parametrize("accept", [None, "identity", "gzip", "forced"])
async def test_compression_enabled_ignores_a_range_only_when_it_compresses(
    tmp_path: Path, serve: Any, accept: str | None
) -> None:
    """``enable_compression()`` compresses only for a client that accepts a coding (or one forced):
    a range is ignored for such a body alone, as docs/aiohttp.md says. A client that accepts none
    got the whole file, not its range (a review: a resumed download started again from byte 0),
    where stock aiohttp answers 206."""
    from aiohttp.web import ContentCoding

    data = pattern(300_000)
    (tmp_path / "f.bin").write_bytes(data)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = sf.FileResponse(tmp_path / "f.bin")
        response.enable_compression(ContentCoding.gzip if accept == "forced" else None)
        return response

    app = web.Application()
    app.router.add_get("/f", handler)
    server = await serve(app)
    headers = {"Range": "bytes=100-199"}
    if accept not in (None, "forced"):
        headers["Accept-Encoding"] = accept
    async with (
        ClientSession(auto_decompress=False, skip_auto_headers=("Accept-Encoding",)) as session,
        session.get(server.make_url("/f"), headers=headers) as resp,
    ):
        body = await resp.read()
        if accept in ("gzip", "forced"):
            assert resp.status == 200
            assert gzip.decompress(body) == data
        else:
            assert (resp.status, body) == (206, data[100:200])
