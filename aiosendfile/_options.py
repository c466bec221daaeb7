"""The tuning surface of one transfer, and the default pool for cold reads.

Defaults:

* ``max_chunk`` 4 MiB per event-loop wakeup (nginx's ``sendfile_max_chunk`` is
  2 MiB). Measured (``benchmarks/loop_stall.py``): the worst loop stall stays
  near 1.5-3 ms, and throughput at 0.91-0.95x of unbounded mode, where 2 MiB
  cost 0.75-0.91x (each ``sendfile`` call and probe has a fixed cost).
* ``probe`` on: before each chunk, ``cachestat(2)`` counts its cached pages
  (with no side effects) and a 1-byte ``RWF_NOWAIT`` read of its last page
  says whether they are readable yet; without ``cachestat``, 1-byte reads of
  its first and last page decide. A cold chunk's
  ``sendfile`` runs in the cold-read pool (still zero-copy, as nginx's
  ``aio threads`` does), so the disk wait never lands on the loop thread.
  Where the probe cannot work, every chunk goes to the pool (the
  conservative path). ``probe=False`` trusts the cache and never offloads.
* The cold-read pool is small and dedicated (4 threads), not the loop's default
  executor, so cold file reads cannot starve ``run_in_executor`` users.
* ``DEFAULT_FALLBACK_CHUNK`` 256 KiB per userspace read or write, where
  zero-copy cannot work (aiohttp uses 256 KiB too): the send side's fallback,
  ``recvfile``'s copy, and the aiohttp responses' ``chunk_size``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from ._state import DEFAULT_MAX_CHUNK

__all__ = (
    "COLD_POOL_THREADS",
    "STREAM_POOL_THREADS",
    "DEFAULT_FALLBACK_CHUNK",
    "DEFAULT_OPTIONS",
    "Options",
    "default_cold_executor",
    "default_stream_executor",
)

COLD_POOL_THREADS = 4
#: Bytes per userspace read/write (aiohttp uses 256 KiB too).
DEFAULT_FALLBACK_CHUNK = 256 * 1024

ProgressCallback = Callable[[int, "int | None"], None]


@dataclass(frozen=True)
class Options:
    """How one transfer runs; built from ``sendfile()``'s keyword arguments."""

    max_chunk: int = DEFAULT_MAX_CHUNK
    probe: bool = True
    executor: Executor | None = None
    on_progress: ProgressCallback | None = None
    headers: bytes = b""
    trailers: bytes = b""

    def __post_init__(self) -> None:
        if isinstance(self.max_chunk, bool) or not isinstance(self.max_chunk, int) or self.max_chunk <= 0:
            raise ValueError(f"max_chunk must be a positive int (got {self.max_chunk!r})")
        for name in ("headers", "trailers"):
            if not isinstance(getattr(self, name), (bytes, bytearray, memoryview)):
                raise TypeError(f"{name} must be bytes-like")
        if self.on_progress is not None and not callable(self.on_progress):
            raise TypeError("on_progress must be callable")

    @property
    def cold_executor(self) -> Executor:
        return self.executor or default_cold_executor()


#: The defaults: the page-cache probe on, the process's cold-read pool. What the straight lines
#: (``_api._straight``, the engine's outlet) probe with, where no call gave options.
DEFAULT_OPTIONS = Options()


class LazyPool:
    """A process-wide thread pool, made on first use (``pool``: None until then)."""

    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self.name = name
        self.pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __call__(self) -> ThreadPoolExecutor:
        with self._lock:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            return self.pool


_cold_pool = LazyPool(COLD_POOL_THREADS, "aiosendfile-cold")


def default_cold_executor() -> ThreadPoolExecutor:
    """The process-wide pool for cold chunks, made on first use."""
    return _cold_pool()


#: Threads for a stream's reads and writes (a pipe, a socket file), which may wait for ever on an
#: idle peer: their own pool, so that such waits hold neither the cold-read pool every file send
#: shares nor the loop's default executor (``getaddrinfo``, ``asyncio.run``'s shutdown).
STREAM_POOL_THREADS = 8
_stream_pool = LazyPool(STREAM_POOL_THREADS, "aiosendfile-stream")


def default_stream_executor() -> ThreadPoolExecutor:
    """The process-wide pool for streams' reads and writes, made on first use."""
    return _stream_pool()
