"""The engine's own paths for accepting and cold pages (``aiosendfile._serve``), on raw sockets, on
both loops: bursts of connections, accepted sockets' options, running out of descriptors, cold
chunks waiting on a timer or the pool.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import socket
import ssl
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from ..support.files import pattern
from ..support.raw_http import all_responses, read_response
from ..support.serve import (
    PAGE_WAITS,
    ServeSite,
    close_writer,
    engine,
    get,
    holding,
    reported,
    serving,
    wait_pages_by,
)
from ..support.waiting import until

pytest.importorskip("httptools")


# -- accepting and cold pages on the engine's own paths ----------------------------------------------


async def test_a_burst_of_connections_is_accepted_in_a_few_turns(www_site: ServeSite) -> None:
    """300 connections already queued in the kernel are all accepted within a few turns of the
    loop (uvloop's ``create_server`` took one per turn: under load, 3-20 a second)."""
    engine_ = engine()._engines[www_site.server]
    # The kernel completes the handshakes and queues the connections; the loop has not run yet.
    clients = [socket.create_connection((www_site.host, www_site.port)) for _ in range(300)]
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(engine_.connections) == 300
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("kind", ["tcp", "unix", "tls"])
async def test_a_closed_connection_leaves_nothing_for_the_garbage_collector(
    tmp_path: Path, kind: str, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """A connection's objects (its protocol, its request reader and the parser holding the
    reader's callbacks) form no cycle once it is gone: they are freed at once, by reference
    counting, not left for the garbage collector (one request per connection made a collection
    every few dozen connections). Plain, memoised, pipelined, HTTP/1.0, refused and body-sending
    connections alike."""
    from aiosendfile._serve._protocol import HttpProtocol
    from aiosendfile._serve._reader import RequestReader

    close = b"GET /small.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    requests = [
        close,
        close,  # (its head memoised now: answered without a parser)
        b"GET /small.txt HTTP/1.1\r\nHost: x\r\n\r\n" + close,
        b"GET /big.bin HTTP/1.0\r\n\r\n",
        b"GET /small.txt HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",  # refused (400), from a callback
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ]
    tls = (tls_server_ctx, tls_client_ctx) if kind == "tls" else None
    async with serving(tmp_path, kind="unix" if kind == "unix" else "tcp", tls=tls) as site:
        engine_ = engine()._engines[site.server]
        gc.collect()
        gc.disable()
        try:
            for request in requests:
                assert (await site.exchange(request)).startswith(b"HTTP/1.1 ")

            def left() -> list[str]:
                return [
                    type(o).__name__ for o in gc.get_objects() if type(o) in (HttpProtocol, RequestReader)
                ]

            # (a TLS connection's transport may linger on a moment after its close, reading what
            # the client still sends: its protocol goes with it; one in a cycle would stay)
            await until(lambda: not engine_.connections and not left())
        finally:
            gc.enable()


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("over", ["tcp", "tls", "ipv6"])
@pytest.mark.parametrize("proto", [0, socket.IPPROTO_TCP])
async def test_an_accepted_connection_is_non_blocking_with_nodelay(
    tmp_path: Path, proto: int, over: str, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """The listener leaves the socket's set-up to the loop's connect_accepted_socket where the
    loop does it (both make it non-blocking; uvloop sets TCP_NODELAY, asyncio where the socket's
    proto is TCP): a served connection has both, whatever proto its listening socket was made with
    (``socket.socket()`` makes 0, ``getaddrinfo`` gives IPPROTO_TCP), over IPv4, TLS and IPv6."""
    if over == "ipv6" and not _has_ipv6():
        pytest.skip("no IPv6 loopback here")
    mod = engine()
    family, host = (socket.AF_INET6, "::1") if over == "ipv6" else (socket.AF_INET, "127.0.0.1")
    listening = socket.socket(family, socket.SOCK_STREAM, proto)
    listening.bind((host, 0))
    tls = over == "tls"
    server = await mod.start_server(
        mod.ServeConfig(directory=str(tmp_path)), sock=listening, ssl=tls_server_ctx if tls else None
    )
    try:
        eng = mod._engines[server]
        _, writer = await asyncio.open_connection(
            host, listening.getsockname()[1], ssl=tls_client_ctx if tls else None
        )
        try:
            await holding(eng, 1)
            (conn,) = eng.connections
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            assert os.get_blocking(sock.fileno()) is False
        finally:
            writer.close()
    finally:
        await mod.shutdown(server)


@pytest.mark.parametrize("way", ["compiled", "pure"])
@pytest.mark.parametrize("failure", [errno.EMFILE, errno.ECONNABORTED])
async def test_accepting_pauses_when_out_of_descriptors_and_resumes(
    monkeypatch: pytest.MonkeyPatch, failure: int, way: str
) -> None:
    """EMFILE from accept: the listener stops reading the listening socket for a while (the queue
    keeps the connection), says so once, then accepts it. ECONNABORTED (a connection reset while
    in the queue): the next one is accepted at once, nothing said. Through the compiled accept
    and the standard library's."""
    from aiosendfile import _platform
    from aiosendfile._serve import _listener

    if way == "compiled" and not _platform.HAS_SYSCALLS_MODULE:
        pytest.skip("aiosendfile._syscalls was not built here")
    if way == "pure":
        monkeypatch.setattr(_platform, "_syscalls", None)
    monkeypatch.setattr(_listener, "ACCEPT_RETRY_DELAY", 0.05)
    failures = [failure]
    real_acceptor = _platform.acceptor

    def scarce(sock: socket.socket) -> Any:
        accept = real_acceptor(sock)

        def call() -> int:
            return -failures.pop() if failures else accept()

        return call

    monkeypatch.setattr(_platform, "acceptor", scarce)
    loop = asyncio.get_running_loop()
    made = loop.create_future()

    class P(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            made.set_result(transport)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    with reported() as errors:
        listener = _listener.Listener(loop, sock, P, None)
        client = socket.create_connection(sock.getsockname())
        try:
            transport = await asyncio.wait_for(made, 5)
            transport.close()
        finally:
            client.close()
            listener.close()
            await listener.wait_closed()
    assert [e["exception"].errno for e in errors] == ([errno.EMFILE] if failure == errno.EMFILE else [])
    assert not failures


async def test_a_connection_whose_set_up_fails_is_closed_and_reported() -> None:
    """A protocol that cannot be made (its factory raises): the loop's error handler hears of it,
    the descriptor is closed (the client sees the end of the connection), and the next
    connection is served. On uvloop the descriptor was never a socket object's
    (``_compat.AdoptedSocket``): the listener closes it itself."""
    from aiosendfile._serve import _listener

    loop = asyncio.get_running_loop()
    made: list[asyncio.BaseTransport] = []
    failing = [RuntimeError("no protocol for you")]

    class P(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)

    def factory() -> asyncio.Protocol:
        if failing:
            raise failing.pop()
        return P()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    with reported() as errors:
        listener = _listener.Listener(loop, sock, factory, None)
        try:
            first = socket.create_connection(sock.getsockname())
            first.settimeout(5)
            with first:
                assert await loop.run_in_executor(None, first.recv, 10) == b""  # closed
            second = socket.create_connection(sock.getsockname())
            with second:
                await until(lambda: made)
                made[0].close()
        finally:
            listener.close()
            await listener.wait_closed()
    assert [str(e["exception"]) for e in errors] == ["no protocol for you"]


@pytest.mark.parametrize("waits", PAGE_WAITS)
@pytest.mark.parametrize("cold", ["once", "always"])
async def test_a_cold_medium_chunk_waits_for_its_pages_then_the_pool(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, cold: str, waits: str
) -> None:
    """A cold chunk up to READ_AHEAD_MAX is sent by the page reader's thread once its pages are in
    (no probe after it: that thread's sendfile waits for any page still on the way); or read in
    by the kernel's read ahead and probed again from a timer, and one still cold after
    COLD_WAITS goes to the pool. No pool thread with the reader. Byte-exact either way."""
    from aiosendfile import _bodies, _outlet, _platform

    body = pattern(100_000, seed=5)
    (www_site.public / "medium.bin").write_bytes(body)
    probes: list[int] = []

    def is_cold(*args: Any, **kwargs: Any) -> bool:
        probes.append(1)
        return cold == "always" or len(probes) == 1

    hints = wait_pages_by(www_site, waits, monkeypatch)
    monkeypatch.setattr(_bodies, "is_cold", is_cold)
    before = _platform.counters.cold
    raw = await www_site.exchange(get("/medium.bin", "Connection: close\r\n"))
    assert all_responses(raw, ["GET"])[0].body == body
    await until(lambda: hints)  # (asked from the read-ahead thread: it may come after the body)
    if waits == "reader":
        assert hints == [(0, len(body))]
        assert len(probes) == 1
        assert _platform.counters.cold == before
    elif cold == "once":
        assert hints == [(0, len(body))]
        assert len(probes) == 2
        assert _platform.counters.cold == before
    else:
        assert hints == [(0, len(body))]  # (the kernel's read ahead once)
        assert len(probes) == 1 + _outlet.COLD_WAITS
        assert _platform.counters.cold == before + 1


async def test_a_chunk_whose_pages_came_in_while_the_iteration_is_spent_takes_a_turn(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer that finds a cold chunk's pages in does not send it in an iteration whose time
    is spent: the transfer waits in the engine's queue with the connections and takes its turn
    in the next iteration (without the page reader, whose thread sends such a chunk itself).
    Byte-exact."""
    from aiosendfile import _bodies

    body = pattern(100_000, seed=7)
    (www_site.public / "medium.bin").write_bytes(body)
    probes: list[int] = []

    def is_cold(*args: Any, **kwargs: Any) -> bool:
        probes.append(1)
        return len(probes) == 1

    monkeypatch.setattr(_bodies, "is_cold", is_cold)
    wait_pages_by(www_site, "timer", monkeypatch)
    eng = engine()._engines[www_site.server]
    in_timer = [False]
    real_spent, real_wait_turn, real_waited = eng.spent, eng.wait_turn, _bodies.Transfer._waited

    def spent() -> bool:
        opened = real_spent()  # (opens the iteration: its queue is then served next iteration)
        return True if in_timer[0] else opened

    turns: list[object] = []

    def wait_turn(item: Any) -> None:
        turns.append(item)
        real_wait_turn(item)

    def waited(self: Any) -> None:
        in_timer[0] = True
        try:
            real_waited(self)
        finally:
            in_timer[0] = False

    monkeypatch.setattr(eng, "spent", spent)
    monkeypatch.setattr(eng, "wait_turn", wait_turn)
    monkeypatch.setattr(_bodies.Transfer, "_waited", waited)
    raw = await www_site.exchange(get("/medium.bin", "Connection: close\r\n"))
    assert all_responses(raw, ["GET"])[0].body == body
    assert [type(t) for t in turns] == [_bodies.Transfer]
    assert len(probes) == 2


async def test_a_client_gone_while_its_chunk_waits_for_pages_leaves_nothing(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset while a cold chunk waits on its timer: the timer is cancelled and the file closed
    (the fd guard), nothing reported (the loop guard)."""
    from aiosendfile import _bodies

    (www_site.public / "medium.bin").write_bytes(pattern(100_000, seed=6))
    waiting = asyncio.get_running_loop().create_future()
    real = _bodies.Transfer._wait_for_pages

    def wait_for_pages(self: Any, size: int) -> None:
        real(self, size)
        if not waiting.done():
            waiting.set_result(None)

    monkeypatch.setattr(_bodies, "is_cold", lambda *args, **kwargs: True)
    monkeypatch.setattr(_bodies.Transfer, "_wait_for_pages", wait_for_pages)
    sock = socket.create_connection((www_site.host, www_site.port))
    try:
        sock.sendall(get("/medium.bin"))
        await asyncio.wait_for(waiting, 5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()  # RST while the chunk waits
    for _ in range(50):
        await asyncio.sleep(0.01)
        if not engine()._engines[www_site.server].connections:
            break
    assert not engine()._engines[www_site.server].connections


async def test_a_slow_reader_costs_one_probe_per_chunk(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page-cache probe runs once per 2 MiB chunk: the rest of a chunk the socket took only
    part of is sent without probing again (a client with a small window made one probe per wakeup)."""
    from aiosendfile import _bodies, _outlet

    probes: list[int] = []

    def is_cold(fd: int, position: int, size: int, *args: Any, **kwargs: Any) -> bool:
        probes.append(position)
        return False

    monkeypatch.setattr(_bodies, "is_cold", is_cold)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (www_site.host, www_site.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(get("/big.bin"))
        a = await read_response(reader)
    finally:
        await close_writer(writer)
    assert a.body == (www_site.public / "big.bin").read_bytes()
    assert probes == [0, _outlet.MAX_CHUNK]


async def test_a_hot_client_is_answered_while_a_cold_file_waits_for_the_disk(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold chunk's disk read blocks a pool thread, never the loop: while one client's big file
    waits for the "disk" (a pool send held on an event), another client's small requests are all
    answered; then the big file arrives whole."""
    import threading

    from aiosendfile import _bodies

    disk, in_pool = threading.Event(), threading.Event()
    real_send = _bodies.sendfile_once
    big = www_site.public / "big.bin"

    def held_in_the_pool(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        if threading.current_thread() is not threading.main_thread():
            in_pool.set()
            disk.wait(20)  # the slow disk
        return real_send(out_fd, in_fd, offset, count)

    def cold_if_big(fd: int, *args: Any, **kwargs: Any) -> bool:
        return os.readlink(f"/proc/self/fd/{fd}") == str(big)

    if not sys.platform.startswith("linux"):
        pytest.skip("needs /proc/self/fd to tell the files apart")
    monkeypatch.setattr(_bodies, "sendfile_once", held_in_the_pool)
    monkeypatch.setattr(_bodies, "is_cold", cold_if_big)
    cold_r, cold_w = await www_site.open()
    hot_r, hot_w = await www_site.open()
    try:
        cold_w.write(get("/big.bin"))
        for _ in range(2000):  # until a pool thread is in the "disk" read
            if in_pool.is_set():
                break
            await asyncio.sleep(0.01)
        assert in_pool.is_set()
        small = (www_site.public / "small.txt").read_bytes()
        for _ in range(20):
            hot_w.write(get("/small.txt"))
            assert (await read_response(hot_r)).body == small
        assert not disk.is_set()  # all answered while the big file waited for the disk
        disk.set()
        a = await read_response(cold_r)
        assert (a.status, a.body) == (200, big.read_bytes())
    finally:
        disk.set()
        await close_writer(cold_w)
        await close_writer(hot_w)
