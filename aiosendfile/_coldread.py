"""Reading a range of a regular file without waiting for the disk on the event-loop thread.

One rule, shared by the userspace fallback (``ChunkReader``) and the aiohttp
``FileResponse``: a range whose pages are all in the page cache is read on
the loop (one ``RWF_NOWAIT`` read, ``_platform.pread_cached``, which reads
the bytes when they are there); any other range is read in the cold-read
pool (``_options.default_cold_executor`` unless the caller has its own), never
in the loop's default executor, so a slow disk cannot starve
``run_in_executor`` users. Where the platform cannot tell (no ``RWF_NOWAIT``),
every read goes to the pool: the conservative choice.

:func:`read_ahead` asks the kernel to start reading a range in, from the read-ahead thread: never
from the loop's, where submitting the read may wait in the block layer (for a request slot while
the pool's reads fill the device's queue, or for memory) for milliseconds.

:class:`PageWaits` does more where the compiled module is here: its page reader's thread (C, no
GIL) reads a range in and the loop is told once its pages are in, through an eventfd; the body
sender of a connection owner (``_bodies.Transfer``) waits on it instead of a timer.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from typing import TYPE_CHECKING

from . import _platform, _reading_in
from ._options import default_cold_executor
from ._threads import in_pool

if TYPE_CHECKING:
    from . import _syscalls as _syscalls_types

__all__ = ("READER_PATIENCE", "PageWaits", "Sent", "read_ahead", "read_range")

#: Seconds a range is waited for before its waiter is told it is late (within twice that): a hung
#: file (a stuck network file system) holds the reader's thread, and what was asked after it, no
#: longer.
READER_PATIENCE = 1.0

#: What became of a range the page reader's thread was asked to send (:meth:`PageWaits.ask_send`):
#: (token, head bytes sent, file bytes sent, errno: 0 when whole or the file ended early, EAGAIN
#: when the socket was full, else why the send failed); None if the reader never began it (its
#: waits closed first); ``UNKNOWN_SEND`` if it was under way as they closed.
Sent = tuple[int, int, int, int]
UNKNOWN_SEND: Sent = (-1, -1, -1, 0)


async def read_range(
    fd: int, size: int, offset: int, executor: Executor | None = None, *, probe: bool = True
) -> bytes | bytearray:
    """Up to *size* bytes of *fd* at *offset* (fewer only at end of file), in a new buffer.

    On the loop if the pages are cached, else in *executor* (default: the cold-read
    pool). ``probe=False`` trusts the cache and always reads on the loop. A read already
    running in a thread when we are cancelled is waited for, so the caller may close
    *fd* as soon as this returns or raises.
    """
    if not probe:
        return os.pread(fd, size, offset)
    data = _platform.pread_cached(fd, size, offset)
    if data is not None:
        return data
    _platform.went_to_pool(fd)
    return await in_pool(executor or default_cold_executor(), os.pread, fd, size, offset)


class _ReadAhead:
    """One daemon thread that asks the kernel to read ranges in (``POSIX_FADV_WILLNEED``).

    Each range comes with a duplicate of its file's fd, which the thread closes once the read is
    asked: the caller may close its own at once. Ranges asked from a loop go to the thread
    together at the loop's next turn, so a burst of cold files costs the thread one wake-up and
    one hand-off of the GIL, not one each (measured on the cold mixed set, a wake-up per file
    cost about a fifth of ``serve``'s requests a second). A batch whose loop closed before its
    turn goes with the next range asked from any other loop. A forked child starts its own thread.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[tuple[int, int, int]]] | None = None
        self._pid = 0
        self._batch: list[tuple[int, int, int]] = []
        self._batch_loop: asyncio.AbstractEventLoop | None = None  # whose next turn sends it
        self._lock = threading.Lock()  # (loops in several threads may ask at once)

    def ask(self, fd: int, offset: int, size: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        _reading_in.started_reading(fd)
        item = (os.dup(fd), offset, size)
        alone: list[tuple[int, int, int]] = [item]  # (sent now unless a loop's turn will send it)
        with self._lock:
            if loop is not None and self._batch_loop is loop:
                self._batch.append(item)
                return
            earlier, self._batch, self._batch_loop = self._batch, [], None
            if loop is not None:
                try:
                    loop.call_soon(self._flush)
                except RuntimeError:  # the loop is closed
                    pass
                else:
                    self._batch, self._batch_loop, alone = alone, loop, []
        if earlier:  # (its loop closed before its turn, or is another loop: sent now)
            self._put(earlier)
        if alone:
            self._put(alone)

    def _flush(self) -> None:
        with self._lock:
            batch, self._batch, self._batch_loop = self._batch, [], None
        if batch:
            self._put(batch)

    def _put(self, batch: list[tuple[int, int, int]]) -> None:
        q = self._queue
        if q is None or self._pid != os.getpid():
            with self._lock:
                q = self._queue
                if q is None or self._pid != os.getpid():
                    self._queue = q = queue.SimpleQueue()
                    self._pid = os.getpid()
                    thread = threading.Thread(
                        target=self._run, args=(q,), name="aiosendfile-read-ahead", daemon=True
                    )
                    thread.start()
        q.put(batch)

    @staticmethod
    def _run(q: queue.SimpleQueue[list[tuple[int, int, int]]]) -> None:
        while True:
            for fd, offset, size in q.get():
                try:
                    _platform.read_ahead(fd, offset, size)
                finally:
                    os.close(fd)


class PageWaits:
    """An owner's waits for ranges read in by the compiled page reader (``_platform.page_reader``,
    made at the first :meth:`ask`): its thread brings a range into the page cache and *then* is
    called on the loop once its first and last pages are in (the caller probes every page after
    it, as after any read this process started). No timer guesses how long the read takes (a
    cold small file is answered as soon as the disk gives it, as nginx's is) and the thread never
    takes the GIL. The reader's eventfd stays registered with the loop until :meth:`close` (the
    owner's end: ``serve``'s engine). What waits is bounded by the owner's transfers: a range each.

    :meth:`ask_send` has the thread send the range itself once it is in, after a head, on the
    owner's socket (a cold small file's whole answer: no Python between the pages and the socket,
    and no probe of every page after the read, as a send from the loop needs).
    """

    __slots__ = (
        "closed",
        "horizon",
        "late",
        "loop",
        "next",
        "patience",
        "reader",
        "sends",
        "starting",
        "timer",
        "waiting",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, patience: float | None = None) -> None:
        self.loop = loop
        self.reader: _syscalls_types.PageReader | None = None
        self.waiting: dict[int, Callable[[], None]] = {}
        #: token -> what to call with what became of it (:data:`Sent`), for the sends asked
        self.sends: dict[int, Callable[[Sent | None], None]] = {}
        #: token -> what to call instead once it has waited :attr:`patience` (in token order)
        self.late: dict[int, Callable[[], None]] = {}
        self.patience = READER_PATIENCE if patience is None else patience
        #: one timer for all the waits, every ``patience`` while any waits: the tokens below the
        #: horizon were asked before its last run (a timer a wait cost 3.5-4.3 us in uvloop)
        self.timer: asyncio.TimerHandle | None = None
        self.horizon = 0
        self.next = 0
        self.closed = False
        self.starting = False  # the reader's thread is woken at the loop's next turn

    @classmethod
    def here(cls, loop: asyncio.AbstractEventLoop) -> PageWaits | None:
        """Waits for *loop*, or None without the compiled page reader (the caller then reads
        ahead with :func:`read_ahead` and waits on a timer)."""
        return cls(loop) if _platform.HAS_PAGE_READER else None

    def ask(
        self,
        fd: int,
        offset: int,
        size: int,
        then: Callable[[], None],
        late: Callable[[], None],
        key: tuple[int, int] | None = None,
    ) -> int:
        """Read [offset, offset+size) of *fd* in (from a duplicate: *fd* may be closed at once),
        then call *then* on the loop; the token :meth:`cancel` takes. A range not in after
        :attr:`patience` (within twice that: a hung file, a very slow device, reads queued behind
        one) is no longer waited for, and *late* is called instead. *key*: the file's device and
        inode, if known (``_reading_in.started_reading``). Not after :meth:`close`."""
        reader = self._reader_for(fd, key)
        token = self.next
        reader.ask(fd, offset, size, token)
        self.next = token + 1
        self.waiting[token] = then
        self._asked(token, late)
        return token

    def ask_send(
        self,
        fd: int,
        offset: int,
        size: int,
        sock: int,
        head: bytes | memoryview,
        flags: int,
        then: Callable[[Sent | None], None],
        late: Callable[[], None],
        key: tuple[int, int] | None = None,
    ) -> int:
        """As :meth:`ask`, but the thread sends *head* (with *flags*) and then the range to *sock*
        (non-blocking) as far as the socket takes them, and *then* is called with what went
        (:data:`Sent`), or with None if the thread never began (these waits closed first: the
        caller sends it another way). A send not begun within the patience is held back and
        *late* called instead (one under way is waited for). The thread takes its own duplicate
        of *sock* as it begins: the caller keeps *sock* open until *then* or *late* is called or
        :meth:`cancel` or :meth:`close` returns (a socket closed meanwhile is never written to,
        whatever its number becomes), and writes nothing else to it until *then* or *late*."""
        reader = self._reader_for(fd, key)
        token = self.next
        reader.ask(fd, offset, size, token, sock, head, flags)
        self.next = token + 1
        self.sends[token] = then
        self._asked(token, late)
        return token

    def _reader_for(self, fd: int, key: tuple[int, int] | None) -> _syscalls_types.PageReader:
        """The reader (made at the first ask), about to read *fd*'s file in (noted: its pages
        may be on the way, ``_reading_in.started_reading``)."""
        if self.closed:
            raise RuntimeError("these page waits are closed")
        reader = self.reader
        if reader is None:
            reader = self.reader = _platform.page_reader()
            self.loop.add_reader(reader.fileno(), self._arrived)
        _reading_in.started_reading(fd, key)
        return reader

    def _asked(self, token: int, late: Callable[[], None]) -> None:
        self.late[token] = late
        if self.timer is None:
            self.horizon = token
            self.timer = self.loop.call_later(self.patience, self._check)
        if not self.starting:  # (a turn's ranges together: one wake-up of the thread)
            self.starting = True
            self.loop.call_soon(self._start)

    def _start(self) -> None:
        self.starting = False
        if self.reader is not None:
            self.reader.start()

    def cancel(self, token: int) -> None:
        """*then* is not called for *token* (its read goes on, and is dropped when it ends; a send
        not begun is not made, and one begun is on the thread's own duplicate of its socket:
        the caller may close its socket once this returns)."""
        self.waiting.pop(token, None)
        self.late.pop(token, None)
        if self.sends.pop(token, None) is not None and self.reader is not None:
            self.reader.cancel(token)

    def _check(self) -> None:
        """(Every ``patience`` while something waits.) What was asked before the last run and is
        still not in is late: forgotten, and its *late* called."""
        self.timer = None
        horizon, self.horizon = self.horizon, self.next
        late = self.late
        overdue = []
        for token in late:  # (in token order: the oldest first)
            if token >= horizon:
                break
            overdue.append(token)
        calls = []
        sends = self.sends
        for token in overdue:
            if token in sends:
                assert self.reader is not None
                if not self.reader.cancel(token):  # under way: what went is told in a moment
                    continue
                del sends[token]
            self.waiting.pop(token, None)
            calls.append(late.pop(token))
        if late and not self.closed:
            self.timer = self.loop.call_later(self.patience, self._check)
        self._call_all(calls, "a late wait for pages failed")

    def close(self) -> None:
        """No more waits: the reader's eventfd leaves the loop and is closed, with the duplicates
        still queued (a read under way ends in the thread, which then ends too). What still
        waits is called back at the loop's next turn (it finds the waits closed: a timer then); a
        send with what became of it (None if it was held back, ``UNKNOWN_SEND`` if under way)."""
        self.closed = True
        reader = self.reader
        sends: list[Callable[[], None]] = []
        if self.sends and reader is not None:
            # A send the thread has not begun is held back (the caller sends it another way); one
            # it made is told by done(); one under way now cannot be known: the caller aborts.
            held = {token for token in self.sends if reader.cancel(token)}
            for item in reader.done():
                if type(item) is tuple and item[0] in self.sends and item[0] not in held:
                    sends.append(partial(self.sends.pop(item[0]), item))
            for token, sent in self.sends.items():
                sends.append(partial(sent, None if token in held else UNKNOWN_SEND))
        self.sends = {}
        waiting, self.waiting = self.waiting, {}
        self.late = {}
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.loop.is_closed():
            for then in waiting.values():
                self.loop.call_soon(then)
            for call in sends:
                self.loop.call_soon(call)
        self.reader = None
        if reader is not None:
            if not self.loop.is_closed():
                self.loop.remove_reader(reader.fileno())
            reader.close()

    def _arrived(self) -> None:
        reader = self.reader
        if reader is None:  # (closed in this iteration, after the loop saw the eventfd readable)
            return
        waiting, late = self.waiting, self.late
        ready: list[Callable[[], None]] = []
        for item in reader.done():
            if type(item) is int:
                then = waiting.pop(item, None)
                if then is not None:
                    del late[item]
                    ready.append(then)
            else:
                assert isinstance(item, tuple)
                sent = self.sends.pop(item[0], None)
                if sent is not None:
                    del late[item[0]]
                    ready.append(partial(sent, item))
        self._call_all(ready, "a wait for pages failed")

    def _call_all(self, calls: list[Callable[[], None]], failed: str) -> None:
        """Call each of *calls* (waits already forgotten): one that raises is reported to the
        loop's handler as *failed* and the others still go on; KeyboardInterrupt or SystemExit
        goes up, the rest at the loop's next turn."""
        for i, call in enumerate(calls):
            try:
                call()
            except Exception as exc:
                self.loop.call_exception_handler({"message": failed, "exception": exc})
            except BaseException:
                for later in calls[i + 1 :]:
                    self.loop.call_soon(later)
                raise


#: ``read_ahead(fd, offset, size, loop=None)``: have the kernel start reading [offset,
#: offset+size) of *fd* in, from the read-ahead thread, at *loop*'s next turn (at once without
#: one). Nothing waits for it; *fd* is duplicated first, so the caller may close it at once.
read_ahead = _ReadAhead().ask
