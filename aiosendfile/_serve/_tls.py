"""``serve``'s own TLS connections: OpenSSL on the connection's socket, driven by the event loop.

asyncio's TLS transport (CPython's ``sslproto``, uvloop's) runs OpenSSL over memory BIOs: every
byte written is copied into a BIO, the ciphertext out of it into a Python object, and that into
the socket transport, with Python calls per record between. nginx calls ``SSL_read`` and
``SSL_write`` on the socket itself. :class:`TLSTransport` does what nginx does, on either loop:
OpenSSL's connection on the accepted, non-blocking socket (``_compat.tls_server_connection``: the
``_ssl`` object alone, no ``ssl.SSLSocket`` around it), its descriptor watched with
``add_reader``/``add_writer``, and the transport API the engine uses on top (``write``, flow
control with ``pause_writing``/``resume_writing``, ``pause_reading``, ``close``, ``abort``).

* **Handshake** as the loop's own would: within ``handshake_timeout`` (asyncio's 60 s) or the
  socket is closed; a failed one is the peer's problem (nothing logged; plain HTTP gets a plain
  400 that says it came to an HTTPS port, as nginx answers: :mod:`._tls_rules`). It begins when the
  socket is readable (the client's hello), in the loop's turn for it, never inside the accept
  batch. The protocol is made and its ``connection_made`` called once it is done, and what the
  client sent behind its last handshake record is read at once.
* **Writes** go to ``SSL_write`` at once when nothing waits. One that the socket cannot take
  whole (``SSLWantWriteError``) is kept, the very object, and written again when the socket is
  writable, as OpenSSL requires; what is written meanwhile waits behind it, and the protocol is
  paused above ``HIGH_WATER`` bytes, resumed below ``LOW_WATER``.
* **Reads**: ``SSL_read`` into a new bytes object per record, handed to ``data_received``; up
  to ``READS_PER_WAKEUP`` per wakeup, and a record already decrypted (``pending()``) is read in
  the next iteration: the socket does not say it is readable for those.
* **End**: the peer's ``close_notify`` or end of stream is ``eof_received`` (then closed unless
  the protocol keeps it open); ``close()`` sends what waits, then our ``close_notify`` and our
  end of stream, and reads and drops what the client still sends (its own ``close_notify``) until
  its end, for ``LINGER`` seconds at most (``LINGER_IDLE`` without a byte from it): closed with
  unread bytes, the socket would answer them with a reset, and a client still reading the
  answer would lose its tail. ``abort()`` closes at once.
  ``connection_lost`` is called once, in a later iteration of the loop.

File bodies on it are :mod:`._tls_body`'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import ssl
from collections.abc import Callable
from typing import Any

from .. import _compat
from ._tls_rules import PLAIN_REFUSAL, plain_http

__all__ = (
    "HANDSHAKE_TIMEOUT",
    "HIGH_WATER",
    "LOW_WATER",
    "TLSTransport",
)

#: A handshake not done in this many seconds is dropped (asyncio's ``ssl_handshake_timeout``).
HANDSHAKE_TIMEOUT = 60.0

#: A closed connection reads what its client still sends this long at most (nginx's
#: ``lingering_time``), then is closed (see ``TLSTransport._linger``): long enough for a slow
#: client to read the end of the answer from the socket buffers.
LINGER = 30.0
#: ... and closed once its client has sent nothing for this long (nginx's ``lingering_timeout``):
#: a client that keeps its socket open and says nothing does not hold it for all of ``LINGER``.
LINGER_IDLE = 5.0
#: Bytes waiting for the socket above which the protocol is paused, and below which resumed.
HIGH_WATER = 64 * 1024
LOW_WATER = 16 * 1024
#: Largest read asked of ``SSL_read``: it returns at most one record, whose plaintext is at most
#: 16 KiB (a larger ask only makes a larger bytes object to shrink).
READ_SIZE = 16 * 1024
READS_PER_WAKEUP = 16

_MISSING = object()
_SESSION_FACTS = frozenset(("ssl_object", "cipher", "peercert", "compression"))


class TLSTransport(asyncio.Transport):
    """One TLS connection on its own socket (see the module)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        raw: socket.socket,
        context: ssl.SSLContext,
        factory: Callable[[], asyncio.Protocol],
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        on_ready: Callable[[TLSTransport], None] | None = None,
        lingering: set[TLSTransport] | None = None,
    ) -> None:
        super().__init__()
        self._lingering = lingering  # where a closed connection waits for its client's end
        self._loop = loop
        raw.setblocking(False)
        self._tls = tls = _compat.tls_server_connection(context, raw)
        self._sock = tls.sock  # (the socket's own calls)
        self._fd = self._sock.fileno()
        self._context = context
        self._factory = factory
        self._on_ready = on_ready
        self._protocol: asyncio.Protocol | None = None
        # (the peer's address now: a client gone before its first request is read leaves none;
        # the rest is asked when wanted: see get_extra_info)
        self._extra: dict[str, Any] = {"sslcontext": context, "socket": self._sock}
        with contextlib.suppress(OSError):
            self._extra["peername"] = self._sock.getpeername()
        self._pending: Any = None  # the write OpenSSL must be given again (whole)
        self._queue: collections.deque[bytes] = collections.deque()
        self._buffered = 0  # bytes in _pending and _queue
        self._high, self._low = HIGH_WATER, LOW_WATER
        self._protocol_paused = False
        self._reading = False  # the reader is registered
        self._read_paused = False  # by the protocol
        self._writing = False  # the writer is registered
        self._write_wants_read = False  # OpenSSL asked to read before a write can go on
        self._read_wants_write = False  # ... and to write before a read can
        self._closing = False
        self._closed = False  # the socket is closed (connection_lost called or scheduled)
        self._handshaking = True
        self._timer: asyncio.TimerHandle | None = loop.call_later(handshake_timeout, self._handshake_expired)
        self._drained: Callable[[], None] | None = None  # a body waiting for the socket (TLSBody)
        self._read, self._write, self._pending_bytes = tls.read, tls.write, tls.pending
        # The handshake begins when the client's hello is read, in the loop's turn for this socket,
        # not here: an accept batch does no handshake (each ~0.4 ms of key exchange and signing),
        # so the connections already set up are not held behind a burst of new ones (as nginx).
        self._watch_read(True)

    # -- handshake --------------------------------------------------------------------------

    def _handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._watch_write(False)
            return
        except ssl.SSLWantWriteError:
            self._watch_write(True)
            return
        except (OSError, ValueError) as exc:  # (ssl.SSLError is an OSError) the peer's problem
            if plain_http(getattr(exc, "reason", None), self._peek()):
                self._plain_refusal()
            self._drop()
            return
        self._handshaking = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._watch_write(False)
        if self._on_ready is not None:
            self._on_ready(self)
        try:
            protocol = self._protocol = self._factory()
            protocol.connection_made(self)
        except BaseException:  # (a bug: no connection left open with nobody to serve it)
            self.abort()
            raise
        if not self._closed:  # (a client's first request comes right behind its last handshake record)
            self._readable()

    def _peek(self) -> bytes:
        """What the client sent that OpenSSL has not read, as far as it came (peeked, not read)."""
        with contextlib.suppress(OSError):
            return self._sock.recv(512, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return b""

    def _plain_refusal(self) -> None:
        """Plain HTTP where a ClientHello belongs: a plain 400 that says so, as nginx answers, so
        that a client asking ``http://`` is told why (not a reset). Best effort, on the socket
        as it is: what the client sent is read and dropped first (up to a bound), so that the
        close after the answer is not a reset that could take the answer with it."""
        fd = self._fd
        with contextlib.suppress(OSError):
            for _ in range(4):
                if len(os.read(fd, 65536)) < 65536:
                    break
        with contextlib.suppress(OSError):
            os.write(fd, PLAIN_REFUSAL)
            self._sock.shutdown(socket.SHUT_WR)

    def _handshake_expired(self) -> None:
        self._timer = None
        self._drop()

    def _drop(self) -> None:
        """End a set-up: close the socket, with no protocol to tell."""
        if self._closed:
            return
        self._handshaking = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._closed = self._closing = True
        self._release_socket()
        if self._on_ready is not None:
            self._on_ready(self)

    @property
    def in_setup(self) -> bool:
        """Whether the handshake is still going on."""
        return self._handshaking

    def cancel_setup(self) -> bool:
        """Close a connection still in its handshake; False if it is set up already."""
        if not self._handshaking:
            return False
        self._drop()
        return True

    # -- the loop's callbacks ----------------------------------------------------------------

    def _watch_read(self, on: bool) -> None:
        if on != self._reading and not self._closed:
            self._reading = on
            if on:
                self._loop.add_reader(self._fd, self._readable)
            else:
                self._loop.remove_reader(self._fd)

    def _watch_write(self, on: bool) -> None:
        if on != self._writing and not self._closed:
            self._writing = on
            if on:
                self._loop.add_writer(self._fd, self._writable)
            else:
                self._loop.remove_writer(self._fd)

    def _readable(self) -> None:
        if self._closed:
            return
        if self._handshaking:
            self._handshake()
            return
        if self._write_wants_read:
            self._write_wants_read = False
            self._flush()
            if self._closed or self._write_wants_read:
                return
        if self._read_paused or self._closing:
            self._watch_read(False)  # (paused: see pause_reading)
            return
        read = self._read
        for _ in range(READS_PER_WAKEUP):
            try:
                data = read(READ_SIZE)
            except ssl.SSLWantReadError:
                return
            except ssl.SSLEOFError:  # the socket's end without a close_notify
                data = b""
            except ssl.SSLWantWriteError:
                self._read_wants_write = True
                self._watch_write(True)
                return
            except (OSError, ValueError) as exc:
                self._fatal(exc)
                return
            if not data:
                self._eof()
                return
            self._protocol.data_received(data)  # type: ignore[union-attr]
            if self._read_paused or self._closing or not self._pending_bytes():
                return
        self._loop.call_soon(self._readable)  # records already decrypted: the next iteration

    def _writable(self) -> None:
        if self._closed:
            return
        if self._handshaking:
            self._handshake()
            return
        if self._read_wants_write:
            self._read_wants_write = False
            if self._pending is None and not self._queue:
                self._watch_write(False)
            self._readable()
            if self._closed:
                return
        self._flush()

    def _eof(self) -> None:
        self._watch_read(False)
        keep = self._protocol.eof_received()  # type: ignore[union-attr]
        if not keep and not self._closing:
            self.close()

    # -- writing ------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._closed or not data:
            return
        if self._pending is None and not self._queue:
            try:
                self._write(data)
                return  # (the common case: whole, at once)
            except (OSError, ValueError) as exc:
                self._write_failed(exc)
            if self._closed:  # (the connection failed: nothing kept)
                return
            # The caller may reuse its buffer: OpenSSL needs these bytes again.
            self._pending = data if type(data) is bytes else bytes(data)
            self._buffered = len(data)
        else:
            self._queue.append(bytes(data))
            self._buffered += len(data)
        if self._buffered > self._high and not self._protocol_paused and self._drained is None:
            self._protocol_paused = True
            self._protocol.pause_writing()  # type: ignore[union-attr]

    def send_body(self, data: memoryview, drained: Callable[[], None]) -> bool:
        """Write *data* (a view of a :class:`TLSBody`'s buffer) now: True when the socket took it
        all; False when *drained* will be called once it has (the buffer untouched meanwhile)
        or the connection ends (then :meth:`is_closing`)."""
        if self._closing or self._closed:
            return False
        self._drained = drained
        if self._pending is None and not self._queue:
            self._pending = data
            self._buffered = len(data)
            if self._send():
                self._drained = None
                return True
        else:
            self._queue.append(bytes(data))  # (the protocol flushes its answers before a body)
            self._buffered += len(data)
        return False

    def _send(self) -> bool:
        """Give ``_pending`` to OpenSSL: True if it went whole (else the loop says when to retry)."""
        pending = self._pending
        try:
            self._write(pending)
        except (OSError, ValueError) as exc:
            self._write_failed(exc)
            return False
        self._pending = None
        self._buffered -= len(pending)
        return True

    def _write_failed(self, exc: OSError | ValueError) -> None:
        """``SSL_write`` did not take a write: wait for what OpenSSL asks (then give it the same
        bytes again), or the connection fails."""
        if isinstance(exc, ssl.SSLWantWriteError):
            self._watch_write(True)
        elif isinstance(exc, ssl.SSLWantReadError):  # (a renegotiation) go on once readable
            self._write_wants_read = True
            self._watch_read(True)
        else:
            self._fatal(exc)

    def _flush(self) -> None:
        while True:
            if self._pending is None:
                queue = self._queue
                if not queue:
                    break
                self._pending = queue.popleft() if len(queue) == 1 else b"".join(queue)
                queue.clear()
            if not self._send():
                return
        self._watch_write(False)
        if self._closing:
            self._finish()
            return
        if self._protocol_paused and self._buffered <= self._low:
            self._protocol_paused = False
            self._protocol.resume_writing()  # type: ignore[union-attr]
        drained, self._drained = self._drained, None
        if drained is not None:
            drained()

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections cannot half-close")

    # -- reading ------------------------------------------------------------------------------

    def is_reading(self) -> bool:
        return not self._read_paused and not self._closing

    def pause_reading(self) -> None:
        """Stop handing reads to the protocol. The reader stays registered until it fires while
        paused (then it is removed): a protocol that pauses and resumes for every request costs
        no ``epoll_ctl`` (on uvloop, also a poll handle made and freed) unless data came meanwhile."""
        if self._closing or self._read_paused:
            return
        self._read_paused = True

    def resume_reading(self) -> None:
        if self._closing or not self._read_paused:
            return
        self._read_paused = False
        if self._reading:
            if self._pending_bytes():  # decrypted already: the socket will not say so
                self._loop.call_soon(self._readable)
        else:
            self._watch_read(True)
            self._loop.call_soon(self._readable)  # (what came while paused, decrypted or not)

    # -- the end --------------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stop reading; once what waits is written, send ``close_notify`` and close."""
        if self._closing:
            return
        self._closing = True
        if self._handshaking:
            self._drop()
            return
        if self._pending is None and not self._queue:
            self._finish()  # (the reader stays registered for the lingering close: no epoll_ctl)
        else:
            self._watch_read(False)

    def abort(self) -> None:
        self._end(None)

    def _fatal(self, exc: BaseException) -> None:
        self._end(exc if isinstance(exc, Exception) else None)

    def _finish(self) -> None:
        """Everything written: our ``close_notify``, then a lingering close (see :meth:`_linger`)."""
        with contextlib.suppress(OSError, ValueError):
            self._tls.close_notify()  # (sends it; then would wait for the peer's: WantRead)
        linger = self._lingering is not None
        if linger:
            try:
                socket.socket.shutdown(self._sock, socket.SHUT_WR)  # our FIN, after all we wrote
            except OSError:
                linger = False
        self._end(None, linger=linger)

    def _start_linger(self) -> None:
        """Watch the closed connection's socket for what its client still sends (see _linger)."""
        assert self._lingering is not None
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)
        # Registered already (the common close): the callback replaced, no epoll_ctl (on uvloop,
        # no poll handle freed and made again, four system calls each).
        self._reading = True
        self._loop.add_reader(self._fd, self._linger)
        self._linger_end = self._loop.time() + LINGER
        self._timer = self._loop.call_later(min(LINGER_IDLE, LINGER), self.end_linger)
        self._lingering.add(self)

    def _linger(self) -> None:
        """Read and drop what the client still sends (its ``close_notify``) until its end of
        stream: a socket closed with unread bytes answers them with a reset, and a client that
        has not read all of the answer yet (a paused reader) then loses its tail. At most
        ``READS_PER_WAKEUP`` reads a wakeup (a client that keeps sending waits for the next one);
        the ``LINGER`` timer ends it in any case, as nginx's ``lingering_time``."""
        for n in range(READS_PER_WAKEUP):
            try:
                if not socket.socket.recv(self._sock, READ_SIZE):
                    break
            except (BlockingIOError, InterruptedError):
                if n:
                    self._still_lingering()
                return
            except OSError:
                break
        else:
            self._still_lingering()
            return  # (more may come: the next wakeup reads on)
        self.end_linger()

    def _still_lingering(self) -> None:
        """The client sent something: it has ``LINGER_IDLE`` more (within ``LINGER`` in all)."""
        if self._timer is not None:
            self._timer.cancel()
        left = self._linger_end - self._loop.time()
        self._timer = self._loop.call_later(max(0.0, min(LINGER_IDLE, left)), self.end_linger)

    def end_linger(self) -> None:
        """Close a lingering socket now (its client's end came, LINGER ran out, or a stop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lingering is not None:
            self._lingering.discard(self)
        self._release_socket()

    def _end(self, exc: Exception | None, *, linger: bool = False) -> None:
        """The connection is over for its protocol (``connection_lost`` next): its socket closed,
        or with *linger* kept open a while for what the client still sends."""
        if self._closed:
            return
        if self._handshaking:
            self._drop()
            return
        self._closing = self._closed = True
        if linger:
            self._start_linger()
        else:
            self._release_socket()
        self._pending = None
        self._queue.clear()
        self._buffered = 0
        self._loop.call_soon(self._lost, exc)

    def _release_socket(self) -> None:
        if self._sock.fileno() < 0:
            return
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)
        self._sock.close()
        _compat.forget_tls_connection(self._tls)

    def _lost(self, exc: Exception | None) -> None:
        protocol, self._protocol = self._protocol, None
        drained, self._drained = self._drained, None
        # A body waiting for the socket hears first (it ends, is logged, as when its own write
        # fails on a plain socket); then the protocol, whose connection_lost stops anything else.
        if drained is not None:
            drained()
        if protocol is not None:
            protocol.connection_lost(exc)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol  # type: ignore[return-value]

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        extra = self._extra
        if name in extra:
            return extra[name]
        found = self._found(name)
        if found is _MISSING:
            return default
        extra[name] = found
        return found

    def _found(self, name: str) -> Any:
        """An extra asked for the first time (each costs calls most connections never need):
        the addresses while the socket is open, the TLS session's facts once it is set up."""
        try:
            if name in ("peername", "sockname"):
                sock = self._sock
                return sock.getpeername() if name == "peername" else sock.getsockname()
            if self._handshaking or name not in _SESSION_FACTS:
                return _MISSING
            info = self._tls.info
            if name == "ssl_object":
                return info
            if name == "cipher":
                return info.cipher()
            if name == "peercert":
                return info.getpeercert()
            return info.compression()
        except (OSError, ValueError, AttributeError):  # (closed: the socket, or the connection let go)
            return _MISSING

    def __repr__(self) -> str:
        state = "closed" if self._closed else "closing" if self._closing else "open"
        return f"<TLSTransport fd={self._fd} {state}>"
