"""The internals ``aiosendfile._compat`` relies on are still there in the installed asyncio, uvloop, aiohttp.

One test per entry of ``_compat.RELIED_ON``, checked on a real object (a module, a live TLS
transport, a ``StreamReader``, aiohttp's writer in a real exchange), on both loops where a loop
is involved. A name that disappears fails here, naming the library, its version and the
attribute, before it shows as a silent change of behaviour somewhere else. Also: the one
TLS-transport test (``_target.is_tls``) and the native transport classes, on every kind of
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import re
import select
import socket
import ssl
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from aiosendfile import _compat
from aiosendfile._target import is_tls

from ..support.connections import Connector, loop_name

VERSIONS = {
    "asyncio": f"CPython {sys.version.split()[0]}",
    "ssl": f"CPython {sys.version.split()[0]}",
    "socket": f"CPython {sys.version.split()[0]}",
    "django": f"Django {metadata.version('django')}",
    "uvloop": f"uvloop {metadata.version('uvloop')}",
    "aiohttp": f"aiohttp {metadata.version('aiohttp')}",
}

#: Where a real object for an entry is found without a connection: a module, or a fresh instance.
STATIC = (
    "asyncio.selector_events",
    "asyncio.base_events",
    "asyncio.sslproto",
    "uvloop.loop",
    "aiohttp.web.",
    "aiohttp.web_response",
    "ssl.",
    "socket.",
    "django.",
)


def missing(library: str, where: str, attribute: str) -> str:
    return (
        f"{VERSIONS[library]}: {where} has no attribute {attribute!r}, which aiosendfile._compat "
        f"relies on (read its docstring: what uses it, and the fallback when it is missing)"
    )


def entries(static: bool) -> list[Any]:
    """The entries checked without (*static*) or with a connection, on the Pythons that rely on them."""
    return [
        pytest.param(entry.library, entry.where, entry.attribute, id=f"{entry.where}.{entry.attribute}")
        for entry in _compat.RELIED_ON
        if entry.where.startswith(STATIC) == static and entry.since <= sys.version_info[:2] < entry.before
    ]


def test_relied_on_is_listed_in_the_docstring() -> None:
    """Every attribute the module relies on is named in its docstring's list of accesses."""
    doc = _compat.__doc__ or ""
    assert [entry.attribute for entry in _compat.RELIED_ON if entry.attribute not in doc] == []


# -- modules and classes ------------------------------------------------------------------------


@contextlib.contextmanager
def static_object(where: str, tmp_path: Path) -> Iterator[Any]:
    if where == "aiohttp.web.StreamResponse":
        yield web.StreamResponse()
    elif where == "aiohttp.web.StaticResource":
        yield web.StaticResource("/s", tmp_path)
    elif where == "ssl.SSLSocket":  # one end of a connected pair: its _ssl._SSLSocket exists at once
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        a, b = socket.socketpair()
        with b, context.wrap_socket(a, server_side=True, do_handshake_on_connect=False) as wrapped:
            yield wrapped
    elif where == "ssl.SSLContext":
        yield ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    elif where == "ssl.SSLObject":
        yield ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).wrap_bio(
            ssl.MemoryBIO(), ssl.MemoryBIO(), server_side=True
        )
    elif where == "socket.socket":
        with socket.socket() as sock:
            yield sock
    elif where == "asyncio.selector_events._SelectorSocketTransport":  # (needs a socket): its source
        from asyncio.selector_events import _SelectorSocketTransport

        assigned = re.findall(r"self\.(_\w+) = ", inspect.getsource(_SelectorSocketTransport))
        yield SimpleNamespace(**dict.fromkeys(assigned))
    elif where == "django.http.response.HttpResponseBase":  # an instance needs settings: its source
        from django.http.response import HttpResponseBase

        assigned = re.findall(r"self\.(_\w+) = ", inspect.getsource(HttpResponseBase))
        yield SimpleNamespace(**dict.fromkeys(assigned))
    else:
        yield importlib.import_module(where)


