"""Never stall the loop: cold pages off the loop thread, bounded chunks, headers/trailers, progress.

Both loops (conftest), TCP/Unix/TLS where a connection is involved.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _api, _platform, _writer

from ..support.connections import Connector, zero_copy_expected
from ..support.files import evict, pattern


def write_cold(path: Path, size: int) -> Path:
    """A file whose pages are not in the page cache (written, synced, evicted)."""
    path.write_bytes(pattern(size, seed=9))
    evict(path)
    return path


def test_whole_chunk_probe_sees_a_hole_in_the_middle(tmp_path: Path) -> None:
    """A chunk cached at both ends but evicted in the middle goes to the pool (cachestat)."""
    if not _platform.range_cached_available():
        pytest.skip("no cachestat(2) here (Linux < 6.5): the probe sees a chunk's two ends only")
    path = tmp_path / "holey.bin"
    path.write_bytes(pattern(4 * 2**20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if _platform.range_cached(fd, 0, 4 * 2**20) is not False:
            pytest.skip("this file system cannot evict pages")
        for _ in range(3):  # all cached now (a read right after DONTNEED once left a page out in CI)
            os.pread(fd, 4 * 2**20, 0)
            if _platform.range_cached(fd, 0, 4 * 2**20):
                break
        assert _platform.range_cached(fd, 0, 4 * 2**20) is True
        os.posix_fadvise(fd, 2**20, 2**20, os.POSIX_FADV_DONTNEED)  # a hole: [1 MiB, 2 MiB)
        assert _platform.range_cached(fd, 2**20, 2**20) is False
        assert _platform.range_cached(fd, 0, 2**20) is True  # around the hole: still cached
        assert _platform.range_cached(fd, 2 * 2**20, 2 * 2**20) is True
        assert _platform.range_cached(fd, 0, 4 * 2**20) is False
        options = aiosendfile._options.Options()
        device = os.fstat(fd).st_dev
        assert _writer.is_cold(fd, 0, 4 * 2**20, options, device)  # ends are cached, middle is not
        assert not _writer.is_cold(fd, 2 * 2**20, 2 * 2**20, options, device)
    finally:
        os.close(fd)


def test_whole_chunk_probe_of_a_closed_fd_raises(tmp_path: Path) -> None:
    if not _platform.range_cached_available():
        pytest.skip("no cachestat(2) here")
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        _platform.range_cached(fd, 0, 4096)


async def collect(conn: Any, send: Any) -> tuple[Any, bytes]:
    """Run *send()* (which closes the writer) while the client reads everything."""

    async def run() -> Any:
        try:
            return await send()
        finally:
            conn.writer.close()

    task = asyncio.create_task(run())
    data = await conn.read_all()
    return await task, data


async def test_cold_file_goes_through_the_pool_byte_exact(
    connect: Connector, kind: str, tmp_path: Path
) -> None:
    size = 8 * 2**20 + 5
    path = write_cold(tmp_path / "cold.bin", size)
    conn = await connect()
    with open(path, "rb") as f:
        sent, data = await collect(conn, lambda: aiosendfile.sendfile(conn.writer, f, max_chunk=2**20))
    assert sent == size
    assert data == pattern(size, seed=9)
    assert _platform.counters.cold > 0, "no chunk took the cold path"
    assert _platform.counters.bytes == (size if zero_copy_expected(kind) else 0)


class WarmingProbe:
    """A page-cache probe as it is without ``cachestat`` (``range_cached`` cannot tell): the
    first probe of a file finds it cold and, as the 1-byte ``RWF_NOWAIT`` read does, starts its
    pages' read; here the read is done at once, so every later probe finds it cached."""

    def __init__(self) -> None:
        self.probed: set[int] = set()

    def range_cached(self, fd: int, offset: int, size: int) -> None:
        return None

    def page_cached(self, fd: int, offset: int, device: int | None = None) -> bool:
        inode = os.fstat(fd).st_ino
        seen = inode in self.probed
        self.probed.add(inode)
        return seen


