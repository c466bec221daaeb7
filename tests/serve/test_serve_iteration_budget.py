"""The engine's iteration budget (``aiosendfile._serve``), on raw sockets, on both loops: answering
stops when an iteration's time is spent, and the connections and requests left wait their turn
(end of stream, TLS, Unix sockets, slow heads, stock asyncio's share).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from aiosendfile._serve import _answering

from ..support.raw_http import all_responses, read_response, read_to_eof
from ..support.serve import (
    ServeSite,
    build,
    close_writer,
    engine,
    get,
    holding,
    serving,
)
from ..support.tls_duplex import TLSDuplex

pytest.importorskip("httptools")


# -- the loop's iteration budget: answering stops when an iteration's time is spent --------------------


class _Transport:
    """Enough of a transport for a protocol driven by hand: what it was given, and whether it reads."""

    def __init__(self, tls: bool = False) -> None:
        self.data = b""
        self.reading = True
        self.extra = {"sslcontext": object()} if tls else {}

    def write(self, data: bytes) -> None:
        self.data += data

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        pass


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_requests_past_the_iterations_budget_wait_for_the_next_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls: bool
) -> None:
    """With the budget spent at once, each iteration answers one request: the first read is
    answered, the others wait and are answered in the following iterations, each whole. A held
    read leaves reading on, over TLS too (an end of stream waits in eof_received); a backlog
    pauses it. Reading is on for all once all is answered."""
    mod = engine()
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    root = build(tmp_path / "www")
    small = (root / "small.txt").read_bytes()
    eng = mod.Engine(mod.ServeConfig(str(root)), asyncio.get_running_loop())
    try:
        # (warm: the first sight of a path is decided in the cold pool)
        warm = eng.protocol()
        warm.connection_made(_Transport())
        warm.data_received(get("/small.txt"))
        for _ in range(200):
            if warm.transport.data:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        protocols = [eng.protocol() for _ in range(3)]
        transports = [_Transport(tls) for _ in protocols]
        for p, t in zip(protocols, transports, strict=True):
            p.connection_made(t)
        flood = get("/small.txt") * 300  # past PARSE_SLICE
        for p, data in zip(protocols, [get("/small.txt"), get("/small.txt"), flood], strict=True):
            p.data_received(data)
        assert [bool(t.data) for t in transports] == [True, False, False]
        assert [t.reading for t in transports] == [True, True, False]
        answered = []
        for _ in range(50):
            await asyncio.sleep(0)
            answered.append(sum(1 for t in transports[:2] if t.data))
            if all(t.data.count(small) == n for t, n in zip(transports, [1, 1, 300], strict=True)):
                break
        assert answered[0] == 2  # the second read: answered in the next iteration
        assert [t.data.count(small) for t in transports] == [1, 1, 300]
        assert [t.data.count(b"HTTP/1.1 200 OK\r\n") for t in transports] == [1, 1, 300]
        assert all(t.reading for t in transports)
        for p in [warm, *protocols]:
            p.connection_lost(None)
    finally:
        eng.stop()


async def _warmed(www_site: ServeSite) -> bytes:
    """small.txt asked for once, so that it is memoised (a first sight is decided in the cold
    pool); its bytes."""
    small = (www_site.public / "small.txt").read_bytes()
    reader, writer = await www_site.open()
    writer.write(get("/small.txt"))
    assert (await read_response(reader)).body == small
    await close_writer(writer)
    return small


async def _connected(www_site: ServeSite, eng: Any, n: int) -> list[socket.socket]:
    """*n* blocking client sockets, once the engine holds exactly *n* connections (the warm-up's
    is gone)."""
    clients = [socket.create_connection((www_site.host, www_site.port)) for _ in range(n)]
    await holding(eng, n)
    return clients


async def test_connections_ready_together_are_answered_one_per_iteration_when_the_budget_is_spent(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over real sockets: three connections whose requests arrive in one iteration, with the budget
    spent at once, are answered in three iterations, each answer whole."""
    mod = engine()
    from aiosendfile._serve import _protocol

    eng = mod._engines[www_site.server]
    iteration = [0]
    at: list[int] = []
    real_over, real_known = mod.Engine._iteration_over, _answering.replay

    def over(self: Any) -> None:
        iteration[0] += 1
        real_over(self)

    def known(*args: Any) -> bool:  # (every answer of a memoised file, straight or not)
        at.append(iteration[0])
        return bool(real_known(*args))

    small = await _warmed(www_site)
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    monkeypatch.setattr(mod.Engine, "_iteration_over", over)
    monkeypatch.setattr(_protocol, "replay", known)  # (a head from the heads memo)
    monkeypatch.setattr(_answering, "replay", known)  # (a parsed one)
    clients = await _connected(www_site, eng, 3)
    try:
        for c in clients:  # (the loop does not run in between: the three reads are ready together)
            c.sendall(get("/small.txt"))
        for _ in range(200):
            if len(at) == 3:
                break
            await asyncio.sleep(0.005)
        assert len(set(at)) == 3, at
        for c in clients:
            c.settimeout(10)
            data = b""
            while not data.endswith(small):
                chunk = c.recv(65536)
                assert chunk
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 OK\r\n")
            assert data.count(small) == 1
    finally:
        for c in clients:
            c.close()


