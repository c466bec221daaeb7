"""Cancellation and timeouts: a transfer stops promptly and leaves everything as it found it.

After a cancel (while flushing, sending, waiting for a cold chunk, or at random points, many
times on one connection): the file position is ``offset + sent``, the peer got exactly
``file[offset:offset + sent]`` then what was written later, the transport has its protocol,
limits and reading back, and no fd, task or poller registration is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform

from ..support.cancellations import random_cancellations
from ..support.connections import Connector
from ..support.files import evict, pattern
from ..support.waiting import stalled

MiB = 2**20


# -- cancel ------------------------------------------------------------------------------------------


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
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f, offset=100))
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


async def test_close_then_cancel_keeps_flow_control_consistent(connect: Connector, make_file: Any) -> None:
    """Another task closes the transport, then the transfer is cancelled: no assertion in resume_writing."""
    conn = await connect(rcvbuf=4096)
    conn.writer.write(b"x" * (2 * 2**20))  # the user's protocol is paused
    with open(make_file(4 * 2**20), "rb") as f:
        task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f))
        await asyncio.sleep(0.05)
        conn.writer.close()
        task.cancel()
        with pytest.raises((asyncio.CancelledError, ConnectionError)):
            await task
    data = await conn.read_all()  # the buffer drains; the loop's exception handler stays silent
    assert data.startswith(b"x" * (2 * 2**20))


async def test_cancel_of_a_queued_cold_chunk_is_immediate(
    connect: Connector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cold.bin"
    path.write_bytes(pattern(2**20))
    evict(path)
    # The probes say "cold" as on a slow disk. (On a fast one, the readahead that an RWF_NOWAIT
    # read starts can finish inside that read: the evicted file was then read on the loop without
    # waiting, and the transfer was done before the cancel; CI saw it once, under TLS.)
    monkeypatch.setattr(_platform, "pread_cached", lambda fd, size, offset: None)
    monkeypatch.setattr(_platform, "range_cached", lambda fd, offset, size: False)
    conn = await connect()
    busy = threading.Event()
    with ThreadPoolExecutor(1) as pool, open(path, "rb") as f:
        pool.submit(busy.wait, 5)  # the only thread is busy: our chunk waits in the queue
        task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, executor=pool))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - start < 1.0
        assert f.tell() == 0
        busy.set()
    conn.writer.close()
    assert await conn.read_all() == b""  # nothing went out after cancel()


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


# -- timeouts ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(asyncio, "timeout"), reason="asyncio.timeout is 3.11+")
@pytest.mark.parametrize("kind", ["tcp", "tls"], indirect=True)
async def test_asyncio_timeout_block_around_a_stalled_transfer(
    connect: Connector, kind: str, make_file: Any
) -> None:
    size = 4 * MiB
    conn = await connect(rcvbuf=4096)
    with open(make_file(size), "rb") as f:
        f.seek(12345)  # the call's offset wins; the final position is offset + sent
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.25):
                await aiosendfile.sendfile(conn.writer, f, 7, size - 7)
        sent = f.tell() - 7
        assert 0 < sent < size - 7
        # The same connection carries a second, complete transfer.
        reader = asyncio.create_task(conn.read_all())
        assert await aiosendfile.sendfile(conn.writer, f, 0, 1000) == 1000
        assert f.tell() == 1000
    conn.writer.close()
    assert await asyncio.wait_for(reader, 20) == pattern(size)[7 : 7 + sent] + pattern(1000)


# -- cancellation at random points -------------------------------------------------------------------


async def test_cancellation_at_random_points(connect: Connector, kind: str, make_file: Any) -> None:
    size = 2 * MiB + 17
    path = make_file(size)
    conn = await connect(rcvbuf=16384)
    seed = int(os.environ.get("AIOSENDFILE_TEST_SEED", "0")) or random.randrange(2**32)
    try:
        outcomes = await random_cancellations(conn, path, size, iterations=40, seed=seed)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (reproduce with AIOSENDFILE_TEST_SEED={seed})") from exc
    assert outcomes["cancelled"] >= 5, outcomes


async def test_idle_pipes_whose_sends_were_cancelled_hold_no_cold_read_thread(connect: Connector) -> None:
    """Sends of pipes whose writers are idle, their callers timed out: the blocking reads they
    left run on in the streams' own pool, never in the cold-read pool every file send shares
    (four of them held all its threads, and every cold file waited), nor in the loop's default
    executor (six held getaddrinfo's threads, and asyncio.run never returned)."""
    from aiosendfile._options import COLD_POOL_THREADS, default_cold_executor

    conn = await connect()
    loop = asyncio.get_running_loop()
    pipes = [os.pipe() for _ in range(max(COLD_POOL_THREADS, min(32, (os.cpu_count() or 1) + 4)) + 1)]
    sources = [open(r, "rb") for r, _ in pipes]  # noqa: SIM115 - closed below, once their reads end
    try:
        for source in sources:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(aiosendfile.sendfile(conn.writer, source), 0.1)
        job = asyncio.wrap_future(default_cold_executor().submit(lambda: "free"))
        assert await asyncio.wait_for(job, 5) == "free"
        # (nor the loop's default executor: getaddrinfo, to_thread, asyncio.run's shutdown)
        assert await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), 5) == "free"
    finally:
        for _, w in pipes:
            os.close(w)  # (the reads left behind end: EOF)
        await asyncio.sleep(0.2)
        for source in sources:
            source.close()
