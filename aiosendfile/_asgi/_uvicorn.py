"""uvicorn's two HTTP protocols, offering ``pathsend``/``zerocopysend`` and carrying them out.

The only module that touches uvicorn's internals. How it hooks in: each protocol instance wraps
its ``self.app`` (uvicorn's ``config.loaded_app``, middlewares included) in a :class:`_Door`. uvicorn
calls ``app(scope, receive, cycle.send)`` for every HTTP request (0.30 to 0.54 alike), and that
bound method's ``__self__`` is the request's ``RequestResponseCycle``. The door adds the extensions
to the scope and gives the app a ``send`` that passes every message to ``cycle.send`` unchanged,
except a pathsend/zerocopysend, which it carries out itself on the cycle's transport with the
cycle's own rules:

* drain first when writing is paused; nothing when disconnected; uvicorn's own error for a file
  message before ``http.response.start`` or after the response completed (``cycle.send`` raises);
* the body's framing and Content-Length from the cycle: httptools' ``expected_content_length`` and
  ``chunked_encoding``, h11's own ``Connection`` (``send_with_data_passthrough`` with a sized
  placeholder for the file bytes, so h11 counts and frames them). A body longer or shorter than
  promised raises uvicorn's (or h11's) error before a byte is written;
* HEAD sends no body bytes; completion as the cycle completes (``response_complete``,
  ``message_event``, close if not keep-alive, ``on_response``);
* peer gone mid-file: ``disconnected``, silently, as uvicorn; file truncated mid-file: the
  connection is aborted (never a short body on keep-alive) with one warning line.

One fix to uvicorn's httptools protocol itself: when the connection is lost, uvicorn marks only the
last request it parsed as disconnected. A client that pipelines has its earlier requests answered
first, so the one running then is not marked: its next ``send`` (waiting for a full socket to drain,
woken by ``connection_lost``) writes on the closed transport, and uvloop raises ``RuntimeError:
unable to perform operation on <TCPTransport closed=True ...>`` into the app, logged as "Exception
in ASGI application" (stock uvicorn logs it for Starlette's ``StaticFiles`` as well). Our protocol
also marks the request running (the door notes it): its writes vanish, as for any request whose
client is gone. uvicorn's h11 protocol reads one request at a time, so its last is the running one.

The httptools protocol also offers a request's thread the writing of a file response
(:data:`THREAD_WRITE`, :class:`ThreadResponse`): the head as ``cycle.send`` would write it for
``http.response.start`` (uvicorn's status lines, header checks, default headers), then the file,
from the thread, as far as the socket takes them (:mod:`._thread_send`); the loop then completes
the cycle as ``cycle.send`` would (its state, the access log line, keep-alive), sending what was
left on the transport first. A response the head rules would treat otherwise (no or another
``Content-Length``, ``Connection``, ``Transfer-Encoding``), ``HEAD``, TLS or a buffered write
goes the usual way.

``limit_concurrency``'s 503 app, websockets and lifespan never pass through the door.
"""

from __future__ import annotations

import functools
import io
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http import h11_impl, httptools_impl
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from .._errors import FileTruncatedError
from ._carry import PATHSEND, ZEROCOPYSEND, FileBody, file_body, offered, transmit
from ._thread_send import THREAD_WRITE, ThreadSocket, ThreadWrite

__all__ = ("RELIED_ON", "THREAD_WRITE", "H11Protocol", "HttpToolsProtocol", "ThreadResponse")

#: What this module relies on in uvicorn, beyond ``self.app`` being called as
#: ``app(scope, receive, cycle.send)``: the response cycle's attributes (by protocol) and its
#: ``flow``'s. ``test_uvicorn_protocol`` checks them on live objects, naming what is missing.
RELIED_ON: dict[str, tuple[str, ...]] = {
    "cycle": (
        "transport",
        "flow",
        "scope",
        "logger",
        "disconnected",
        "keep_alive",
        "response_started",
        "response_complete",
        "message_event",
        "on_response",
        "send",
    ),
    "httptools cycle": (
        "expected_content_length",
        "chunked_encoding",
        "default_headers",
        "access_log",
        "access_logger",
        "waiting_for_100_continue",
    ),
    "h11 cycle": ("conn",),
    "flow": ("write_paused", "drain"),
}

