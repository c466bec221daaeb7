"""A connection's file bodies: which body sender takes one, and what happens when it ends.

Four body senders share one small interface (:class:`BodySender`: ``run`` starts or goes on,
``stop`` when the connection is gone, ``done(sent, exc)`` once at the end, ``progress`` on the
way): ``_bodies.Transfer`` (``sendfile`` on the connection's own socket, plain TCP or Unix),
``_tls_body.TLSBody`` (the connection's own TLS transport), ``_archive_body.ArchiveBody`` (a
folder's tar archive), and :class:`PublicBody` (the public
``aiosendfile.sendfile`` in a task: answers still in the transport's buffer, a transport of another
kind). A whole file of one chunk is first tried at once (``_bodies.send_first``), with no sender
object at all: the common case. One body is in flight at a time (the connection is ``busy``); a
body that cannot be sent whole aborts the connection, never passed off as complete.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .._api import sendfile
from .._bodies import ColdWhole, Transfer, send_first
from .._errors import SendfileError
from .._outlet import MAX_CHUNK, PROBED_COLD, READ_AHEAD_MAX, Outlet
from .._static._answer import Answer, Archive, FileRange, Multipart
from ._archive_body import ArchiveBody
from ._exchange import Exchange
from ._tls import TLSTransport
from ._tls_body import TLSBody

if TYPE_CHECKING:
    from ._protocol import HttpProtocol

__all__ = ("BodySender", "PublicBody", "send_body", "send_whole")

_GET = b"GET"


class BodySender(Protocol):
    """What a connection drives a file body through (see the module)."""

    def run(self) -> None:
        """Send what can be sent now; go on from the loop."""

    def stop(self) -> None:
        """The connection is gone: stop, without calling ``done``."""


def send_whole(
    conn: HttpProtocol,
    exchange: Exchange | None,
    url: bytes,
    mode: int,
    fd: int,
    size: int,
    head: bytes,
    warm_to: int,
    key: tuple[int, int] | None = None,
) -> None:
    """GET of a whole file from *fd* (ours: closed here, or by the sender) after *head*: a kept
    one, or a first sight (the core's plain 200). *warm_to*: 0 if its pages were not probed yet,
    PROBED_COLD if they were and are not all cached, *size* if they were all cached a moment ago
    (trusted only by a send made now). A file of one chunk, on a connection whose outlet exists
    and whose transport holds nothing, is first sent at once (``send_first``); whatever is left
    goes on as a transfer from where that stopped. The request object *exchange* is made only
    when a sender or the access log needs it. *key*: the file's device and inode, if known (its
    cold reads are told by them, not by an ``fstat``)."""
    position = 0
    rest = head
    outlet = conn.outlet
    probed = warm_to > 0
    if probed:
        warm_to = 0  # (what a later transfer finds, it probes again)
    if type(outlet) is Outlet and size <= MAX_CHUNK and not conn.out:
        transport = conn.transport
        if not transport.get_write_buffer_size() and not transport.is_closing():
            if warm_to == PROBED_COLD:
                pages = conn.engine.pages
                if size <= READ_AHEAD_MAX and pages is not None and not pages.closed:
                    # The page reader's thread sends head and file once the pages are in.
                    if exchange is None:
                        exchange = Exchange(_GET, url, mode, None, None)
                    done = _done_of(conn, exchange)
                    _run(
                        conn, ColdWhole(outlet, head, fd, size, done, conn._progress, conn.engine, pages, key)
                    )
                    return
            else:
                position, rest, warm_to = send_first(outlet, head, fd, size, probed, key)
                if position == size:
                    os.close(fd)
                    conn.since = conn.engine.now
                    if exchange is not None and exchange.log is not None:
                        conn._log(exchange, size)
                    return
    if exchange is None:
        exchange = Exchange(_GET, url, mode, None, None)
    body_range = FileRange(fd, position, size - position)
    ans = Answer(200, [], size, body=body_range, fd=fd, close=os.close)
    send_body(conn, exchange, ans, body_range, rest, position, warm_to, key)


def send_body(
    conn: HttpProtocol,
    exchange: Exchange,
    ans: Answer,
    body: FileRange | Multipart | Archive,
    head: bytes,
    sent: int = 0,
    warm_to: int = 0,
    key: tuple[int, int] | None = None,
) -> None:
    """Send a file body after *head* through the body sender that fits the connection. *ans* is
    closed once it is sent (or the connection is gone); *sent*: file bytes already sent before
    *body* (for the access log)."""
    if conn.out:
        conn._flush()
    conn.busy = True
    transport = conn.transport
    if transport.is_closing():  # the peer is gone (its reset seen; connection_lost not run yet)
        ans.close()
        conn.dead = True
        transport.abort()
        return

    done = _done_of(conn, exchange)
    sender: BodySender
    if isinstance(body, Archive):
        sender = ArchiveBody(conn, ans, head, done, conn._progress)
    elif type(transport) is TLSTransport:
        if isinstance(body, FileRange):
            fd, segments, closing = body.fd, [(head, body.start, body.length)], b""
        else:
            assert isinstance(body.source, int)
            fd, closing = body.source, body.closing
            segments = [(part_head, r.start, r.length) for part_head, r in body.parts]
            segments[0] = (head + segments[0][0], *segments[0][1:])

        def tls_done(body_sent: int, exc: BaseException | None) -> None:
            body_done(conn, exchange, sent + body_sent, exc)

        sender = TLSBody(transport, fd, segments, closing, tls_done, conn._progress, ans.close)
    elif isinstance(body, FileRange) and (outlet := _outlet_of(conn)) is not None:
        sender = Transfer(
            outlet,
            head,
            body.fd,
            body.start,
            body.length,
            done,
            conn._progress,
            ans.close,
            sent,
            warm_to,
            conn.engine,
            conn.engine.pages,
            key,
        )
    else:
        sender = PublicBody(transport, ans, head, sent, done, conn._progress)
    _run(conn, sender)


def _done_of(conn: HttpProtocol, exchange: Exchange) -> Callable[[int, BaseException | None], None]:
    def done(body_sent: int, exc: BaseException | None) -> None:
        body_done(conn, exchange, body_sent, exc)

    return done


def _run(conn: HttpProtocol, sender: BodySender) -> None:
    """Start *sender*, the connection's body now (busy: nothing else is written meanwhile)."""
    conn.busy = True
    conn.owned = sender
    conn.sending = True
    conn.since = conn.engine.now
    conn.starting = True
    try:
        sender.run()
    finally:
        conn.starting = False
    if conn.owned is sender:  # still going: from the loop (the socket was full, a read is cold)
        conn._update_reading()