async def test_a_request_then_end_of_stream_is_answered_when_its_turn_comes(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients that send a request and half-close (``nc``, health checks), with the iteration's
    budget spent at once: each request is answered in its turn, then the connection closes (the
    end of stream is not read before the request is answered)."""
    mod = engine()
    eng = mod._engines[www_site.server]
    small = await _warmed(www_site)
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    clients = await _connected(www_site, eng, 4)
    try:
        for c in clients:
            c.sendall(get("/small.txt"))
            c.shutdown(socket.SHUT_WR)
        for c in clients:
            c.setblocking(False)
        got = [b""] * 4
        done = [False] * 4
        for _ in range(400):
            await asyncio.sleep(0.005)
            for i, c in enumerate(clients):
                while not done[i]:
                    try:
                        chunk = c.recv(65536)
                    except BlockingIOError:
                        break
                    if not chunk:
                        done[i] = True
                    got[i] += chunk
            if all(done):
                break
        assert done == [True] * 4
        assert [g.count(small) for g in got] == [1] * 4
    finally:
        for c in clients:
            c.close()


async def test_end_of_stream_waits_for_the_answers_over_a_unix_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above over a Unix socket, with a large body asked for too: every request is answered
    whole before the connection closes."""
    mod = engine()
    async with serving(tmp_path, kind="unix") as www_site:
        eng = mod._engines[www_site.server]
        small = await _warmed(www_site)
        big = (www_site.public / "big.bin").read_bytes()
        monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
        conns = [await www_site.open() for _ in range(4)]
        await holding(eng, 4)
        try:
            for i, (_, writer) in enumerate(conns):
                writer.write(get("/big.bin" if i == 3 else "/small.txt"))
                writer.write_eof()
            raws = [await asyncio.wait_for(read_to_eof(reader), 20) for reader, _ in conns]
        finally:
            for _, writer in conns:
                await close_writer(writer)
    answers = [all_responses(raw, ["GET"]) for raw in raws]
    assert [[a.body for a in got] for got in answers] == [[small], [small], [small], [big]]


def _ask_then_end(host: str, port: int, ctx: ssl.SSLContext, request: bytes, close_notify: bool) -> bytes:
    """(A blocking TLS client, for a thread.) Send *request*, then end: our ``close_notify``
    (*close_notify*) or a bare end of stream, with no ``close_notify`` (a half-close); what the
    server answers, to its end.

    TLS runs over memory BIOs (:class:`TLSDuplex`): OpenSSL's shutdown, called on a socket, also
    reads, and fails with ``APPLICATION_DATA_AFTER_CLOSE_NOTIFY`` when the server's answer is
    already there (a race the test once lost)."""
    with TLSDuplex(socket.create_connection((host, port), timeout=20), ctx) as tls:
        tls.sendall(request)
        if close_notify:
            tls.close_notify()  # (the server's comes after its answer)
        else:
            tls.raw.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := tls.recv(65536):
            got += chunk
        return got


@pytest.mark.parametrize("close_notify", [True, False], ids=["close_notify", "half_close"])
async def test_end_of_stream_over_tls_waits_for_the_answers(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tls_ca: Any,
    tls_client_ctx: ssl.SSLContext,
    close_notify: bool,
) -> None:
    """Over TLS as over TCP: clients that send a request then end (a ``close_notify``, or a bare
    half-close: the context ``serve`` makes lets OpenSSL take it as an end of stream), with the
    iteration's budget spent at once, get every answer whole in its turn, then the server's end;
    nothing is logged, and the server goes on answering others."""
    from aiosendfile._cli._serve_run import tls_context

    cert = tls_ca.issue_cert("localhost", "127.0.0.1")
    with cert.private_key_pem.tempfile() as key, cert.cert_chain_pems[0].tempfile() as chain:
        server_ctx = tls_context(argparse.Namespace(tls_cert=chain, tls_key=key))
    mod = engine()
    async with serving(tmp_path, tls=(server_ctx, tls_client_ctx)) as www_site:
        eng = mod._engines[www_site.server]
        small = await _warmed(www_site)
        big = (www_site.public / "big.bin").read_bytes()
        monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
        targets = ["/small.txt", "/small.txt", "/small.txt", "/big.bin"]
        with caplog.at_level(logging.WARNING):
            raws = await asyncio.gather(
                *(
                    asyncio.to_thread(
                        _ask_then_end, www_site.host, www_site.port, tls_client_ctx, get(t), close_notify
                    )
                    for t in targets
                )
            )
            await holding(eng, 0)
            assert not eng.connections
            monkeypatch.setattr(mod, "ITERATION_BUDGET", 0.0005)
            assert (await www_site.exchange(get("/small.txt", "Connection: close\r\n"))).endswith(small)
    answers = [all_responses(raw, ["GET"]) for raw in raws]
    assert [[a.body for a in got] for got in answers] == [[small], [small], [small], [big]]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_connection_that_ends_is_closed_once(
    tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """asyncio's TLS transport tears its TLS layer down at a second ``close()`` (its
    ``get_write_buffer_size()`` then raises AttributeError until ``connection_lost``): a
    connection that ends is closed once, however often it goes on before it is gone, and the
    engine's timer finds it whole (it once raised in the timer, in CI)."""
    mod = engine()
    async with serving(tmp_path, tls=(tls_server_ctx, tls_client_ctx)) as www_site:
        eng = mod._engines[www_site.server]
        _, writer = await www_site.open()
        await holding(eng, 1)
        (conn,) = eng.connections
        conn.dead = True
        conn._resume()  # (closes it: dead, nothing in flight)
        conn._resume()  # (goes on again before connection_lost: a read held for a turn, ...)
        conn.expire(eng.now, eng.config)
        await close_writer(writer)
        await holding(eng, 0)


async def test_a_slow_head_gets_408_also_while_the_iterations_budget_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head's later bytes arriving while the iteration's budget is spent wait for a turn, and
    do not restart the header timeout (a slowloris client is still cut when the server is busy)."""
    mod = engine()
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    root = build(tmp_path / "www")
    config = mod.ServeConfig(str(root), header_timeout=1.0)
    eng = mod.Engine(config, asyncio.get_running_loop())
    try:
        other, slow = eng.protocol(), eng.protocol()
        other.connection_made(_Transport())
        slow.connection_made(t := _Transport())
        await asyncio.sleep(0)
        slow.data_received(b"GET /small.txt HTTP/1.1\r\n")  # (the first read of this iteration)
        began = slow.since
        for _ in range(3):
            await asyncio.sleep(0)
            eng.now += 0.4  # (time passes; the engine's clock is its timer's)
            other.data_received(b"\r\n")  # opens this iteration's window and spends it
            slow.data_received(b"X-Slow: x\r\n")  # held for a turn
            assert slow.held is not None or slow.reader.backlog
        assert slow.since == began
        slow.expire(eng.now, config)
        assert t.data.startswith(b"HTTP/1.1 408 ")
        for p in (other, slow):
            p.connection_lost(None)
    finally:
        eng.stop()


async def test_stock_asyncio_answers_for_half_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock asyncio runs the turns deferred from one iteration before the next one's timers (a
    sleeping task waits through two batches; uvloop runs timers first): the connections answer
    for half the budget there. An iteration whose answers took 0.3 ms is spent on asyncio only."""
    mod = engine()
    eng = mod.Engine(mod.ServeConfig(str(build(tmp_path / "www"))), asyncio.get_running_loop())
    try:
        stock = isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)
        clock = [100.0]
        monkeypatch.setattr(mod.time, "perf_counter", lambda: clock[0])
        assert not eng.spent()  # (opens the iteration)
        clock[0] += 0.0003
        assert eng.spent() is stock
        clock[0] += 0.0003
        assert eng.spent()
    finally:
        eng.stop()
