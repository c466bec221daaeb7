"""The file bodies a connection owner sends on its :class:`~._outlet.Outlet` (``serve``'s engine).

:func:`send_first` tries a whole small file at once with no object; :class:`Transfer` sends a body
(after its head) chunk by chunk, driven by the loop; :class:`ColdWhole` hands a whole file found
cold to the page reader's thread. How they send:

* **A straight line when the socket takes it.** The head goes with ``send(MSG_MORE)`` (it shares
  the file's first packet), then ``sendfile`` from the saved offset; a response the socket takes
  whole costs those two calls and no event-loop machinery. A short send waits for the duplicate
  to be writable (``add_writer``); a full chunk (``MAX_CHUNK``) gives way to the other
  connections (``call_soon``) before the next.
* **Cold pages never on the loop.** Before each chunk its pages are probed (``_writer.is_cold``:
  ``cachestat`` and a 1-byte ``RWF_NOWAIT`` read), once: the rest of a chunk the socket took only
  part of is sent when the socket has room, without probing it again. A cold chunk of up to
  ``READ_AHEAD_MAX`` bytes is read in off the loop and sent once it is in, no pool thread. Where
  the owner has a page reader (``_coldread.PageWaits``: the compiled module's thread, which never
  takes the GIL; ``serve``'s engine has one), that thread asks the kernel for a loop turn's chunks
  together and then *sends* each, after what is left of the head, with ``sendfile`` on its own
  duplicate of the socket (which waits there for any page still on the way: nothing is probed
  after the read), and the loop is told through an eventfd how far it went: a cold small file
  is answered as soon as the disk gives it, with no Python between its pages and the socket. A
  body known cold before its head went (``PROBED_COLD``) keeps the head for that send: one
  ``send`` and one ``sendfile``. What the socket did not take goes on from the loop (probed
  again); a chunk the reader has not begun within its patience (``_coldread.READER_PATIENCE``:
  a hung file, a very slow device, reads queued behind one; one timer of the waits keeps it for
  all) is held back and sent from the cold-read pool. :class:`ColdWhole` is that send for a
  whole file found cold as it was opened, with no transfer unless it must go on another way.
  Without a page reader, the read is asked of the kernel (``POSIX_FADV_WILLNEED``, from the
  read-ahead thread, ``_coldread.read_ahead``, a loop turn's chunks together: submitting it may
  wait in the block layer for milliseconds) and the chunk is probed again from a timer, 1 ms
  later, then twice as long each time, every page of it (``is_cold(read_in=True)``: a read's
  pages come in out of order on a busy device, and the last one in says nothing of the others);
  no GIL is handed off per cold file and back (h2o tries ``RWF_NOWAIT`` first for the same
  reason). A larger chunk, or one still cold after ``COLD_WAITS`` waits, is sent from the
  cold-read pool, whose thread hands the result back with one ``call_soon_threadsafe``. The
  duplicate stays open until that thread is done with it, whatever happens to the connection.
  Where the owner shares out each iteration of the loop (``Turns``: ``serve``'s engine), a chunk
  whose timer's wait ends while the iteration's time is spent takes a turn in a following
  iteration, as a connection's new request does.
* **A small chunk read, not sent with sendfile.** A chunk of up to ``READ_MAX`` bytes is read with
  one ``RWF_NOWAIT`` read, which is also its probe, and sent from memory like the head (the last
  send without ``MSG_MORE``): below that size the copy costs less than a probe and a ``sendfile``.
  A read that would wait for the disk makes the chunk cold; where the file system cannot tell,
  the chunk is probed and sent as any other.
* **Whole or aborted.** A file that ends early (``sendfile`` returns 0) or a send that fails
  ends the transfer with an error: the protocol aborts the connection, so a short body is never
  passed off as complete.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
from collections.abc import Callable
from typing import Protocol

from . import _platform
from ._coldread import PageWaits, Sent, read_ahead
from ._options import DEFAULT_OPTIONS
from ._outlet import COLD_WAITS, FIRST_WAIT, MAX_CHUNK, PROBED_COLD, READ_AHEAD_MAX, READ_MAX, Outlet
from ._platform import sendfile_once
from ._writer import is_cold

__all__ = ("ColdWhole", "Done", "Transfer", "Turn", "Turns", "send_first")

#: Called once when a transfer ends: (file bytes sent, None when whole, else why it stopped).
Done = Callable[[int, "Exception | None"], None]


class Turn(Protocol):
    """Work that waits for a turn in a later iteration of the loop (see :class:`Turns`)."""

    def take_turn(self) -> None: ...


class Turns(Protocol):
    """An owner's share-out of each iteration of the loop (``serve``'s engine)."""

    def spent(self) -> bool:
        """Whether this iteration's time for answering is used up."""
        ...

    def wait_turn(self, item: Turn) -> None:
        """Run ``item.take_turn()`` in a following iteration, after what waited before it."""
        ...