def _outlet_of(conn: HttpProtocol) -> Outlet | None:
    """The connection's outlet (made at its first file body), if a transfer may use it now: not
    over a transport of another kind, nor behind answers still in the transport's buffer."""
    outlet = conn.outlet
    if outlet is None:
        try:
            outlet = conn.outlet = Outlet.of(conn.transport, conn.engine.loop) or False
        except OSError:  # no descriptor for the duplicate (EMFILE): the public path, this time
            return None
    if outlet is False or conn.transport.get_write_buffer_size():
        return None
    assert isinstance(outlet, Outlet)
    return outlet


def body_done(conn: HttpProtocol, exchange: Exchange, sent: int, exc: BaseException | None) -> None:
    """A file body ended: whole (*exc* None), or the connection is aborted."""
    conn.owned = None
    conn.sending = False
    if exchange.log is not None:
        conn._log(exchange, sent)
    transport = conn.transport
    if exc is not None:
        conn.dead = True
        if transport is not None:
            transport.abort()
        if not isinstance(exc, (OSError, EOFError, SendfileError, _Gone)):  # (the peer left, the file shrank)
            conn._report(exc, "sending a file body failed")  # type: ignore[arg-type]
        return
    conn.busy = False
    conn.since = conn.engine.now
    if not conn.starting:  # (else the caller's loop goes on with what waits)
        conn._free()
        conn._resume()


class _Gone(Exception):
    """A body the public ``sendfile`` could not finish because the peer went meanwhile."""


class PublicBody:
    """A file body through the public ``aiosendfile.sendfile``, in a task (see the module)."""

    __slots__ = ("ans", "done", "head", "progress", "sent", "task", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        ans: Answer,
        head: bytes,
        sent: int,
        done: Callable[[int, BaseException | None], None],
        progress: Callable[..., None],
    ) -> None:
        self.transport = transport
        self.ans = ans
        self.head = head
        self.sent = sent
        self.done = done
        self.progress = progress
        self.task: asyncio.Task[None] | None = None

    def run(self) -> None:
        ans = self.ans
        self.task = asyncio.get_running_loop().create_task(self._send())
        self.task.add_done_callback(lambda _: ans.close())  # also if cancelled before it ran

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _send(self) -> None:
        transport = self.transport
        body = self.ans.body
        head = self.head
        sent = self.sent
        try:
            if isinstance(body, FileRange):
                with io.FileIO(body.fd, "rb", closefd=False) as file:
                    if body.length:
                        sent = await sendfile(
                            transport, file, body.start, body.length, headers=head, on_progress=self.progress
                        )
                    else:
                        transport.write(head)
            else:
                assert isinstance(body, Multipart)
                assert isinstance(body.source, int)
                last = len(body.parts) - 1
                with io.FileIO(body.source, "rb", closefd=False) as file:
                    for i, (part_head, r) in enumerate(body.parts):
                        sent += await sendfile(
                            transport,
                            file,
                            r.start,
                            r.length,
                            headers=head + part_head if i == 0 else part_head,
                            trailers=body.closing if i == last else b"",
                            on_progress=self.progress,
                        )
        except asyncio.CancelledError:  # the connection was lost (stop): done is not called
            transport.abort()
            raise
        except Exception as exc:  # the peer went away, the file shrank; else a bug, reported
            if isinstance(exc, RuntimeError) and transport.is_closing():
                exc = _Gone()  # (the peer went meanwhile)
            self.done(sent, exc)
            return
        self.done(sent, None)