_FILE_MESSAGES = frozenset((PATHSEND, ZEROCOPYSEND))
_OFFERED = offered()  # copied per request; the empty option dicts are shared

Send = Callable[[Any], Awaitable[None]]
Carry = Callable[[Any, Any], Awaitable[None]]


class _Door:
    """The app uvicorn runs: the real app, with the extensions and our ``send``.

    Plain functions that return the awaitable, not coroutines: no extra frame per request or per
    message (uvicorn awaits what ``__call__`` returns, the app what ``send`` returns).
    """

    __slots__ = ("app", "carry", "running", "thread_socket")

    def __init__(self, app: Any, carry: Carry, *, thread_writes: bool = False) -> None:
        self.app = app
        self.carry = carry
        self.running: Any = None  # the cycle of the request whose app started last
        # THREAD_WRITE's socket for the connection (httptools cycles only), found once
        self.thread_socket = _ConnectionSocket() if thread_writes else None

    def __call__(self, scope: Any, receive: Any, send: Send) -> Awaitable[None]:
        cycle = getattr(send, "__self__", None)
        if cycle is None or scope["type"] != "http":  # not uvicorn's cycle.send: stay out of the way
            return self.app(scope, receive, send)  # type: ignore[no-any-return]
        extensions = scope.get("extensions")
        if extensions is None:
            scope["extensions"] = _OFFERED.copy()
        else:
            for name in _OFFERED:
                extensions.setdefault(name, {})
        if self.thread_socket is not None:
            # (the cycle weakly: the scope holds the offer, and the cycle the scope)
            offer = functools.partial(ThreadResponse.open, weakref.ref(cycle), self.thread_socket)
            scope["extensions"][THREAD_WRITE] = {"open": offer}
        carry = self.carry
        self.running = cycle

        def door_send(message: Any) -> Awaitable[None]:
            if message["type"] in _FILE_MESSAGES:
                return carry(cycle, message)
            return send(message)

        return self.app(scope, receive, door_send)  # type: ignore[no-any-return]


async def _prelude(cycle: Any, message: Any) -> bool:
    """uvicorn's opening of ``cycle.send``; True if a file body may be sent now."""
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return False
    if not cycle.response_started or cycle.response_complete:
        await cycle.send(message)  # raises uvicorn's own error for this message type
        return False
    return True


async def _send_body(cycle: Any, body: FileBody, head: bytes, tail: bytes) -> bool:
    """Send the body on the cycle's transport; False (connection given up) if it failed."""
    transport = cycle.transport
    if transport.is_closing():
        # The loop has seen the peer go and connection_lost runs next turn: uvicorn's own writes
        # vanish silently now, and its cycle completes. So does the file.
        return True
    try:
        await transmit(transport, body, head, tail)
    except FileTruncatedError as exc:
        _cut_short(cycle, exc)
        return False
    except ConnectionError:
        transport.abort()
        cycle.disconnected = True
        return False
    except BaseException:
        transport.abort()  # bytes may have gone: never leave a short body on the connection
        raise
    return True


def _cut_short(cycle: Any, why: object) -> None:
    """The file ended before the bytes promised: abort the connection, with one warning line."""
    cycle.transport.abort()
    cycle.disconnected = True
    scope = cycle.scope
    method, path = scope["method"], scope["path"]
    cycle.logger.warning("File body cut short (%s), connection aborted: %s %s", why, method, path)


def _complete(cycle: Any) -> None:
    """The response is complete: uvicorn's cycle completion (and its protocol's)."""
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


