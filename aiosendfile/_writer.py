"""The event-loop driver of zero-copy ``sendfile``.

Theory of operation
-------------------
* **Waiting on a transport-owned socket.** Both asyncio and uvloop refuse
  ``add_writer()`` on a fd a transport owns. We ``dup()`` the socket fd and
  register the duplicate instead: it is a separate fd in the loop's poller
  (epoll/kqueue keys on the fd), so nothing of the transport's own
  registration is touched. Every ``sendfile`` call goes to the duplicate too.
  If another task closes the transport, the original fd number may be reused
  at once for an unrelated file. Our duplicate still refers to this
  connection's socket, so a byte can never reach the wrong fd.
* **Byte order.** Before the first ``sendfile`` the caller has flushed the
  transport's buffer (see ``_lease``), so the file follows everything written
  before. While we run, writes on the transport are refused (where they
  can be intercepted). After we return, the transport's buffer is empty and
  later writes follow the file.
* **Bounded work per wakeup.** One attempt moves at most ``max_chunk`` bytes.
  After a full chunk we yield behind every timer and I/O callback that came
  due meanwhile, and behind the tasks they wake (``yield_to_others``), so a
  waiting task is late by at most the chunk in progress. After a short one
  the socket buffer is full, so we wait until the poller says it is writable
  again (``wait_ready``). That wait yields too, and it avoids a string of
  tiny sends. Both waits live in ``_readiness``, shared with the splice driver.
* **Resuming.** The file offset is ours (``TransferState.position``) and goes
  to ``sendfile`` explicitly, so the file's own position is never read.
  After EAGAIN we simply try again from the same offset. The job's
  ``TransferState`` is the transfer's one byte count (an error's ``.sent``
  is read from it), advanced here as the kernel takes bytes, including a cold
  chunk that a thread finishes after we were cancelled.
* **Cold pages.** Before a chunk, ``cachestat(2)`` counts its pages in the
  page cache (no side effects), and a 1-byte ``RWF_NOWAIT`` read of its last
  page says whether the pages are readable yet (pages still being read in are
  in the cache but not ready). A read's pages may come in out of order, so
  every page is checked (one ``RWF_NOWAIT`` read of the chunk into a scratch
  buffer) where the caller had the chunk read ahead a moment ago, and while any
  read this process started may still be bringing pages in. Without
  ``cachestat`` (Linux < 6.5, BSD) the first and last page are probed. If any
  page is missing, that chunk's ``sendfile`` runs in the cold-read pool (see
  ``_options``), so the disk wait happens off the loop thread, and it is not
  probed again until the pool has sent it (``SendJob.cold``): without
  ``cachestat`` a probe is a read that starts bringing the pages in, and a
  second probe would find the first ones and send the chunk on the loop. The
  transfer stays zero-copy. (Measured and
  dropped: a ``POSIX_FADV_WILLNEED`` of the next chunk from the pool halved
  cold throughput and doubled CPU; see ``benchmarks/loop_stall.py``.)
* **Headers and trailers** go to the same socket with ``send()``. On Linux
  the headers are flagged ``MSG_MORE``, so they wait to share a packet with
  the file's first bytes, and the trailers follow the file's last chunk
  (which ``sendfile`` pushes) unflagged: no ``setsockopt`` per transfer. If
  the transfer ends, however it ends, right after a flagged send, the held
  bytes are pushed at once (``_platform.push``) instead of after the kernel's
  200 ms. Elsewhere (BSD, macOS) both go inside ``TCP_NOPUSH``, released when
  the transfer ends, however it ends.
* **Starting at once.** ``send_at_once`` runs before the caller's first
  await, when nothing is buffered ahead of us (the transport's buffer is
  empty): headers, one chunk (probed as any other) and trailers go straight
  to the target's own fd, borrowed for those few calls (nothing else runs
  meanwhile, so its number cannot be reused under us). No dup, no waiter, no
  lease: a response the socket takes whole costs no event-loop machinery.
  Whatever is left (socket full, a full chunk sent, a cold chunk) goes on in
  ``send_zero_copy``, told how to begin (wait, yield, or go). Only the
  caller's ``on_progress`` could write meanwhile, so with one, ``_api`` starts
  at once only where a lease could not refuse that write either (a bare
  uvloop transport); elsewhere the lease comes first, as before.
* **Cleanup.** Every wait removes its writer registration in ``finally``, and
  the duplicate socket is closed in ``finally``, on errors and cancellation alike.
  The duplicate is made only when a wait may be needed; it is created with its
  type and protocol given (the family comes from the ``getsockname`` CPython
  makes anyway) and keeps its ``None`` timeout (the fd is non-blocking
  already), which saves the ``getsockopt``/``ioctl`` calls of a bare ``socket(fileno=)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Literal

from . import _platform, _reading_in
from ._job import SendJob
from ._lease import TransportLease
from ._options import Options
from ._readiness import wait_ready, yield_to_others
from ._threads import settled

__all__ = ("Start", "is_cold", "send_at_once", "send_zero_copy")

#: How the loop-driven part begins after ``send_at_once``: wait until the socket is
#: writable, yield to others (a full chunk went), or go at once.
Start = Literal["wait", "yield", "go"]


def send_at_once(job: SendJob) -> Start | None:
    """Send what the socket takes now, synchronously, on the target's own fd; None when all went.

    Call it before any await, and only when nothing is buffered ahead of the
    file (a transport's buffer is empty). Sends the rest of the headers, at most
    one chunk (a cold one is left to the pool), and the trailers. Otherwise
    returns how ``send_zero_copy`` is to go on. Raises as ``send_zero_copy``.
    """
    options = job.options
    if (options.headers or options.trailers) and not _platform.HAS_MSG_MORE:
        return "go"  # BSD/macOS: headers and trailers inside TCP_NOPUSH, set once, in send_zero_copy
    target = job.target
    sock = target.sock if target.sock is not None else _platform.borrow_socket(target.sock_fd)
    try:
        return _send_now(job, sock)
    except BaseException:
        if job.held:
            _platform.push(sock)
        raise
    finally:
        if target.sock is None:
            sock.detach()  # the transport's fd: never ours to close


def _send_now(job: SendJob, sock: socket.socket) -> Start | None:
    state, file_fd = job.state, job.file.fd
    assert file_fd is not None  # zero-copy needs a regular file's fd
    if not _frame_sent(job, sock, trailers=False):
        return "wait"
    if not state.done:
        size = state.next_chunk()
        position = state.position
        if _found_cold(job, position, size):
            return "go"  # the pool sends it
        try:
            n = _platform.sendfile_once(sock.fileno(), file_fd, position, size)
        except BlockingIOError:
            return "wait"
        _advance(job, n)
        if n < size:
            return "wait"
        if not state.done:
            return "yield"
    if not _frame_sent(job, sock, trailers=True):
        return "wait"
    return None


def _frame_sent(job: SendJob, sock: socket.socket, *, trailers: bool) -> bool:
    """Whether the headers (or trailers) are all sent, after one send of their unsent rest if any."""
    data = job.options.trailers if trailers else job.options.headers
    if _unsent(job, data, trailers=trailers):
        try:
            _send_some(job, sock, data, trailers=trailers)
        except BlockingIOError:
            return False
    return not _unsent(job, data, trailers=trailers)


def _unsent(job: SendJob, data: bytes, *, trailers: bool) -> bool:
    return (job.trailers_sent if trailers else job.headers_sent) < len(data)


async def send_zero_copy(job: SendJob, lease: TransportLease | None = None, start: Start = "go") -> None:
    """Send the rest of the job's headers, its ``state``'s remaining bytes of the file, then its trailers.

    *start* says how to begin: what ``send_at_once`` returned, or ``"go"``.
    Raises ``_platform.NotSupportedBySendfile`` (before or after some bytes;
    ``state.sent`` says which), ``FileTruncatedError``, or the OS error.
    """
    options = job.options
    loop = asyncio.get_running_loop()
    # Ours: closed below, whatever happens. Its timeout is None unless socket.setdefaulttimeout()
    # was called: then clear it, or send() would wait.
    out = socket.socket(-1, socket.SOCK_STREAM, 0, fileno=os.dup(job.target.sock_fd))
    corked = False
    try:
        if out.gettimeout() is not None:
            out.setblocking(False)
        if start == "wait":
            await _wait_writable(loop, out.fileno(), lease)
        elif start == "yield":
            await yield_to_others(loop)
        if (options.headers or options.trailers) and not _platform.HAS_MSG_MORE:
            corked = _platform.set_cork(out, True)
        await _send_all(loop, job, out, lease, trailers=False)
        await _send_file(loop, out, job, lease)
        await _send_all(loop, job, out, lease, trailers=True)
    except BaseException:
        if job.held:
            _platform.push(out)
        raise
    finally:
        if corked:
            with contextlib.suppress(OSError):
                _platform.set_cork(out, False)  # flush what the cork holds
        out.close()


def _advance(job: SendJob, n: int) -> None:
    """Count *n* file bytes the kernel took; 0 is an end of file before the promised total."""
    state = job.state
    if n == 0:
        raise state.truncated()
    state.advance(n)
    job.held = False  # sendfile's last segment goes out unflagged, pushing the headers with it
    on_progress = job.options.on_progress
    if on_progress is not None:
        on_progress(state.sent, state.total)


def _send_some(job: SendJob, sock: socket.socket, data: bytes, *, trailers: bool) -> None:
    """One ``send`` of the unsent rest of the headers (flagged *more*) or of the trailers."""
    if trailers:
        job.trailers_sent += _platform.send_once(sock, memoryview(data)[job.trailers_sent :])
        job.held = False
    else:
        job.headers_sent += _platform.send_once(sock, memoryview(data)[job.headers_sent :], more=True)
        job.held = _platform.HAS_MSG_MORE


async def _send_file(
    loop: asyncio.AbstractEventLoop, out: socket.socket, job: SendJob, lease: TransportLease | None
) -> None:
    state, options, file_fd = job.state, job.options, job.file.fd
    assert file_fd is not None
    out_fd = out.fileno()
    while not state.done:
        if lease is not None:
            lease.check_alive()
        size = state.next_chunk()
        position = state.position
        try:
            if _found_cold(job, position, size):  # (still so while the pool's send finds the socket full)
                _platform.went_to_pool(file_fd)
                send = _platform.sendfile_once
                pool_job = options.cold_executor.submit(send, out_fd, file_fd, position, size)
                pending = asyncio.wrap_future(pool_job)
                try:
                    n = await asyncio.shield(pending)
                    job.cold = False
                except asyncio.CancelledError:
                    if not pool_job.cancel():
                        # The thread is already sending on our fd: count what it sends, then stop.
                        sent = await settled(pending) or 0
                        if sent:
                            state.advance(sent)
                            job.held = False
                    raise
            else:
                n = _platform.sendfile_once(out_fd, file_fd, position, size)
        except BlockingIOError:
            await _wait_writable(loop, out_fd, lease)
            continue
        _advance(job, n)
        if state.done:
            break
        if n < size:
            await _wait_writable(loop, out_fd, lease)
        else:
            await yield_to_others(loop)


def _found_cold(job: SendJob, position: int, size: int) -> bool:
    """Whether the job's next chunk is cold: probed once, then remembered (``SendJob.cold``) until
    the pool has sent it."""
    if not job.cold:
        assert job.file.fd is not None
        job.cold = is_cold(job.file.fd, position, size, job.options)
    return job.cold


def is_cold(
    file_fd: int,
    position: int,
    size: int,
    options: Options,
    device: int | None = None,
    *,
    read_in: bool = False,
    key: tuple[int, int] | None = None,
) -> bool:
    """Whether this chunk's sendfile may wait for the disk (and so belongs in the pool).

    *device* (the file's ``st_dev``) only spares ``page_cached`` an ``fstat`` where a file system refused.
    *read_in*: the caller had the chunk read ahead a moment ago, so any of its pages may still be
    on the way (a throttled or busy device completes a read's pages out of order): every page is
    checked, not only the last (``range_readable``: a copy of the chunk into a scratch buffer). The
    same while a read this process started of the same file may still be bringing pages in
    (``_reading_in.reading_in``: another connection's), and only then: a server with every file
    cached pays nothing for it, nor does one file for another's cold read. *key*: the file's
    device and inode, if the caller knows them (``_reading_in.reading_in`` then needs no ``fstat``).
    """
    if not options.probe:
        return False
    last = position + size - 1
    whole = _platform.range_cached(file_fd, position, size)
    if whole is not None:
        if not whole:
            return True
        if read_in or _reading_in.reading_in(file_fd, key):
            every = _platform.range_readable(file_fd, position, size)
            if every is not None:  # (it read every page, the last one too: no probe after it)
                return not every
        # All pages present: ready unless the last is still being read in.
        return _platform.page_cached(file_fd, last, device) is False
    first = _platform.page_cached(file_fd, position, device)
    if first is None:
        return True  # cannot tell: the conservative path
    return not (first and _platform.page_cached(file_fd, last, device))


async def _send_all(
    loop: asyncio.AbstractEventLoop,
    job: SendJob,
    out: socket.socket,
    lease: TransportLease | None,
    *,
    trailers: bool,
) -> None:
    """Send the unsent rest of the headers or the trailers, waiting while the socket is full."""
    data = job.options.trailers if trailers else job.options.headers
    while _unsent(job, data, trailers=trailers):
        if lease is not None:
            lease.check_alive()
        try:
            _send_some(job, out, data, trailers=trailers)
        except BlockingIOError:
            await _wait_writable(loop, out.fileno(), lease)


async def _wait_writable(loop: asyncio.AbstractEventLoop, fd: int, lease: TransportLease | None) -> None:
    """Wait until *fd* is writable, or the leased connection is lost; then give way as after a chunk."""
    await wait_ready(loop, fd, lease, writable=True, behind_timers=True)
