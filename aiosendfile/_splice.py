"""The splice driver of ``recvfile``: socket → pipe → file, with pooled pipes, on the event loop.

Theory of operation
-------------------
* **The path.** socket → pipe → file, both legs ``splice``: the bytes never
  enter userspace. Each transfer borrows pipes from a small pool. Pipes are
  grown to 1 MiB (``F_SETPIPE_SZ``), so one pipe-full moves per step.
* **Waiting.** The socket is read through a ``dup()`` of its fd (a transport
  owns the original). On EAGAIN we drain the pipe into the file, then wait
  for the duplicate to be readable (``_readiness``), as ``_writer`` waits for writable.
* **Where the file write runs.** See :func:`splice_to_file`, and the dirty-page
  policy at the end of this module (:func:`page_cache_writes_calm`).

Only the syscalls themselves (``splice_once``, ``make_pipe``) are in the
platform shim.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time

from . import _platform
from ._lease import TransportLease
from ._readiness import wait_ready
from ._sink import FileSink, pwrite_all

__all__ = ("PIPE_SIZE", "close_idle_pipes", "page_cache_writes_calm", "splice_to_file", "vmstat_is_calm")

PIPE_SIZE = 1024 * 1024
_POOL_LIMIT = 8
_pipes: list[tuple[int, int]] = []


def _take_pipe() -> tuple[int, int]:
    return _pipes.pop() if _pipes else _platform.make_pipe(PIPE_SIZE)


def close_idle_pipes() -> None:
    """Close the pooled pipes (tests, and a forked child, which must not share them)."""
    while _pipes:
        for fd in _pipes.pop():
            with contextlib.suppress(OSError):
                os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=close_idle_pipes)


def _give_back(pipe: tuple[int, int], clean: bool) -> None:
    if clean and len(_pipes) < _POOL_LIMIT:
        _pipes.append(pipe)
    else:
        for fd in pipe:
            os.close(fd)


class _Pipe:
    """A pooled pipe and how many bytes it holds (moved from the socket, not yet in the file)."""

    def __init__(self) -> None:
        self.fds = _take_pipe()
        self.held = 0
        self.clean = True  # False once its state is unknown: closed, not pooled


async def splice_to_file(sock_fd: int, sink: FileSink, lease: TransportLease | None) -> None:
    """socket → pipe on the loop thread; pipe → file there too while that cannot block.

    A buffered write into the page cache blocks when the kernel throttles
    writers (too many dirty pages: a disk slower than the network) or when a
    disk read is needed. While ``page_cache_writes_calm()`` says the
    dirty pages are far from the throttle point, the loop drains the pipe
    itself; otherwise the pool does, with two pipes: while the pool writes one
    into the file, the loop fills the other from the socket. Drains are issued
    in order and one at a time, so what has landed is always the contiguous
    ``offset .. offset+received``.
    """
    loop = asyncio.get_running_loop()
    assert sink.fd is not None
    file_fd = sink.fd
    with contextlib.ExitStack() as undo:  # on a failure half-way (EMFILE), give back what we took
        filling = _Pipe()
        undo.callback(_give_back, filling.fds, True)
        other = _Pipe()
        undo.callback(_give_back, other.fds, True)
        src = os.dup(sock_fd)
        undo.pop_all()
    draining: asyncio.Future[tuple[int, OSError | None]] | None = None  # the pool's drain of `other`
    pending = 0  # bytes in flight to the file

    def start_drain() -> None:
        nonlocal draining, filling, other, pending
        position = sink.state.position
        if draining is None and page_cache_writes_calm():
            # A buffered write that cannot be throttled is a memory copy: do it here. (The
            # pool's hop costs ~50% more CPU per byte and a third of the throughput.)
            n, exc = _drain(filling.fds[0], file_fd, filling.held, position)
            filling.held -= n
            sink.landed(n)
            if exc is not None:
                filling.clean = False
                raise exc
            return
        drain = sink.pool.submit(_drain, filling.fds[0], file_fd, filling.held, position)
        draining = asyncio.wrap_future(drain)
        pending, filling.held = filling.held, 0
        filling, other = other, filling

    async def land() -> bool:
        """Wait for the drain in flight, through cancellations: its bytes left the socket.

        Records what reached the file, raises the drain's error, and returns
        whether a cancellation arrived meanwhile (the caller re-raises it).
        """
        nonlocal draining, pending
        if draining is None:
            return False
        fut, draining = draining, None
        cancelled = False
        while not fut.done():
            try:
                await asyncio.wait([fut])
            except asyncio.CancelledError:
                cancelled = True
        n, exc = (0, OSError("the drain into the file was cancelled")) if fut.cancelled() else fut.result()
        pending = 0
        sink.landed(n)
        if exc is not None:
            other.clean = False
            raise exc
        return cancelled

    async def flush() -> bool:
        """Land everything that left the socket; True if a cancellation arrived meanwhile."""
        cancelled = await land()
        if filling.held:
            start_drain()
            cancelled = await land() or cancelled
        return cancelled

    cancelled = False
    try:
        since_yield = 0
        while unread := sink.remaining - pending - filling.held:  # bytes still in the socket
            if lease is not None and lease.transport.is_closing():
                lease.check_alive()
            try:
                moved = _platform.splice_once(src, filling.fds[1], min(unread, PIPE_SIZE - filling.held))
            except BlockingIOError:
                moved = -1  # the socket has nothing more for now
            if moved == 0:
                cancelled = await flush()
                raise sink.incomplete()
            if moved > 0:
                filling.held += moved
                sink.taken += moved
                since_yield += moved
            # EAGAIN means the socket is empty *or* the pipe is full: a pipe has a slot per
            # page buffer, and socket data can fill the slots well below PIPE_SIZE bytes.
            # Either way, hand this pipe to the pool now.
            if filling.held >= PIPE_SIZE or (moved < 0 and filling.held):
                if await land():
                    raise asyncio.CancelledError
                start_drain()
            if moved < 0:
                await wait_ready(loop, src, lease, writable=False)
                since_yield = 0
            elif since_yield >= PIPE_SIZE * 2:
                await asyncio.sleep(0)  # bounded work per wakeup
                since_yield = 0
        cancelled = await flush()
    finally:
        try:
            # An error or a cancellation too: what left the socket must reach the file.
            cancelled = await flush() or cancelled
        finally:
            for pipe in (filling, other):
                _give_back(pipe.fds, pipe.clean and pipe.held == 0)
            os.close(src)
    if cancelled:
        raise asyncio.CancelledError


def _drain(pipe_r: int, fd: int, held: int, position: int) -> tuple[int, OSError | None]:
    """In the pool: move the *held* bytes of the pipe into the file at *position*.

    Returns the bytes that reached the file and the error that stopped it, if any.
    """
    done = 0
    try:
        while done < held:
            try:
                n = _platform.splice_once(pipe_r, fd, held - done, offset_dst=position + done)
            except _platform.NotSupportedBySendfile:
                # This file system cannot splice into files: copy what the pipe holds.
                data = os.read(pipe_r, held - done)
                pwrite_all(fd, data, position + done)
                n = len(data)
            except BlockingIOError as exc:  # the pipe holds the bytes: cannot be empty
                raise OSError(f"pipe unexpectedly empty with {held - done} bytes unaccounted") from exc
            if n == 0:
                raise OSError("splice into the file made no progress")
            done += n
    except OSError as exc:
        return done, exc
    return done, None


# -- the dirty-page policy: may a file write run on the loop thread? ------------------------


class _Writeback:
    """Whether a write into the page cache can be throttled by the kernel right now.

    Linux makes a writer sleep (``balance_dirty_pages``) once dirty + writeback
    pages pass halfway between the background and the hard dirty thresholds;
    below that a buffered write is a memory copy. We call it calm while dirty +
    writeback stay under a quarter of that point (and of the cgroup v2 memory
    limit's share, inside a container), read from ``/proc/vmstat`` at most every
    ``interval`` seconds for the whole process (about 40 µs a read).
    """

    interval = 0.02

    def __init__(self) -> None:
        self.checked_at = -1.0
        self.calm = False
        self.available = _platform.PLATFORM == "linux" and os.path.exists("/proc/vmstat")
        self.cgroup_dir = _cgroup2_dir() if self.available else None
        try:
            with open("/proc/sys/vm/dirty_ratio", "rb") as f:
                self.dirty_ratio = int(f.read()) or 20
        except (OSError, ValueError):
            self.dirty_ratio = 20

    def is_calm(self) -> bool:
        if not self.available:
            return False
        now = time.monotonic()
        if now - self.checked_at < self.interval:
            return self.calm
        self.checked_at = now
        try:
            self.calm = self._measure()
        except (OSError, ValueError, KeyError):
            self.calm = False
        return self.calm

    def _measure(self) -> bool:
        with open("/proc/vmstat", "rb") as f:
            if not vmstat_is_calm(f.read()):
                return False
        if self.cgroup_dir is None:
            return True
        with open(os.path.join(self.cgroup_dir, "memory.max"), "rb") as f:
            limit = f.read().strip()
        if limit == b"max":
            return True
        with open(os.path.join(self.cgroup_dir, "memory.stat"), "rb") as f:
            mstat = dict(line.split()[:2] for line in f.read().splitlines())
        cg_dirty = int(mstat[b"file_dirty"]) + int(mstat[b"file_writeback"])
        return cg_dirty < int(limit) * self.dirty_ratio // 100 // 4


_VMSTAT_FIELDS = re.compile(
    rb"^(nr_dirty|nr_writeback|nr_dirty_threshold|nr_dirty_background_threshold) (\d+)$", re.M
)


def vmstat_is_calm(vmstat: bytes) -> bool:
    """From ``/proc/vmstat``'s text: dirty + writeback pages under a quarter of the throttle point."""
    stats = dict(_VMSTAT_FIELDS.findall(vmstat))
    dirty = int(stats[b"nr_dirty"]) + int(stats[b"nr_writeback"])
    freerun = (int(stats[b"nr_dirty_threshold"]) + int(stats[b"nr_dirty_background_threshold"])) // 2
    return dirty < freerun // 4


def _cgroup2_dir() -> str | None:
    """This process's cgroup v2 directory, if it has a memory controller file there."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    path = os.path.join("/sys/fs/cgroup", line[3:].strip().lstrip("/"))
                    return path if os.path.exists(os.path.join(path, "memory.max")) else None
    except OSError:
        pass
    return None


_writeback = _Writeback()


def page_cache_writes_calm() -> bool:
    """Whether a buffered file write is (very likely) a memory copy now, not a throttled wait.

    False where it cannot tell (not Linux): callers then write off the event-loop thread.
    """
    return _writeback.is_calm()
