"""The test files: making them, warming them, evicting them, and checking their page-cache state.

A trial's numbers depend on whether the file is in the page cache: ``cache_state`` makes it
cold or warm right before the transfer and counts its resident pages (``mincore``), so a trial
that could not get the state it needs fails instead of measuring the wrong thing. The HTTP
benchmark's mixed set is many files at once: ``make_mixed_set`` writes them (sizes from a
seeded distribution) and ``evict_files`` drops them all and counts what stayed.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import MiB, TrialError


def make_file(directory: str, size: int) -> str:
    """A real (non-sparse) file of random-looking bytes: one random MiB, repeated."""
    block = os.urandom(MiB)
    path = os.path.join(directory, "payload.bin")
    with open(path, "wb") as f:
        left = size
        while left:
            left -= f.write(block[: min(left, MiB)])
        f.flush()
        os.fsync(f.fileno())
    return path


def warm(path: str) -> float:
    """Read the file once so every trial reads from the page cache; return seconds taken."""
    t0 = time.perf_counter()
    view = memoryview(bytearray(8 * MiB))
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - t0


def mincore(fd: int, size: int) -> bytes | None:
    """Per page of the file, whether it is in the page cache (mincore on a mapping); None if unknown.

    Unlike a read probe this has no side effects: ``preadv(RWF_NOWAIT)`` on a
    missing page starts readahead of it (Linux >= 5.9), so probing would warm the file.
    """
    try:
        import ctypes
        import mmap

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (ImportError, OSError, AttributeError):
        return None
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return None
    try:
        vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
        if libc.mincore(addr, size, vec) != 0:
            return None
        return bytes(b & 1 for b in vec.raw)
    finally:
        libc.munmap(addr, size)


def resident_ranges(resident: bytes, limit: int = 4) -> str:
    """The first *limit* runs of resident pages, as byte ranges in MiB, for error messages."""
    runs: list[str] = []
    page = os.sysconf("SC_PAGE_SIZE")
    start = None
    for i, flag in enumerate([*resident, 0]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append(f"{start * page / MiB:g}-{i * page / MiB:g} MiB")
            start = None
    return ", ".join(runs[:limit]) + (", ..." if len(runs) > limit else "")


def flush_deferred_skbs() -> None:
    """Run a little loopback TCP on each CPU, so skbs of earlier transfers release the file's pages.

    TCP frees a consumed skb on the CPU that allocated it: it waits on that
    CPU's defer list (``net.core.skb_defer_max``) until the CPU next runs
    network receive work. Such an skb from a sendfile still references page-cache
    pages (seen here: the file's last 2 MiB folio), and ``FADV_DONTNEED`` cannot
    drop a page with extra references. It stays pinned until that CPU next sees traffic.
    """
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = os.sched_getaffinity(0)
    try:
        for cpu in sorted(cpus):
            os.sched_setaffinity(0, {cpu})
            with (
                socket.create_server(("127.0.0.1", 0)) as listener,
                socket.create_connection(listener.getsockname()) as a,
                listener.accept()[0] as b,
            ):
                for _ in range(16):
                    a.sendall(b"x" * 1024)
                    b.recv(4096)
    finally:
        os.sched_setaffinity(0, cpus)


CACHE_STATE_ERROR = "page cache not "  # how run_trial's error starts when it could not make the cache state


def cache_state(path: str, *, evict: bool) -> tuple[bytes | None, int]:
    """Make *path* cold (``evict``) or warm in the page cache; return (``mincore``, file pages).

    Cold: ``posix_fadvise(DONTNEED)`` (the file was fsynced, so every page can
    go, once ``flush_deferred_skbs`` has released the last transfer's pages),
    then a 1-byte ``preadv(RWF_NOWAIT)`` at offset 0 must raise
    ``BlockingIOError``. That probe starts a readahead, and pages still under
    I/O cannot be dropped, so the file is evicted again every 20 ms until
    ``mincore`` counts nothing left (or 2 s pass: the caller sees the count).
    Warm: read the whole file (from memory if it is already cached), then count
    (all pages expected).
    """
    size = os.path.getsize(path)
    pages = (size + os.sysconf("SC_PAGE_SIZE") - 1) // os.sysconf("SC_PAGE_SIZE")
    if not evict:
        warm(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        if evict:
            flush_deferred_skbs()
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
            except BlockingIOError:
                pass
            else:
                raise TrialError(f"{CACHE_STATE_ERROR}cold: offset 0 still cached after POSIX_FADV_DONTNEED")
            deadline = time.monotonic() + 2.0
            while True:
                time.sleep(0.02)  # let the probe's readahead I/O finish
                flush_deferred_skbs()
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                resident = mincore(fd, size)
                if resident is None or not any(resident) or time.monotonic() > deadline:
                    return resident, pages
        return mincore(fd, size), pages
    finally:
        os.close(fd)


def mixed_sizes(count: int, seed: int, *, median: int, sigma: float, low: int, high: int) -> list[int]:
    """``count`` file sizes, log-normal around ``median`` bytes (``sigma`` in ln), clamped to [low, high].

    Seeded, so every run makes the same set. Web assets are mostly small with a long tail of big
    ones; a log-normal is the usual model of that.
    """
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(high, max(low, int(rng.lognormvariate(mu, sigma)))) for _ in range(count)]


def make_mixed_set(root: str, sizes: list[int], seed: int, *, subdir: str = "mixed") -> list[str]:
    """Write one file per size under ``root/subdir/dNN/fNNNNN.bin`` (100 files a folder); their URL paths.

    Contents are slices of one random 2 MiB block at seeded offsets (real, non-sparse data).
    Everything is flushed to disk (``os.sync``) so that ``evict_files`` can drop every page.
    """
    rng = random.Random(seed)
    block = os.urandom(2 * MiB)
    paths = []
    for i, size in enumerate(sizes):
        rel = f"{subdir}/d{i // 100:02d}/f{i:05d}.bin"
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        offset = rng.randrange(len(block) - size + 1)
        with open(full, "wb") as f:
            f.write(block[offset : offset + size])
        paths.append("/" + rel)
    os.sync()
    return paths


def evict_files(paths: list[str], *, attempts: int = 5) -> tuple[int, int]:
    """Drop every page of ``paths`` from the page cache; return (resident pages left, pages in all).

    ``flush_deferred_skbs`` first (pages an earlier transfer's skbs still hold cannot be
    dropped), then ``POSIX_FADV_DONTNEED`` on each file, counted with ``mincore``; repeated
    up to ``attempts`` times while pages remain. Resident -1: ``mincore`` is not available.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for _ in range(attempts):
        flush_deferred_skbs()
        resident = total = 0
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += (size + page - 1) // page
                if size:
                    pages = mincore(fd, size)
                    if pages is None:
                        resident = -1
                    elif resident >= 0:
                        resident += sum(pages)
            finally:
                os.close(fd)
        if resident <= 0:
            break
        time.sleep(0.05)
    return resident, total


def cold_read_us(paths: list[str], *, count: int = 16) -> float | None:
    """The median time of a 4 KiB read of a file just evicted, in µs, over *count* files of
    *paths* (evicted again after): what a cold read costs on this disk now. On a VM it may be
    the host's page cache (tens of µs) or its disk (ms), and it changes from run to run: a
    server that blocks on the disk (nginx) loses little in the first case, much in the second."""
    picked = random.sample(paths, min(count, len(paths)))
    times = []
    for path in picked:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            start = time.perf_counter()
            os.pread(fd, 4096, 0)
            times.append((time.perf_counter() - start) * 1e6)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return statistics.median(times) if times else None


def storage_info(path: str) -> dict[str, Any]:
    """The block device under *path*: readahead, scheduler, rotational (what a cold read depends on)."""
    st = os.stat(path)
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    info: dict[str, Any] = {"dev": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"}
    try:
        real = dev.resolve(strict=True)
    except OSError:
        return info
    info["name"] = real.name
    queue = real / "queue" if (real / "queue").exists() else real.parent / "queue"
    for key in ("read_ahead_kb", "scheduler", "rotational", "nr_requests", "max_sectors_kb"):
        with contextlib.suppress(OSError):
            info[key] = (queue / key).read_text().strip()
    return info
