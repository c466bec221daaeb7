"""Test data and the disk under it: position-dependent bytes, the load tests' download mix,
page-cache eviction, a slow disk, the ways a served file changes between two requests."""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import _platform


def pattern(size: int, seed: int = 0) -> bytes:
    """Deterministic, position-dependent bytes: misordered or repeated chunks show up. Sizes up
    to 16 MiB are kept (the most recent 16): the suite asks for the same few thousands of times."""
    return _kept_pattern(size, seed) if size <= 16 * 2**20 else _pattern(size, seed)


def _pattern(size: int, seed: int) -> bytes:
    block = bytes((i * 7 + seed) & 0xFF for i in range(251))  # prime length
    reps = size // len(block) + 1
    return (block * reps)[:size]


_kept_pattern = functools.lru_cache(maxsize=16)(_pattern)


#: The ways a served file changes between two requests (the answer caches' stale-file tables): each
#: must make a door that answered it before from its answer cache decide it again.
CHANGES = ["in place", "renamed over", "truncated", "grown", "chmod", "symlink out"]


def change_file(path: Path, change: str, outside: Path) -> None:
    """Apply *change* (one of :data:`CHANGES`) to *path*; ``symlink out`` points it at *outside*.
    Its mtime is first set far back, so the change gets a new one whatever the clock says."""
    size = path.stat().st_size
    os.utime(path, ns=(1, 1))
    if change == "in place":
        with open(path, "r+b") as f:
            f.write(b"X")  # same inode, same size
    elif change == "renamed over":
        fresh = path.with_name("fresh.tmp")
        fresh.write_bytes(b"Y" * size)  # same size: another inode
        fresh.replace(path)
    elif change == "truncated":
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    elif change == "grown":
        with open(path, "ab") as f:
            f.write(b"more")
    elif change == "chmod":
        path.chmod(0)  # (as root the file stays readable; its fields are decided again)
    elif change == "symlink out":
        path.unlink()
        path.symlink_to(outside)
    else:
        raise ValueError(change)


# (size, how many): 1,000 downloads, about 640 MB in all (test_stress's and test_serve_load's mix).
DOWNLOAD_MIX = [
    (1_000, 200),
    (30_000, 250),
    (65_536, 100),  # the largest body sent inline with the headers
    (200_000, 200),
    (1_000_000, 150),
    (4_000_000, 70),
    (8_000_000, 30),
]


def write_download_mix(root: Path) -> dict[int, str]:
    """One file ``f{size}.bin`` a size of ``DOWNLOAD_MIX`` in *root*; their sha256 by size."""
    digests = {}
    for size, _ in DOWNLOAD_MIX:
        data = pattern(size, seed=size % 251)
        (root / f"f{size}.bin").write_bytes(data)
        digests[size] = hashlib.sha256(data).hexdigest()
    return digests


def download_sizes(n: int) -> list[int]:
    """*n* downloads (a multiple of 1,000 / 10) in ``DOWNLOAD_MIX``'s proportions, interleaved so
    big and small transfers overlap."""
    sizes = [size for size, count in DOWNLOAD_MIX for _ in range(count * n // 1000)]
    assert len(sizes) == n
    return sizes[::2] + sizes[1::2][::-1]


def evict(path: Path) -> None:
    """Drop *path*'s pages from the page cache (fsync + ``POSIX_FADV_DONTNEED``), or skip the test.

    The check counts the pages with ``cachestat(2)`` (the package's, else the tests' own binding:
    an install without the C module runs the same tests), with no side effect: a 1-byte
    ``RWF_NOWAIT`` probe of a missing page would start readahead and warm the file again.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        pages = _pages_cached(fd, 4096)
        cached = (pages > 0) if pages is not None else _platform.page_cached(fd, 0)
        if cached is not False:
            pytest.skip("this file system cannot evict pages or cannot probe them")
    finally:
        os.close(fd)


def _pages_cached(fd: int, size: int) -> int | None:
    """Pages of *fd*'s first *size* bytes in the page cache (``cachestat(2)``), or None where it
    cannot be asked. Through ``ctypes`` where the package has no C module (tests only: the
    request path never imports it)."""
    if _platform.range_cached_available():
        return _platform._cachestat.call(fd, 0, size)  # type: ignore[misc]
    if _platform.PLATFORM != "linux" or os.uname().machine not in ("x86_64", "aarch64"):
        return None
    import ctypes

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    rng, st = (ctypes.c_uint64 * 2)(0, size), (ctypes.c_uint64 * 5)()
    if syscall(ctypes.c_long(451), fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        return None  # (a kernel before 6.5, a filter)
    return int(st[0])


class SlowDisk(ThreadPoolExecutor):
    """A pool whose jobs (those *slow* picks) first sleep *delay*: a disk that takes its time.

    ``started`` is set when a slow job begins, and ``threads`` holds the threads they ran on.
    """

    def __init__(self, workers: int, delay: float, slow: Callable[[Any], bool] = lambda fn: True) -> None:
        super().__init__(workers)
        self.delay, self.slow = delay, slow
        self.started = threading.Event()
        self.threads: set[int] = set()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            if self.slow(fn):
                self.threads.add(threading.get_ident())
                self.started.set()
                time.sleep(self.delay)
            return fn(*args, **kwargs)

        return super().submit(run)


def far_future_tree() -> Path:
    """A tree on tmpfs holding ``far.txt``, modified in the year 11476 (tmpfs keeps such a time;
    ext4 stops at 2446), or skip. The caller removes its parent."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    root = Path(tempfile.mkdtemp(dir="/dev/shm")) / "www"
    root.mkdir()
    far = root / "far.txt"
    far.write_bytes(b"x" * 100)
    try:
        os.utime(far, (300_000_000_000, 300_000_000_000))
    except (OSError, OverflowError):
        pytest.skip("this file system keeps no such time")
    if os.stat(far).st_mtime < 253_402_300_800:  # (clamped: past the year 9999 it is not)
        pytest.skip("this file system keeps no such time")
    return root
