"""The engine (``aiosendfile._serve``) when a client vanishes, when it stops, and when it fails, on
raw sockets, on both loops: a client gone mid-file leaves nothing behind, a graceful shutdown
finishes answers in flight, and a bug is reported, never hidden behind a hung or short answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

import pytest

from aiosendfile._serve import _answering
from aiosendfile._static import _inline

from ..support.fds import describe_fd, open_fds
from ..support.raw_http import all_responses, read_response
from ..support.serve import (
    BIG,
    ServeSite,
    at_eof,
    close_writer,
    engine,
    get,
    reported,
    serving,
)
from ..support.waiting import until

pytest.importorskip("httptools")


# -- a client that vanishes, shutdown ---------------------------------------------------------------


async def _reset_mid_body(www_site: ServeSite, requests: bytes) -> None:
    """A client with a 4 KiB window sends *requests*, reads 10,000 bytes, and resets (RST)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (www_site.host, www_site.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(requests)
    await reader.readexactly(10000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST mid-body


async def test_a_client_vanishing_mid_file_leaves_nothing_behind(www_site: ServeSite) -> None:
    """The fd and loop guards of the conftest check that nothing leaked or was reported."""
    for _ in range(3):
        await _reset_mid_body(www_site, get("/big.bin") + get("/big.bin"))
    raw = await www_site.exchange(get("/small.txt", "Connection: close\r\n"))
    assert all_responses(raw, ["GET"])[0].status == 200


async def test_cold_chunks_go_through_the_pool_in_order_and_vanishing_leaves_nothing(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every chunk probed cold: the outlet sends each from the cold pool. Pipelined answers around
    a big file are byte-exact; a client gone while a pool thread sends leaves no fd behind (the fd
    guard) and nothing reported (the loop guard)."""
    from aiosendfile import _bodies, _platform

    monkeypatch.setattr(_bodies, "is_cold", lambda *args, **kwargs: True)
    small, big = (www_site.public / "small.txt").read_bytes(), (www_site.public / "big.bin").read_bytes()
    before = _platform.counters.cold
    raw = await www_site.exchange(
        get("/small.txt") + get("/big.bin") + get("/small.txt", "Connection: close\r\n")
    )
    answers = all_responses(raw, ["GET"] * 3)
    assert [a.body for a in answers] == [small, big, small]
    assert _platform.counters.cold > before
    for _ in range(3):
        await _reset_mid_body(www_site, get("/big.bin"))
    raw = await www_site.exchange(get("/small.txt", "Connection: close\r\n"))
    assert all_responses(raw, ["GET"])[0].status == 200
    # A pool thread may still be in its sendfile to a reset socket: the file and the socket's
    # duplicate are let go once it is done (the fd guard then finds nothing), not at the reset.
    await until(lambda: not [fd for fd in open_fds() if describe_fd(fd).endswith("big.bin")])


async def test_shutdown_closes_idle_connections_and_finishes_answers_in_flight(tmp_path: Path) -> None:
    mod = engine()
    async with serving(tmp_path) as www_site:
        idle_r, idle_w = await www_site.open()
        idle_w.write(get("/small.txt"))
        await read_response(idle_r)
        busy_r, busy_w = await www_site.open()
        busy_w.write(get("/big.bin"))
        head = await busy_r.readuntil(b"\r\n\r\n")  # the big answer has begun
        try:
            await mod.shutdown(www_site.server, 20.0)
            assert await at_eof(idle_r)
            body = await asyncio.wait_for(busy_r.readexactly(BIG), 20)
            assert head.startswith(b"HTTP/1.1 200")
            assert body == (www_site.public / "big.bin").read_bytes()
            assert await at_eof(busy_r)
        finally:
            await close_writer(idle_w)
            await close_writer(busy_w)


def _stop_when_made(monkeypatch: pytest.MonkeyPatch, server: Any) -> list[asyncio.Task[None]]:
    """Begin stopping *server* from each protocol's connection_made (after it, before the
    set-up task resumes); the stops begun, in a list."""
    from aiosendfile._serve import _protocol

    mod = engine()
    stops: list[asyncio.Task[None]] = []
    made = _protocol.HttpProtocol.connection_made

    def made_then_stop(self: Any, transport: Any) -> None:
        made(self, transport)
        stops.append(asyncio.ensure_future(mod.shutdown(server, 30.0)))

    monkeypatch.setattr(_protocol.HttpProtocol, "connection_made", made_then_stop)
    return stops


@pytest.mark.parametrize(
    "moment", ["right after its accept", "before connection_made", "after connection_made"]
)
async def test_a_stop_during_a_connections_set_up_closes_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """A stop that comes while a new connection is being set up (accepted, its
    connect_accepted_socket not finished) closes that connection at once, and leaks no socket.
    Each moment is made exact: the stop begun between the accept and the set-up (when the set-up
    was a task, a socket accepted before its first step was left open); the stop begun when the loop
    makes the protocol, before its connection_made (the connection came after the stop had closed
    the others, and stayed open, idle, until the stop's timeout); the stop begun from the
    protocol's connection_made, before the set-up task resumes (cancelling it there left uvloop's
    transport closed without connection_lost, and the stop waited its whole timeout)."""
    from aiosendfile._serve import _listener

    mod = engine()
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    server = await mod.start_server(mod.ServeConfig(directory=str(tmp_path)), sock=listening)
    eng = mod._engines[server]
    stops: list[asyncio.Task[None]] = []
    if moment == "right after its accept":
        attach = _listener.Listener._attach

        def stop_then_attach(self: Any, fd: int) -> None:
            stops.append(asyncio.ensure_future(mod.shutdown(server, 30.0)))  # (its first step: next turn)
            attach(self, fd)

        monkeypatch.setattr(_listener.Listener, "_attach", stop_then_attach)
    elif moment == "before connection_made":
        factory = server._factory

        def protocol_then_stop() -> Any:  # (called within connect_accepted_socket)
            stops.append(asyncio.ensure_future(mod.shutdown(server, 30.0)))  # (runs before connection_made)
            return factory()

        monkeypatch.setattr(server, "_factory", protocol_then_stop)
    else:
        stops = _stop_when_made(monkeypatch, server)
    client = socket.create_connection(listening.getsockname())
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        assert await asyncio.wait_for(loop.sock_recv(client, 1), 5) == b""  # closed by the server
        await asyncio.wait_for(stops[0] if stops else mod.shutdown(server, 30.0), 5)
        assert not eng.connections
    finally:
        client.close()
    gc.collect()  # (an accepted socket nobody closed would warn here: the test fails on warnings)


async def test_a_stop_right_after_a_tls_connection_is_made_closes_it_at_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
) -> None:
    """As above over TLS, the stop begun from the protocol's connection_made (right after the
    handshake): the connection is closed at once and the stop does not wait for it. The engine's
    timer ticks every half millisecond (a 2 ms send timeout; a header timeout would bound the
    handshake too), so that it looks at the connection while it closes. (When the engine used
    asyncio's TLS transport, the listener cancelled such a set-up as a handshake, and stock
    asyncio then closed the transport a second time, which dropped its TLS layer: the tick
    raised on its get_write_buffer_size().)"""
    mod = engine()
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    config = mod.ServeConfig(directory=str(tmp_path), send_timeout=0.002)
    server = await mod.start_server(config, sock=listening, ssl=tls_server_ctx)
    eng = mod._engines[server]
    stops = _stop_when_made(monkeypatch, server)
    reader, writer = await asyncio.open_connection(*listening.getsockname(), ssl=tls_client_ctx)
    try:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            assert await asyncio.wait_for(reader.read(), 5) == b""
        await asyncio.wait_for(stops[0], 5)
        assert not eng.connections
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


# -- bugs are reported, never hidden behind a hung or short answer ----------------------------------


async def test_a_failing_core_gives_500_and_is_reported(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("core bug")

    monkeypatch.setattr(_answering, "core_answer", broken)
    monkeypatch.setattr(_inline, "decide", broken)  # (the first sight's decision on the loop)
    with reported() as errors:
        for target in ("/first-sight", "/first-sight"):  # in the cold pool, then inline
            raw = await www_site.exchange(get(target))
            (a,) = all_responses(raw, ["GET"])
            assert (a.status, a.headers["connection"]) == (500, "close")
    assert [type(e["exception"]) for e in errors] == [ZeroDivisionError] * 2


@pytest.mark.parametrize("error", [ZeroDivisionError, RuntimeError])
async def test_a_failing_body_send_aborts_the_connection_and_is_reported(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    from aiosendfile import _bodies

    def broken(*args: Any, **kwargs: Any) -> int:
        raise error("send bug")  # a RuntimeError with the connection alive is a bug too

    monkeypatch.setattr(_bodies, "sendfile_once", broken)
    with reported() as errors:
        raw = await www_site.exchange(get("/big.bin"))  # aborted: no complete answer, no hang
    assert len(raw.partition(b"\r\n\r\n")[2]) < BIG
    assert [type(e["exception"]) for e in errors] == [error]
