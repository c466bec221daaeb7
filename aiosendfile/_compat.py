"""Other libraries' internals, behind one door: the only module that touches asyncio's, uvloop's,
the ssl module's, aiohttp's or Django's private names.

The rule is the syscall shim's (``_platform``): nothing else in the package reads or writes
another library's underscore names, or imports its undocumented modules. Each access is one
small function here, documented with the versions it was checked against (by reading their
source) and what happens when the name is missing. ``tests/test_compat.py`` checks every
entry of :data:`RELIED_ON` on real objects and fails naming the attribute, so a new CPython,
uvloop or aiohttp release means reading this one file.

Checked against CPython 3.10.13, 3.11.7, 3.12.1, 3.13.0; uvloop 0.23.0; aiohttp 3.14.5; Django
4.2.30, 5.2.19, 6.1.3.

Every access:

asyncio (``asyncio/selector_events.py``, ``asyncio/sslproto.py``, ``asyncio/streams.py``)
  * :func:`native_transport_types`: ``selector_events._SelectorSocketTransport``, the plain
    TCP/Unix transport that writes straight to its socket (plus uvloop's, below).
  * :func:`tls_protocol_types`: ``sslproto.SSLProtocol`` (plus uvloop's, below).
  * :func:`tls_shutting_down`: ``_SSLProtocolTransport._ssl_protocol._state`` (3.11+; 3.10's
    ``_ssl_protocol`` has none, so this says False there, as for uvloop's compiled transport).
  * :func:`reader_transport`: ``StreamReader._transport``.
  * :func:`reader_buffer`: ``StreamReader._buffer``.
  * :func:`defuse_py310_tls_resume`: 3.10's ``_SSLProtocolTransport._ssl_protocol._transport``
    (read) and ``StreamReader._paused`` (written).
  * :func:`tls_socket_transport`: ``_SSLProtocolTransport._ssl_protocol._transport`` (read).
  * :func:`asyncio_sendfile_holds`: ``_SelectorSocketTransport._empty_waiter`` (read: set while
    ``loop.sendfile``'s native path runs) and ``base_events._SendfileFallbackProtocol`` (its copy's
    stand-in protocol).
uvloop (``uvloop.loop``, a compiled module not re-exported by ``uvloop``)
  * :func:`native_transport_types`: ``uvloop.loop.TCPTransport``, ``uvloop.loop.UnixTransport``.
  * :func:`tls_protocol_types`: ``uvloop.loop.SSLProtocol``.
  * :func:`tls_socket_transport`: the TLS transport's ``get_extra_info("uvloop.sslproto")`` key
    (``uvloop/sslproto.pyx``), and the socket transport its ``SSLProtocol`` holds in a C field,
    found among ``gc.get_referents`` (Cython's traversal of the object's fields).
  * :class:`AdoptedSocket` (behaviour, not a name): ``Loop.connect_accepted_socket`` reads a
    socket's ``type``, ``family`` and ``fileno()`` only, and at the transport's close calls
    ``close()`` of an object that is no ``socket.socket`` (``uvloop/loop.pyx``,
    ``uvloop/handles/handle.pyx``); ``fileno()`` is asked once, for the transport's ``_open``,
    the only step after it that raises ``OSError``.
ssl (``ssl.py``)
  * :func:`ssl_calls`: ``SSLSocket._sslobj``, the ``_ssl._SSLSocket`` under the Python wrapper.
  * :func:`tls_server_connection`: ``SSLContext._wrap_socket``, the call ``SSLContext.wrap_socket``
    makes (through ``SSLSocket._create``) for the ``_ssl._SSLSocket`` on a socket.
  * :func:`tls_server_connection`, :func:`forget_tls_connection`: ``SSLObject._sslobj``
    (written), the ``_ssl._SSLSocket`` an ``SSLObject``'s methods call.
socket (``socket.py``)
  * :func:`acceptor`: ``socket._accept``, the C call under ``socket.accept``.
aiohttp (``aiohttp/http_writer.py``, ``aiohttp/web_response.py``, ``aiohttp/web_urldispatcher.py``)
  * :func:`take_buffered_headers`: ``StreamWriter._headers_buf``, ``StreamWriter._headers_written``.
  * :func:`keep_headers_buffered`: ``StreamResponse._send_headers_immediately`` (set on a subclass).
  * :func:`turn_off_compression`: ``StreamResponse._compression`` (written).
  * :func:`compresses`: ``StreamResponse._compression_force`` and ``web_response.CONTENT_CODINGS``
    (read: whether ``enable_compression()`` compresses for a request).
  * :func:`skip_length_check`: ``StreamResponse._length_check`` (written).
  * :func:`route_static_requests`: ``StaticResource._handle`` (overridden in a subclass).
Django (``django/http/response.py``, ``django/core/handlers/asgi.py``)
  * :func:`set_handler_class`: ``HttpResponseBase._handler_class`` (written, as Django's handlers
    write it; its ``close()`` sends ``request_finished`` from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import socket
import ssl
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

_T = TypeVar("_T", bound=type)

__all__ = (
    "RELIED_ON",
    "AdoptedSocket",
    "Internal",
    "acceptor",
    "adopts_descriptors",
    "asyncio_sendfile_holds",
    "compresses",
    "defuse_py310_tls_resume",
    "keep_headers_buffered",
    "native_transport_types",
    "reader_buffer",
    "reader_transport",
    "route_static_requests",
    "set_handler_class",
    "skip_length_check",
    "ssl_calls",
    "forget_tls_connection",
    "TLSConnection",
    "tls_server_connection",
    "take_buffered_headers",
    "tls_protocol_types",
    "tls_shutting_down",
    "tls_socket_transport",
    "turn_off_compression",
)


class Internal(NamedTuple):
    """A private name relied on: *where* names the object as ``tests/test_compat.py`` finds a
    real one (a module, a class's instance, or a live object of a connection). Relied on by the
    Pythons from *since* up to, not including, *before*."""

    library: str
    where: str
    attribute: str
    since: tuple[int, int] = (3, 10)
    before: tuple[int, int] = (99, 0)


#: Every private name this module relies on.
RELIED_ON: tuple[Internal, ...] = tuple(
    Internal(*entry)
    for entry in (
        ("asyncio", "asyncio.selector_events", "_SelectorSocketTransport"),
        ("asyncio", "asyncio.selector_events._SelectorSocketTransport", "_empty_waiter"),
        ("asyncio", "asyncio.base_events", "_SendfileFallbackProtocol"),
        ("asyncio", "asyncio.sslproto", "SSLProtocol"),
        ("asyncio", "TLS transport", "_ssl_protocol"),
        ("asyncio", "TLS transport._ssl_protocol", "_state", (3, 11)),
        ("asyncio", "StreamReader", "_transport"),
        ("asyncio", "StreamReader", "_buffer"),
        ("asyncio", "StreamReader", "_paused", (3, 10), (3, 11)),
        ("asyncio", "TLS transport._ssl_protocol", "_transport"),
        ("uvloop", "uvloop.loop", "TCPTransport"),
        ("uvloop", "uvloop.loop", "UnixTransport"),
        ("uvloop", "uvloop.loop", "SSLProtocol"),
        ("uvloop", "uvloop TLS transport", "uvloop.sslproto"),
        ("aiohttp", "aiohttp StreamWriter", "_headers_buf"),
        ("aiohttp", "aiohttp StreamWriter", "_headers_written"),
        ("aiohttp", "aiohttp.web.StreamResponse", "_send_headers_immediately"),
        ("aiohttp", "aiohttp.web.StreamResponse", "_compression"),
        ("aiohttp", "aiohttp.web.StreamResponse", "_compression_force"),
        ("aiohttp", "aiohttp.web_response", "CONTENT_CODINGS"),
        ("aiohttp", "aiohttp.web.StreamResponse", "_length_check"),
        ("aiohttp", "aiohttp.web.StaticResource", "_handle"),
        ("ssl", "ssl.SSLSocket", "_sslobj"),
        ("ssl", "ssl.SSLContext", "_wrap_socket"),
        ("ssl", "ssl.SSLObject", "_sslobj"),
        ("socket", "socket.socket", "_accept"),
        ("django", "django.http.response.HttpResponseBase", "_handler_class"),
    )
)


# -- asyncio and uvloop: transports ------------------------------------------------------------


def native_transport_types() -> tuple[type, ...]:
    """The transport classes known to write straight to their socket: zero-copy can go around them.

    asyncio's ``selector_events._SelectorSocketTransport`` (the TCP and Unix transport in every
    version checked), and, only if the program has imported uvloop, ``uvloop.loop.TCPTransport``
    and ``uvloop.loop.UnixTransport``. Missing: asyncio's class raises ``AttributeError`` (every
    transport ``sendfile`` is given would fail loudly: nothing can be assumed about the new
    classes); uvloop's raise ``AttributeError`` too. Worked out once per state of uvloop (not
    imported, imported): a call costs one dictionary lookup.
    """
    return _native_transport_types(sys.modules.get("uvloop.loop"))


@functools.cache
def _native_transport_types(uvloop_mod: Any) -> tuple[type, ...]:
    from asyncio import selector_events

    types: list[type] = [selector_events._SelectorSocketTransport]  # type: ignore[attr-defined]
    if uvloop_mod is not None:
        types += [uvloop_mod.TCPTransport, uvloop_mod.UnixTransport]
    return tuple(types)


def pipe_transport_types() -> tuple[type, ...]:
    """The pipe transport classes (``connect_write_pipe``, a subprocess's ``stdin``): asyncio's
    ``unix_events`` ones and, once uvloop is imported, its ``WriteUnixTransport`` and
    ``ReadUnixTransport`` (which say no ``"pipe"`` extra for a subprocess's pipe, and whose
    ``socket`` extra is a stream socket's). Classes missing in a version are left out."""
    return _pipe_transport_types(sys.modules.get("uvloop.loop"))


@functools.cache
def _pipe_transport_types(uvloop_mod: Any) -> tuple[type, ...]:
    from asyncio import unix_events

    names = [(unix_events, "_UnixWritePipeTransport"), (unix_events, "_UnixReadPipeTransport")]
    if uvloop_mod is not None:
        names += [(uvloop_mod, "WriteUnixTransport"), (uvloop_mod, "ReadUnixTransport")]
    return tuple(found for mod, name in names if isinstance(found := getattr(mod, name, None), type))


def adopts_descriptors(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether *loop*'s ``connect_accepted_socket`` may be given an :class:`AdoptedSocket` for a
    plain connection: uvloop's (checked once per loop class)."""
    loop_type: Any = type(loop)
    return _adopts(loop_type, sys.modules.get("uvloop.loop"))


@functools.cache
def _adopts(loop_type: Any, uvloop_mod: Any) -> bool:
    return uvloop_mod is not None and issubclass(loop_type, uvloop_mod.Loop)


class AdoptedSocket:
    """An accepted connection's descriptor, for uvloop's ``connect_accepted_socket`` in place of
    a ``socket.socket``: no socket object to make (``socket.socket(fileno=)`` asks the kernel
    ``getsockname`` to check the descriptor) and none to detach at the close. uvloop's transport
    owns the descriptor from its ``_open``, which asks :meth:`fileno`, and calls :meth:`close`
    once it has closed it itself: nothing is closed twice. Should the set-up fail before the
    transport took it, :meth:`abandon` closes it."""

    __slots__ = ("asked", "family", "fd", "type")

    def __init__(self, fd: int, family: int, kind: int) -> None:
        self.fd = fd
        self.family = family
        self.type = kind
        self.asked = False

    def fileno(self) -> int:
        self.asked = True
        return self.fd

    def close(self) -> None:
        """(The transport closed the descriptor: another may have its number already.)"""

    def abandon(self, exc: BaseException) -> None:
        """The set-up failed with *exc*: close the descriptor unless the transport took it (it is
        asked for at the transport's ``_open``, and an ``OSError`` after that is ``_open``'s own:
        nothing took it then either)."""
        fd, self.fd = self.fd, -1
        if fd >= 0 and (not self.asked or isinstance(exc, OSError)):
            with contextlib.suppress(OSError):
                os.close(fd)


def asyncio_sendfile_holds(transport: Any) -> bool:
    """Whether asyncio's own ``loop.sendfile`` is sending on *transport* now: its native path sets
    the transport's ``_empty_waiter`` (its ``write`` raises meanwhile), its copy puts a
    ``_SendfileFallbackProtocol`` in the protocol's place. Checked against CPython 3.10-3.13.
    Either name missing: that check says False (uvloop's transports have neither: uvloop has no
    ``loop.sendfile``)."""
    return getattr(transport, "_empty_waiter", None) is not None or isinstance(
        transport.get_protocol(), _sendfile_fallback_types()
    )


@functools.cache
def _sendfile_fallback_types() -> tuple[type, ...]:
    from asyncio import base_events

    fallback = getattr(base_events, "_SendfileFallbackProtocol", None)
    return () if fallback is None else (fallback,)


def tls_protocol_types() -> tuple[type, ...]:
    """The TLS layers' protocol classes: a transport whose protocol is one of them carries TLS.

    ``asyncio.sslproto.SSLProtocol`` (every version checked: an undocumented module), and,
    only if the program has imported uvloop and it has one, ``uvloop.loop.SSLProtocol``.
    Missing: asyncio's raises ``AttributeError``; uvloop's is left out (a raw uvloop
    transport under TLS is then not recognised as one). Cached as
    :func:`native_transport_types` is.
    """
    return _tls_protocol_types(sys.modules.get("uvloop.loop"))


@functools.cache
def _tls_protocol_types(uvloop_mod: Any) -> tuple[type, ...]:
    from asyncio import sslproto

    tls_protocols: tuple[type, ...] = (sslproto.SSLProtocol,)
    if uvloop_mod is not None and hasattr(uvloop_mod, "SSLProtocol"):
        tls_protocols += (uvloop_mod.SSLProtocol,)
    return tls_protocols


def tls_socket_transport(transport: Any) -> Any:
    """The socket transport under a TLS transport, or None where it cannot be found.

    The TLS transport looks open until its ``connection_lost`` runs, a loop iteration or two
    after the socket transport under it was lost (a failed ``send()``, a reset read) or began
    to close (uvloop: the peer's EOF); every write meanwhile is dropped with a warning. The
    socket transport's ``is_closing()`` says it at once.

    asyncio (3.10-3.13): ``transport._ssl_protocol._transport`` (None once the TLS layer's
    ``connection_lost`` ran). uvloop (0.23.0): ``get_extra_info("uvloop.sslproto")`` gives its
    ``SSLProtocol``, whose ``_transport`` is a C field: it is the one of the objects the
    protocol refers to (``gc.get_referents``) that is a uvloop socket transport with this
    protocol. Missing (any of them): None, and loss is seen from the TLS transport alone (later).
    """
    ssl_protocol = getattr(transport, "_ssl_protocol", None)
    if ssl_protocol is not None:
        return getattr(ssl_protocol, "_transport", None)
    uvloop_mod = sys.modules.get("uvloop.loop")
    if uvloop_mod is None:
        return None
    ssl_protocol = transport.get_extra_info("uvloop.sslproto")
    if not isinstance(ssl_protocol, _tls_protocol_types(uvloop_mod)):
        return None
    socket_types = _native_transport_types(uvloop_mod)
    for under in gc.get_referents(ssl_protocol):
        if type(under) in socket_types and under.get_protocol() is ssl_protocol:
            return under
    return None


def tls_shutting_down(transport: Any) -> bool:
    """asyncio's TLS layer (3.11+) past WRAPPED: it drops writes with only a log line.

    Private state, read defensively: other transports (uvloop's, 3.10's) have
    no such attribute and report loss through ``is_closing``/``connection_lost``.
    (Reads ``transport._ssl_protocol._state``, an ``SSLProtocolState`` enum in 3.11-3.13;
    3.10's ``SSLProtocol`` has no ``_state``, its ``_SSLPipe`` has: never "shutting down"
    there.) Missing (either name, or ``name``): False, as for any other transport.
    """
    state = getattr(getattr(transport, "_ssl_protocol", None), "_state", None)
    name = getattr(state, "name", None)
    return name is not None and name != "WRAPPED"


# -- asyncio: StreamReader ---------------------------------------------------------------------


def reader_transport(reader: asyncio.StreamReader) -> Any:
    """The transport a ``StreamReader`` reads from (it has no public accessor), or None.

    ``StreamReader._transport``, every version checked (None until ``set_transport``).
    Missing: None, which ``recvfile`` reports as a reader with no transport (``ValueError``).
    """
    return getattr(reader, "_transport", None)


def reader_buffer(reader: asyncio.StreamReader) -> bytearray:
    """The bytes a ``StreamReader`` has received but not handed out: the live buffer, to consume.

    ``StreamReader._buffer``, a ``bytearray`` in every version checked; the caller takes
    bytes from its front (``del buffer[:n]``) while reading is paused, as ``read()`` would.
    Missing: ``AttributeError`` (no fallback: those bytes would be lost or reordered).
    """
    buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
    return buffer


def defuse_py310_tls_resume(reader: asyncio.StreamReader) -> None:
    """CPython 3.10: once a TLS connection is gone, ``StreamReader.read()`` crashes (and drops
    the bytes it took) trying to resume reading on the torn-down TLS layer. There is nothing
    left to resume, so clear the reader's paused flag first: its buffered bytes then read fine.

    Reads ``reader._transport._ssl_protocol._transport`` (3.10's ``SSLProtocol`` sets it to
    None in ``connection_lost``) and writes ``StreamReader._paused``. A no-op on 3.11+.
    Missing (any of them): nothing is done, and such a read fails as before (``recvfile``
    maps 3.10's ``AttributeError`` there to an incomplete transfer).
    """
    if sys.version_info >= (3, 11):
        return
    ssl_protocol = getattr(getattr(reader, "_transport", None), "_ssl_protocol", None)
    if ssl_protocol is not None and getattr(ssl_protocol, "_transport", True) is None:
        reader._paused = False  # type: ignore[attr-defined]


# -- ssl -----------------------------------------------------------------------------------------


def ssl_calls(sock: ssl.SSLSocket) -> tuple[Callable[..., Any], Callable[..., Any], Callable[[], int]]:
    """``read``, ``write`` and ``pending`` of *sock*'s TLS connection, for ``serve``'s own TLS
    transport: those of the ``_ssl._SSLSocket`` under it (``SSLSocket._sslobj``, every version
    checked), without ``SSLSocket``'s Python wrappers and their checks, a few microseconds a
    request. Missing (or without one of the three): the wrappers' own, which do the same."""
    inner = getattr(sock, "_sslobj", None)
    if inner is not None and all(hasattr(inner, name) for name in ("read", "write", "pending")):
        return inner.read, inner.write, inner.pending
    return sock.recv, sock.send, sock.pending


class TLSConnection(NamedTuple):
    """A server's TLS connection on a socket, as ``serve``'s TLS transport drives it."""

    sock: socket.socket  # for the socket's own calls: fileno, shutdown, recv, close
    do_handshake: Callable[[], None]
    read: Callable[[int], bytes]
    write: Callable[[Any], int]
    pending: Callable[[], int]
    close_notify: Callable[[], Any]  # SSL_shutdown: our close_notify
    info: Any  # an SSLObject (or the SSLSocket): cipher(), getpeercert(), version(), context...


_INNER_CALLS = (
    "do_handshake",
    "read",
    "write",
    "pending",
    "shutdown",
    "cipher",
    "getpeercert",
    "compression",
    "version",
)


def tls_server_connection(context: ssl.SSLContext, sock: socket.socket) -> TLSConnection:
    """The server side of a TLS connection on the non-blocking, connected *sock*, not begun.

    ``SSLContext._wrap_socket(sock, True, None, owner=...)`` (CPython 3.10-3.13: the call
    ``wrap_socket`` makes through ``SSLSocket._create``) gives the ``_ssl._SSLSocket`` alone,
    working on *sock*'s descriptor with *sock*'s timeout: no ``SSLSocket`` around it, which costs
    a second socket object made from *sock* (detached), a ``getsockopt``, a ``getsockname``, a
    ``getpeername`` and an ``ioctl`` a connection. Its owner, what an SNI callback is given
    (``sni_callback(obj, name, context)``, which may set ``obj.context``), is an ``ssl.SSLObject``
    over it, as asyncio's transports give (made with ``__new__``: its constructor refuses to be
    called; its methods call the one in ``_sslobj``); the connection holds it (``info``: the owner
    is held weakly). ``context.sslsocket_class`` is not used. Missing (or without one of the
    calls): ``wrap_socket``, whose ``SSLSocket`` takes *sock*'s descriptor and is ``sock`` then."""
    wrap = getattr(context, "_wrap_socket", None)
    if wrap is not None:
        shell = ssl.SSLObject.__new__(ssl.SSLObject)
        inner = wrap(sock, True, None, owner=shell)
        if all(hasattr(inner, name) for name in _INNER_CALLS):
            shell._sslobj = inner  # type: ignore[attr-defined]
            return TLSConnection(
                sock, inner.do_handshake, inner.read, inner.write, inner.pending, inner.shutdown, shell
            )
    wrapped = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    read, write, pending = ssl_calls(wrapped)
    return TLSConnection(wrapped, wrapped.do_handshake, read, write, pending, wrapped.unwrap, wrapped)


def forget_tls_connection(conn: TLSConnection) -> None:
    """*conn*'s socket is closed: its ``SSLObject`` (handed out as a transport's ``ssl_object``)
    lets go of the ``_ssl._SSLSocket``, so that a call on it raises instead of reaching OpenSSL
    with a descriptor number that may be another's now (an ``SSLSocket`` does so at its close)."""
    if isinstance(conn.info, ssl.SSLObject):
        conn.info._sslobj = None  # type: ignore[attr-defined]


# -- socket --------------------------------------------------------------------------------------


def acceptor(sock: socket.socket) -> Callable[[], tuple[int, Any]]:
    """*sock*'s accept as ``() -> (descriptor, address)``: ``socket._accept`` (every version
    checked: ``accept4`` with ``SOCK_CLOEXEC``), the call ``socket.accept`` wraps. The wrapper
    adds what ``serve``'s listener undoes or never uses, per connection: the new socket object,
    the conversion of its family and type to enums, and, for a non-blocking listening socket,
    an ``ioctl`` that makes the new one blocking (the loop makes it non-blocking again). Missing:
    the wrapper's, its socket detached."""
    inner = getattr(sock, "_accept", None)
    if inner is not None:
        return inner  # type: ignore[no-any-return]

    def accept() -> tuple[int, Any]:
        conn, address = sock.accept()
        return conn.detach(), address

    return accept


# -- aiohttp -------------------------------------------------------------------------------------


def take_buffered_headers(writer: Any) -> bytes:
    """Take aiohttp's not-yet-sent response headers, to send them with the file's first bytes.

    aiohttp (3.10+) buffers them until the first body write. Where its writer
    does not look as expected, send them now the ordinary way: the order is
    right either way, only the packet count differs.

    Reads and clears ``StreamWriter._headers_buf`` (bytes) and sets ``_headers_written``
    (``aiohttp/http_writer.py``, 3.14.5; what its own ``send_headers`` does). Missing: the
    public ``send_headers()`` sends them in a write of their own (one more packet).
    """
    buf = getattr(writer, "_headers_buf", None)
    if isinstance(buf, bytes) and buf and getattr(writer, "_headers_written", True) is False:
        writer._headers_buf = None
        writer._headers_written = True
        return buf
    send_headers = getattr(writer, "send_headers", None)
    if send_headers is not None:
        send_headers()
    return b""


def keep_headers_buffered(cls: _T) -> _T:
    """Class decorator for a ``StreamResponse`` subclass: aiohttp keeps its headers buffered
    after ``prepare()`` until the first body write, so :func:`take_buffered_headers` can send
    them in one write with the body.

    Sets ``_send_headers_immediately = False`` (``aiohttp/web_response.py`` 3.14.5, which sets
    it so on its own ``Response``). Missing (renamed): aiohttp sends the headers at
    ``prepare()``, :func:`take_buffered_headers` finds none, and they go in a packet of their own.
    """
    cls._send_headers_immediately = False  # type: ignore[attr-defined]
    return cls


def turn_off_compression(response: Any) -> None:
    """A middleware must not compress this response (its body is already compressed).

    aiohttp has ``enable_compression()`` only; this writes ``StreamResponse._compression``
    (3.14.5, as aiohttp's own ``FileResponse`` does for a pre-compressed file). Missing
    (renamed): a middleware's ``enable_compression()`` would compress it again, and the
    public ``compression`` property would say so (the test catches it first).
    """
    response._compression = False


def compresses(response: Any, request: Any) -> bool:
    """Whether aiohttp will compress *response*'s body for *request*: ``enable_compression()``
    was called, and (``StreamResponse._start_compression``, 3.14.5) its forced coding, else the
    first of ``web_response.CONTENT_CODINGS`` named in ``Accept-Encoding``, is not identity.
    Missing (renamed): taken as compressing whenever it is enabled (a range then gets the whole
    file, as before; the test catches it first)."""
    if not response.compression:
        return False
    try:
        from aiohttp.web_response import CONTENT_CODINGS
    except ImportError:
        return True
    force = getattr(response, "_compression_force", None)
    if force:
        return bool(force.value != "identity")
    accept = request.headers.get("Accept-Encoding", "").lower()
    for value in CONTENT_CODINGS:
        if value in accept:
            return value != "identity"
    return False


def skip_length_check(response: Any) -> None:
    """No ``Content-Length``/chunking bookkeeping for this response (a 304 with no body).

    Writes ``StreamResponse._length_check`` (3.14.5, a class attribute aiohttp turns off for
    WebSockets and in its own ``FileResponse`` for a 304). Missing (renamed): aiohttp would
    frame the 304 as it frames any response without a length.
    """
    response._length_check = False


def route_static_requests(handler: str) -> Callable[[_T], _T]:
    """Class decorator for a ``web.StaticResource`` subclass: its GET/HEAD routes call *handler*.

    aiohttp's ``StaticResource.__init__`` binds ``self._handle`` into its routes
    (``aiohttp/web_urldispatcher.py`` 3.14.5): this points ``_handle`` at the subclass's
    *handler* method. Missing (renamed): aiohttp's own handler would answer every request,
    silently, with aiohttp's ``FileResponse`` (the test catches it first).
    """

    def route(cls: _T) -> _T:
        cls._handle = getattr(cls, handler)  # type: ignore[attr-defined]
        return cls

    return route


# -- Django --------------------------------------------------------------------------------------


def set_handler_class(response: Any, handler_class: type) -> None:
    """Mark *response* as made by *handler_class*, as Django's own handlers do to every response
    (``response._handler_class = self.__class__`` in ``ASGIHandler.handle`` and
    ``WSGIHandler.__call__``): its ``close()`` sends ``request_finished`` with that sender.
    ``HttpResponseBase.__init__`` sets it to None in every version checked; an older or newer
    Django without it ignores the attribute (the signal's sender is then None)."""
    response._handler_class = handler_class
