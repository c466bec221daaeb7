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
  in the cache but not ready). Without ``cachestat`` (Linux < 6.5, BSD) the
  first and last page are probed. If any page is missing, that chunk's
  ``sendfile`` runs in the cold-read pool (see ``_options``), so the disk wait
  happens off the loop thread. The transfer stays zero-copy. (Measured and
  dropped: a ``POSIX_FADV_WILLNEED`` of the next chunk from the pool halved
  cold throughput and doubled CPU; see ``benchmarks/loop_stall.py``.)
* **Headers and trailers** go to the same socket with ``send()``, inside
  ``TCP_CORK`` (``TCP_NOPUSH`` on BSD), so they share packets with the file's
  first and last bytes. The cork is released when the transfer ends, however
  it ends.
* **Cleanup.** Every wait removes its writer registration in ``finally``, and
  the duplicate socket is closed in ``finally``, on errors and cancellation alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from . import _platform
from ._job import SendJob
from ._lease import TransportLease
from ._options import Options
from ._readiness import wait_ready, yield_to_others
from ._state import TransferState
from ._threads import settled

__all__ = ("send_zero_copy",)


async def send_zero_copy(job: SendJob, lease: TransportLease | None = None) -> None:
    """Send the job's headers, its ``state``'s remaining bytes of the file, then its trailers.

    Raises ``_platform.NotSupportedBySendfile`` (before or after some bytes;
    ``state.sent`` says which), ``FileTruncatedError``, or the OS error.
    """
    state, options, file_fd = job.state, job.options, job.file.fd
    assert file_fd is not None  # zero-copy needs a regular file's fd
    loop = asyncio.get_running_loop()
    out = socket.socket(fileno=os.dup(job.target.sock_fd))  # ours: closed below, whatever happens
    out.setblocking(False)  # never inherit socket.setdefaulttimeout(): send() must not wait
    corked = False
    try:
        if options.headers or options.trailers:
            corked = _platform.set_cork(out, True)
        if options.headers:
            await _send_all(loop, out, options.headers, lease)
        await _send_file(loop, out, file_fd, state, options, lease)
        if options.trailers:
            await _send_all(loop, out, options.trailers, lease)
    finally:
        if corked:
            with contextlib.suppress(OSError):
                _platform.set_cork(out, False)  # flush what the cork holds
        out.close()


async def _send_file(
    loop: asyncio.AbstractEventLoop,
    out: socket.socket,
    file_fd: int,
    state: TransferState,
    options: Options,
    lease: TransportLease | None,
) -> None:
    out_fd = out.fileno()
    on_progress = options.on_progress
    device = os.fstat(file_fd).st_dev if options.probe else 0
    while not state.done:
        if lease is not None:
            lease.check_alive()
        size = state.next_chunk()
        position = state.position
        try:
            if _is_cold(file_fd, position, size, options, device):
                _platform.counters.cold += 1
                job = options.cold_executor.submit(_platform.sendfile_once, out_fd, file_fd, position, size)
                pending = asyncio.wrap_future(job)
                try:
                    n = await asyncio.shield(pending)
                except asyncio.CancelledError:
                    if not job.cancel():
                        # The thread is already sending on our fd: count what it sends, then stop.
                        state.advance(await settled(pending) or 0)
                    raise
            else:
                n = _platform.sendfile_once(out_fd, file_fd, position, size)
        except BlockingIOError:
            await _wait_writable(loop, out_fd, lease)
            continue
        if n == 0:
            raise state.truncated()
        state.advance(n)
        if on_progress is not None:
            on_progress(state.sent, state.total)
        if state.done:
            break
        if n < size:
            await _wait_writable(loop, out_fd, lease)
        else:
            await yield_to_others(loop)


def _is_cold(file_fd: int, position: int, size: int, options: Options, device: int) -> bool:
    """Whether this chunk's sendfile may wait for the disk (and so belongs in the pool)."""
    if not options.probe:
        return False
    last = position + size - 1
    whole = _platform.range_cached(file_fd, position, size)
    if whole is not None:
        # All pages present: ready unless the last is still being read in.
        return not whole or _platform.page_cached(file_fd, last, device) is False
    first = _platform.page_cached(file_fd, position, device)
    if first is None:
        return True  # cannot tell: the conservative path
    return not (first and _platform.page_cached(file_fd, last, device))


async def _send_all(
    loop: asyncio.AbstractEventLoop, out: socket.socket, data: bytes, lease: TransportLease | None
) -> None:
    """``send()`` all of *data* on the non-blocking socket, waiting while it is full."""
    view = memoryview(data)
    while view:
        if lease is not None:
            lease.check_alive()
        try:
            view = view[out.send(view) :]
        except BlockingIOError:
            await _wait_writable(loop, out.fileno(), lease)


async def _wait_writable(loop: asyncio.AbstractEventLoop, fd: int, lease: TransportLease | None) -> None:
    """Wait until *fd* is writable, or the leased connection is lost; then give way as after a chunk."""
    await wait_ready(loop, fd, lease, writable=True, behind_timers=True)
