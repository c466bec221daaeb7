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
  After a full chunk we yield (``sleep(0)``) so other connections run. After
  a short one the socket buffer is full, so we wait until the poller says it
  is writable again. That wait yields too, and it avoids a string of tiny
  sends.
* **Resuming.** The file offset is ours (``TransferState.position``) and goes
  to ``sendfile`` explicitly, so the file's own position is never read.
  After EAGAIN we simply try again from the same offset.
* **Cleanup.** Every wait removes its writer registration in ``finally``, and
  the duplicate fd is closed in ``finally``, on errors and cancellation alike.
"""

from __future__ import annotations

import asyncio
import os

from . import _platform
from ._errors import _Progress
from ._lease import TransportLease
from ._state import TransferState

__all__ = ("send_zero_copy",)


async def send_zero_copy(
    sock_fd: int,
    file_fd: int,
    state: TransferState,
    progress: _Progress,
    lease: TransportLease | None = None,
) -> None:
    """Send ``state``'s remaining bytes of *file_fd* to the socket *sock_fd*.

    Raises ``_platform.NotSupportedBySendfile`` (before or after some bytes;
    ``state.sent`` says which), ``FileTruncatedError``, or the OS error.
    """
    loop = asyncio.get_running_loop()
    out_fd = os.dup(sock_fd)
    try:
        while not state.done:
            if lease is not None:
                lease.check_alive()
            size = state.next_chunk()
            try:
                n = _platform.sendfile_once(out_fd, file_fd, state.position, size)
            except BlockingIOError:
                await _wait_writable(loop, out_fd, lease)
                continue
            if n == 0:
                raise state.truncated()
            state.advance(n)
            progress.sent = state.sent
            if state.done:
                break
            if n < size:
                await _wait_writable(loop, out_fd, lease)
            else:
                await asyncio.sleep(0)
    finally:
        os.close(out_fd)


async def _wait_writable(loop: asyncio.AbstractEventLoop, fd: int, lease: TransportLease | None) -> None:
    """Wait until *fd* is writable, or the leased connection is lost."""
    _platform.counters.waits += 1
    fut: asyncio.Future[None] = loop.create_future()

    def on_writable() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_writer(fd, on_writable)
    if lease is not None:
        lease.wake_on_loss(fut)
    try:
        await fut
    finally:
        loop.remove_writer(fd)
        if lease is not None:
            lease.wake_on_loss(None)
