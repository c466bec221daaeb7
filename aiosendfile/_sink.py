"""The file side of one receive: where the bytes go, how many have landed, the write off the loop.

Shared by ``recvfile``'s copy loops (``_recv``) and the splice driver
(``_splice``), as ``SendJob`` is by the send side's drivers. Its ``state`` (a
``TransferState``) is the receive's one byte counter, which ``map_exceptions``
reads. What has landed is always the contiguous ``offset .. offset + received``
of the file: a write handed to a thread is counted even when the caller is
cancelled.
"""

from __future__ import annotations

import asyncio
import io
import os
import select
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from ._errors import IncompleteTransferError
from ._state import TransferState
from ._threads import shielded

__all__ = ("FileSink", "pwrite_all")


class FileSink:
    """One receive: where the bytes go and how many have landed."""

    def __init__(
        self,
        file: Any,
        fd: int | None,
        offset: int,
        count: int,
        pool: Executor,
        on_progress: Callable[[int, int], None] | None,
        streaming: bool = False,
    ) -> None:
        self.file, self.fd, self.count = file, fd, count
        self.pool, self.on_progress = pool, on_progress
        self.streaming = streaming  # a pipe, a socket: a write may wait for its reader for ever
        self.state = TransferState(offset, count)  # the one count of what has landed
        self.taken = 0  # (splice) bytes taken off the socket, landed or not: where the stream is

    @property
    def received(self) -> int:
        return self.state.sent

    @property
    def remaining(self) -> int:
        return self.count - self.state.sent

    def landed(self, n: int) -> None:
        self.state.advance(n)
        if self.on_progress is not None:
            self.on_progress(self.state.sent, self.count)

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
        then holds exactly ``offset..offset+received``. But a stream's (a pipe
        whose reader stopped may take it never): cancelled, the caller returns at
        once, and the write in flight may still land after, uncounted.
        """
        position = self.state.position
        loop = asyncio.get_running_loop()
        if self.fd is not None:
            pending = loop.run_in_executor(self.pool, pwrite_all, self.fd, data, position)
        else:
            pending = loop.run_in_executor(self.pool, _write_at, self.file, data, position)
        if self.streaming:
            pending.add_done_callback(_retrieved)  # (its error is nobody's once we are cancelled)
            self.landed(await pending)
            return
        self.landed(await shielded(pending, lambda written: self.landed(written or 0)))


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def pwrite_all(fd: int, data: bytes, position: int) -> int:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, position)
        view, position = view[n:], position + n
    return len(data)


def _write_at(file: Any, data: bytes, position: int) -> int:
    """Write all of *data* to *file* (at *position* if it has positions), in a pool thread. A
    file may take less than asked: a raw file (``buffering=0``) part or, non-blocking and full,
    nothing (None); a buffered one, non-blocking and full, raises ``BlockingIOError`` with what it
    took into its buffer. The rest is written once the file takes more (``poll``), never dropped,
    and what a buffer took is flushed before it counts (a close would lose it, or raise)."""
    if file.seekable():
        file.seek(position)
    view = memoryview(data)
    while view:
        try:
            n = file.write(view)
        except BlockingIOError as exc:
            n = exc.characters_written
        if not n:
            _wait_writable(file)
            continue
        view = view[n:]
    if isinstance(file, io.BufferedIOBase):
        while True:
            try:
                file.flush()
                break
            except BlockingIOError:
                _wait_writable(file)
    return len(data)


def _wait_writable(file: Any) -> None:
    """Until *file* takes more (or has an error, or is closed: the next write says so). Polled a
    tenth of a second at a time: a receive given up (cancelled, idle) closes its file, and its
    thread is not left waiting for ever on a reader that stopped."""
    poller = select.poll()
    poller.register(file.fileno(), select.POLLOUT)
    while not poller.poll(100):
        if file.closed:
            return
