"""aiosendfile.recvfile: socket → file, zero-copy with splice, on both loops over TCP/Unix/TLS."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform, _splice

from ..support.connections import Connector, zero_copy_expected
from ..support.files import SlowDisk, pattern
from ..support.waiting import until, until_set


async def upload(conn: Any, payload: bytes, *, close: bool = True) -> None:
    """The client side: send *payload* (in pieces, so the server sees it arrive over time)."""
    assert conn.client_writer is not None
    for i in range(0, len(payload), 1 << 20):
        conn.client_writer.write(payload[i : i + (1 << 20)])
        await conn.client_writer.drain()
    if close:
        conn.client_writer.write_eof() if conn.client_writer.can_write_eof() else conn.client_writer.close()


def server_reader(conn: Any) -> asyncio.StreamReader:
    return conn.writer.transport.get_protocol()._stream_reader  # type: ignore[no-any-return]


@pytest.mark.parametrize("size", [0, 1, 65536, 3 * 2**20 + 7])
async def test_receive_byte_exact(connect: Connector, kind: str, tmp_path: Path, size: int) -> None:
    payload = pattern(size, seed=4)
    conn = await connect()
    sender = asyncio.create_task(upload(conn, payload + b"NEXT", close=False))
    with open(tmp_path / "out.bin", "wb") as f:
        assert await aiosendfile.recvfile(server_reader(conn), f, size) == size
        assert f.tell() == size
    await sender
    assert (tmp_path / "out.bin").read_bytes() == payload
    # Nothing past count was consumed: the next message is still there for the reader.
    assert await server_reader(conn).readexactly(4) == b"NEXT"
    if zero_copy_expected(kind) and size > 65536:
        assert _platform.counters.splice_bytes > 0


@pytest.mark.slow
async def test_receive_256_mib(connect: Connector, kind: str, tmp_path: Path) -> None:
    size = 256 * 2**20
    payload = pattern(size, seed=7)
    conn = await connect()
    sender = asyncio.create_task(upload(conn, payload))
    with open(tmp_path / "out.bin", "wb") as f:
        assert await aiosendfile.recvfile(server_reader(conn), f, size) == size
    await sender
    assert (tmp_path / "out.bin").read_bytes() == payload
    if zero_copy_expected(kind):
        assert _platform.counters.splice_bytes >= size // 2  # most of it never entered userspace


async def test_body_prebuffered_with_the_headers(connect: Connector, kind: str, tmp_path: Path) -> None:
    """Headers and the start of the body arrive together: the buffered part is written first."""
    body = pattern(2 * 2**20 + 1, seed=2)
    conn = await connect()
    assert conn.client_writer is not None
    conn.client_writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body[:50_000])
    await conn.client_writer.drain()
    reader = server_reader(conn)
    await reader.readuntil(b"\r\n\r\n")
    await asyncio.sleep(0.05)  # let the first 50 kB land in the StreamReader's buffer
    sender = asyncio.create_task(upload(conn, body[50_000:], close=False))
    with open(tmp_path / "out.bin", "wb") as f:
        f.write(b"PREFIX")  # buffered by the file object; must land before our bytes
        assert await aiosendfile.recvfile(reader, f, len(body)) == len(body)
        assert f.tell() == 6 + len(body)
    await sender
    assert (tmp_path / "out.bin").read_bytes() == b"PREFIX" + body


async def test_early_close_keeps_what_arrived(connect: Connector, kind: str, tmp_path: Path) -> None:
    payload = pattern(1_500_000, seed=1)
    conn = await connect()
    sender = asyncio.create_task(upload(conn, payload))  # then EOF, 1.5 MB short of the 3 MB promised
    with open(tmp_path / "out.bin", "wb") as f:
        with pytest.raises(aiosendfile.IncompleteTransferError) as exc_info:
            await aiosendfile.recvfile(server_reader(conn), f, 3_000_000, offset=10)
        received = exc_info.value.received
        if sys.version_info < (3, 11) and kind == "tls":
            # CPython 3.10's TLS StreamReader can lose its last read when the peer is gone.
            assert received <= len(payload)
        else:
            assert received == len(payload)
        assert exc_info.value.expected == 3_000_000
        assert isinstance(exc_info.value, EOFError)
        assert f.tell() == 10 + received
    await sender
    assert (tmp_path / "out.bin").read_bytes() == b"\0" * 10 + payload[:received]


async def test_cancellation_leaves_the_file_consistent(connect: Connector, tmp_path: Path) -> None:
    payload = pattern(2 * 2**20, seed=3)
    conn = await connect()
    assert conn.client_writer is not None
    conn.client_writer.write(payload)  # 2 MiB of the promised 8, then silence
    with open(tmp_path / "out.bin", "wb") as f:
        task = asyncio.create_task(aiosendfile.recvfile(server_reader(conn), f, 8 * 2**20))
        await conn.client_writer.drain()  # (only completes once recvfile reads: Unix buffers are small)
        # Everything sent must land before we cancel (however slow the machine is).
        for _ in range(3000):
            if (tmp_path / "out.bin").stat().st_size >= len(payload):
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        position = f.tell()
    assert position == len(payload)
    assert (tmp_path / "out.bin").read_bytes() == payload
    # The connection is given back: the reader works again.
    conn.client_writer.write(b"more")
    await conn.client_writer.drain()
    assert await server_reader(conn).readexactly(4) == b"more"


async def test_file_writes_run_off_the_loop_thread_when_writeback_is_busy(
    connect: Connector, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernel near its dirty-page throttle point, every write into the file (the
    pipe → file splice, or the fallback's write) runs in the executor, never on the loop
    thread, and a slow disk still gets every byte in order."""
    monkeypatch.setattr(_splice, "page_cache_writes_calm", lambda: False)
    payload = pattern(4 * 2**20 + 11, seed=12)
    conn = await connect()
    sender = asyncio.create_task(upload(conn, payload))
    with SlowDisk(2, 0.02) as pool, open(tmp_path / "out.bin", "wb") as f:
        assert await aiosendfile.recvfile(server_reader(conn), f, len(payload), executor=pool) == len(payload)
        assert f.tell() == len(payload)
    await sender
    assert (tmp_path / "out.bin").read_bytes() == payload
    assert pool.threads, "no write went through the executor"
    assert threading.get_ident() not in pool.threads
    if zero_copy_expected(kind):
        assert _platform.counters.splice_bytes == len(payload)


