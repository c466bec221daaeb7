"""Borrow a transport for the length of one transfer, then give it back as it was.

Theory of operation
-------------------
A transport belongs to its protocol. To send a file on it without that
protocol's help we borrow it through public transport APIs only:

1. **Pause reading** (if it was reading), so no ``data_received`` arrives
   while the file goes out. Bytes that arrive meanwhile wait in the kernel.
2. **Swap in our protocol** with ``transport.set_protocol(lease)``. That is how
   we hear ``pause_writing``/``resume_writing``/``connection_lost``. A
   ``connection_lost`` is passed on to the user's protocol at once, so it
   learns of the loss just as it would have.
3. **Set the write-buffer limits to (0, 0)**. The transport now pauses us while
   anything is buffered and resumes us exactly when the buffer is empty. That
   is the only public signal that everything written before the call has left.
   The first flow-control event we hear tells whether the user's protocol was
   paused when we took over. On release we make it agree with the transport
   again, or a ``StreamWriter.drain()`` waiting in another task would never
   wake (or a protocol would be paused twice).
4. **Guard writes**: where the transport (or the StreamWriter the call came
   through) is a Python object, its ``write``/``writelines``/``write_eof``
   are shadowed for the duration by ones that raise
   ``RuntimeError("unable to write; sendfile is in progress")``, as
   ``loop.sendfile`` does. uvloop's compiled transports cannot be shadowed:
   there, writing during a transfer is documented as an error.
5. **Release** (always, exactly once): unshadow, give back the protocol, resume
   the user's writing if we swallowed its resume, restore its limits (which
   may pause it again, correctly) and resume reading.

A TLS connection fresh from its handshake
-----------------------------------------
uvloop (checked: 0.23.0, ``uvloop/sslproto.pyx``) ends a server-side handshake
with ciphertext still in its outgoing memory BIO: the TLS 1.3 session tickets,
or under TLS 1.2 the server's ChangeCipherSpec and Finished. It does not send
it then: ``_on_handshake_complete`` calls ``connection_made`` (which, for
``asyncio.start_server``, schedules the handler task) and *then* schedules its
first ``_do_read`` with ``call_soon``, and only that ``_do_read`` sends the
BIO. So when ``sendfile`` is the handler's first await, step 1 pauses reading
before that ``_do_read`` runs, and a ``_do_read`` with reading paused skips
its flush. The bytes stay buffered, ``get_write_buffer_size()`` never falls to
zero, nothing else would send them, and the wait for "everything written
before the call has left" lasts until the peer gives up (under TLS 1.2 the
peer cannot even finish its handshake). CPython's ``asyncio.sslproto`` (3.11+)
calls ``_do_read()`` synchronously at the end of the handshake, so it never
shows there.

So, when a TLS transport holds bytes as we take it over, :meth:`acquire`
runs its write path once with nothing to write: ``writelines(())``. uvloop's
(and CPython's) ``_write_appdata`` then encrypts nothing, sends what the BIO
holds (unless the socket transport under it is paused: then its
``resume_writing`` sends it) and reports flow control, so the resume we wait
for comes. This is the flush the suppressed ``_do_read`` would have done.
It reads no private state (uvloop's ``_state``, ``_app_reading_paused`` and
``_outgoing`` are C fields, unreachable from Python) and costs nothing where
nothing waits. Elsewhere (``write(b"")`` returns
early in both loops) an empty ``writelines`` writes nothing either.

While the lease is held, the transfer may also use the write path itself
(the userspace fallback). It uses :meth:`write` and :meth:`drain`, which go to
the unshadowed methods and respect whatever limits it set.

A *receiving* lease (``recvfile``) does steps 1, 2 and 5 only. Writing stays
the user's, so flow-control events go straight through to the user's
protocol, and nothing is shadowed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from . import _compat
from ._errors import ConnectionLostError
from ._target import is_tls

__all__ = ("TransportLease",)

_GUARDED = ("write", "writelines", "write_eof")
_MISSING = object()


def _refuse_write(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("unable to write; sendfile is in progress")


class TransportLease(asyncio.Protocol):
    """Stands in for a transport's protocol while a file is sent on it."""

    def __init__(
        self, transport: asyncio.WriteTransport, writer: Any = None, *, receiving: bool = False
    ) -> None:
        if transport.is_closing() and not receiving:
            raise RuntimeError("Transport is closing")
        self.refuse_if_held(transport)
        self._receiving = receiving
        self._transport = transport
        self._writer = writer
        self._user_protocol = transport.get_protocol()
        self._was_reading = _is_reading(transport)
        self._limits = transport.get_write_buffer_limits()  # (low, high)
        self._transport_write = transport.write  # the real ones, kept before guarding
        self._transport_writelines = getattr(transport, "writelines", None)  # a duck-typed one may lack it
        self._paused = False  # our mirror of the transport's "protocol paused" flag
        # The first flow-control event we hear tells what the flag was when we
        # took over, and so what the user's protocol still believes: a
        # resume_writing first means it was paused; pause_writing first, not.
        # With no event at all, the flag never changed and the user is in step.
        self._first_event: str | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loss_waiter: asyncio.Future[None] | None = None
        self._lost = False
        self._lost_exc: Exception | None = None
        self._shadowed: list[tuple[object, str, object]] = []
        self._held = False
        self._under: Any = None  # see watch_socket_under_tls

    @staticmethod
    def held_on(transport: asyncio.BaseTransport) -> bool:
        """Whether a lease (a ``sendfile`` or ``recvfile`` in progress) holds *transport* now, or
        asyncio's own ``loop.sendfile`` sends on it (our bytes went in the middle of its file)."""
        if isinstance(transport.get_protocol(), TransportLease):
            return True
        return _compat.asyncio_sendfile_holds(transport)

    @staticmethod
    def refuse_if_held(transport: asyncio.BaseTransport) -> None:
        """RuntimeError if a lease holds *transport*: a second transfer is refused, as
        ``loop.sendfile`` refuses one."""
        if TransportLease.held_on(transport):
            raise RuntimeError("unable to start; another sendfile/recvfile is in progress on this transport")

    @staticmethod
    def guards_writes(transport: asyncio.BaseTransport, writer: Any = None) -> bool:
        """Whether a lease would refuse writes here (step 4): a StreamWriter, or a Python transport."""
        return writer is not None or hasattr(transport, "__dict__")

    # -- lifecycle ------------------------------------------------------------

    def acquire(self) -> None:
        """Take the transport over (steps 1 to 4 above); on failure, leave it as it was."""
        transport = self._transport
        if self._was_reading:
            transport.pause_reading()  # type: ignore[attr-defined]
        transport.set_protocol(self)
        self._held = True
        if self._receiving:
            return
        try:
            # Anything buffered now triggers pause_writing, or, if the transport had
            # paused the user's protocol already, only a bare resume_writing later.
            self._paused = transport.get_write_buffer_size() > 0
            transport.set_write_buffer_limits(high=0, low=0)
            kick = self._transport_writelines
            if kick is not None and transport.get_write_buffer_size() > 0 and is_tls(transport):
                # Send what a fresh TLS handshake left buffered (see "A TLS connection
                # fresh from its handshake"): no flush would come while reading is paused.
                # Before the guards: CPython 3.10's writelines goes through self.write.
                kick(())
            for obj in (transport, self._writer):
                if obj is not None:
                    self._shadow(obj)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give the transport back as it was. Safe to call more than once."""
        if not self._held:
            return
        self._held = False
        for obj, name, previous in reversed(self._shadowed):
            with contextlib.suppress(AttributeError):
                if previous is _MISSING:
                    delattr(obj, name)
                else:
                    setattr(obj, name, previous)  # someone else's instance attribute: put it back
        self._shadowed.clear()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()
        self._waiter = None
        transport = self._transport
        if self._lost:
            # connection_lost was forwarded: the user's protocol is finished with it.
            with contextlib.suppress(Exception):  # a transport already torn down
                transport.set_protocol(self._user_protocol)
            return
        closing = transport.is_closing()
        if self._receiving:
            transport.set_protocol(self._user_protocol)
        else:
            # Limits first, while we are still the protocol: whatever pause/resume
            # that causes lands on our mirror of the transport's paused flag...
            low, high = self._limits
            with contextlib.suppress(Exception):  # a closing uvloop transport may refuse
                transport.set_write_buffer_limits(high=high, low=low)
            transport.set_protocol(self._user_protocol)
            # ...then make the user's protocol agree with that flag. (Also when the
            # transport is closing: it still flushes and will still resume writing.)
            if self._first_event is not None:
                user_paused = self._first_event == "resume"
                if self._paused and not user_paused:
                    self._user_protocol.pause_writing()
                elif user_paused and not self._paused:
                    self._user_protocol.resume_writing()
        if self._was_reading and not closing:
            transport.resume_reading()  # type: ignore[attr-defined]

    def _shadow(self, obj: object) -> None:
        for name in _GUARDED:
            previous = vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
            try:
                setattr(obj, name, _refuse_write)
            except (AttributeError, TypeError):
                return  # a compiled type (uvloop): cannot guard, documented
            self._shadowed.append((obj, name, previous))

    # -- what a transfer uses -------------------------------------------------

    @property
    def transport(self) -> asyncio.WriteTransport:
        return self._transport

    def check_alive(self) -> None:
        """Raise :class:`ConnectionLostError` if the connection is gone or closing."""
        if self._lost:
            if isinstance(self._lost_exc, OSError) and self._lost_exc.errno is not None:
                raise ConnectionLostError(self._lost_exc.errno, self._lost_exc.strerror)
            raise ConnectionLostError("connection lost during sendfile")
        if self._transport.is_closing():
            raise ConnectionLostError("transport was closed during sendfile")
        if self._under is not None and self._under.is_closing():
            # A write now would be dropped, with a warning (see _compat.tls_socket_transport).
            raise ConnectionLostError("the connection under TLS was lost during sendfile")
        if _compat.tls_shutting_down(self._transport):
            raise ConnectionLostError("the TLS session is shutting down (the peer closed its side)")

    def watch_socket_under_tls(self) -> None:
        """Also see the connection as lost once the socket transport under this TLS one is lost
        or closing: the TLS transport itself says so only a loop iteration or two later, and drops
        (with a warning) every write made meanwhile. Found through ``_compat.tls_socket_transport``;
        where it cannot be found, loss is seen from the TLS transport alone, as before.
        """
        self._under = _compat.tls_socket_transport(self._transport)

    def wake_on_loss(self, fut: asyncio.Future[None] | None) -> None:
        """Have *fut* (a wait of the transfer's own) resolved if the connection is lost."""
        self._loss_waiter = fut

    def set_buffer_limits(self, *, high: int, low: int) -> None:
        """Change the write-buffer limits for the rest of the lease."""
        self._transport.set_write_buffer_limits(high=high, low=low)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write through the real ``transport.write`` (the fallback's path)."""
        self.check_alive()
        self._transport_write(data)

    async def drain(self) -> None:
        """Wait until the transport has resumed writing (below its low-water mark)."""
        while self._paused:
            await self._signal()
        self.check_alive()

    async def flushed(self) -> None:
        """Wait until every byte buffered in the transport has been written.

        Valid while the limits are (0, 0), as :meth:`acquire` sets them: the
        transport stays paused while anything is buffered and resumes at zero.
        """
        while self._transport.get_write_buffer_size() > 0:
            await self._signal()
        self.check_alive()

    async def _signal(self) -> None:
        """Wait for the next resume_writing or connection_lost."""
        self.check_alive()
        waiter = self._waiter
        if waiter is None or waiter.done():
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter

    # -- protocol callbacks (from the transport) --------------------------------

    def pause_writing(self) -> None:
        if self._receiving:
            self._user_protocol.pause_writing()
            return
        if self._first_event is None:
            self._first_event = "pause"
        self._paused = True

    def resume_writing(self) -> None:
        if self._receiving:
            self._user_protocol.resume_writing()
            return
        if self._first_event is None:
            self._first_event = "resume"
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._lost_exc = exc
        self._wake()
        self._user_protocol.connection_lost(exc)

    def data_received(self, data: bytes) -> None:  # pragma: no cover - reading is paused
        # Only reachable if someone resumes reading during the lease: pass it on.
        self._user_protocol.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:  # pragma: no cover - reading is paused
        return self._user_protocol.eof_received()  # type: ignore[attr-defined,no-any-return]

    def _wake(self) -> None:
        for waiter in (self._waiter, self._loss_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


def _is_reading(transport: asyncio.BaseTransport) -> bool:
    is_reading = getattr(transport, "is_reading", None)
    return bool(is_reading()) if is_reading is not None else False
