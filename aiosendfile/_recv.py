"""Zero-copy receive: ``recvfile`` moves bytes from a socket into a file with ``splice(2)``.

Theory of operation
-------------------
* **The path.** socket → pipe → file, both legs ``splice``: the bytes never
  enter userspace. Each transfer borrows a pipe from a small pool. Pipes are
  grown to 1 MiB (``F_SETPIPE_SZ``), so one pipe-full moves per step.
* **Waiting.** The socket is read through a ``dup()`` of its fd (a transport
  owns the original). On EAGAIN we drain the pipe into the file, then wait
  for the duplicate to be readable (``_readiness``), as ``_writer`` waits for writable.
* **Nothing lost, nothing reordered.** The transport's reading is paused, and
  its protocol swapped (``TransportLease(receiving=True)``) before we look at
  the ``StreamReader``. Whatever the reader had already buffered (the start of
  a body that arrived with the headers) goes to the file first, then the
  socket's bytes. We never read past ``count``, so the next message stays in
  the socket for the reader.
* **Consistency.** ``received`` counts bytes that are in the file. Bytes still
  in the pipe when we stop (an error, a cancellation) are written out first,
  so the file always holds exactly ``offset .. offset + received``. A peer
  that closes early raises :class:`IncompleteTransferError` with ``.received``.
* **Fallback.** TLS transports, non-regular files and platforms without
  splice read through the ``StreamReader`` (or ``sock_recv``) and write in
  bounded chunks from the cold-read pool, so a slow disk never blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import stat
import sys
from collections.abc import Callable
from concurrent.futures import Executor
from typing import IO, Any

from . import _platform
from ._errors import IncompleteTransferError, SendfileNotAvailableError, _Progress, map_exceptions
from ._lease import TransportLease
from ._options import default_cold_executor
from ._readiness import wait_ready
from ._target import resolve_socket
from ._threads import shielded

__all__ = ("close_idle_pipes", "recvfile")

PIPE_SIZE = 1024 * 1024
FALLBACK_CHUNK = 256 * 1024
_POOL_LIMIT = 8
_pipes: list[tuple[int, int]] = []


async def recvfile(
    source: Any,
    file: IO[bytes],
    count: int,
    *,
    offset: int | None = None,
    fallback: bool = True,
    executor: Executor | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Receive exactly *count* bytes from *source* into *file*; return *count*.

    *source* is an ``asyncio.StreamReader`` (of a stock asyncio or uvloop
    connection) or a non-blocking stream ``socket.socket``. The bytes go to
    *file* at *offset* (default: its current position). Afterwards the file
    position is ``offset + received``, on success and on error. Errors carry
    ``.received`` (``.sent``) where it applies.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, not {type(count).__name__}")
    if count < 0:
        raise ValueError(f"count must be a non-negative integer (got {count!r})")
    if isinstance(file, io.TextIOBase) or "b" not in getattr(file, "mode", "b"):
        raise ValueError("file should be opened in binary mode")
    if getattr(file, "closed", False):
        raise ValueError("I/O operation on closed file")
    writable = getattr(file, "writable", None)
    if callable(writable) and not writable():
        raise ValueError("file is not open for writing")
    if offset is None:
        offset = file.tell()
    elif isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer (got {offset!r})")
    file_fd = _regular_fd(file)
    reader: asyncio.StreamReader | None = None
    transport: Any = None
    sock_fd = -1
    if isinstance(source, socket.socket):
        target = resolve_socket(source)
        sock_fd = target.sock_fd
    elif isinstance(source, asyncio.StreamReader):
        reader = source
        transport = getattr(reader, "_transport", None)  # StreamReader has no public accessor
        if transport is None:
            raise ValueError("the StreamReader has no transport")
        tls = transport.get_extra_info("sslcontext") is not None
        sock = None if tls else transport.get_extra_info("socket")
        sock_fd = sock.fileno() if sock is not None else -1
    else:
        raise TypeError(
            f"source must be an asyncio.StreamReader or a socket.socket, not {type(source).__name__}"
        )
    zero_copy = _platform.HAS_SPLICE and file_fd is not None and sock_fd >= 0
    if not zero_copy and not fallback:
        raise SendfileNotAvailableError("zero-copy receive is not possible for this source and file")
    progress = _Progress()
    pool = executor or default_cold_executor()
    job = _Job(file, file_fd, offset, count, progress, pool, on_progress)
    try:
        with map_exceptions(progress):
            if count == 0:
                return 0
            if reader is not None and zero_copy:
                await _from_reader_zero_copy(reader, transport, sock_fd, job)
            elif reader is not None:
                await _from_reader_copy(reader, job)
            elif zero_copy:
                await _splice_loop(sock_fd, job, None)
            else:
                await _from_socket_copy(source, job)
    finally:
        with contextlib.suppress(OSError, ValueError):
            file.seek(offset + progress.sent)
    return count


def _regular_fd(file: Any) -> int | None:
    try:
        fd = file.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    file.flush()  # anything the file object buffered goes before our bytes
    if getattr(os, "O_APPEND", 0) and _fd_flags(fd) & os.O_APPEND:
        return None  # positioned writes do not work in append mode: copy instead
    return int(fd)


def _fd_flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


class _Job:
    """One receive: where the bytes go and how many have landed."""

    def __init__(
        self,
        file: Any,
        fd: int | None,
        offset: int,
        count: int,
        progress: _Progress,
        pool: Executor,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        self.file, self.fd, self.offset, self.count = file, fd, offset, count
        self.progress, self.pool, self.on_progress = progress, pool, on_progress

    @property
    def received(self) -> int:
        return self.progress.sent

    @property
    def remaining(self) -> int:
        return self.count - self.progress.sent

    def landed(self, n: int) -> None:
        self.progress.sent += n
        if self.on_progress is not None:
            self.on_progress(self.progress.sent, self.count)

    def incomplete(self) -> IncompleteTransferError:
        return IncompleteTransferError(
            f"the peer closed the connection after {self.received} of {self.count} bytes",
            received=self.received,
            expected=self.count,
        )

    async def write(self, data: bytes) -> None:
        """Write *data* at the current end of what has landed, off the loop thread.

        Cancellation-safe: a write already handed to a thread lands whatever we
        do, so a cancelled caller first waits for it and counts it. The file
        then holds exactly ``offset..offset+received``.
        """
        position = self.offset + self.received
        loop = asyncio.get_running_loop()
        if self.fd is not None:
            pending = loop.run_in_executor(self.pool, _pwrite_all, self.fd, data, position)
        else:
            pending = loop.run_in_executor(self.pool, _write_at, self.file, data, position)
        self.landed(await shielded(pending, lambda written: self.landed(written or 0)))


def _pwrite_all(fd: int, data: bytes, position: int) -> int:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, position)
        view, position = view[n:], position + n
    return len(data)


def _write_at(file: Any, data: bytes, position: int) -> int:
    if file.seekable():
        file.seek(position)
    view = memoryview(data)
    while view:
        n = file.write(view)
        view = view[len(view) if n is None else n :]  # a raw file may take less
    return len(data)


async def _from_reader_zero_copy(
    reader: asyncio.StreamReader, transport: Any, sock_fd: int, job: _Job
) -> None:
    lease = TransportLease(transport, receiving=True)
    lease.acquire()  # reading paused: the reader's buffer can no longer grow
    try:
        buffered: bytearray = reader._buffer  # type: ignore[attr-defined]
        take = min(len(buffered), job.remaining)
        if take:
            data = bytes(buffered[:take])
            del buffered[:take]
            await job.write(data)
        if job.remaining and reader.at_eof():
            raise job.incomplete()
        exc = reader.exception()
        if job.remaining and exc is not None:
            raise exc
        if job.remaining:
            await _splice_loop(sock_fd, job, lease)
    finally:
        lease.release()


def _defuse_py310_tls_resume(reader: asyncio.StreamReader) -> None:
    """CPython 3.10: once a TLS connection is gone, ``StreamReader.read()`` crashes (and drops
    the bytes it took) trying to resume reading on the torn-down TLS layer. There is nothing
    left to resume, so clear the reader's paused flag first: its buffered bytes then read fine."""
    if sys.version_info >= (3, 11):
        return
    ssl_protocol = getattr(getattr(reader, "_transport", None), "_ssl_protocol", None)
    if ssl_protocol is not None and getattr(ssl_protocol, "_transport", True) is None:
        reader._paused = False  # type: ignore[attr-defined]