@pytest.mark.parametrize(("library", "where", "attribute"), entries(static=True))
def test_module_or_class_internal_is_there(library: str, where: str, attribute: str, tmp_path: Path) -> None:
    with static_object(where, tmp_path) as found:
        assert hasattr(found, attribute), missing(library, where, attribute)


def test_ssl_calls_are_the_connections_own() -> None:
    """The read, write and pending of the ``_ssl._SSLSocket`` under an ``SSLSocket``; its own
    wrappers where it has none."""
    with static_object("ssl.SSLSocket", Path()) as wrapped:
        read, write, pending = _compat.ssl_calls(wrapped)
        assert read.__self__ is write.__self__ is wrapped._sslobj
        assert pending() == 0
        wrapped._sslobj = None  # as a library without the inner object would have it
        assert _compat.ssl_calls(wrapped) == (wrapped.recv, wrapped.send, wrapped.pending)


@contextlib.contextmanager
def _tls_pair(
    server_ctx: Any, client_ctx: ssl.SSLContext, name: str
) -> Iterator[tuple[_compat.TLSConnection, ssl.SSLSocket, socket.socket]]:
    """A server connection (``tls_server_connection``), a blocking client asking for *name*, and
    the server's socket it was made on: a connected pair, not begun; all closed after."""
    a, b = socket.socketpair()
    a.setblocking(False)
    with contextlib.ExitStack() as stack, a, b:
        client = stack.enter_context(
            client_ctx.wrap_socket(b, server_hostname=name, do_handshake_on_connect=False)
        )
        conn = _compat.tls_server_connection(server_ctx, a)
        stack.callback(conn.sock.close)  # (without _wrap_socket, an SSLSocket took a's descriptor)
        yield conn, client, a


def _handshake_over(server: _compat.TLSConnection, client: ssl.SSLSocket) -> None:
    """Both ends of a connected pair through their handshake (the client blocking in a thread)."""
    import threading

    done = threading.Thread(target=client.do_handshake)
    done.start()
    while True:
        try:
            server.do_handshake()
            break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            select.select([server.sock], [], [], 5)
    done.join(5)


@pytest.mark.parametrize("inner", [True, False])
def test_a_tls_server_connection_works_on_its_socket(
    tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext, inner: bool
) -> None:
    """The ``_ssl._SSLSocket`` alone on the socket (or, where ``_wrap_socket`` is missing, the
    ``SSLSocket`` that took the socket's descriptor): handshake, both ways, the session's facts,
    an ``ssl_object`` as asyncio's, our close_notify, and the socket's own calls on ``sock``."""
    server_ctx: Any = tls_server_ctx if inner else _NoInnerWrap(tls_server_ctx)
    with _tls_pair(server_ctx, tls_client_ctx, "localhost") as (conn, client, a):
        assert (conn.sock is a) is inner
        assert conn.sock.gettimeout() == 0.0
        _handshake_over(conn, client)
        client.sendall(b"ping")
        select.select([conn.sock], [], [], 5)
        assert conn.read(1024) == b"ping"
        assert conn.pending() == 0
        assert conn.write(b"pong") == 4
        assert client.recv(4) == b"pong"
        assert conn.info.cipher()[1] in ("TLSv1.2", "TLSv1.3")
        assert conn.info.getpeercert() is None
        assert isinstance(conn.info, ssl.SSLObject if inner else ssl.SSLSocket)  # (as asyncio's)
        assert conn.info.version() == client.version()
        assert conn.info.server_side
        assert conn.info.cipher() == client.cipher()
        with contextlib.suppress(ssl.SSLWantReadError):
            conn.close_notify()
        assert client.recv(1) == b""  # (the client read our close_notify)
        assert conn.sock.fileno() >= 0
        assert conn.sock.getpeername() == ""
        conn.sock.close()
        _compat.forget_tls_connection(conn)  # (its socket closed: no call reaches OpenSSL now)
        if inner:
            with pytest.raises(AttributeError):
                conn.info.cipher()


