"""aiosendfile.sendfile on StreamWriters: bytes, order, return value, file position, zero-copy.

Each test runs on stock asyncio and uvloop (conftest) and over TCP, Unix and TLS (``kind``).
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform

from ..support.connections import Conn, Connector, zero_copy_expected
from ..support.files import pattern

HEAD, TAIL = b"HEAD\r\n", b"\r\nTAIL"


async def framed_transfer(
    conn: Conn, file: Any, offset: int = 0, count: int | None = None, **kw: Any
) -> tuple[int, int, bytes]:
    """HEAD, the file, TAIL; then close. Returns (sent, file position after, bytes the client got)."""

    async def serve() -> tuple[int, int]:
        try:
            conn.writer.write(HEAD)
            sent = await aiosendfile.sendfile(conn.writer, file, offset, count, **kw)
            position = file.tell() if file.seekable() else -1
            conn.writer.write(TAIL)
            return sent, position
        finally:
            conn.writer.close()

    task = asyncio.create_task(serve())
    data = await conn.read_all()
    sent, position = await task
    return sent, position, data


SIZES = [0, 1, 4095, 65535, 65536, 65537, 3 * 65536 + 17, 2**21 + 1]


@pytest.mark.parametrize("size", SIZES)
async def test_whole_file_byte_exact(connect: Connector, kind: str, make_file: Any, size: int) -> None:
    path = make_file(size)
    conn = await connect()
    with open(path, "rb") as f:
        sent, position, data = await framed_transfer(conn, f, max_chunk=65536)
    assert sent == size
    assert position == size
    assert data == HEAD + pattern(size) + TAIL
    expected_zero_copy = size if zero_copy_expected(kind) else 0
    assert _platform.counters.bytes == expected_zero_copy


@pytest.mark.parametrize(
    ("offset", "count"),
    [
        (0, None),
        (0, 1),
        (1, None),
        (1000, 5000),
        (65535, 2),
        (199_999, 1),
        (200_000, None),
        (7, 0),
        (0, 200_000),
    ],
)
async def test_offset_and_count(
    connect: Connector, kind: str, make_file: Any, offset: int, count: int | None
) -> None:
    size = 200_000
    path = make_file(size)
    expected = pattern(size)[offset : None if count is None else offset + count]
    conn = await connect()
    with open(path, "rb") as f:
        f.seek(12345)  # the call must not depend on (or be confused by) the current position
        sent, position, data = await framed_transfer(conn, f, offset, count)
    assert sent == len(expected)
    assert position == offset + sent
    assert data == HEAD + expected + TAIL


@pytest.mark.slow
async def test_large_file_slow_reader_takes_the_eagain_path(
    connect: Connector, kind: str, make_file: Any
) -> None:
    size = 64 * 2**20 + 3
    path = make_file(size)
    # The small SO_RCVBUF makes the reader slow. The StreamReader limit stays large,
    # because Python 3.10's TLS client crashes resuming a paused transport after EOF.
    conn = await connect(rcvbuf=4096, limit=2**22)

    async def slow_read() -> bytes:
        assert conn.client_reader is not None
        chunks = []
        while chunk := await conn.client_reader.read(8192):
            chunks.append(chunk)
            if len(chunks) % 64 == 0:
                await asyncio.sleep(0.0005)
        return b"".join(chunks)

    async def serve() -> int:
        conn.writer.write(HEAD)
        with open(path, "rb") as f:
            sent = await aiosendfile.sendfile(conn.writer, f)
        conn.writer.write(TAIL)
        conn.writer.close()
        return sent

    task = asyncio.create_task(serve())
    data = await slow_read()
    assert await task == size
    assert len(data) == size + len(HEAD) + len(TAIL)
    assert data == HEAD + pattern(size) + TAIL
    if zero_copy_expected(kind):
        assert _platform.counters.bytes == size
        assert _platform.counters.waits > 0, "the socket never filled: the wait path did not run"


async def test_offsets_past_4gib_in_sparse_file(connect: Connector, kind: str, tmp_path: Path) -> None:
    path = tmp_path / "sparse.bin"
    far = 5 * 2**30 + 12345  # > 4 GiB: 64-bit offsets all the way down
    tail = pattern(300_000, seed=3)
    with open(path, "wb") as f:
        f.truncate(far)
        f.seek(far)
        f.write(tail)
    conn = await connect()
    with open(path, "rb") as f:
        sent, position, data = await framed_transfer(conn, f, far - 10, 100_010)
    assert sent == 100_010
    assert position == far + 100_000
    assert data == HEAD + b"\0" * 10 + tail[:100_000] + TAIL
    conn2 = await connect()
    with open(path, "rb") as f:
        sent, position, data = await framed_transfer(conn2, f, far + 1000)  # to EOF
    assert data == HEAD + tail[1000:] + TAIL
    assert position == far + len(tail)


async def test_empty_file_and_zero_count_send_nothing(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    empty = make_file(0, "empty.bin")
    full = make_file(1000, "full.bin")
    with open(empty, "rb") as f1, open(full, "rb") as f2:
        conn.writer.write(HEAD)
        assert await aiosendfile.sendfile(conn.writer, f1) == 0
        assert await aiosendfile.sendfile(conn.writer, f2, 500, 0) == 0
        assert f2.tell() == 500
        assert await aiosendfile.sendfile(conn.writer, f2, 1000) == 0  # offset == size: nothing left
        conn.writer.write(TAIL)
        conn.writer.close()
    assert await conn.read_all() == HEAD + TAIL
    assert _platform.counters.calls == 0


async def test_many_transfers_on_one_connection(connect: Connector, kind: str, make_file: Any) -> None:
    """Back-to-back calls interleaved with writes: order kept, nothing leaked (fd check in conftest)."""
    path = make_file(10_000)
    conn = await connect()
    expected = b""

    async def serve() -> None:
        nonlocal expected
        with open(path, "rb") as f:
            for i in range(100):
                marker = b"<%d>" % i
                conn.writer.write(marker)
                await aiosendfile.sendfile(conn.writer, f, i * 37, 1000 + i)
                expected += marker + pattern(10_000)[i * 37 : i * 37 + 1000 + i]
        conn.writer.close()

    task = asyncio.create_task(serve())
    data = await conn.read_all()
    await task
    assert data == expected


async def test_stream_writer_usable_after(connect: Connector, make_file: Any) -> None:
    """Protocol, reading and flow control are given back: the connection keeps working both ways."""
    path = make_file(300_000)
    conn = await connect()
    transport = conn.transport
    protocol_before = transport.get_protocol()
    limits_before = transport.get_write_buffer_limits()
    reader_task = asyncio.create_task(conn.read_exactly(300_000 + 5))
    with open(path, "rb") as f:
        await aiosendfile.sendfile(conn.writer, f)
    assert transport.get_protocol() is protocol_before
    assert transport.get_write_buffer_limits() == limits_before
    assert transport.is_reading()
    conn.writer.write(b"after")
    await conn.writer.drain()
    assert await reader_task == pattern(300_000) + b"after"
    # The server side still reads what the client sends.
    assert conn.client_writer is not None
    conn.client_writer.write(b"ping")
    await conn.client_writer.drain()
    server_reader = protocol_before._stream_reader  # StreamReaderProtocol's reader
    assert await server_reader.readexactly(4) == b"ping"


async def test_user_protocol_paused_before_the_call_is_resumed(
    connect: Connector, kind: str, make_file: Any
) -> None:
    """A drain() pending in another task when sendfile takes over must still wake up.

    (asyncio's TLS transport moves the 4 MiB into its TCP transport at once, so
    there the protocol may not be paused; the rest of the test still holds.)
    """
    path = make_file(100_000)
    conn = await connect(rcvbuf=4096)
    big = b"x" * (4 * 2**20)
    conn.writer.write(big)  # far above the high-water mark: the protocol is paused
    drain = asyncio.create_task(conn.writer.drain())
    await asyncio.sleep(0.01)
    if kind != "tls":
        assert not drain.done()

    async def serve() -> int:
        with open(path, "rb") as f:
            n = await aiosendfile.sendfile(conn.writer, f)
        conn.writer.close()
        return n

    task = asyncio.create_task(serve())
    data = await conn.read_all()
    assert await task == 100_000
    await asyncio.wait_for(drain, 5)
    assert data == big + pattern(100_000)


@pytest.mark.parametrize("source", ["bytesio", "pipe"])
async def test_non_regular_files_use_the_fallback(connect: Connector, source: str) -> None:
    payload = pattern(700_001, seed=5)
    conn = await connect()
    if source == "bytesio":
        f: Any = io.BytesIO(payload)
        sent, position, data = await framed_transfer(conn, f)
        assert position == len(payload)
    else:
        r, w = os.pipe()
        writer_task = asyncio.get_running_loop().run_in_executor(None, _write_and_close, w, payload)
        with open(r, "rb") as f:
            sent, _, data = await framed_transfer(conn, f)
        await writer_task
    assert sent == len(payload)
    assert data == HEAD + payload + TAIL
    assert _platform.counters.bytes == 0


def _write_and_close(fd: int, payload: bytes) -> None:
    with open(fd, "wb") as f:
        f.write(payload)


async def test_bytesio_with_offset_and_count(connect: Connector) -> None:
    payload = pattern(10_000)
    conn = await connect()
    sent, position, data = await framed_transfer(conn, io.BytesIO(payload), 100, 5000)
    assert (sent, position) == (5000, 5100)
    assert data == HEAD + payload[100:5100] + TAIL


async def test_transport_target(connect: Connector, kind: str, make_file: Any) -> None:
    """A bare transport works like its StreamWriter."""
    path = make_file(123_457)
    conn = await connect()

    async def serve() -> int:
        with open(path, "rb") as f:
            n = await aiosendfile.sendfile(conn.transport, f)
        conn.writer.close()
        return n

    task = asyncio.create_task(serve())
    assert await conn.read_all() == pattern(123_457)
    assert await task == 123_457
    assert _platform.counters.bytes == (123_457 if zero_copy_expected(kind) else 0)


# -- the TLS fallback writes in pieces (bounded memory) ----------------------------------------


@pytest.mark.parametrize("kind", ["tls"])
@pytest.mark.parametrize(("budget", "piece"), [(0, 16 * 1024), (48 * 1024, 64 * 1024)])
async def test_tls_pieces_stopped_short_are_read_again(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch, budget: int, piece: int
) -> None:
    """A slow reader keeps the socket under TLS full, so chunks end early: every byte still arrives once.

    With no budget left a connection writes 16 KiB pieces (64 KiB reads); with 48 KiB of budget,
    64 KiB pieces (256 KiB reads). The bytes read exceed the file: the rest of a chunk the TLS
    layer stopped short was read again.
    """
    from aiosendfile import _fallback

    buffers = _fallback.TLSBuffers(budget)
    monkeypatch.setattr(_fallback, "tls_buffers", buffers)
    read_total = 0
    real_read = _fallback.ChunkReader.read

    async def read(self: Any, position: int, size: int) -> bytes:
        nonlocal read_total
        data = await real_read(self, position, size)
        read_total += len(data)
        return data

    monkeypatch.setattr(_fallback.ChunkReader, "read", read)
    size = 3 * 2**20 + 7
    path = make_file(size)
    conn = await connect(rcvbuf=16384)
    # A small send buffer too (the kernel's autotuned one takes megabytes before it fills).
    conn.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
    headers, trailers = b"H" * 1000, b"T" * 40_000  # trailers longer than a piece go whole too

    expected = headers + pattern(size) + trailers

    async def send() -> int:
        with open(path, "rb") as f:
            return await aiosendfile.sendfile(conn.writer, f, headers=headers, trailers=trailers)

    async def read_slowly() -> bytes:
        # Up to the expected length, with the connection still open (CPython 3.10's TLS transport
        # crashes when a paused StreamReader resumes after the peer closed).
        assert conn.client_reader is not None
        chunks, got = [], 0
        while got < len(expected):
            chunk = await conn.client_reader.read(8192)
            assert chunk, "the connection ended early"
            chunks.append(chunk)
            got += len(chunk)
            await asyncio.sleep(0.0005)
        return b"".join(chunks)

    sent, data = await asyncio.gather(send(), read_slowly())
    assert sent == size
    assert data == expected
    assert max(r[0] for r in buffers._sizes.values()) == piece
    assert read_total > size, "no chunk was stopped short"