@pytest.fixture
def warming_probe(kind: str, monkeypatch: pytest.MonkeyPatch) -> WarmingProbe:
    """:class:`WarmingProbe` in place of the platform's, for the zero-copy connections."""
    if not zero_copy_expected(kind):
        pytest.skip("the copy reads cold chunks in the pool by its own path")
    probe = WarmingProbe()
    monkeypatch.setattr(_platform, "range_cached", probe.range_cached)
    monkeypatch.setattr(_platform, "page_cached", probe.page_cached)
    return probe


@pytest.mark.usefixtures("warming_probe")
async def test_a_chunk_found_cold_goes_to_the_pool_though_its_probe_warmed_it(
    connect: Connector, tmp_path: Path
) -> None:
    """A chunk found cold is sent from the pool, not probed again: the probe itself started the
    read, and a second one would find the first pages and send the chunk on the loop thread.
    Both ways in: a transport's first transfer, and a later one (the straight line)."""
    first, second = tmp_path / "first.bin", tmp_path / "second.bin"
    first.write_bytes(pattern(100_000, seed=1))
    second.write_bytes(pattern(200_000, seed=2))
    conn = await connect()

    async def both() -> list[int]:
        with open(first, "rb") as f, open(second, "rb") as g:
            return [await aiosendfile.sendfile(conn.writer, f), await aiosendfile.sendfile(conn.writer, g)]

    sent, data = await collect(conn, both)
    assert sent == [100_000, 200_000]
    assert data == pattern(100_000, seed=1) + pattern(200_000, seed=2)
    assert _platform.counters.cold == 2, _platform.counters


