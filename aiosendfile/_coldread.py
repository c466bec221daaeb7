"""Reading a range of a regular file without waiting for the disk on the event-loop thread.

One rule, shared by the userspace fallback (``ChunkReader``) and the aiohttp
``FileResponse``: a range whose pages are all in the page cache is read on
the loop (one ``RWF_NOWAIT`` read, ``_platform.pread_cached``, which reads
the bytes when they are there); any other range is read in the cold-read
pool (``_options.default_cold_executor`` unless the caller has its own), never
in the loop's default executor, so a slow disk cannot starve
``run_in_executor`` users. Where the platform cannot tell (no ``RWF_NOWAIT``),
every read goes to the pool: the conservative choice.

:func:`read_ahead` asks the kernel to start reading a range in, from the read-ahead thread: never
from the loop's, where submitting the read may wait in the block layer (for a request slot while
the pool's reads fill the device's queue, or for memory) for milliseconds.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from concurrent.futures import Executor

from . import _platform
from ._options import default_cold_executor
from ._threads import in_pool

__all__ = ("read_ahead", "read_range")


async def read_range(
    fd: int, size: int, offset: int, executor: Executor | None = None, *, probe: bool = True
) -> bytes | bytearray:
    """Up to *size* bytes of *fd* at *offset* (fewer only at end of file), in a new buffer.

    On the loop if the pages are cached, else in *executor* (default: the cold-read
    pool). ``probe=False`` trusts the cache and always reads on the loop. A read already
    running in a thread when we are cancelled is waited for, so the caller may close
    *fd* as soon as this returns or raises.
    """
    if not probe:
        return os.pread(fd, size, offset)
    data = _platform.pread_cached(fd, size, offset)
    if data is not None:
        return data
    _platform.went_to_pool(fd)
    return await in_pool(executor or default_cold_executor(), os.pread, fd, size, offset)


class _ReadAhead:
    """One daemon thread that asks the kernel to read ranges in (``POSIX_FADV_WILLNEED``).

    Each range comes with a duplicate of its file's fd, which the thread closes once the read is
    asked: the caller may close its own at once. Ranges asked from a loop go to the thread
    together at the loop's next turn, so a burst of cold files costs the thread one wake-up and
    one hand-off of the GIL, not one each (measured on the cold mixed set, a wake-up per file
    cost about a fifth of ``serve``'s requests a second). A batch whose loop closed before its
    turn goes with the next range asked from any other loop. A forked child starts its own thread.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[tuple[int, int, int]]] | None = None
        self._pid = 0
        self._batch: list[tuple[int, int, int]] = []
        self._batch_loop: asyncio.AbstractEventLoop | None = None  # whose next turn sends it
        self._lock = threading.Lock()  # (loops in several threads may ask at once)

    def ask(self, fd: int, offset: int, size: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        _platform.started_reading(fd)
        item = (os.dup(fd), offset, size)
        alone: list[tuple[int, int, int]] = [item]  # (sent now unless a loop's turn will send it)
        with self._lock:
            if loop is not None and self._batch_loop is loop:
                self._batch.append(item)
                return
            earlier, self._batch, self._batch_loop = self._batch, [], None
            if loop is not None:
                try:
                    loop.call_soon(self._flush)
                except RuntimeError:  # the loop is closed
                    pass
                else:
                    self._batch, self._batch_loop, alone = alone, loop, []
        if earlier:  # (its loop closed before its turn, or is another loop: sent now)
            self._put(earlier)
        if alone:
            self._put(alone)

    def _flush(self) -> None:
        with self._lock:
            batch, self._batch, self._batch_loop = self._batch, [], None
        if batch:
            self._put(batch)

    def _put(self, batch: list[tuple[int, int, int]]) -> None:
        q = self._queue
        if q is None or self._pid != os.getpid():
            with self._lock:
                q = self._queue
                if q is None or self._pid != os.getpid():
                    self._queue = q = queue.SimpleQueue()
                    self._pid = os.getpid()
                    thread = threading.Thread(
                        target=self._run, args=(q,), name="aiosendfile-read-ahead", daemon=True
                    )
                    thread.start()
        q.put(batch)

    @staticmethod
    def _run(q: queue.SimpleQueue[list[tuple[int, int, int]]]) -> None:
        while True:
            for fd, offset, size in q.get():
                try:
                    _platform.read_ahead(fd, offset, size)
                finally:
                    os.close(fd)


#: ``read_ahead(fd, offset, size, loop=None)``: have the kernel start reading [offset,
#: offset+size) of *fd* in, from the read-ahead thread, at *loop*'s next turn (at once without
#: one). Nothing waits for it; *fd* is duplicated first, so the caller may close it at once.
read_ahead = _ReadAhead().ask
