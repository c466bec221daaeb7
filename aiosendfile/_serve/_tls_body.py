"""File bodies on ``serve``'s own TLS connections (:class:`._tls.TLSTransport`).

A :class:`TLSBody` sends a file as nginx does over TLS: the file is read into a buffer of the
transfer's own with one ``RWF_NOWAIT`` read per chunk (a cold chunk is read in the cold pool),
then the buffer goes to ``SSL_write``: one copy into userspace and one encryption. The buffer is
not touched again until the socket took it all. Its size is drawn from :data:`BODY_BUDGET`,
shared by every connection of the process: at least ``BODY_MIN`` bytes, up to ``BODY_MAX`` while
the budget allows (bytes per ``SSL_write`` set the CPU cost of a byte).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import _platform
from .._options import DEFAULT_OPTIONS
from .._outlet import MAX_CHUNK
from .._writer import is_cold

if TYPE_CHECKING:
    from ._tls import TLSTransport

__all__ = ("BODY_BUDGET", "BODY_BUDGET_POOL", "BODY_MAX", "BODY_MIN", "Segment", "TLSBody")

#: A file body's buffer: at least one TLS record, up to BODY_MAX while BODY_BUDGET allows.
BODY_MIN = 16 * 1024
BODY_MAX = 256 * 1024
BODY_BUDGET = 16 * 1024 * 1024

#: One piece of a body: bytes to write first (a head, a part's head), then *length* bytes of the
#: file from *start* (0: none).
Segment = tuple[bytes, int, int]


class _Budget:
    """Bytes of body buffers all open transfers may hold beyond BODY_MIN each (every loop of the
    process together; a body whose loop closed under a pool read gives its share back from there)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.claimed = 0
        self._lock = threading.Lock()

    def claim(self, want: int) -> int:
        """A buffer size for a body of *want* bytes: the largest that is of use and fits."""
        with self._lock:
            size = BODY_MAX
            while size > BODY_MIN and (size > 2 * want or self.claimed + size - BODY_MIN > self.total):
                size //= 2
            size = max(size, BODY_MIN)
            self.claimed += size - BODY_MIN
            return size

    def give_back(self, size: int) -> None:
        with self._lock:
            self.claimed -= size - BODY_MIN


BODY_BUDGET_POOL = _Budget(BODY_BUDGET)

#: Called once when a body ends: (file bytes sent, None when whole, else why it stopped).
Done = Callable[[int, "Exception | None"], None]


