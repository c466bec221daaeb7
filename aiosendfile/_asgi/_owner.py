"""File bodies on the connection's own outlet, for the uvicorn protocols (they own their connections).

The public :func:`aiosendfile.sendfile` leases the transport for each body (swapping its protocol,
polling a ``dup()`` of its fd): machinery for callers who do not own their transport. A uvicorn
protocol subclass does own its connection, so it sends a file body the way ``serve`` does
(``_outlet``): one duplicate of the socket per connection, made at its first file body and closed
at ``connection_lost``; a :class:`~aiosendfile._outlet.Transfer` per body, awaited by the app's
``send``.

Nothing else may write on the connection while a body goes on the duplicate: the transport would
send its bytes at once, into the middle of the file's (its buffer is empty when a body starts).
The protocol's own parser could: uvicorn answers a bad pipelined request with a ``400`` itself.
So what arrives meanwhile is held, not parsed, up to :data:`HOLD_MAX` bytes, past which reading
pauses; it is handed to the protocol once the body has gone, in order with what comes after.
The public path stays for what the outlet does not take: TLS, an unknown transport, several ranges,
bytes still in the transport's buffer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._errors import FileTruncatedError
from .._outlet import Outlet, Transfer

__all__ = ("HOLD_MAX", "Owner")

#: Bytes a connection's reads may hold while a file body is on its outlet; past it, reading pauses.
HOLD_MAX = 64 * 1024


def _nothing() -> None:
    pass


class _Body:
    """One body on the outlet as an awaitable outcome: ``future`` gets the transfer's error (None
    when whole) once the transfer no longer reads the file."""

    __slots__ = ("future", "lost", "on_release", "released", "sent", "transfer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[Exception | None] = loop.create_future()
        self.sent = 0
        self.released = False
        self.lost = False
        self.on_release: Any = None  # what to run at release (the file's close, left to it)
        self.transfer: Transfer | None = None

    def done(self, sent: int, exc: Exception | None) -> None:
        self.sent = sent
        if not self.future.done():
            self.future.set_result(exc)

    def release(self) -> None:
        self.released = True
        if self.on_release is not None:
            self.on_release()
        if self.lost and not self.future.done():
            self.future.set_result(ConnectionResetError("the connection was lost during the file body"))

    def lose(self) -> None:
        """The connection is gone: stop; the outcome comes once no thread sends from the file."""
        self.lost = True
        if self.transfer is not None:
            self.transfer.stop()  # (calls release now unless a pool thread is sending)


class Owner:
    """Mixed into a uvicorn protocol class (before it): the outlet, the body in flight, the hold.

    ``resume_after_hold`` is the protocol's: whether and how reading resumes after a hold paused it
    (uvicorn's flow control may want it paused for its own reasons).
    """

    transport: Any
    _outlet: Outlet | bool | None = None
    _owned: _Body | None = None
    _held: list[bytes] | None = None
    _held_size = 0
    _held_paused = False

    def data_received(self, data: bytes) -> None:
        if self._owned is not None or self._held:
            self._hold(data)
            return
        super().data_received(data)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        owned = self._owned
        if owned is not None:
            owned.lose()
        self._held = None
        outlet, self._outlet = self._outlet, False
        if isinstance(outlet, Outlet):
            outlet.close()
        super().connection_lost(exc)  # type: ignore[misc]

    def resume_after_hold(self) -> None:
        self.transport.resume_reading()

    def _hold(self, data: bytes) -> None:
        held = self._held
        if held is None:
            held = self._held = []
        held.append(data)
        self._held_size += len(data)
        if self._held_size > HOLD_MAX and not self._held_paused:
            self._held_paused = True
            self.transport.pause_reading()

    def _unhold(self) -> None:
        """The body has gone: what arrived meanwhile goes to the protocol, in order."""
        held = self._held
        if self._owned is not None or not held:  # another body started, or the connection went
            return
        self._held, self._held_size = None, 0
        data = held[0] if len(held) == 1 else b"".join(held)
        if self._held_paused:
            self._held_paused = False
            if not self.transport.is_closing():
                self.resume_after_hold()
        super().data_received(data)  # type: ignore[misc]

    async def send_owned(
        self, transport: Any, fd: int, offset: int, count: int, head: bytes, file: Any
    ) -> int | None:
        """Send *head*, then *count* bytes of *fd* from *offset*, on the connection's outlet; the
        file bytes sent. None (nothing sent) where the public path must: TLS, an unknown
        transport, bytes in the transport's buffer. Raises as ``sendfile`` does: a
        ``ConnectionError`` when the peer goes, ``FileTruncatedError`` when the file ends early.
        *file* is closed by the caller; if the caller is cancelled while a pool thread still sends
        from it, its ``close`` is left to that thread's end (``file.hand_over()``)."""
        loop = asyncio.get_running_loop()
        outlet = self._outlet
        if outlet is None:
            try:
                outlet = self._outlet = Outlet.of(transport, loop) or False
            except OSError:  # no descriptor for the duplicate (EMFILE): the public path, this time
                return None
        if outlet is False or transport.get_write_buffer_size() or transport.is_closing():
            return None
        assert isinstance(outlet, Outlet)
        owned = self._owned = _Body(loop)
        transfer = owned.transfer = Transfer(
            outlet, head, fd, offset, count, owned.done, _nothing, owned.release
        )
        try:
            transfer.run()
            exc = await owned.future
        except BaseException:  # cancelled: stop here; the caller aborts the connection
            transfer.stop()
            if not owned.released:
                owned.on_release = file.hand_over()
            raise
        finally:
            self._owned = None
            if self._held:
                loop.call_soon(self._unhold)
        if exc is None:
            return owned.sent
        if isinstance(exc, EOFError):
            raise FileTruncatedError(str(exc), sent=owned.sent, expected=count) from None
        raise exc