async def _carry_httptools(cycle: Any, message: Any) -> None:
    """A file message on an httptools cycle (``httptools_impl.RequestResponseCycle.send``'s rules)."""
    if not await _prelude(cycle, message):
        return
    body = file_body(message)
    try:
        more_body = body.more_body
        if cycle.scope["method"] == "HEAD":
            cycle.expected_content_length = 0
        else:
            length = body.length
            if cycle.chunked_encoding:
                head = b"%x\r\n" % length if length else b""
                tail = b"\r\n" if length else b""
                if not more_body:
                    tail += b"0\r\n\r\n"
            else:
                if length > cycle.expected_content_length:
                    raise RuntimeError("Response content longer than Content-Length")
                if not more_body and length != cycle.expected_content_length:
                    raise RuntimeError("Response content shorter than Content-Length")
                cycle.expected_content_length -= length
                head = tail = b""
            if not await _send_body(cycle, body, head, tail):
                return
    finally:
        body.close()
    if not more_body:
        _complete(cycle)


class _ConnectionSocket:
    """A connection's :class:`ThreadSocket` (None where a thread cannot write), once looked at."""

    __slots__ = ("sock",)

    def __init__(self) -> None:
        self.sock: ThreadSocket | bool | None = False


class ThreadResponse:
    """A file response a request's thread writes on an httptools cycle; the loop completes it.

    :meth:`open` on the loop's thread, :meth:`write` on the request's, then :meth:`finish` on the
    loop's, always, when :meth:`write` returned True, else :meth:`release` (see the module).
    """

    __slots__ = ("_cycle", "_fd", "_keep_alive", "_status", "_write")

    def __init__(self, cycle: Any, write: ThreadWrite) -> None:
        self._cycle = cycle
        self._write = write
        self._keep_alive = cycle.keep_alive
        self._fd = -1
        self._status = 0

    @staticmethod
    def open(ref: weakref.ref[Any], connection: _ConnectionSocket) -> ThreadResponse | None:
        """On the loop's thread, before the request's thread writes: None where it cannot."""
        cycle = ref()
        if cycle is None:
            return None
        sock = connection.sock
        if sock is False:  # (a connection's transport stays what it is: looked at once)
            sock = connection.sock = ThreadSocket.of(cycle.transport)
        transport = cycle.transport
        if (
            not isinstance(sock, ThreadSocket)
            or cycle.response_started
            or cycle.disconnected
            or cycle.scope["method"] == "HEAD"
            or transport.is_closing()
            or transport.get_write_buffer_size()
        ):
            return None
        # Claimed for the thread now: until release() (nothing was written), the cycle refuses
        # another start, and uvicorn, should the request end in an error or be cancelled while
        # the thread writes, closes the connection instead of writing a 500 into its stream.
        cycle.response_started = True
        return ThreadResponse(cycle, ThreadWrite(sock))

    def release(self) -> None:
        """On the loop's thread: the thread wrote nothing (:meth:`write` False, or never called):
        the response is the loop's to send, its own way."""
        if not self._write.attempted:
            self._cycle.response_started = False

    @property
    def complete(self) -> bool:
        """The thread wrote the whole response (:meth:`finish` only completes the cycle)."""
        return self._write.complete

    def write(
        self, status: int, headers: list[tuple[bytes, bytes]], fd: int, offset: int, count: int
    ) -> bool:
        """On the request's thread: the head for *status* and *headers*, then *count* bytes of
        *fd* from *offset*. False: nothing was sent, the loop sends the response its own way."""
        head = self._head(status, headers, count)
        if head is None:
            return False
        self._fd, self._status = fd, status
        return self._write.write(head, fd, offset, count)

    def _head(self, status: int, headers: list[tuple[bytes, bytes]], count: int) -> bytes | None:
        """``cycle.send``'s head for ``http.response.start`` with these, or None where it would
        do more than write it (uvicorn's header error, another framing, ``Connection``)."""
        line = httptools_impl.STATUS_LINE.get(status)
        if line is None:
            return None
        content = [line]
        length = None
        for name, value in self._cycle.default_headers + headers:
            if httptools_impl.HEADER_RE.search(name) or httptools_impl.HEADER_VALUE_RE.search(value):
                return None
            name = name.lower()
            if name == b"content-length":
                if length is None:
                    length = value
            elif name in (b"transfer-encoding", b"connection"):
                return None
            content.extend([name, b": ", value, b"\r\n"])
        try:
            if length is None or int(length.decode()) != count:
                return None
        except (UnicodeDecodeError, ValueError):
            return None
        if not self._keep_alive:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    async def finish(self) -> None:
        """On the loop's thread, after :meth:`write` returned True: the cycle as ``cycle.send``
        leaves it (its state, the access log line), what the thread left sent, completion."""
        cycle, write = self._cycle, self._write
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = False
        cycle.expected_content_length = 0
        scope = cycle.scope
        if cycle.access_log:
            cycle.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),
                scope["method"],
                get_path_with_query_string(scope),
                scope["http_version"],
                self._status,
            )
        if cycle.disconnected:
            return
        if write.error is not None:
            cycle.transport.abort()
            cycle.disconnected = True
            if isinstance(write.error, ConnectionError):
                return
            raise write.error
        if write.truncated:
            _cut_short(cycle, f"the file ended {write.file_left} bytes early")
            return
        if write.head_left or write.file_left:
            body = FileBody(
                file=io.FileIO(self._fd, "rb", closefd=False),
                ranges=[(b"", write.file_offset, write.file_left)] if write.file_left else [],
                closing=b"",
                length=write.file_left,
                more_body=False,
                owned=True,
                position=None,
            )
            try:
                if not await _send_body(cycle, body, write.head_left, b""):
                    return
            finally:
                body.close()
        _complete(cycle)