async def test_calm_writeback_drains_on_the_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Far from the throttle point a drain is a memory copy: no thread hop (it costs CPU)."""
    monkeypatch.setattr(_splice, "page_cache_writes_calm", lambda: True)
    used: list[object] = []

    class Watched(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            used.append(fn)
            return super().submit(fn, *args, **kwargs)

    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    payload = pattern(3 * 2**20 + 5, seed=13)
    loop = asyncio.get_running_loop()
    with a, b, Watched(1) as pool, open(tmp_path / "out.bin", "wb") as f:
        sender = asyncio.create_task(loop.sock_sendall(a, payload))
        assert await aiosendfile.recvfile(b, f, len(payload), executor=pool) == len(payload)
        await sender
    assert (tmp_path / "out.bin").read_bytes() == payload
    assert used == []
    assert _platform.counters.splice_bytes == len(payload)


def test_writeback_calm_rule() -> None:
    def vmstat(dirty: int, writeback: int) -> bytes:
        return (
            b"nr_free_pages 5\nnr_dirty %d\nnr_writeback %d\nnr_writeback_temp 0\n"
            b"nr_dirty_threshold 1000\nnr_dirty_background_threshold 600\n" % (dirty, writeback)
        )

    # Throttling starts at (1000 + 600) / 2 = 800 pages; calm means under 200.
    assert _splice.vmstat_is_calm(vmstat(100, 50))
    assert not _splice.vmstat_is_calm(vmstat(150, 50))
    assert not _splice.vmstat_is_calm(vmstat(0, 700))
    if Path("/proc/vmstat").exists():  # this kernel's file parses
        _splice._writeback._measure()
    else:
        assert _splice.page_cache_writes_calm() is False  # cannot tell: always the pool


async def test_concurrent_uploads(connect: Connector, tmp_path: Path) -> None:
    conns = [await connect() for _ in range(4)]
    payloads = [pattern(3 * 2**20 + i, seed=i) for i in range(4)]

    async def one(i: int) -> None:
        sender = asyncio.create_task(upload(conns[i], payloads[i]))
        with open(tmp_path / f"out{i}.bin", "wb") as f:
            await aiosendfile.recvfile(server_reader(conns[i]), f, len(payloads[i]))
        await sender

    await asyncio.gather(*(one(i) for i in range(4)))
    for i in range(4):
        assert (tmp_path / f"out{i}.bin").read_bytes() == payloads[i]


@pytest.mark.parametrize("size", [0, 1, 5 * 2**20 + 3])
async def test_raw_socket_zero_copy(tmp_path: Path, size: int) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    payload = pattern(size, seed=6)
    loop = asyncio.get_running_loop()
    with a, b, open(tmp_path / "out.bin", "wb") as f:
        sender = asyncio.create_task(loop.sock_sendall(a, payload))
        assert await aiosendfile.recvfile(b, f, size) == size
        await sender
    assert (tmp_path / "out.bin").read_bytes() == payload
    if size > 1:
        assert _platform.counters.splice_bytes == size


async def test_non_regular_targets_and_fallback_false(tmp_path: Path) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    loop = asyncio.get_running_loop()
    with a, b:
        out = io.BytesIO()
        await loop.sock_sendall(a, b"hello world")
        assert await aiosendfile.recvfile(b, out, 11) == 11
        assert out.getvalue() == b"hello world"
        with pytest.raises(aiosendfile.SendfileNotAvailableError):
            await aiosendfile.recvfile(b, io.BytesIO(), 1, fallback=False)
        with open(tmp_path / "append.bin", "ab") as f:  # append mode: the copy path, still right
            f.write(b"old")
            await loop.sock_sendall(a, b"new")
            assert await aiosendfile.recvfile(b, f, 3) == 3
        assert (tmp_path / "append.bin").read_bytes() == b"oldnew"
        # An append-mode file takes its bytes at its end: an offset elsewhere cannot be kept, and
        # is refused before anything is read (it was taken, and the bytes landed at the end).
        for mode in ("ab", "a+b"):
            with open(tmp_path / "append.bin", mode) as f:
                with pytest.raises(ValueError, match="append"):
                    await asyncio.wait_for(aiosendfile.recvfile(b, f, 3, offset=2), 5)
                await loop.sock_sendall(a, b"end")
                assert await aiosendfile.recvfile(b, f, 3, offset=6 if mode == "ab" else 9) == 3
        assert (tmp_path / "append.bin").read_bytes() == b"oldnewendend"
        # By default, at its end too, whatever its position: the position after is where they are.
        with open(tmp_path / "append.bin", "a+b") as f:
            f.seek(2)
            await loop.sock_sendall(a, b"more")
            assert await aiosendfile.recvfile(b, f, 4) == 4
            assert f.tell() == 16
        assert (tmp_path / "append.bin").read_bytes() == b"oldnewendendmore"
        # A pipe has no position: its default offset is no error.
        r, w = os.pipe()
        with open(w, "wb", buffering=0) as sink, open(r, "rb") as source:
            await loop.sock_sendall(a, b"piped")
            assert await aiosendfile.recvfile(b, sink, 5) == 5
            assert source.read(5) == b"piped"


@pytest.mark.parametrize("buffering", [0, -1])
async def test_a_non_blocking_pipe_that_fills_loses_nothing(buffering: int) -> None:
    """A target that is non-blocking and full takes nothing (a raw file's write says None) or part
    (a buffered one's raises ``BlockingIOError``): the rest waits for room. A raw one's None was
    taken as all written: 1 MiB received and counted, 64 KiB of it in the pipe."""
    payload = pattern(1 << 20)
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    r, w = os.pipe()
    os.set_blocking(w, False)
    got = bytearray()

    def drain() -> None:
        with open(r, "rb", buffering=0) as source:
            while chunk := source.read(65536):
                got.extend(chunk)

    reader = threading.Thread(target=drain)
    loop = asyncio.get_running_loop()
    with a, b, open(w, "wb", buffering=buffering) as sink:
        sending = asyncio.ensure_future(loop.sock_sendall(a, payload))
        received = asyncio.ensure_future(aiosendfile.recvfile(b, sink, len(payload)))
        await asyncio.sleep(0.2)  # (the pipe fills: nobody reads it yet)
        reader.start()
        assert await asyncio.wait_for(received, 20) == len(payload)
        await sending
        # All of it is in the pipe once counted, none left in a buffer (a close lost it, or raised)
        await until(lambda: len(got) == len(payload), 10)
    reader.join(10)
    assert bytes(got) == payload


async def test_cancelled_into_a_pipe_nobody_reads_returns_at_once() -> None:
    """A pipe whose reader stopped may never take the write in flight: a cancelled receive returns
    at once (it waited for that write for ever), and its write left behind ends with the pipe."""
    payload = pattern(1 << 20)
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    r, w = os.pipe()
    loop = asyncio.get_running_loop()
    with a, b, open(w, "wb", buffering=0, closefd=False) as sink:
        sending = asyncio.ensure_future(loop.sock_sendall(a, payload))
        received = asyncio.ensure_future(aiosendfile.recvfile(b, sink, len(payload)))
        await asyncio.sleep(0.3)  # (the pipe is full; its write waits)
        received.cancel()
        done, _ = await asyncio.wait({received}, timeout=3)
        assert done
        assert received.cancelled()
        sending.cancel()
    os.close(r)  # (the write left behind fails now: EPIPE, retrieved by nobody, logged by nobody)
    await asyncio.sleep(0.1)
    os.close(w)


async def test_bad_arguments(tmp_path: Path) -> None:
    a, b = socket.socketpair()
    with a, b, open(tmp_path / "x", "wb") as f:
        b.setblocking(False)
        with pytest.raises(ValueError, match="non-negative"):
            await aiosendfile.recvfile(b, f, -1)
        with pytest.raises(TypeError):
            await aiosendfile.recvfile(b, f, 1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="source"):
            await aiosendfile.recvfile("nope", f, 1)
        with open(tmp_path / "x") as text, pytest.raises(ValueError, match="binary"):
            await aiosendfile.recvfile(b, text, 1)  # type: ignore[arg-type]
        a.setblocking(True)
        with pytest.raises(ValueError, match="non-blocking"):
            await aiosendfile.recvfile(a, f, 1)


async def test_cancelled_during_a_thread_write_counts_what_lands(
    connect: Connector, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while a write into the file runs in the executor (the fallback's write, or a
    pipe → file drain): that write lands anyway, so recvfile waits for it and counts it. The file
    position then matches the file's bytes exactly, and they are the stream's first bytes."""
    monkeypatch.setattr(_splice, "page_cache_writes_calm", lambda: False)  # every write in the pool
    payload = pattern(2**20, seed=21)
    conn = await connect()
    assert conn.client_writer is not None
    conn.client_writer.write(payload)  # of the promised 8 MiB
    with SlowDisk(1, 0.3) as pool, open(tmp_path / "out.bin", "wb") as f:  # in flight when cancelled
        task = asyncio.create_task(aiosendfile.recvfile(server_reader(conn), f, 8 * 2**20, executor=pool))
        await until_set(pool.started)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        position = f.tell()
    landed = (tmp_path / "out.bin").read_bytes()
    assert position > 0
    assert len(landed) == position
    assert landed == payload[:position]


@pytest.mark.parametrize(
    ("offset", "count"),
    [(1.5, 1), ("0", 1), (True, 1), (-1, 1), (0, 1.5), (0, "1"), (0, True), (0, -1)],
)
async def test_bad_offset_or_count_is_the_same_error_as_sendfiles(
    tmp_path: Path, offset: Any, count: Any
) -> None:
    """One rule for both directions, loop.sendfile's: TypeError for a non-int (bool too),
    ValueError for a negative."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10)
    a, b = socket.socketpair()
    with a, b, open(path, "r+b") as f:
        a.setblocking(False)
        b.setblocking(False)
        with pytest.raises((TypeError, ValueError)) as sent:
            await aiosendfile.sendfile(a, f, offset, count)
        with pytest.raises((TypeError, ValueError)) as received:
            await aiosendfile.recvfile(b, f, count, offset=offset)
        assert type(received.value) is type(sent.value)
        assert f.tell() == 0  # an argument error leaves the file alone


async def test_arguments_are_checked_count_then_file_then_offset(tmp_path: Path) -> None:
    """Where more than one thing is wrong, recvfile names the same one as before issue #14: the
    count first, then the file, then the offset (only a non-int offset's type changed, to
    TypeError)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10)
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        with pytest.raises(TypeError, match="count"):
            await aiosendfile.recvfile(b, io.BytesIO(), None, offset=-1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="count"):
            await aiosendfile.recvfile(b, io.BytesIO(), -1, offset=-1)
        with open(path, "rb") as read_only, pytest.raises(ValueError, match="not open for writing"):
            await aiosendfile.recvfile(b, read_only, 1, offset=-1)
        with open(path, "rb") as read_only, pytest.raises(ValueError, match="not open for writing"):
            await aiosendfile.recvfile(b, read_only, 1, offset=1.5)  # type: ignore[arg-type]
        closed = open(path, "r+b")  # noqa: SIM115
        closed.close()
        with pytest.raises(ValueError, match="closed file"):
            await aiosendfile.recvfile(b, closed, 1, offset=-1)