def test_an_sni_callback_may_choose_the_certificate(tls_ca: Any, tls_client_ctx: ssl.SSLContext) -> None:
    """The owner an SNI callback is given is an ``SSLObject`` whose ``context`` it may set (as
    with asyncio's transports): the client asking for another name gets that name's certificate."""
    first = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls_ca.issue_cert("localhost").configure_cert(first)
    other = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls_ca.issue_cert("other.example").configure_cert(other)
    given: list[Any] = []

    def choose(obj: Any, name: str | None, context: ssl.SSLContext) -> None:
        given.append(obj)
        if name == "other.example":
            obj.context = other

    first.sni_callback = choose
    with _tls_pair(first, tls_client_ctx, "other.example") as (conn, client, _):
        _handshake_over(conn, client)
        assert given == [conn.info]
        assert ("DNS", "other.example") in client.getpeercert()["subjectAltName"]


class _NoInnerWrap:
    """A context without ``_wrap_socket``, as a library without it would have it."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.wrap_socket = context.wrap_socket


def test_a_response_marked_by_our_handler_tells_request_finished_so() -> None:
    """Django's ``close()`` sends ``request_finished`` from the class set on the response."""
    from django.http.response import HttpResponseBase

    assert "sender=self._handler_class" in inspect.getsource(HttpResponseBase.close)
    response = SimpleNamespace()
    _compat.set_handler_class(response, HttpResponseBase)
    assert response._handler_class is HttpResponseBase


# -- live objects, on both loops -----------------------------------------------------------------


async def aiohttp_writer_state() -> dict[str, Any]:
    """A real aiohttp exchange: what its payload writer holds after ``prepare()`` of a buffered response."""
    seen: dict[str, Any] = {}

    @_compat.keep_headers_buffered
    class Buffered(web.StreamResponse):
        pass

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        response = Buffered()
        try:
            writer = await response.prepare(request)
        except Exception as exc:
            seen["error"] = exc
            raise
        for attribute in ("_headers_buf", "_headers_written"):
            seen[attribute] = hasattr(writer, attribute)
        seen["taken"] = _compat.take_buffered_headers(writer)
        await response.write_eof()
        return response

    server = await asyncio.get_running_loop().create_server(web.Server(handler), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await reader.read()
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    return seen


@pytest.mark.parametrize("kind", ["tls"])
@pytest.mark.parametrize(("library", "where", "attribute"), entries(static=False))
async def test_live_internal_is_there(library: str, where: str, attribute: str, connect: Connector) -> None:
    if where == "aiohttp StreamWriter":
        seen = await aiohttp_writer_state()
        assert "error" not in seen, f"{VERSIONS[library]}: a plain response failed: {seen['error']!r}"
        assert seen[attribute], missing(library, where, attribute)
        assert seen["taken"].startswith(b"HTTP/1.1 200 OK\r\n"), "aiohttp no longer buffers the headers"
        return
    conn = await connect()
    if where == "StreamReader":
        reader, client_writer = conn.client_reader, conn.client_writer
        assert reader is not None
        assert client_writer is not None
        assert hasattr(reader, attribute), missing(library, where, attribute)
        assert _compat.reader_transport(reader) is client_writer.transport
        assert isinstance(_compat.reader_buffer(reader), bytearray)
        return
    transport = conn.transport
    if library == "uvloop":  # an extra-info key of uvloop's TLS transport, not an attribute
        if loop_name() != "uvloop":
            pytest.skip("uvloop's TLS transport only")
        assert transport.get_extra_info(attribute) is not None, missing(library, where, attribute)
        assert _compat.tls_socket_transport(transport) is not None, "the socket transport under TLS"
        return
    # asyncio's TLS transport; uvloop's is compiled and has none of these: _compat's fallback applies.
    if loop_name() == "uvloop":
        assert not _compat.tls_shutting_down(transport)
        pytest.skip("uvloop's TLS transport: the fallback applies (tls_shutting_down is False)")
    obj, path = transport, where.split(".")[1:]
    for step in path:
        obj = getattr(obj, step)
    assert hasattr(obj, attribute), missing(library, where, attribute)
    if attribute == "_state" and sys.version_info >= (3, 11):
        assert obj._state.name == "WRAPPED", "asyncio's TLS state no longer says WRAPPED while open"
        assert not _compat.tls_shutting_down(transport)


# -- one TLS test, the native transports -----------------------------------------------------------


async def test_transports_are_recognised(connect: Connector, kind: str) -> None:
    """``is_tls`` for every target form, and which transports zero-copy may go around.

    asyncio's and uvloop's TLS transports report both ``sslcontext`` and ``ssl_object``; the
    old checks (``_target``: either; ``_lease``/``_fallback``/``_recv``: ``sslcontext``) agreed
    on all of them. Plain ones report neither.
    """
    conn = await connect()
    tls = kind == "tls"
    client_writer = conn.client_writer
    assert client_writer is not None
    target: Any
    for target in (conn.writer, conn.transport, client_writer, client_writer.transport):
        assert is_tls(target) is tls, target
        assert (target.get_extra_info("sslcontext") is not None) is tls
        assert (target.get_extra_info("ssl_object") is not None) is tls
    assert isinstance(conn.transport, _compat.native_transport_types()) is not tls
    assert not isinstance(conn.transport.get_protocol(), _compat.tls_protocol_types())
    assert not is_tls(conn.client)  # the client's plain socket (under TLS or not)
    family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
    with socket.socket(family) as plain:
        assert not is_tls(plain)


def test_an_ssl_socket_is_tls() -> None:
    import ssl

    context = ssl.create_default_context()
    with (
        socket.socket() as raw,
        context.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False) as wrapped,
    ):
        assert is_tls(wrapped)


