"""Our uvicorn httptools protocol's ``aiosendfile.thread_write``: a request's thread writes a file
response (head and file) on the connection, the loop completes the cycle.

uvicorn runs in the test's loop (both loops; TCP, Unix socket, TLS where nothing is offered) with
an app that writes from a thread (``asyncio.to_thread``), and raw clients. The head is the one
``cycle.send`` writes for the same message; what the socket does not take, the loop sends; a file
that ends early aborts the connection; a client gone costs nothing; keep-alive, ``Connection:
close`` and the access log line as uvicorn's. The Django handler on top: ``test_django``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trustme

from aiosendfile import _platform
from aiosendfile._asgi._thread_send import THREAD_WRITE, ThreadSocket, ThreadWrite
from aiosendfile.uvicorn import HttpToolsProtocol

from ..support.files import pattern
from ..support.raw_http import read_response, read_to_eof
from ..support.uvicorn_inproc import request, serve
from ..support.waiting import until

PATHSEND = "http.response.pathsend"
MIB = 2**20
Hook = Callable[[], Awaitable[object]]


class Files:
    """The app's files by name, and what each request's thread write came to."""

    def __init__(self, root: Path, sizes: dict[str, int]) -> None:
        self.paths = {}
        for name, size in sizes.items():
            self.paths[name] = root / name
            self.paths[name].write_bytes(pattern(size, seed=size))
        self.outcomes: list[tuple[bool, bool] | None] = []


def app_for(files: Files, *, extra: int = 0, before_write: Hook | None = None) -> Any:
    """``/thread?NAME``: the file written from a thread (announcing *extra* bytes more than it
    has), sent by the loop where the thread wrote nothing; ``/loop?NAME``: the same response sent
    by ``cycle.send`` and pathsend."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = files.paths[scope["query_string"].decode()]
        count = path.stat().st_size + extra
        headers = [(b"content-type", b"application/octet-stream"), (b"Content-Length", str(count).encode())]
        offer = scope["extensions"].get(THREAD_WRITE)
        writer = offer["open"]() if offer and scope["path"] == "/thread" else None
        if scope["path"] == "/thread" and writer is None:
            files.outcomes.append(None)
        if writer is not None:
            if before_write is not None:
                await before_write()
            fd = os.open(path, os.O_RDONLY)
            try:
                wrote = await asyncio.to_thread(writer.write, 200, headers, fd, 0, count)
                files.outcomes.append((wrote, writer.complete))
                if wrote:
                    await writer.finish()
                    return
            finally:
                os.close(fd)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": PATHSEND, "path": str(path)})

    return app


def without_date(head: bytes) -> bytes:
    return b"\r\n".join(line for line in head.split(b"\r\n") if not line.startswith(b"date:"))