class _Sized:
    """Stands for the file bytes in h11's output: h11 only takes their length."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


async def _carry_h11(cycle: Any, message: Any) -> None:
    """A file message on an h11 cycle (``h11_impl.RequestResponseCycle.send``'s rules)."""
    if not await _prelude(cycle, message):
        return
    body = file_body(message)
    try:
        more_body = body.more_body
        conn = cycle.conn
        if cycle.scope["method"] == "HEAD":
            conn.send(h11.Data(data=b""))
            head = tail = b""
        else:
            sized = _Sized(body.length)
            pieces = conn.send_with_data_passthrough(h11.Data(data=sized))  # type: ignore[arg-type]  # h11 documents it
            at = next((i for i, piece in enumerate(pieces) if piece is sized), len(pieces))
            head = b"".join(pieces[:at])
            tail = b"".join(pieces[at + 1 :])
        if not more_body:
            tail += conn.send(h11.EndOfMessage())  # h11 checks a short body here: before any byte
        if body.length and cycle.scope["method"] != "HEAD":
            if not await _send_body(cycle, body, head, tail):
                return
        elif head or tail:
            cycle.transport.write(head + tail)
    finally:
        body.close()
    if not more_body:
        cycle.response_complete = True
        cycle.message_event.set()
        if conn.our_state is h11.MUST_CLOSE or not cycle.keep_alive:
            conn.send(event=h11.ConnectionClosed())
            cycle.transport.close()
        cycle.on_response()


class HttpToolsProtocol(httptools_impl.HttpToolsProtocol):
    """uvicorn's httptools protocol, offering and carrying out ``pathsend``/``zerocopysend``."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: Any = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.app = self._door = _Door(self.app, _carry_httptools, thread_writes=True)

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's, and the request running is marked disconnected too (see the module docstring)."""
        running = self._door.running
        if running is not None and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
        super().connection_lost(exc)


class H11Protocol(h11_impl.H11Protocol):
    """uvicorn's h11 protocol, offering and carrying out ``pathsend``/``zerocopysend``."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: Any = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.app = _Door(self.app, _carry_h11)