async def _from_reader_copy(reader: asyncio.StreamReader, job: _Job) -> None:
    while job.remaining:
        _defuse_py310_tls_resume(reader)
        try:
            data = await reader.read(min(FALLBACK_CHUNK, job.remaining))
        except AttributeError as exc:
            # CPython 3.10's TLS transport: StreamReader.read() crashes resuming a
            # transport whose connection is gone (its TLS layer is torn down). That
            # read's bytes are lost inside asyncio; the file still holds `received`.
            if sys.version_info >= (3, 11):
                raise
            raise job.incomplete() from exc
        if not data:
            raise job.incomplete()
        await job.write(data)


async def _from_socket_copy(sock: socket.socket, job: _Job) -> None:
    loop = asyncio.get_running_loop()
    while job.remaining:
        data = await loop.sock_recv(sock, min(FALLBACK_CHUNK, job.remaining))
        if not data:
            raise job.incomplete()
        await job.write(data)


# -- the splice driver --------------------------------------------------------------------


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


async def _splice_loop(sock_fd: int, job: _Job, lease: TransportLease | None) -> None:
    """socket → pipe on the loop thread; pipe → file there too while that cannot block.

    A buffered write into the page cache blocks when the kernel throttles
    writers (too many dirty pages: a disk slower than the network) or when a
    disk read is needed. While ``_platform.page_cache_writes_calm()`` says the
    dirty pages are far from the throttle point, the loop drains the pipe
    itself; otherwise the pool does, with two pipes: while the pool writes one
    into the file, the loop fills the other from the socket. Drains are issued
    in order and one at a time, so what has landed is always the contiguous
    ``offset .. offset+received``.
    """
    loop = asyncio.get_running_loop()
    assert job.fd is not None
    file_fd = job.fd
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
        position = job.offset + job.received
        if draining is None and _platform.page_cache_writes_calm():
            # A buffered write that cannot be throttled is a memory copy: do it here. (The
            # pool's hop costs ~50% more CPU per byte and a third of the throughput.)
            n, exc = _drain(filling.fds[0], file_fd, filling.held, position)
            filling.held -= n
            job.landed(n)
            if exc is not None:
                filling.clean = False
                raise exc
            return
        drain = job.pool.submit(_drain, filling.fds[0], file_fd, filling.held, position)
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
        job.landed(n)
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
        while unread := job.remaining - pending - filling.held:  # bytes still in the socket
            if lease is not None and lease.transport.is_closing():
                lease.check_alive()
            try:
                moved = _platform.splice_once(src, filling.fds[1], min(unread, PIPE_SIZE - filling.held))
            except BlockingIOError:
                moved = -1  # the socket has nothing more for now
            if moved == 0:
                cancelled = await flush()
                raise job.incomplete()
            if moved > 0:
                filling.held += moved
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
                _pwrite_all(fd, data, position + done)
                n = len(data)
            except BlockingIOError as exc:  # the pipe holds the bytes: cannot be empty
                raise OSError(f"pipe unexpectedly empty with {held - done} bytes unaccounted") from exc
            if n == 0:
                raise OSError("splice into the file made no progress")
            done += n
    except OSError as exc:
        return done, exc
    return done, None