@pytest.mark.usefixtures("warming_probe")
async def test_a_cold_chunk_whose_pool_send_found_the_socket_full_goes_to_the_pool_again(
    connect: Connector, tmp_path: Path
) -> None:
    """The pool's ``sendfile`` finding the socket full (EAGAIN): after the wait, the same chunk
    goes to the pool again, not probed again (the probe would find the pages its first read
    brought in, and the failed send's read too)."""
    path = tmp_path / "cold.bin"
    path.write_bytes(pattern(300_000, seed=4))
    submitted: list[Any] = []

    class FullOnce(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            submitted.append(fn)
            if len(submitted) == 1:
                full: Future[Any] = Future()
                full.set_exception(BlockingIOError(errno.EAGAIN, "full"))
                return full
            return super().submit(fn, *args, **kwargs)

    conn = await connect()
    with FullOnce(1) as pool, open(path, "rb") as f:
        sent, data = await collect(conn, lambda: aiosendfile.sendfile(conn.writer, f, executor=pool))
    assert (sent, data) == (300_000, pattern(300_000, seed=4))
    assert len(submitted) == 2


async def test_probe_false_trusts_the_cache(connect: Connector, tmp_path: Path) -> None:
    path = write_cold(tmp_path / "cold.bin", 2**20)
    conn = await connect()
    with open(path, "rb") as f:
        sent, data = await collect(conn, lambda: aiosendfile.sendfile(conn.writer, f, probe=False))
    assert (sent, data) == (2**20, pattern(2**20, seed=9))
    assert _platform.counters.cold == 0


async def test_custom_cold_executor_is_used(connect: Connector, tmp_path: Path) -> None:
    path = write_cold(tmp_path / "cold.bin", 3 * 2**20)
    submitted: list[Any] = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            submitted.append(fn)
            return super().submit(fn, *args, **kwargs)

    conn = await connect()
    with Counting(1) as pool, open(path, "rb") as f:
        sent, data = await collect(conn, lambda: aiosendfile.sendfile(conn.writer, f, executor=pool))
    assert sent == 3 * 2**20
    assert data == pattern(3 * 2**20, seed=9)
    assert submitted


async def test_cancel_during_a_cold_chunk_counts_what_the_thread_sent(
    connect: Connector, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread is still sending when the task is cancelled: its bytes must be accounted.

    (Over TLS the pool only reads into a fresh buffer, so cancelling need not wait for it.)
    Every chunk is probed cold: a refused probe starts the file's read-ahead, which could warm
    it before the next probe, and then no chunk went to the pool (seen once in CI, over TLS).
    """
    size = 4 * 2**20
    path = write_cold(tmp_path / "cold.bin", size)
    for module in (_writer, _api):
        monkeypatch.setattr(module, "is_cold", lambda *args, **kwargs: True)
    monkeypatch.setattr(_platform, "pread_cached", lambda fd, size, offset: None)
    entered, release = threading.Event(), threading.Event()

    class Gated(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            def gated() -> Any:
                entered.set()
                release.wait(10)
                return fn(*args, **kwargs)

            return super().submit(gated)

    conn = await connect()
    reader = asyncio.create_task(conn.read_all())
    with Gated(1) as pool, open(path, "rb") as f:
        task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, executor=pool, max_chunk=2**20))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
        task.cancel()
        await asyncio.sleep(0.01)
        if zero_copy_expected(kind):
            assert not task.done()  # it waits for the thread rather than abandon its fd
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        position = f.tell()
    conn.writer.close()
    data = await reader
    if zero_copy_expected(kind):
        assert position > 0  # the gated thread's sendfile ran and was counted
    assert data == pattern(size, seed=9)[:position]


async def test_two_transfers_share_the_loop(connect: Connector, make_file: Any) -> None:
    """Neither of two concurrent transfers to fast readers finishes before the other got far."""
    size = 48 * 2**20
    path = make_file(size)
    conns = [await connect(), await connect()]
    progress: list[list[int]] = [[], []]
    finished_at: dict[int, int] = {}

    def tracker(i: int) -> Any:
        def on_progress(sent: int, total: int | None) -> None:
            progress[i].append(sent)

        return on_progress

    async def one(i: int) -> bytes:
        conn = conns[i]

        async def send() -> int:
            with open(path, "rb") as f:
                n = await aiosendfile.sendfile(conn.writer, f, max_chunk=2**20, on_progress=tracker(i))
            finished_at[i] = progress[1 - i][-1] if progress[1 - i] else 0
            return n

        return (await collect(conn, send))[1]

    results = await asyncio.gather(one(0), one(1))
    assert results == [pattern(size), pattern(size)]
    first = min(finished_at, key=lambda i: len(progress[i]))
    other_share = finished_at[first] / size
    assert other_share >= 0.25, f"the other transfer had sent only {other_share:.0%} when one finished"


@pytest.mark.parametrize("source", ["timer", "io"])
@pytest.mark.parametrize("chunk", ["full", "short"])
async def test_a_task_woken_during_a_chunk_runs_before_the_next_chunk(
    make_file: Any, monkeypatch: pytest.MonkeyPatch, source: str, chunk: str
) -> None:
    """A callback that came due during a chunk, and the task it wakes, run before the next chunk.

    With ``sleep(0)`` after a full chunk the writer was resumed ahead of them:
    on stock asyncio such a task waited for two more chunks (the loop stall
    benchmark's 1 ms ticker was late by about three ``sendfile`` calls), on
    uvloop for one. After a short chunk the writer waits for the socket, and
    stock asyncio ran that readiness ahead of the timers due with it. The sends
    are faked (each chunk "goes" in full, or half of it, into a socket with room),
    so the order does not depend on socket buffers or timing.
    """
    loop = asyncio.get_running_loop()
    events: list[str] = []
    woken: asyncio.Future[None] = loop.create_future()
    rsock, wsock = socket.socketpair()

    def due() -> None:
        events.append("due")
        if source == "io":
            loop.remove_reader(rsock.fileno())
        woken.set_result(None)

    def fake_sendfile(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        events.append("chunk")
        if events.count("chunk") == 4:  # something becomes ready while this chunk is sent
            if source == "timer":
                loop.call_at(loop.time() - 1, due)  # a timer whose deadline passed during the chunk
            else:
                wsock.send(b"x")  # a readable socket, seen by the next poll
                loop.add_reader(rsock.fileno(), due)
        return count if chunk == "full" or count == 1 else count // 2

    async def waiter() -> None:
        await woken
        events.append("woke")

    monkeypatch.setattr(_platform, "sendfile_once", fake_sendfile)
    a, b = socket.socketpair()
    a.setblocking(False)
    with a, b, rsock, wsock, open(make_file(16 * 2**16), "rb") as f:
        task = asyncio.create_task(waiter())
        assert await aiosendfile.sock_sendfile(a, f, max_chunk=2**16, probe=False) == 16 * 2**16
        await task
    armed = 4  # the 4th chunk armed the wake-up: index of the first event after it
    after = events[armed : events.index("woke")]
    assert after == ["due"], f"chunks sent between the wake-up and the woken task: {events}"


@pytest.mark.parametrize(("size", "count"), [(0, None), (1, None), (700_001, None), (700_001, 5)])
async def test_headers_and_trailers_order(
    connect: Connector, kind: str, make_file: Any, size: int, count: Any
) -> None:
    path = make_file(size)
    conn = await connect()
    headers, trailers = b"HTTP/1.1 200 OK\r\n\r\n", b"\r\n0\r\n\r\n"

    async def send() -> int:
        conn.writer.write(b"<before>")
        with open(path, "rb") as f:
            n = await aiosendfile.sendfile(conn.writer, f, 0, count, headers=headers, trailers=trailers)
            assert f.tell() == n
        conn.writer.write(b"<after>")
        return n

    sent, data = await collect(conn, send)
    body = pattern(size)[: count if count is not None else size]
    assert sent == len(body)
    assert data == b"<before>" + headers + body + trailers + b"<after>"
    if zero_copy_expected(kind) and body:
        assert _platform.counters.bytes == len(body)


async def test_headers_and_trailers_on_raw_sockets(make_file: Any) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    loop = asyncio.get_running_loop()
    with a, b, open(make_file(3 * 2**20 + 1), "rb") as f:

        async def recv() -> bytes:
            chunks = []
            while chunk := await loop.sock_recv(b, 2**20):
                chunks.append(chunk)
            return b"".join(chunks)

        reader = asyncio.create_task(recv())
        assert await aiosendfile.sock_sendfile(a, f, headers=b"H" * 100_000, trailers=b"T") == 3 * 2**20 + 1
        a.shutdown(socket.SHUT_WR)
        assert await reader == b"H" * 100_000 + pattern(3 * 2**20 + 1) + b"T"


async def test_progress_callback_totals(connect: Connector, kind: str, make_file: Any) -> None:
    size = 5 * 2**20 + 3
    path = make_file(size)
    calls: list[tuple[int, int | None]] = []
    conn = await connect()
    with open(path, "rb") as f:
        sent, _ = await collect(
            conn,
            lambda: aiosendfile.sendfile(
                conn.writer, f, max_chunk=2**20, on_progress=lambda s, t: calls.append((s, t))
            ),
        )
    assert sent == size
    assert calls[-1] == (size, size)
    assert all(t == size for _, t in calls)
    sents = [s for s, _ in calls]
    assert sents == sorted(set(sents)), "progress must strictly increase"
    assert len(calls) >= size // 2**20  # at least one call per chunk


async def test_bad_tuning_arguments(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    with open(make_file(10), "rb") as f:
        with pytest.raises(ValueError, match="max_chunk"):
            await aiosendfile.sendfile(conn.writer, f, max_chunk=0)
        with pytest.raises(TypeError, match="headers"):
            await aiosendfile.sendfile(conn.writer, f, headers="text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="on_progress"):
            await aiosendfile.sendfile(conn.writer, f, on_progress=3)  # type: ignore[arg-type]
        assert f.tell() == 0