@pytest.mark.parametrize("family", ["tcp", "unix"])
async def test_uvloop_adopts_a_bare_descriptor_and_closes_it_once(family: str, tmp_path: Path) -> None:
    """What ``_compat.AdoptedSocket`` relies on, on uvloop's own loop: ``connect_accepted_socket``
    takes an object with ``family``, ``type`` and ``fileno()``, serves the connection, and closes
    the descriptor itself at the transport's close (``close()`` of the stand-in is no second
    close). Elsewhere: only uvloop's loops are said to take one."""
    loop = asyncio.get_running_loop()
    if not _compat.adopts_descriptors(loop):
        assert loop_name() != "uvloop"
        return
    if family == "tcp":
        listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listening.bind(("127.0.0.1", 0))
    else:
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listening.bind(str(tmp_path / "s"))
    listening.listen()
    with listening, socket.socket(listening.family, socket.SOCK_STREAM) as client:
        client.connect(listening.getsockname())
        fd, _ = listening._accept()  # type: ignore[attr-defined]
        adopted = _compat.AdoptedSocket(fd, listening.family, socket.SOCK_STREAM)
        got: asyncio.Future[bytes] = loop.create_future()

        class Echo(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                self.transport.write(data.upper())
                got.set_result(data)

        transport, _ = await loop.connect_accepted_socket(Echo, adopted)  # type: ignore[arg-type]
        assert adopted.asked
        client.sendall(b"ping")
        assert await asyncio.wait_for(got, 5) == b"ping"
        assert await loop.run_in_executor(None, client.recv, 10) == b"PING"
        transport.close()
        for _ in range(5):
            await asyncio.sleep(0)
        with pytest.raises(OSError, match="Bad file descriptor"):  # closed by the transport
            os.fstat(fd)
        assert await loop.run_in_executor(None, client.recv, 10) == b""
