"""Failures: bad arguments, truncation, vanished peers, cancellation, misuse during a transfer.

After every failure: the file position is ``offset + sent``, the transport is
given back (or closed), no fd leaks and the loop's exception handler stays
silent (conftest checks the last two).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform

from .conftest import Connector, loop_name, pattern, zero_copy_expected

# -- bad arguments: a typed error before any byte, file untouched --------------------


@pytest.mark.parametrize(
    ("offset", "count", "error"),
    [
        (-1, None, ValueError),
        (0, -1, ValueError),
        (1.5, None, TypeError),
        (0, 2.0, TypeError),
        (True, None, TypeError),
        (0, False, TypeError),
        ("0", None, TypeError),
        (1001, None, ValueError),  # past EOF
    ],
)
async def test_bad_offset_and_count(
    connect: Connector, make_file: Any, offset: Any, count: Any, error: type
) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        f.seek(17)
        with pytest.raises(error):
            await aiosendfile.sendfile(conn.writer, f, offset, count)
        assert f.tell() == 17
    assert conn.transport.get_write_buffer_size() == 0
    assert _platform.counters.calls == 0


async def test_count_beyond_eof_is_refused_before_the_first_byte(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        with pytest.raises(aiosendfile.FileTruncatedError) as exc_info:
            await aiosendfile.sendfile(conn.writer, f, 500, 501)
        assert exc_info.value.sent == 0
        assert exc_info.value.expected == 501
        assert f.tell() == 0
    conn.writer.write(b"end")
    conn.writer.close()
    assert await conn.read_all() == b"end"


async def test_text_mode_and_closed_files(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    path = make_file(10)
    with open(path) as text, pytest.raises(ValueError, match="binary mode"):
        await aiosendfile.sendfile(conn.writer, text)
    f = open(path, "rb")  # noqa: SIM115
    f.close()
    with pytest.raises(ValueError, match="closed file"):
        await aiosendfile.sendfile(conn.writer, f)
    with pytest.raises(TypeError):
        await aiosendfile.sendfile(conn.writer, b"not a file")  # type: ignore[arg-type]


async def test_bad_targets(make_file: Any) -> None:
    with open(make_file(10), "rb") as f:
        with pytest.raises(TypeError, match="target must be"):
            await aiosendfile.sendfile(object(), f)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setblocking(False)
        with udp, pytest.raises(ValueError, match="SOCK_STREAM"):
            await aiosendfile.sendfile(udp, f)
        a, b = socket.socketpair()
        with a, b:
            with pytest.raises(ValueError, match="non-blocking"):
                await aiosendfile.sendfile(a, f)
            with pytest.raises(TypeError):
                await aiosendfile.sock_sendfile("sock", f)  # type: ignore[arg-type]


async def test_closing_transport(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        f.seek(3)
        conn.writer.close()
        with pytest.raises(RuntimeError, match="Transport is closing"):
            await aiosendfile.sendfile(conn.writer, f)
        assert f.tell() == 3


async def test_fallback_false(connect: Connector, kind: str, make_file: Any) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        if zero_copy_expected(kind):
            assert await aiosendfile.sendfile(conn.writer, f, fallback=False) == 1000
        else:
            with pytest.raises(aiosendfile.SendfileNotAvailableError, match="TLS") as exc_info:
                await aiosendfile.sendfile(conn.writer, f, 5, fallback=False)
            assert isinstance(exc_info.value, asyncio.SendfileNotAvailableError)
            assert exc_info.value.sent == 0
            assert f.tell() == 0
    with pytest.raises(aiosendfile.SendfileNotAvailableError):
        await aiosendfile.sendfile(conn.writer, io.BytesIO(b"abc"), fallback=False)
    conn.writer.write(b"|end")
    conn.writer.close()
    assert await conn.read_all() == (pattern(1000) if zero_copy_expected(kind) else b"") + b"|end"


# -- failures during a transfer --------------------------------------------------------


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    """Wait (by polling the loop) until *predicate()* holds."""
    async with asyncio.timeout(timeout) if hasattr(asyncio, "timeout") else _nullcontext():
        while not predicate():
            await asyncio.sleep(0.005)


class _nullcontext:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _stalled_transfer(conn: Any, f: Any, **kw: Any) -> asyncio.Task[int]:
    """Start a transfer to a client that does not read, and wait until it is stuck."""
    task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, **kw))
    await _until(
        lambda: _platform.counters.waits > 0 or conn.transport.get_write_buffer_size() > 0 or task.done()
    )
    await asyncio.sleep(0.05)
    assert not task.done()
    return task


async def test_file_truncated_during_transfer(connect: Connector, kind: str, make_file: Any) -> None:
    size = 16 * 2**20
    path = make_file(size)
    conn = await connect(rcvbuf=4096)
    with open(path, "rb") as f:
        task = await _stalled_transfer(conn, f)
        os.truncate(path, 65536)  # far less than what is already on its way
        reader = asyncio.create_task(conn.read_all())
        with pytest.raises(aiosendfile.FileTruncatedError) as exc_info:
            await task
        err = exc_info.value
        assert err.expected == size
        assert 0 < err.sent < size
        assert f.tell() == err.sent
    # The HTTP-layer rule: close the connection rather than pass off a short body.
    conn.writer.close()
    data = await reader
    assert len(data) == err.sent
    if zero_copy_expected(kind):
        # Bytes already queued on the socket reference page-cache pages that the
        # truncation zeroed: only what is still in the file is guaranteed. (The
        # kernel's rule, as with nginx; the error tells the body is short.)
        assert data[:65536] == pattern(65536)
    else:
        assert data == pattern(size)[: err.sent]


async def test_peer_reset_during_transfer(connect: Connector, kind: str, make_file: Any) -> None:
    size = 16 * 2**20
    conn = await connect(rcvbuf=4096)
    with open(make_file(size), "rb") as f:
        task = await _stalled_transfer(conn, f, offset=10)
        # The client vanishes with a RST (SO_LINGER 0).
        conn.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert conn.client_writer is not None
        conn.client_writer.transport.abort()
        with pytest.raises(ConnectionError) as exc_info:
            await asyncio.wait_for(task, 10)
        assert isinstance(exc_info.value, aiosendfile.ConnectionLostError)
        assert f.tell() == 10 + exc_info.value.sent


async def test_transport_closed_by_another_task(connect: Connector, make_file: Any) -> None:
    conn = await connect(rcvbuf=4096)
    with open(make_file(16 * 2**20), "rb") as f:
        task = await _stalled_transfer(conn, f)
        conn.transport.abort()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(task, 10)
        assert f.tell() == getattr(task.exception(), "sent", -1)


@pytest.mark.parametrize("when", ["while-flushing", "while-sending"])
async def test_cancellation_restores_everything(
    connect: Connector, kind: str, make_file: Any, when: str
) -> None:
    size = 16 * 2**20
    path = make_file(size)
    conn = await connect(rcvbuf=4096)
    transport = conn.transport
    protocol = transport.get_protocol()
    limits = transport.get_write_buffer_limits()
    prefix = b""
    if when == "while-flushing":
        prefix = b"p" * (2 * 2**20)
        conn.writer.write(prefix)  # the lease must wait for this to flush first
    with open(path, "rb") as f:
        task = await _stalled_transfer(conn, f, offset=100)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        position = f.tell()
    sent = position - 100
    assert transport.get_protocol() is protocol
    assert transport.get_write_buffer_limits() == limits
    assert transport.is_reading()
    # The connection keeps working: what was sent, then what is written now.
    conn.writer.write(b"AFTER")
    conn.writer.close()
    data = await conn.read_all()
    assert data == prefix + pattern(size)[100 : 100 + sent] + b"AFTER"


async def test_writes_during_transfer_are_refused(connect: Connector, kind: str, make_file: Any) -> None:
    conn = await connect(rcvbuf=4096)
    size = 8 * 2**20
    with open(make_file(size), "rb") as f:
        task = await _stalled_transfer(conn, f)
        with pytest.raises(RuntimeError, match="sendfile is in progress"):
            conn.writer.write(b"interloper")
        with pytest.raises(RuntimeError, match="sendfile is in progress"):
            conn.writer.writelines([b"interloper"])
        if loop_name() == "asyncio":  # uvloop's compiled transports cannot be guarded
            with pytest.raises(RuntimeError, match="sendfile is in progress"):
                conn.transport.write(b"interloper")
        reader = asyncio.create_task(conn.read_all())
        assert await task == size
        conn.writer.write(b"ok")  # allowed again
        conn.writer.close()
        assert await reader == pattern(size) + b"ok"


async def test_disk_read_error_keeps_its_type_and_carries_sent(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulated EIO after 1 MiB: raised as OSError(EIO) with .sent, position consistent."""
    import errno

    conn = await connect()
    real_sendfile, real_pread = os.sendfile, os.pread
    limit = 2**20  # the "bad sector": every read at or past it fails

    def sendfile(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        if offset >= limit:
            raise OSError(errno.EIO, "Input/output error")
        return real_sendfile(out_fd, in_fd, offset, min(count, limit - offset))

    def pread(fd: int, n: int, offset: int) -> bytes:
        if offset >= limit:
            raise OSError(errno.EIO, "Input/output error")
        return real_pread(fd, min(n, limit - offset), offset)

    monkeypatch.setattr(os, "sendfile", sendfile)
    monkeypatch.setattr(os, "pread", pread)  # (the fallback's reads: aiosendfile._coldread)
    # A failing disk is never "cached": the fallback's reads go to the pool, through pread.
    monkeypatch.setattr(_platform, "pread_cached", lambda fd, size, offset: None)
    reader = asyncio.create_task(conn.read_all())
    with open(make_file(4 * 2**20), "rb") as f:
        with pytest.raises(OSError, match="Input/output") as exc_info:
            await aiosendfile.sendfile(conn.writer, f, max_chunk=2**18)
        assert exc_info.value.errno == errno.EIO
        sent = exc_info.value.sent  # type: ignore[attr-defined]
        assert sent == limit
        assert f.tell() == sent
    conn.writer.close()
    assert await reader == pattern(4 * 2**20)[:limit]


async def test_no_fd_leak_over_many_transfers(connect: Connector, make_file: Any, tmp_path: Path) -> None:
    """Many transfers, some cancelled: the fd count comes back to where it was (conftest checks)."""
    path = make_file(200_000)
    conn = await connect()
    reader = asyncio.create_task(conn.read_all())
    with open(path, "rb") as f:
        for i in range(50):
            task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, 0, 1000 + i))
            if i % 5 == 0:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    conn.writer.close()
    data = await reader
    assert len(data) <= sum(1000 + i for i in range(50))
