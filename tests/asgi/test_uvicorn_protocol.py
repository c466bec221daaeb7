"""``aiosendfile.uvicorn``: uvicorn's two HTTP protocols carrying out pathsend/zerocopysend.

uvicorn runs in the test's loop (both loops, TCP, Unix socket and TLS) with hand-written ASGI apps
and raw clients that check the bytes and the framing on keep-alive connections; zero-copy is
proved by the shim's counters (and their absence under TLS, where the bounded copy runs): whole
files, framing and keep-alive, the app's mistakes, and the transport (flow control, settings
restored, slow and vanishing peers). uvicorn's own features around the door, a real uvicorn
process and the bytes of uvicorn's own body messages are ``test_uvicorn_protocol_features``; whole
apps against stock uvicorn, load and hostile clients are ``test_asgi_differential`` and
``test_asgi_hostile``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
import trustme

from aiosendfile import _platform
from aiosendfile.uvicorn import H11Protocol

from ..support.files import pattern
from ..support.raw_http import read_response, read_to_eof
from ..support.uvicorn_inproc import (
    MIB,
    PATHSEND,
    ZEROCOPYSEND,
    Script,
    Site,
    problems,
    request,
    routes,
    sent_zero_copy,
    serve,
    start,
)
from ..support.waiting import until

# -- whole files, framing, keep-alive -------------------------------------------------------------


async def test_extensions_listed_and_pathsend_whole_files(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    sizes = {b"0": 0, b"1": 1, b"big": 3 * MIB + 17}
    files = {}
    for name, size in sizes.items():
        files[name] = tmp_path / f"f{size}"
        files[name].write_bytes(pattern(size, seed=size))
    seen: list[dict[str, Any]] = []

    async def with_length(scope: Any, receive: Any, send: Any) -> None:
        path = files[scope["query_string"]]
        await send(start(path.stat().st_size))
        await send({"type": PATHSEND, "path": str(path)})

    async def chunked(scope: Any, receive: Any, send: Any) -> None:
        await send(start())
        await send({"type": PATHSEND, "path": str(files[scope["query_string"]])})

    app = routes({"/cl": with_length, "/chunked": chunked}, seen)
    async with serve(app, proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await site.open()
        total = 0
        for name, size in sizes.items():
            for route in (b"/cl", b"/chunked"):
                writer.write(request(route + b"?" + name))
                reply = await read_response(reader)
                assert reply.status == 200
                assert reply.body == pattern(size, seed=size)
                if route == b"/chunked":
                    assert reply.chunks == ([size, 0] if size else [0])
                else:
                    assert reply.headers["content-length"] == str(size)
                total += size
        writer.close()
    for scope in seen:
        assert {PATHSEND, ZEROCOPYSEND, "aiosendfile.pathsend"} <= set(scope["extensions"])
    sent_zero_copy(kind, total)
    assert not problems(caplog)


async def test_private_keys_fd_range_and_multipart(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, data_file: tuple[Path, bytes]
) -> None:
    path, data = data_file
    parts = [(b"\r\n--B\r\nContent-Range: bytes 5-9/x\r\n\r\n", 5, 5), (b"\r\n--B\r\n\r\n", 0, 0)]
    parts.append((b"\r\n--B\r\nContent-Range: big\r\n\r\n", MIB, 2 * MIB))
    closing = b"\r\n--B--\r\n"
    multipart = b"".join(head + data[at : at + n] for head, at, n in parts) + closing
    ranged = data[100 : 100 + MIB]

    def script(chunked: bool, message: dict[str, Any], length: int) -> Script:
        async def run(scope: Any, receive: Any, send: Any) -> None:
            assert "aiosendfile.pathsend" in scope["extensions"]
            fd = os.open(path, os.O_RDONLY)
            try:
                await send(start(None if chunked else length))
                # the path is a decoy: the fd is what is sent
                await send({"type": PATHSEND, "path": "/nonexistent", "aiosendfile.fd": fd, **message})
            finally:
                os.close(fd)

        return run

    range_keys = {"aiosendfile.offset": 100, "aiosendfile.count": MIB}
    multi_keys = {"aiosendfile.parts": parts, "aiosendfile.closing": closing}
    table = {
        "/range": script(False, range_keys, len(ranged)),
        "/range-chunked": script(True, range_keys, len(ranged)),
        "/multi": script(False, multi_keys, len(multipart)),
        "/multi-chunked": script(True, multi_keys, len(multipart)),
    }
    async with serve(routes(table), proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await site.open()
        for target, expected in [(b"/range", ranged), (b"/multi", multipart)] * 2:
            for suffix in (b"", b"-chunked"):
                writer.write(request(target + suffix))
                reply = await read_response(reader)
                assert reply.body == expected
                if suffix:
                    assert reply.chunks == [len(expected), 0]
        writer.close()
    sent_zero_copy(kind, 4 * (MIB + 5 + 2 * MIB))


async def test_zerocopysend_mixed_with_body_and_the_file_position(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, data_file: tuple[Path, bytes]
) -> None:
    """An explicit offset leaves the position alone; without one the send starts at the
    position and leaves it after the bytes sent (ASGI spec; sendfile(2))."""
    path, data = data_file
    expected = b"<" + data[10:110] + data[1000:1050] + b">" + data[1050:]
    positions: list[int] = []

    def script(chunked: bool, buffered: bool) -> Script:
        async def run(scope: Any, receive: Any, send: Any) -> None:
            with open(path, "rb", buffering=-1 if buffered else 0) as file:
                file.seek(1000)
                await send(start(None if chunked else len(expected)))
                await send({"type": "http.response.body", "body": b"<", "more_body": True})
                await send(
                    {"type": ZEROCOPYSEND, "file": file, "offset": 10, "count": 100, "more_body": True}
                )
                positions.append(file.tell())
                await send({"type": ZEROCOPYSEND, "file": file, "count": 50, "more_body": True})
                positions.append(file.tell())
                await send({"type": "http.response.body", "body": b">", "more_body": True})
                await send({"type": ZEROCOPYSEND, "file": file})
                positions.append(file.tell())

        return run

    table = {
        f"/{c}{b}": script(c == "chunked", b == "buffered")
        for c in ("cl", "chunked")
        for b in ("", "buffered")
    }
    async with serve(routes(table), proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await site.open()
        for target in table:
            writer.write(request(target.encode()))
            reply = await read_response(reader)
            assert reply.body == expected
        writer.close()
    assert positions == [1000, 1050, len(data)] * 4
    sent_zero_copy(kind, 4 * (len(expected) - 2))


async def test_head_sends_no_body_and_keeps_the_connection(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, data_file: tuple[Path, bytes]
) -> None:
    path, data = data_file

    async def by_path(scope: Any, receive: Any, send: Any) -> None:
        await send(start(len(data)))
        await send({"type": PATHSEND, "path": str(path)})

    async def by_file(scope: Any, receive: Any, send: Any) -> None:
        with open(path, "rb") as file:
            await send(start(len(data)))
            await send({"type": ZEROCOPYSEND, "file": file})

    async with serve(routes({"/p": by_path, "/z": by_file}), proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await site.open()
        for target in (b"/p", b"/z"):
            writer.write(request(target, b"HEAD") + request(target))  # pipelined: HEAD then GET
            head = await read_response(reader, b"HEAD")
            assert head.headers["content-length"] == str(len(data))
            assert (await read_response(reader)).body == data
        writer.close()
    sent_zero_copy(kind, 2 * len(data))


async def test_connection_close_closes_after_the_whole_body(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, data_file: tuple[Path, bytes]
) -> None:
    path, data = data_file

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(start(len(data)))
        await send({"type": PATHSEND, "path": str(path)})

    async with serve(routes({"/": app}), proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await site.open()
        writer.write(request(b"/", extra=b"Connection: close\r\n"))
        reply = await read_response(reader)
        assert reply.body == data
        assert b"connection: close" in reply.head.lower()
        assert await reader.read() == b""
        writer.close()


# -- the app's mistakes: uvicorn's errors, raised before a byte of body ------------------------


@pytest.mark.parametrize("declared", [-1, +1], ids=["longer", "shorter"])
@pytest.mark.parametrize("message", [PATHSEND, ZEROCOPYSEND])
async def test_content_length_not_met_is_an_app_error_before_any_body_byte(
    proto: Any,
    tmp_path: Path,
    data_file: tuple[Path, bytes],
    caplog: pytest.LogCaptureFixture,
    declared: int,
    message: str,
) -> None:
    path, data = data_file
    errors: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        with open(path, "rb") as file:
            await send(start(len(data) + declared))
            try:
                await send({"type": message, "path": str(path), "file": file})
            except Exception as exc:
                errors.append(exc)
                raise

    async with serve(routes({"/": app}), proto, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/"))
        raw = await read_to_eof(reader)
        writer.close()
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    assert raw.endswith(b"\r\n\r\n")  # the head alone, then the connection closed
    (error,) = errors
    h11 = proto is H11Protocol
    word = ("much" if h11 else "longer") if declared < 0 else ("little" if h11 else "shorter")
    assert word in str(error)
    assert _platform.counters.calls == 0
    assert any(r.getMessage().startswith("Exception in ASGI application") for r in caplog.records)


async def test_missing_file_and_misplaced_messages_are_app_errors(
    proto: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def missing(scope: Any, receive: Any, send: Any) -> None:
        await send(start(10))
        await send({"type": PATHSEND, "path": str(tmp_path / "missing")})

    async def before_start(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": PATHSEND, "path": str(tmp_path / "missing")})

    async def after_end(scope: Any, receive: Any, send: Any) -> None:
        await send(start(2))
        await send({"type": "http.response.body", "body": b"ok"})
        await send({"type": PATHSEND, "path": str(tmp_path / "missing")})

    table = {"/missing": missing, "/before": before_start, "/after": after_end}
    async with serve(routes(table), proto, "tcp", tmp_path) as site:
        replies = {}
        for target in table:
            reader, writer = await site.open()
            writer.write(request(target.encode()))
            replies[target] = await read_to_eof(reader)
            writer.close()
    assert replies["/missing"].startswith(b"HTTP/1.1 200 OK\r\n")
    assert replies["/missing"].endswith(b"\r\n\r\n")
    assert replies["/before"].startswith(b"HTTP/1.1 500 ")
    assert replies["/after"].startswith(b"HTTP/1.1 200 OK\r\n")
    assert replies["/after"].endswith(b"\r\n\r\nok")
    errors = [r for r in caplog.records if r.getMessage().startswith("Exception in ASGI application")]
    assert [type(r.exc_info[1]) for r in errors if r.exc_info] == [
        FileNotFoundError,
        RuntimeError,
        RuntimeError,
    ]
    assert "Expected ASGI message 'http.response.start'" in str(errors[1].exc_info[1])  # type: ignore[index]
    assert "after response already completed" in str(errors[2].exc_info[1])  # type: ignore[index]


async def test_a_path_that_is_no_regular_file_is_an_app_error_that_holds_nothing(
    proto: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``pathsend`` of a FIFO: its open waited on the loop for a writer, and every connection with
    it (a review: another client's GET timed out until something opened the FIFO). It is opened
    without waiting, and refused as no regular file, as Starlette's ``FileResponse`` refuses it.
    (A writer opens the FIFO after 2 s, so that the old open would end.)"""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def writer_later() -> None:
        threading.Event().wait(2)
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(start(10))
        await send({"type": PATHSEND, "path": str(fifo)})

    later = threading.Thread(target=writer_later, daemon=True)
    later.start()
    async with serve(routes({"/": app}), proto, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/"))
        reply = await read_to_eof(reader)
        writer.close()
    later.join()
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b"\r\n\r\n")
    errors = [r for r in caplog.records if r.getMessage().startswith("Exception in ASGI application")]
    assert [str(r.exc_info[1]) for r in errors if r.exc_info] == [
        f"[Errno 22] pathsend: not a regular file: '{fifo}'"
    ]


