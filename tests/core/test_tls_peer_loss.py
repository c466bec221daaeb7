"""A TLS client that vanishes (a reset) while the body is flowing, on both loops.

The userspace copy over TLS writes several pieces per wakeup. Once the socket under the TLS
layer is lost, the TLS transport itself still looks open until its ``connection_lost`` runs
(a later loop iteration), and every piece written meanwhile is dropped with a warning:
asyncio's socket transport logs ``socket.send() raised exception.``, uvloop's TLS layer
``SSL connection is closed``. The contract: a ``ConnectionLostError`` (a ``ConnectionError``
with ``.sent``), promptly, no write after the loss, nothing logged, nothing left running.
(The loop's exception handler is watched by the conftest guard.)

The client is a plain blocking TLS socket. It vanishes from the transfer's own ``on_progress``,
so it is gone in the middle of a write burst every time, as when the client runs elsewhere:
with a RST (``SO_LINGER`` 0; asyncio's socket transport fails its next ``send()``), or with a
FIN and no close_notify (TLS has no half-close: uvloop's TLS layer closes the socket transport
and drops writes, asyncio's 3.11+ one shuts down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _compat

from ..support.connections import loop_name

MiB = 2**20
SIZE = 64 * MiB


class Pair:
    """A TLS server's StreamWriter and its client: a blocking ``ssl.SSLSocket`` the test resets."""

    def __init__(self, writer: asyncio.StreamWriter, client: ssl.SSLSocket) -> None:
        self.writer = writer
        self.client = client

    def half_close(self) -> None:
        """The client shuts its write side (a FIN, no close_notify): TLS has no half-close, the
        session ends. (uvloop's TLS layer then closes the socket transport and drops writes.)"""
        if self.client.fileno() >= 0:
            with contextlib.suppress(OSError):
                self.client.shutdown(socket.SHUT_WR)

    def reset(self) -> None:
        """The client vanishes: a RST, at once (the kernel sends it on close)."""
        if self.client.fileno() >= 0:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.client.close()


@pytest.fixture
async def tls_pair(tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext) -> AsyncIterator[Pair]:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.StreamWriter] = loop.create_future()

    async def on_client(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.set_result(w)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=tls_server_ctx)
    port = server.sockets[0].getsockname()[1]

    def connect() -> ssl.SSLSocket:
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)  # the first writes all fit
        raw.settimeout(10)
        raw.connect(("127.0.0.1", port))
        return tls_client_ctx.wrap_socket(raw, server_hostname="localhost")

    client = await loop.run_in_executor(None, connect)
    writer = await accepted
    result = Pair(writer, client)
    try:
        yield result
    finally:
        result.reset()
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("how", ["reset", "half_close"])
@pytest.mark.parametrize("after", [0, 1, 2 * MiB])
async def test_client_vanishes_mid_body(
    tls_pair: Pair, make_file: Any, caplog: pytest.LogCaptureFixture, after: int, how: str
) -> None:
    if how == "half_close" and sys.version_info < (3, 11) and loop_name() == "asyncio":
        pytest.skip(
            "3.10's TLS transport pauses reading on the socket transport: the FIN is not read while "
            "the transfer runs, so a half-closed peer that stops reading is a stalled peer"
        )
    caplog.set_level(logging.DEBUG, logger="asyncio")
    vanish = getattr(tls_pair, how)

    def progress(sent: int, _total: int | None) -> None:
        if sent >= after:
            vanish()

    with open(make_file(SIZE), "rb") as f:
        if not after:
            vanish()  # before the transfer starts: its first write finds the peer gone
        task = asyncio.ensure_future(aiosendfile.sendfile(tls_pair.writer, f, on_progress=progress))
        with pytest.raises(ConnectionError) as exc_info:
            await asyncio.wait_for(task, 10)
        assert isinstance(exc_info.value, aiosendfile.ConnectionLostError)
        assert after <= exc_info.value.sent < SIZE
        assert f.tell() == exc_info.value.sent
    await asyncio.sleep(0.05)  # the transports' late callbacks (which would log) have run
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_the_socket_transport_under_tls_is_found(tls_pair: Pair) -> None:
    """What the transfer watches: the socket transport under the TLS one, on both loops."""
    transport = tls_pair.writer.transport
    under = _compat.tls_socket_transport(transport)
    assert isinstance(under, _compat.native_transport_types())
    assert isinstance(under.get_protocol(), _compat.tls_protocol_types())
    assert not under.is_closing()
    tls_pair.writer.close()
    assert under.is_closing() or transport.is_closing()


def test_transport_types_are_worked_out_once() -> None:
    """Cached per state of uvloop: the same tuple each call; asyncio's class alone without uvloop."""
    assert _compat.native_transport_types() is _compat.native_transport_types()
    assert _compat.tls_protocol_types() is _compat.tls_protocol_types()
    assert _compat._native_transport_types(None) == (asyncio.selector_events._SelectorSocketTransport,)  # type: ignore[attr-defined]
    assert _compat._tls_protocol_types(None) == (asyncio.sslproto.SSLProtocol,)
