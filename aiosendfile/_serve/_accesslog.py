"""The access log: one line per response, in the Combined Log Format as nginx and Apache write it
(the default), the Common Log Format (the same without ``Referer`` and ``User-Agent``), or JSON::

    127.0.0.1 - - [24/Nov/2026:08:09:07 +0000] "GET /a.txt HTTP/1.1" 200 4096 "-" "curl/8.5.0"
    127.0.0.1 - - [24/Nov/2026:08:09:07 +0000] "GET /a.txt HTTP/1.1" 200 4096
    {"time": "2026-11-24T08:09:07+00:00", "remote_addr": "127.0.0.1", "request": "GET /a.txt
    HTTP/1.1", "status": 200, "body_bytes_sent": 4096, "http_referer": "", "http_user_agent":
    "curl/8.5.0"}  (one line)

``%b`` is the body bytes sent (``-`` for none; 0 in JSON). Request line, ``Referer`` and
``User-Agent`` are the client's bytes with ``"``, ``\\`` and non-printable bytes escaped as
``\\xHH`` (nginx's rule), so a line can be neither split nor forged; in JSON they are JSON strings
of those escaped bytes (nginx's ``escape=json`` names the keys). The address is the client a
trusted proxy names (``--trusted-proxy``), else the peer's. Lines are batched here, up to
``PIPE_BUF`` (4 KiB) of whole lines per batch; the engine flushes each second and at shutdown.
Nothing here runs when no log is configured.

**A log never blocks serving.** A stream with a file descriptor (stderr, a file) is written by a
:class:`LineWriter`: the loop only hands it a batch; its thread writes with ``os.write`` on the
descriptor (not through the stream object, whose lock the loop's thread may need). It holds at
most :data:`BUFFER_BYTES` (1 MiB) of lines waiting; when a reader stops reading (a pipe nobody
drains fills in 64 KiB), the lines that do not fit are dropped and counted, and once there is
room again one line says how many::

    aiosendfile serve: 1234 log lines dropped (stderr was not being read)

Each ``write`` is whole lines, at most ``PIPE_BUF`` bytes, so workers sharing a pipe never tear
each other's lines: no line is longer, as each field a client sets (the request line, the
referer, the user agent) keeps at most ``_FIELD_MAX`` characters, escaped, and ends with ``...``
where it was cut. At the end, :meth:`LineWriter.drain` gives what is
queued a bounded time (the command line: 1 s, and ``atexit`` does the same for a program that
exits normally); the thread is a daemon and never holds up the exit. A stream without a
descriptor (``io.StringIO``) cannot block: it is written directly, as before.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import re
import select
import signal
import threading
import time
from typing import TextIO

__all__ = ("BUFFER_BYTES", "FORMATS", "AccessLog", "LineWriter", "line_writer")

#: The line formats (``--access-log-format``), the first the default.
FORMATS = ("combined", "common", "json")

#: A batch of lines written at once: a write to a pipe up to PIPE_BUF is never interleaved.
_BATCH = 4096

#: Bytes of lines a :class:`LineWriter` keeps waiting at most; beyond, lines are dropped and counted.
BUFFER_BYTES = 1 << 20

#: How long a :class:`LineWriter`'s thread waits for more lines before it ends, by default.
_LINGER = 1.0

#: The signals the command line handles: delivered to the loop's thread, never to a writer's.
_HANDLED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}

_UNSAFE = re.compile(rb'[^\x20-\x7e]|["\\]')


#: The characters a field (the request line, the referer, the user agent) keeps, escaped: three
#: of them and the rest of a line, also as JSON (which writes each ``\`` twice), stay within
#: PIPE_BUF, so that a line a client made long is still written whole (see the module).
_FIELD_MAX = 1000


def _escape(value: bytes | None) -> str:
    if not value:
        return "-"
    long = len(value) > _FIELD_MAX
    if long:
        value = value[:_FIELD_MAX]
    if _UNSAFE.search(value) is not None:
        value = _UNSAFE.sub(lambda m: b"\\x%02X" % m[0][0], value)
        long = long or len(value) > _FIELD_MAX
    text = value.decode("ascii")
    if long:  # cut short, not inside an escape (every backslash begins one of four characters)
        text = text[: _FIELD_MAX - 3]
        cut = text.rfind("\\", len(text) - 3)
        return (text[:cut] if cut >= 0 else text) + "..."
    return text


class LineWriter:
    """Writes whole lines to file descriptor *fd* from its own thread; :meth:`put` never blocks.

    One per descriptor and process (:func:`line_writer`). *prefix* starts the line that says how
    many lines were dropped (``aiosendfile serve`` on the command line).
    """

    __slots__ = (
        "cond",
        "dropped",
        "fd",
        "gave_up",
        "gone",
        "linger",
        "prefix",
        "queue",
        "queued",
        "thread",
        "writing",
    )

    def __init__(self, fd: int, prefix: str = "aiosendfile") -> None:
        self.fd = fd
        self.prefix = prefix
        self.cond = threading.Condition(threading.Lock())
        self.queue: collections.deque[bytes] = collections.deque()
        self.queued = 0  # bytes in queue (not counting the batch being written)
        self.dropped = 0  # lines dropped since the last note
        self.writing = False
        self.gone = False  # the descriptor broke (EPIPE, EBADF): lines are dropped uncounted
        self.gave_up = False  # a drain timed out: the next ones do not wait (the exit is held up once)
        self.thread: threading.Thread | None = None
        #: How long the thread waits for more lines before it ends (the next line starts another):
        #: no thread is left behind by a process that writes a line now and then (one that forks).
        self.linger = _LINGER

    def say(self, text: str) -> None:
        """Write ``prefix: text`` as one line."""
        self.put(f"{self.prefix}: {text}\n".encode(), 1)

    def put(self, data: bytes, lines: int) -> None:
        """Queue *data*, *lines* whole lines, or drop and count them if the buffer is full."""
        with self.cond:
            if self.gone:
                return
            if self.dropped:
                if self.queued + len(self._note()) + len(data) > BUFFER_BYTES:
                    self.dropped += lines
                    return
                self._queue_note()
            elif self.queued + len(data) > BUFFER_BYTES:
                self.dropped += lines
                return
            self._queue(data)

    def drain(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds for every queued line to be written (the dropped-lines
        note included); whether they were. Once a drain timed out, later ones do not wait."""
        with self.cond:
            if self.dropped and not self.gone:
                self._queue_note()  # (past the bound by one line, at most once)
            done = self.cond.wait_for(
                lambda: self.gone or not (self.queue or self.writing), 0.0 if self.gave_up else timeout
            )
            self.gave_up = not done
            return done

    # -- inside, with self.cond held ------------------------------------------------------------

    def _note(self) -> bytes:
        where = "stderr" if self.fd == 2 else f"file descriptor {self.fd}"
        return f"{self.prefix}: {self.dropped} log lines dropped ({where} was not being read)\n".encode()

    def _queue_note(self) -> None:
        note = self._note()
        self.dropped = 0
        self._queue(note)

    def _queue(self, data: bytes) -> None:
        self.queue.append(data)
        self.queued += len(data)
        if self.thread is not None:
            self.cond.notify_all()
            return
        thread = threading.Thread(target=self._run, name=f"aiosendfile-log-{self.fd}", daemon=True)
        # Started with the signals the command line handles blocked (a new thread keeps the mask):
        # they go to the loop's thread, whose waits they must interrupt.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: the next line tries again
            pass
        else:
            self.thread = thread
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _take(self) -> bytes:
        """Queued lines for one ``write``: whole batches, together at most ``PIPE_BUF`` bytes."""
        queue = self.queue
        parts = [queue.popleft()]
        size = len(parts[0])
        while queue and size + len(queue[0]) <= _BATCH:
            size += len(queue[0])
            parts.append(queue.popleft())
        self.queued -= size
        return parts[0] if len(parts) == 1 else b"".join(parts)

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        cond = self.cond
        while True:
            with cond:
                self.writing = False
                if not self.queue and self.dropped:
                    self._queue_note()  # room again: say what was lost
                if not self.queue:
                    cond.notify_all()  # drain()
                    if not cond.wait_for(lambda: self.queue, self.linger):
                        self.thread = None
                        return
                data = self._take()
                self.writing = True
            if not self._write(data):
                with cond:
                    self.gone = True
                    self.queue.clear()
                    self.queued = 0
                    self.writing = False
                    self.thread = None
                    cond.notify_all()
                return

    def _write(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:  # someone made the shared description non-blocking
                poller = select.poll()
                poller.register(self.fd, select.POLLOUT)
                poller.poll(1000)
            except OSError:  # EPIPE (nobody will ever read), EBADF: the log is gone, serving goes on
                return False
        return True


_writers: dict[int, LineWriter] = {}
_writers_lock = threading.Lock()


def line_writer(fd: int, prefix: str | None = None) -> LineWriter:
    """This process's :class:`LineWriter` for *fd* (made at the first call; a thread only starts
    with the first line). *prefix*, if given, becomes its prefix."""
    with _writers_lock:
        writer = _writers.get(fd)
        if writer is None:
            if not _writers:
                atexit.register(_drain_all, 1.0)
            writer = _writers[fd] = LineWriter(fd)
        if prefix is not None:
            writer.prefix = prefix
        return writer


def _drain_all(timeout: float) -> None:
    for writer in list(_writers.values()):
        writer.drain(timeout)


def _forget_after_fork() -> None:
    # A forked child has none of the parent's threads: its lines need writers of its own.
    global _writers_lock
    _writers.clear()
    _writers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _writer_for(stream: TextIO) -> LineWriter | None:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.StringIO and the like: written directly
        return None
    with contextlib.suppress(OSError, ValueError):
        stream.flush()  # what the stream holds goes before our lines
    return line_writer(fd)


class AccessLog:
    """Writes lines of *form* (:data:`FORMATS`) to *stream* (see the module docstring)."""

    __slots__ = ("form", "lines", "size", "stamped", "stream", "writer")

    def __init__(self, stream: TextIO, form: str = "combined") -> None:
        if form not in FORMATS:
            raise ValueError(f"an access log format is one of {', '.join(FORMATS)}, not {form!r}")
        self.form = form
        self.stamped = (0, "")  # (the second, its ISO 8601 time): JSON's, made once a second
        self.stream = stream
        self.writer = _writer_for(stream)  # None: a stream without a descriptor, written directly
        self.lines: list[str] = []  # not yet written: at most _BATCH characters, or one line
        self.size = 0

    def line(
        self,
        peer: str,
        stamp: str,
        request: bytes,
        status: int,
        sent: int,
        referer: bytes | None,
        agent: bytes | None,
    ) -> None:
        form = self.form
        if form == "combined":
            text = (
                f'{peer} - - {stamp} "{_escape(request)}" {status} {sent or "-"} '
                f'"{_escape(referer)}" "{_escape(agent)}"\n'
            )
        elif form == "common":
            text = f'{peer} - - {stamp} "{_escape(request)}" {status} {sent or "-"}\n'
        else:
            text = self._json(peer, request, status, sent, referer, agent)
        if self.size + len(text) > _BATCH and self.lines:
            self._write()
        self.lines.append(text)
        self.size += len(text)

    def _json(
        self, peer: str, request: bytes, status: int, sent: int, referer: bytes | None, agent: bytes | None
    ) -> str:
        import json  # (here: only a JSON log needs it)

        now = int(time.time())
        second, iso = self.stamped
        if second != now:
            iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now))
            self.stamped = (now, iso)
        fields = {
            "time": iso,
            "remote_addr": peer,
            "request": _escape(request) if request else "",
            "status": status,
            "body_bytes_sent": sent,
            "http_referer": _escape(referer) if referer else "",
            "http_user_agent": _escape(agent) if agent else "",
        }
        return json.dumps(fields, separators=(", ", ": ")) + "\n"

    def _write(self) -> None:
        text = "".join(self.lines)
        count = len(self.lines)
        self.lines.clear()
        self.size = 0
        if self.writer is not None:
            self.writer.put(text.encode(), count)
            return
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: serving goes on
            self.stream.write(text)
            self.stream.flush()

    def flush(self) -> None:
        if self.lines:
            self._write()