async def test_the_thread_writes_what_the_loop_would_and_keeps_the_connection(
    kind: str, tmp_path: Path, tls_ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    sizes = {"empty": 0, "one": 1, "big": 3 * MIB + 17}
    files = Files(tmp_path, sizes)
    async with serve(app_for(files), HttpToolsProtocol, kind, tmp_path, tls_ca) as site:
        reader, writer = await site.open()
        for done, name in enumerate(sizes, 1):
            writer.write(request(b"/loop?" + name.encode()))
            by_loop = await read_response(reader)
            _platform.counters.reset()
            writer.write(request(b"/thread?" + name.encode()))
            by_thread = await read_response(reader)
            assert by_thread.body == files.paths[name].read_bytes()
            assert without_date(by_thread.head) == without_date(by_loop.head)
            # (the client may have the bytes before the thread has counted them)
            await until(lambda done=done: len(files.outcomes) == done)
            if kind != "tls":
                assert _platform.counters.bytes == sizes[name]  # (zero-copy, from the thread)
        writer.close()
    if kind == "tls":
        assert files.outcomes == [None] * 3  # (TLS: the loop encrypts; nothing is offered)
    else:  # (3 MiB may be more than a Unix socket takes at once: the loop sends the rest)
        assert files.outcomes[:2] == [(True, True)] * 2
        assert files.outcomes[2] in ((True, True), (True, False))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_what_the_socket_does_not_take_the_loop_sends(tmp_path: Path) -> None:
    """A client that reads nothing until the thread is done: the thread writes what the socket
    takes, the loop the rest (then the next request on the connection)."""
    files = Files(tmp_path, {"huge": 48 * MIB + 5, "one": 1})
    async with serve(app_for(files), HttpToolsProtocol, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/thread?huge") + request(b"/thread?one"))
        await until(lambda: len(files.outcomes) == 1)
        first = await read_response(reader)
        assert first.body == files.paths["huge"].read_bytes()
        assert (await read_response(reader)).body == files.paths["one"].read_bytes()
        writer.close()
    assert files.outcomes[0] == (True, False)
    assert files.outcomes[1] == (True, True)


async def test_a_file_that_ends_early_aborts_the_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Announced 100 bytes more than the file has: the thread's sendfile meets the end, the loop
    aborts the connection (never a short body that looks complete) with uvicorn's one line."""
    files = Files(tmp_path, {"short": MIB})
    async with serve(app_for(files, extra=100), HttpToolsProtocol, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/thread?short"))
        got = await read_to_eof(reader)
        writer.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"content-length: %d" % (MIB + 100) in head
    assert body == files.paths["short"].read_bytes()
    assert files.outcomes == [(True, False)]
    assert any("File body cut short" in r.getMessage() for r in caplog.records)


async def test_a_client_gone_before_the_thread_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The client resets the connection after the write was opened, before the thread writes:
    the thread's write fails (or finds the descriptor gone), the loop gives the connection up
    quietly, and the server serves the next client."""
    files = Files(tmp_path, {"big": 8 * MIB})
    gone = asyncio.Event()
    async with serve(app_for(files, before_write=gone.wait), HttpToolsProtocol, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.write(request(b"/thread?big"))
        await until(lambda: site.server.server_state.tasks)
        writer.close()  # (a reset: SO_LINGER 0)
        await asyncio.sleep(0.05)
        gone.set()
        await until(lambda: files.outcomes)
        reader, writer = await site.open()
        writer.write(request(b"/thread?big"))
        assert (await read_response(reader)).body == files.paths["big"].read_bytes()
        writer.close()
    assert files.outcomes[0] is None or not files.outcomes[0][1]
    second = files.outcomes[1]
    assert second is not None
    assert second[0] is True
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("extra", "method"),
    [
        pytest.param(b"", b"HEAD", id="HEAD"),
        pytest.param(b"Connection: close\r\n", b"GET", id="connection-close"),
    ],
)
async def test_head_and_connection_close_as_uvicorn(tmp_path: Path, extra: bytes, method: bytes) -> None:
    """``HEAD`` is not offered (the loop sends the head alone); a request asking to close gets
    ``connection: close`` in the thread's head and the connection closed after."""
    files = Files(tmp_path, {"one": 1})
    async with serve(app_for(files), HttpToolsProtocol, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/thread?one", method, extra))
        reply = await read_response(reader, method)
        if method == b"HEAD":
            assert files.outcomes == [None]
            assert reply.headers["content-length"] == "1"
            writer.close()
        else:
            await until(lambda: files.outcomes)  # (the client may have the bytes first)
            assert files.outcomes == [(True, True)]
            assert reply.headers["connection"] == "close"
            assert reply.body == files.paths["one"].read_bytes()
            assert await reader.read() == b""  # (closed by the server)
            writer.close()


async def test_the_access_log_line_is_uvicorns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = Files(tmp_path, {"one": 1})
    caplog.set_level(logging.INFO, "uvicorn.access")
    async with serve(app_for(files), HttpToolsProtocol, "tcp", tmp_path, access_log=True) as site:
        reader, writer = await site.open()
        for route in (b"/loop?one", b"/thread?one"):
            writer.write(request(route))
            await read_response(reader)
        writer.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert len(lines) == 2
    assert lines[1] == lines[0].replace("/loop", "/thread")


async def test_headers_uvicorn_would_treat_otherwise_are_left_to_the_loop(tmp_path: Path) -> None:
    """A ``Connection`` or ``Transfer-Encoding`` field, a length that is not the count, a field
    uvicorn refuses: the thread writes nothing (False), the loop sends as ``cycle.send`` does."""
    files = Files(tmp_path, {"one": 1})
    refused: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        fd = os.open(files.paths["one"], os.O_RDONLY)
        try:
            for headers in (
                [(b"content-length", b"1"), (b"connection", b"keep-alive")],
                [(b"content-length", b"1"), (b"transfer-encoding", b"chunked")],
                [(b"content-length", b"2")],
                [],
                [(b"content-length", b"1"), (b"x-bad", b"a\nb")],
                [(b"content-length", b"1"), (b"bad name", b"x")],
            ):
                writer = scope["extensions"][THREAD_WRITE]["open"]()
                refused.append(await asyncio.to_thread(writer.write, 200, headers, fd, 0, 1))
                writer.release()  # (nothing written: the response is the loop's again)
        finally:
            os.close(fd)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
        await send({"type": "http.response.body", "body": b"x"})

    async with serve(app, HttpToolsProtocol, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/"))
        assert (await read_response(reader)).body == b"x"
        writer.close()
    assert refused == [False] * 6


def test_a_descriptor_that_is_no_longer_the_connections_gets_nothing(tmp_path: Path) -> None:
    """The thread checks that its duplicate is the connection's socket (its inode, taken on the
    loop's thread): a descriptor closed and reused meanwhile is written nothing."""
    left, right = socket.socketpair()
    other, peer = socket.socketpair()
    path = tmp_path / "f"
    path.write_bytes(b"data")
    fd = os.open(path, os.O_RDONLY)
    try:
        sock = ThreadSocket(left.fileno())
        os.dup2(other.fileno(), left.fileno())  # (the number now names another socket)
        write = ThreadWrite(sock)
        assert write.write(b"head", fd, 0, 4) is False
        assert not write.attempted
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(10)
    finally:
        os.close(fd)
        for s in (left, right, other, peer):
            s.close()