def send_first(
    outlet: Outlet,
    head: bytes,
    fd: int,
    size: int,
    probed: bool = False,
    key: tuple[int, int] | None = None,
) -> tuple[int, bytes, int]:
    """The first send of a file of at most one chunk after *head*, made here, with no transfer
    object, where its pages are cached and the socket takes them (the common case, as the public
    call's straight line); *probed*: the caller found every page cached a moment ago. Returns the
    file bytes sent, what is left of *head*, and what a transfer that goes on from there takes for
    its ``warm_to``: *size* (probed warm), ``PROBED_COLD``, or 0 (not probed); *key*: the file's
    device and inode, if known (no ``fstat`` to tell its reads). A full socket or
    an error stops it where it is: the transfer meets an error again, and aborts."""
    warm_to = 0
    position = 0
    rest = head
    try:
        if not probed and is_cold(fd, 0, size, DEFAULT_OPTIONS, key=key):
            return 0, head, PROBED_COLD  # (the transfer waits for its pages at once)
        warm_to = size
        rest = head[outlet.sock.send(head, outlet.flags) :]
        if not rest:
            position = sendfile_once(outlet.fd, fd, 0, size)
    except OSError:  # (BlockingIOError: the socket is full)
        pass
    return position, rest, warm_to


class Transfer:
    """One file body (after its head) on an :class:`Outlet`; ``done`` is called once at the end.

    ``release`` is called exactly once, when the transfer no longer uses *file_fd* (the caller
    closes it then): before ``done``, or after :meth:`stop` (the connection lost first; ``done``
    is not called then) once a pool thread still sending from it is finished.
    """

    __slots__ = (
        "asked",
        "buffered",
        "done",
        "end",
        "file_fd",
        "head",
        "key",
        "on_progress",
        "outlet",
        "pages",
        "position",
        "release",
        "sending_to",
        "sent",
        "stopped",
        "timer",
        "turns",
        "waits",
        "warm_to",
        "watching",
    )

    def __init__(
        self,
        outlet: Outlet,
        head: bytes,
        file_fd: int,
        start: int,
        length: int,
        done: Done,
        on_progress: Callable[[], None],
        release: Callable[[], None],
        sent: int = 0,
        warm_to: int = 0,
        turns: Turns | None = None,
        pages: PageWaits | None = None,
        key: tuple[int, int] | None = None,
    ) -> None:
        self.outlet = outlet
        self.head = memoryview(head) if head else None
        self.buffered = 0  # file bytes read into ``head`` (a small chunk sent from memory)
        self.file_fd = file_fd
        self.position = start
        self.end = start + length
        self.sent = sent  # file bytes already sent by the caller (the rest starts at *start*)
        self.done = done
        self.on_progress = on_progress
        self.release: Callable[[], None] | None = release
        self.stopped = False
        self.watching = False  # the duplicate is registered with the loop (add_writer)
        self.waits = 0  # waits so far for this chunk's pages
        self.asked: int | None = None  # the page reader's token while it reads this chunk in
        # The end of the chunk last probed warm (sent without a probe up to it), or PROBED_COLD.
        self.warm_to = warm_to
        self.timer: asyncio.TimerHandle | None = None
        self.turns = turns
        self.pages = pages  # the owner's page reader (else cold pages are waited for on a timer)
        self.key = key  # the file's (device, inode), if the owner knows them: no fstat to track its reads
        self.sending_to = 0  # the end of the chunk the page reader's thread was asked to send

    def stop(self) -> None:
        """The connection is gone: stop at once (any wait unregistered), without calling ``done``."""
        self.stopped = True
        self._unwatch()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._forget_ask()
        if not self.outlet.in_pool:
            self._release()

    def _forget_ask(self) -> None:
        """The page reader's read of this chunk is not waited for any more (it may go on)."""
        if self.asked is not None:
            assert self.pages is not None
            self.pages.cancel(self.asked)
            self.asked = None

    def _release(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()

    def run(self) -> None:
        """Send what the socket takes now; go on from the loop when it is full or a chunk went."""
        if self.stopped:
            return
        outlet = self.outlet
        try:
            head = self.head
            if head is not None and not (self.warm_to == PROBED_COLD and self._reader_sends()):
                # (A chunk known cold that the page reader's thread will send takes the head with it.)
                if not self._head_sent(head):
                    return
                if self.buffered:
                    self.sent += self.buffered
                    self.buffered = 0
                    if self.position >= self.end:
                        self._end(None)
                        return
            if self.position < self.warm_to:  # the rest of a chunk the socket took only part of
                size = self.warm_to - self.position  # (probed a moment ago: not probed again)
            else:
                size = min(self.end - self.position, MAX_CHUNK)
                if size <= READ_MAX and self.warm_to != PROBED_COLD:
                    read = _platform.read_nowait(self.file_fd, size, self.position)
                    if isinstance(read, bytearray):  # (its own probe: then sent from memory)
                        self._read_in(read, size)
                        return
                    cold = read is False or (
                        read is None
                        and is_cold(self.file_fd, self.position, size, DEFAULT_OPTIONS, key=self.key)
                    )
                else:
                    cold = self.warm_to == PROBED_COLD or is_cold(
                        self.file_fd,
                        self.position,
                        size,
                        DEFAULT_OPTIONS,
                        read_in=self.waits > 0,
                        key=self.key,
                    )
                if cold:
                    self.warm_to = 0  # (probed again after the wait)
                    if size <= READ_AHEAD_MAX and self.waits < COLD_WAITS:
                        self._wait_for_pages(size)
                    else:
                        self._to_pool(size)
                    return
                self.warm_to = self.position + size
            n = sendfile_once(outlet.fd, self.file_fd, self.position, size)
        except BlockingIOError:
            self._wait()
            return
        except Exception as exc:
            self._end(exc)
            return
        self._advance(n, size)

    def _head_sent(self, head: memoryview) -> bool:
        """Send what is left of the head: with MSG_MORE while file bytes follow (it shares their
        first packet); not after the last of them, read into memory (nothing would push it out).
        False: the socket took only part, and the rest waits for room (raises as ``send`` does)."""
        outlet = self.outlet
        n = outlet.sock.send(head, outlet.flags if self.position < self.end else 0)
        if n < len(head):
            self.head = head[n:]
            self._wait()
            return False
        self.head = None
        return True

    def _read_in(self, read: bytearray, size: int) -> None:
        """A small chunk read into memory: sent as the head is (the file ends early: an error)."""
        if len(read) < size:
            self._end(EOFError(f"the file ended {size - len(read)} bytes early"))
            return
        self.waits = 0
        self.position += size
        self.warm_to = self.position
        self.head = memoryview(read)
        self.buffered = size
        self.on_progress()
        self.run()

    def _reader_sends(self) -> bool:
        """Whether the next chunk, if cold, goes to the page reader's thread to be sent once in."""
        pages = self.pages
        return (
            pages is not None
            and not pages.closed
            and self.waits < COLD_WAITS
            and not self.buffered
            and min(self.end - self.position, MAX_CHUNK) <= READ_AHEAD_MAX
        )

    def _wait_for_pages(self, size: int) -> None:
        """Have the page reader's thread send the chunk (after what is left of the head) once its
        pages are in, and go on from what it sent; without it, have the kernel read it in and
        probe it again from a timer (see the module)."""
        self._unwatch()
        pages = self.pages
        if pages is not None and not pages.closed:
            head = self.head
            try:
                self.asked = pages.ask_send(
                    self.file_fd,
                    self.position,
                    size,
                    self.outlet.fd,
                    b"" if head is None else head,
                    self.outlet.flags,
                    self._sent_by_reader,
                    self._late,
                    self.key,
                )
            except (OSError, MemoryError):  # (EMFILE for its duplicate: the timer's way, this once)
                pass
            else:
                self.sending_to = self.position + size
                self.waits += 1
                return
        if self.waits == 0:
            read_ahead(self.file_fd, self.position, size, self.outlet.loop)  # (not from the loop's thread)
        delay = FIRST_WAIT * (1 << self.waits)
        self.waits += 1
        self.timer = self.outlet.loop.call_later(delay, self._waited)

    def _sent_by_reader(self, result: Sent | None) -> None:
        """What the page reader's thread sent of the head and the chunk (``PageWaits.ask_send``)."""
        self.asked = None
        if self.stopped:  # (told by waits that closed before the connection went: nothing to do)
            return
        if result is None:  # (the waits closed before the thread began it: sent another way)
            self.warm_to = 0
            self._waited()
            return
        _, head_sent, file_sent, err = result
        if head_sent < 0:  # (under way as the waits closed: how far it went is not known)
            self._end(ConnectionAbortedError("the page reader closed while it sent this body"))
            return
        head = self.head
        if head is not None:
            self.head = head[head_sent:] if head_sent < len(head) else None
        if file_sent:
            self.waits = 0
            self.position += file_sent
            self.sent += file_sent
            _platform.counters.calls += 1
            _platform.counters.bytes += file_sent
        if file_sent or head_sent:
            self.on_progress()
        if err == errno.EAGAIN:  # the socket is full: the rest when it has room, probed again
            _platform.counters.eagain += 1
            self.warm_to = 0
            self._wait()
        elif err:
            self._end(OSError(err, os.strerror(err)))
        elif self.position >= self.end:
            self._end(None)
        elif self.position < self.sending_to:
            self._end(EOFError(f"the file ended {self.end - self.position} bytes early"))
        else:  # (a chunk of a larger file: the next from the loop)
            self.warm_to = 0
            self.outlet.loop.call_soon(self.run)

    def _late(self) -> None:
        """The page reader has not read the chunk in within its patience (a hung file, a very
        slow device, or reads queued behind one): it goes to the pool, as a chunk still cold."""
        self.asked = None
        self.warm_to = 0
        self._to_pool(min(self.end - self.position, MAX_CHUNK))

    def _waited(self) -> None:
        self.timer = None
        turns = self.turns
        if turns is not None and turns.spent():
            turns.wait_turn(self)  # (a later iteration: the chunk's sendfile, and its probe first)
            return
        self.run()

    def take_turn(self) -> None:
        self.run()

    def _advance(self, n: int, size: int) -> None:
        self.waits = 0
        if n == 0:
            self._end(EOFError(f"the file ended {self.end - self.position} bytes early"))
            return
        self.position += n
        self.sent += n
        self.on_progress()
        if self.position >= self.end:
            self._end(None)
        elif n < size:
            self._wait()  # the socket is full
        else:
            self._unwatch()
            self.outlet.loop.call_soon(self.run)  # a whole chunk: let the other connections in

    def _wait(self) -> None:
        """Go on when the socket is writable (a registration kept across successive waits)."""
        if not self.watching:
            self.watching = True
            self.outlet.loop.add_writer(self.outlet.fd, self.run)

    def _unwatch(self) -> None:
        if self.watching:
            self.watching = False
            self.outlet.loop.remove_writer(self.outlet.fd)

    def _to_pool(self, size: int) -> None:
        self._unwatch()
        outlet = self.outlet
        head = self.head
        if head is not None:  # (held for the page reader's send, which was given up: it goes first)
            try:
                if not self._head_sent(head):
                    return
            except BlockingIOError:
                self._wait()
                return
            except OSError as exc:
                self._end(exc)
                return
        outlet.in_pool = True
        _platform.went_to_pool(self.file_fd, self.key)
        job = DEFAULT_OPTIONS.cold_executor.submit(
            sendfile_once, outlet.fd, self.file_fd, self.position, size
        )
        job.add_done_callback(lambda job: self._pool_arrived(job, size))

    def _pool_arrived(self, job: concurrent.futures.Future[int], size: int) -> None:
        """(In the pool thread.) One hop back to the loop; if the loop is gone, release the fd."""
        try:
            self.outlet.loop.call_soon_threadsafe(self._pool_done, job, size)
        except RuntimeError:  # the loop is closed
            self.outlet.in_pool = False
            if self.outlet.closed:
                self.outlet.sock.close()
            self._release()

    def _pool_done(self, job: concurrent.futures.Future[int], size: int) -> None:
        outlet = self.outlet
        outlet.in_pool = False
        if outlet.closed:
            outlet.sock.close()  # the connection went meanwhile
        if self.stopped:
            self._release()
            return
        exc = RuntimeError("the cold pool cancelled a send") if job.cancelled() else job.exception()
        if exc is not None and not isinstance(exc, Exception):
            raise exc
        if isinstance(exc, BlockingIOError):
            self._wait()
        elif exc is not None:
            self._end(exc)
        else:
            self._advance(job.result(), size)

    def _end(self, exc: Exception | None) -> None:
        self.stopped = True
        self._unwatch()
        self._release()
        self.done(self.sent, exc)


class ColdWhole:
    """A whole file of at most ``READ_AHEAD_MAX`` bytes found cold a moment ago (``PROBED_COLD``),
    sent after its head by the owner's page reader's thread once its pages are in
    (``PageWaits.ask_send``), with no :class:`Transfer` and nothing on the loop between: the
    common cold body, for a fraction of a transfer's Python. Where it cannot end so (the socket
    took only part, the wait was given up, the waits closed first, the reader could not be
    asked), a transfer goes on from where it stopped (:attr:`went_on`). The contract is a
    transfer's: ``done`` is called once at the end (not after :meth:`stop`), and *file_fd* is
    closed once nothing uses it (here, or by the transfer)."""

    __slots__ = (
        "done",
        "file_fd",
        "head",
        "key",
        "on_progress",
        "outlet",
        "pages",
        "size",
        "stopped",
        "token",
        "turns",
        "went_on",
    )

    def __init__(
        self,
        outlet: Outlet,
        head: bytes,
        file_fd: int,
        size: int,
        done: Done,
        on_progress: Callable[[], None],
        turns: Turns | None,
        pages: PageWaits,
        key: tuple[int, int] | None = None,
    ) -> None:
        self.outlet = outlet
        self.head = head
        self.file_fd = file_fd
        self.size = size
        self.done = done
        self.on_progress = on_progress
        self.turns = turns
        self.pages = pages
        self.key = key
        self.token: int | None = None  # the reader's, while its thread may send
        self.went_on: Transfer | None = None
        self.stopped = False

    def run(self) -> None:
        """Ask the reader's thread to send it (once)."""
        try:
            self.token = self.pages.ask_send(
                self.file_fd,
                0,
                self.size,
                self.outlet.fd,
                self.head,
                self.outlet.flags,
                self._sent,
                self._late,
                self.key,
            )
        except (OSError, MemoryError):  # (EMFILE for a duplicate: the timer's way, this once)
            self._go_on(self.head, 0).run()

    def stop(self) -> None:
        """The connection is gone: the send is held back if not begun, the file let go."""
        if self.stopped:
            return
        self.stopped = True
        went_on = self.went_on
        if went_on is not None:
            went_on.stop()
            return
        token, self.token = self.token, None
        if token is not None:
            self.pages.cancel(token)
        self._close_file()

    def _close_file(self) -> None:
        fd, self.file_fd = self.file_fd, -1
        if fd >= 0:
            os.close(fd)

    def _go_on(self, head: bytes, sent: int) -> Transfer:
        """A transfer for the rest, after *sent* file bytes and what is left of the head."""
        fd = self.file_fd
        self.went_on = went_on = Transfer(
            self.outlet,
            head,
            fd,
            sent,
            self.size - sent,
            self.done,
            self.on_progress,
            self._close_file,
            sent,
            0,
            self.turns,
            self.pages,
            self.key,
        )
        return went_on

    def _sent(self, result: Sent | None) -> None:
        """What the reader's thread sent (``PageWaits.ask_send``)."""
        self.token = None
        if self.stopped:  # (told by waits that closed before the connection went: nothing to do)
            return
        if result is None:  # (the waits closed before the thread began it)
            self._go_on(self.head, 0).run()
            return
        size = self.size
        if result[3] == 0 and result[2] == size:  # whole: the common case, no transfer
            _platform.counters.calls += 1
            _platform.counters.bytes += size
            self.on_progress()
            self._close_file()
            self.done(size, None)
            return
        # Anything else (the socket full, an error, a file cut short) is told as a transfer's send.
        went_on = self._go_on(self.head, 0)
        went_on.sending_to = size
        went_on._sent_by_reader(result)

    def _late(self) -> None:
        """The reader held it past its patience, not begun: the head and the file from the pool."""
        self.token = None
        if not self.stopped:
            self._go_on(self.head, 0)._to_pool(min(self.size, MAX_CHUNK))