# -- the transport: flow control, settings restored, slow and vanishing peers ----------------------


def small_socket(kind: str, site: Site) -> socket.socket:
    """A client socket with a small receive buffer, connected to *site*."""
    sock = socket.socket(socket.AF_UNIX if kind == "unix" else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.connect(site.uds if kind == "unix" else (site.host, site.port))
    sock.setblocking(False)
    return sock


async def open_small(kind: str, site: Site) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = small_socket(kind, site)
    if kind == "tls":
        return await asyncio.open_connection(
            sock=sock, ssl=site.ctx, server_hostname="localhost", limit=2**16
        )
    return await asyncio.open_connection(sock=sock, limit=2**16)


def shrink_send_buffer(site: Site) -> None:
    """The server side's send buffer small, so a multi-MiB body waits on the reader."""
    sock = site.protocol().transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)


async def test_slow_reader_gets_every_byte_and_the_transport_settings_come_back(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA
) -> None:
    data = pattern(8 * MIB + 3)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    states: list[Any] = []

    def state(site: Site) -> Any:
        protocol = site.protocol()
        transport = protocol.transport
        return (transport.get_write_buffer_limits(), transport.is_reading(), protocol.flow.write_paused)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        shrink_send_buffer(site)
        await send(start(len(data)))
        states.append(state(site))
        await send({"type": PATHSEND, "path": str(path)})
        states.append(state(site))

    async with serve(routes({"/": app}), proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await open_small(kind, site)
        for _ in range(2):  # keep-alive: twice on one connection
            writer.write(request(b"/"))
            head = await reader.readuntil(b"\r\n\r\n")
            assert b" 200 " in head
            body = bytearray()
            while len(body) < len(data):
                body += await reader.read(8192)
                await asyncio.sleep(0)
            assert body == data
        writer.close()
    assert states[0] == states[1] == states[2] == states[3]
    assert states[0][0] != (0, 0)
    if kind != "tls":
        assert _platform.counters.waits > 0  # the writer really waited on the reader
    sent_zero_copy(kind, 2 * len(data))


async def test_peer_gone_mid_file_is_silent_and_the_server_goes_on(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    data = pattern(16 * MIB)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    returned = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["query_string"] == b"small":
            await send(start(10))
            await send({"type": PATHSEND, "path": str(path), "aiosendfile.count": 10})
            return
        shrink_send_buffer(site)
        await send(start(len(data)))
        await send({"type": PATHSEND, "path": str(path)})  # returns, silently, when the peer is gone
        returned.set()

    async with serve(routes({"/": app}), proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await open_small(kind, site)
        writer.write(request(b"/"))
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(100_000)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
        writer.transport.abort()
        await asyncio.wait_for(returned.wait(), 30)
        await until(lambda: not site.server.server_state.connections)
        reader, writer = await site.open()
        writer.write(request(b"/?small"))
        assert (await read_response(reader)).body == data[:10]
        writer.close()
    assert not problems(caplog)


@pytest.mark.parametrize("message", [PATHSEND, ZEROCOPYSEND])
async def test_file_on_a_transport_already_closing_is_dropped_as_uvicorn_drops_writes(
    proto: Any, tmp_path: Path, data_file: tuple[Path, bytes], caplog: pytest.LogCaptureFixture, message: str
) -> None:
    """The loop saw the peer reset (the transport is closing, connection_lost comes next turn):
    uvicorn's own body write would vanish silently, so does the file (found by engineer D)."""
    path, data = data_file
    raised: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        with open(path, "rb") as file:
            await send(start(len(data)))
            site.protocol().transport.abort()  # what a reset on read leaves
            try:
                await send({"type": message, "path": str(path), "file": file})
            except BaseException as exc:
                raised.append(exc)
                raise

    async with serve(routes({"/": app}), proto, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/"))
        await read_to_eof(reader)
        writer.close()
        await until(lambda: not site.server.server_state.tasks)
    assert not raised
    assert not problems(caplog)


async def test_the_request_running_when_a_pipelining_client_goes_is_disconnected(
    proto: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client pipelines two requests and goes while the first is answered (#23 item 7). uvicorn's
    httptools protocol marks only the last request it parsed (the second, queued) as disconnected:
    the first one's next write went to the closed transport (under uvloop a RuntimeError raised into
    the app, "Exception in ASGI application"; asyncio drops it) and its receive never said
    ``http.disconnect``. Ours marks the running one too: its send returns quietly, its receive says
    ``http.disconnect``, the second never runs, nothing is logged. (h11 reads one request at a time.)"""
    raised: list[BaseException] = []
    heard: list[Any] = []
    ran: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.append(scope["path"])
        try:
            await send(start(10))
            site.protocol().transport.abort()  # what the client's reset leaves
            await until(lambda: not site.server.server_state.connections)  # connection_lost ran
            await send({"type": "http.response.body", "body": b"01234", "more_body": True})
            heard.append(await receive())
        except BaseException as exc:
            raised.append(exc)
            raise

    async with serve(routes({"/first": app, "/second": app}), proto, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/first") + request(b"/second"))
        await read_to_eof(reader)
        writer.close()
        await until(lambda: not site.server.server_state.tasks)
    assert ran == ["/first"]
    assert not raised, raised
    assert heard == [{"type": "http.disconnect"}]
    assert not problems(caplog)


async def test_file_truncated_mid_file_aborts_with_one_warning(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    data = pattern(16 * MIB)
    path = tmp_path / "big.bin"
    path.write_bytes(data)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        shrink_send_buffer(site)
        await send(start(len(data)))
        await send({"type": PATHSEND, "path": str(path)})

    async with serve(routes({"/": app}), proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await open_small(kind, site)
        writer.write(request(b"/"))  # keep-alive
        await reader.readuntil(b"\r\n\r\n")
        got = len(await reader.readexactly(100_000))
        os.truncate(path, MIB)
        got += len(await read_to_eof(reader))  # the connection ends, short: never reused
        writer.close()
    assert got < len(data)
    (record,) = problems(caplog)
    assert record.levelno == logging.WARNING
    assert record.name == "uvicorn.error"
    assert record.exc_info is None
    assert "cut short" in record.getMessage()


async def test_shutdown_cancels_a_stalled_file_without_leaking(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA
) -> None:
    """uvicorn cancels tasks after timeout_graceful_shutdown: the transfer stops, its file is closed
    (the fd guard) and the connection is aborted, never left with a short body."""
    data = pattern(16 * MIB)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    cancelled = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        shrink_send_buffer(site)
        await send(start(len(data)))
        try:
            await send({"type": PATHSEND, "path": str(path)})
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serve(routes({"/": app}), proto, kind, tmp_path, tls_ca, timeout_graceful_shutdown=1) as site:
        reader, writer = await open_small(kind, site)
        writer.write(request(b"/"))
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(50_000)
        site.server.should_exit = True  # the client stalls: the server gives up waiting
        await asyncio.wait_for(cancelled.wait(), 30)
    rest = await read_to_eof(reader)
    writer.close()
    assert 50_000 + len(rest) < len(data)