class TLSBody:
    """A file body (one or more segments of one file, then a closing) on a :class:`TLSTransport`.

    ``release`` is called exactly once, when the body no longer reads *file_fd*: before ``done``,
    or after :meth:`stop` once a pool thread still reading from it is finished.
    """

    __slots__ = (
        "buf",
        "closing",
        "done",
        "fd",
        "file_in_buf",
        "filled",
        "in_pool",
        "left",
        "on_progress",
        "position",
        "release",
        "segments",
        "sent",
        "size",
        "stopped",
        "transport",
        "unyielded",
    )

    def __init__(
        self,
        transport: TLSTransport,
        file_fd: int,
        segments: Sequence[Segment],
        closing: bytes,
        done: Done,
        on_progress: Callable[[], None],
        release: Callable[[], None],
    ) -> None:
        self.transport = transport
        self.fd = file_fd
        self.segments = collections.deque(segments)
        self.closing = closing
        self.done = done
        self.on_progress = on_progress
        self.release: Callable[[], None] | None = release
        self.sent = 0  # file bytes the socket took
        self.position = 0  # where the file is read next
        self.left = 0  # file bytes of the current segment not read yet
        self.filled = 0  # bytes in the buffer
        self.file_in_buf = 0  # of which from the file
        self.unyielded = 0  # bytes written since the body last gave way to other connections
        self.stopped = False
        self.in_pool = False
        want = sum(len(head) + length for head, _, length in segments) + len(closing)
        self.size = BODY_BUDGET_POOL.claim(want)
        self.buf: bytearray | None = bytearray(self.size)

    def stop(self) -> None:
        """The connection is gone: stop, without calling ``done``."""
        if self.stopped:
            return
        self.stopped = True
        if not self.in_pool:
            self._release()

    def _release(self) -> None:
        if self.buf is not None:
            self.buf = None
            BODY_BUDGET_POOL.give_back(self.size)
        release, self.release = self.release, None
        if release is not None:
            release()

    def run(self) -> None:
        """Fill the buffer and write it, while the socket takes it all, up to ``MAX_CHUNK`` bytes
        a wakeup; then from the loop (writable again, a cold read back, the next iteration)."""
        while not self.stopped:
            if not self._fill():
                return  # (a read in the pool, or the end of the file came early)
            if not self.filled:
                closing, self.closing = self.closing, b""
                if closing:
                    self.filled = len(closing)
                    self.buf[: self.filled] = closing  # type: ignore[index]
                else:
                    self._end(None)
                    return
            if not self._write():
                return
            if self.unyielded >= MAX_CHUNK:
                self.unyielded = 0
                self.transport._loop.call_soon(self.run)  # let the other connections in
                return

    def _fill(self) -> bool:
        """Fill the buffer: the segments' heads and file bytes in order (a head larger than the
        buffer on its own); False if it goes on from the pool, or the body ended."""
        buf = self.buf
        assert buf is not None
        size = self.size
        while self.filled < size:
            filled = self.filled
            if not self.left:
                if not self.segments:
                    break
                head, start, length = self.segments[0]
                if len(head) > size - filled:
                    if filled:
                        break
                    # (a head larger than the buffer: the buffer holds it, whole, for its write)
                    self.buf = buf = bytearray(head)
                    self.filled = len(head)
                    self.segments[0] = (b"", start, length)
                    break
                self.segments.popleft()
                buf[filled : filled + len(head)] = head
                self.filled = filled + len(head)
                self.position, self.left = start, length
                continue
            into = memoryview(buf)[filled : filled + min(self.left, size - filled)]
            got = _platform.read_into_nowait(self.fd, into, self.position)
            # (None: the platform cannot tell; probed, and read here if warm)
            if got is None and not is_cold(self.fd, self.position, len(into), DEFAULT_OPTIONS):
                got = os.preadv(self.fd, [into], self.position)
            if got is None or got is False:
                self._to_pool(into)
                return False
            if not self._took(got, len(into)):
                return False
        return True

    def _took(self, got: int, asked: int) -> bool:
        if got < asked:
            self._end(EOFError(f"the file ended {self.left - got} bytes early"))
            return False
        self.position += got
        self.left -= got
        self.filled += got
        self.file_in_buf += got
        return True

    def _to_pool(self, into: memoryview) -> None:
        self.in_pool = True
        _platform.went_to_pool(self.fd)
        job = DEFAULT_OPTIONS.cold_executor.submit(os.preadv, self.fd, [into], self.position)
        loop = self.transport._loop
        asked = len(into)

        def arrived(job: concurrent.futures.Future[int]) -> None:  # (in the pool thread)
            try:
                loop.call_soon_threadsafe(self._pool_done, job, asked)
            except RuntimeError:  # the loop is closed
                self.in_pool = False
                self._release()

        job.add_done_callback(arrived)

    def _pool_done(self, job: concurrent.futures.Future[int], asked: int) -> None:
        self.in_pool = False
        if self.stopped:
            self._release()
            return
        exc = RuntimeError("the cold pool cancelled a read") if job.cancelled() else job.exception()
        if exc is not None:
            if not isinstance(exc, Exception):
                raise exc
            self._end(exc)
            return
        if self._took(job.result(), asked):
            self.run()

    def _write(self) -> bool:
        """Write the buffer; True if the socket took it all (else the body goes on when it has)."""
        transport = self.transport
        data = memoryview(self.buf)[: self.filled]  # type: ignore[arg-type]
        if transport.send_body(data, self._drained):
            self._written()
            return True
        if transport.is_closing():
            self._end(ConnectionResetError("the connection closed during the body"))
        return False

    def _written(self) -> None:
        self.unyielded += self.filled
        self.filled = 0
        if self.file_in_buf:
            self.sent += self.file_in_buf
            self.file_in_buf = 0
            self.on_progress()
        if self.buf is not None and len(self.buf) != self.size:  # (a large head's own buffer)
            self.buf = bytearray(self.size)

    def _drained(self) -> None:
        if self.stopped:
            return
        if self.transport.is_closing():
            self._end(ConnectionResetError("the connection closed during the body"))
            return
        self._written()
        self.unyielded = 0
        self.run()

    def _end(self, exc: Exception | None) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._release()
        self.done(self.sent, exc)
