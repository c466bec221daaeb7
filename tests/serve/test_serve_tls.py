"""``serve``'s own TLS connections (``aiosendfile._serve._tls``, ``_tls_body``), on both loops.

The engine runs OpenSSL on the connection's socket itself (no memory BIO): these tests hold it to
the promises of asyncio's TLS transport and of the file-body path over it. A handshake that never
comes is dropped; a stop closes the handshakes under way; a file body is byte-exact past 4 GiB
(sparse) and under a reader with a 4 KiB window, whole or aborted (a file truncated mid-body, a
client that resets or stops reading), and its buffers are bounded by the shared budget whatever
the clients do. Clients in separate processes are ``test_serve_clients``'s (``*-tls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from ..support.files import pattern
from ..support.raw_http import read_response
from ..support.serve import BIG, close_writer, engine, get, reported, serving
from ..support.waiting import until

pytest.importorskip("httptools")

GiB = 1024**3


def tls_module() -> Any:
    from aiosendfile._serve import _tls

    return _tls


def tls_body_module() -> Any:
    from aiosendfile._serve import _tls_body

    return _tls_body


@pytest.fixture
def tls_contexts(
    tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """``serving``'s *tls*: (the server's context, the client's)."""
    return tls_server_ctx, tls_client_ctx


async def test_a_client_that_never_shakes_hands_is_dropped_after_the_header_timeout(
    tmp_path: Path, tls_contexts: Any
) -> None:
    async with serving(tmp_path, tls=tls_contexts, header_timeout=0.2) as site:
        reader, writer = await asyncio.open_connection(site.host, site.port)  # plain TCP: no ClientHello
        try:
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
        finally:
            writer.close()


@pytest.mark.parametrize(
    "method",
    ["GET", "OPTIONS", "DELETE", "PATCH", "PROPFIND", "CONNECT", "LOCK", "ACL", "MOVE", None],
    ids=str,
)
async def test_a_garbage_handshake_is_closed_quietly(
    tmp_path: Path, tls_contexts: Any, method: str | None
) -> None:
    """Plain HTTP on the HTTPS port gets a plain 400 that says so before the close (as nginx), so
    that ``curl http://`` tells its user why, whatever its method (OpenSSL knows four: the rest
    were closed with no answer); other garbage is closed with no answer."""
    plain = method is not None
    async with serving(tmp_path, tls=tls_contexts) as site:
        with reported() as errors:
            reader, writer = await asyncio.open_connection(site.host, site.port)
            try:
                # HTTP where a ClientHello belongs, pipelined and with a body: all read and dropped
                writer.write(get("/small.txt", method=method) * 3 if method else b"\x00\x01garbage" * 100)
                got = b""
                with contextlib.suppress(ConnectionError):
                    got = await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
            if plain:
                head, _, body = got.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
                assert b"Connection: close" in head
                assert b"HTTPS" in body
                assert f"Content-Length: {len(body)}".encode() in head
            else:
                assert got == b""

            # and the server still serves
            reader, writer = await site.open()
            try:
                writer.write(get("/small.txt"))
                assert (await read_response(reader)).status == 200
            finally:
                await close_writer(writer)
        assert errors == []


async def test_a_stop_closes_the_handshakes_under_way(tmp_path: Path, tls_contexts: Any) -> None:
    mod = engine()
    async with serving(tmp_path, tls=tls_contexts) as site:
        listener = site.server
        reader, writer = await asyncio.open_connection(site.host, site.port)
        try:
            await until(lambda: bool(listener._tls_setups))
            await mod.shutdown(site.server, 5.0)
            assert not listener._tls_setups
            assert await asyncio.wait_for(reader.read(), 10) == b""
        finally:
            writer.close()


async def test_a_range_past_4_gib_of_a_sparse_file_is_byte_exact(tmp_path: Path, tls_contexts: Any) -> None:
    async with serving(tmp_path, tls=tls_contexts) as site:
        tail = pattern(300_000, seed=9)
        with open(site.public / "sparse.bin", "wb") as f:
            f.truncate(5 * GiB)
            f.seek(5 * GiB - len(tail))
            f.write(tail)
        reader, writer = await site.open()
        try:
            start = 5 * GiB - len(tail) - 1000
            writer.write(get("/sparse.bin", f"Range: bytes={start}-\r\n"))
            answer = await read_response(reader)
        finally:
            await close_writer(writer)
    assert answer.status == 206
    assert answer.body == bytes(1000) + tail


async def test_a_reader_with_a_4_kib_window_gets_every_byte(tmp_path: Path, tls_contexts: Any) -> None:
    async with serving(tmp_path, tls=tls_contexts) as site:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (site.host, site.port))
        reader, writer = await asyncio.open_connection(sock=sock, ssl=site.ctx, server_hostname="localhost")
        try:
            writer.write(get("/big.bin") + get("/small.txt") + get("/big.bin", "Range: bytes=5-9,100-\r\n"))
            first = await read_response(reader)
            second = await read_response(reader)
            third_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        finally:
            await close_writer(writer)
    assert first.body == (site.public / "big.bin").read_bytes()
    assert second.body == (site.public / "small.txt").read_bytes()
    assert third_head.startswith(b"HTTP/1.1 206")


async def test_a_file_truncated_mid_body_aborts_the_connection(
    tmp_path: Path, tls_contexts: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiosendfile import _platform

    real = _platform.read_into_nowait
    calls = []

    def truncating(fd: int, buf: Any, offset: int, device: int | None = None) -> Any:
        calls.append(offset)
        if len(calls) == 2:  # the first chunk went: the file shrinks under the second
            (site.public / "big.bin").write_bytes(b"short")
        return real(fd, buf, offset, device)

    async with serving(tmp_path, tls=tls_contexts) as site:
        monkeypatch.setattr(_platform, "read_into_nowait", truncating)
        with reported() as errors:
            raw = await site.exchange(get("/big.bin") + get("/small.txt"))
    assert len(calls) >= 2
    assert raw.startswith(b"HTTP/1.1 200")
    assert len(raw.partition(b"\r\n\r\n")[2]) < BIG  # never passed off as complete; nothing after it
    assert errors == []  # a file that shrank is no bug
    assert tls_body_module().BODY_BUDGET_POOL.claimed == 0


async def test_clients_that_reset_or_stop_reading_mid_body_leave_nothing_behind(
    tmp_path: Path, tls_contexts: Any
) -> None:
    """Many bodies stalled at once (clients that never read a 2 GiB sparse file) hold at most the
    budget beyond BODY_MIN each; reset or cut off after send_timeout, they give it all back."""
    tls_mod = tls_body_module()
    async with serving(tmp_path, tls=tls_contexts, send_timeout=3.0) as site:
        with open(site.public / "huge.bin", "wb") as f:
            f.truncate(2 * GiB)
        connections = engine()._engines[site.server].connections
        writers = []
        try:
            for _ in range(24):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, (site.host, site.port))
                _, writer = await asyncio.open_connection(
                    sock=sock, ssl=site.ctx, server_hostname="localhost"
                )
                writer.write(get("/huge.bin"))
                writers.append(writer)
            await until(
                lambda: sum(1 for c in connections if c.owned is not None) == len(writers), timeout=30
            )
            budget = tls_mod.BODY_BUDGET_POOL
            assert 0 < budget.claimed <= budget.total
            bodies = [c.owned for c in connections]
            assert all(tls_mod.BODY_MIN <= b.size <= tls_mod.BODY_MAX for b in bodies)
            for writer in writers[:12]:  # reset
                writer.transport.abort()
            await until(lambda: len(connections) <= 12, timeout=20)
            await until(lambda: not connections, timeout=30)  # the rest: cut off after send_timeout
            assert budget.claimed == 0
        finally:
            for writer in writers:
                writer.transport.abort()


def test_the_body_budget_gives_at_least_a_record_and_never_more_than_its_total() -> None:
    tls_mod = tls_body_module()
    budget = tls_mod._Budget(1024 * 1024)
    sizes = [budget.claim(10 * 1024 * 1024) for _ in range(20)]
    assert sizes[0] == tls_mod.BODY_MAX
    assert all(tls_mod.BODY_MIN <= s <= tls_mod.BODY_MAX for s in sizes)
    assert budget.claimed <= budget.total
    assert sizes[-1] == tls_mod.BODY_MIN  # spent: one record each
    assert budget.claim(100) == tls_mod.BODY_MIN  # a small body needs no more
    for s in [*sizes, tls_mod.BODY_MIN]:
        budget.give_back(s)
    assert budget.claimed == 0


async def test_the_engine_runs_tls_on_its_own_transport(tmp_path: Path, tls_contexts: Any) -> None:
    async with serving(tmp_path, tls=tls_contexts) as site:
        reader, writer = await site.open()
        try:
            writer.write(get("/small.txt"))
            assert (await read_response(reader)).status == 200
            (conn,) = engine()._engines[site.server].connections
            assert type(conn.transport) is tls_module().TLSTransport
            assert (
                conn.transport.get_extra_info("ssl_object").version()
                == writer.get_extra_info("ssl_object").version()
            )
            # (asked when wanted, not made for every connection)
            transport = conn.transport
            assert transport.get_extra_info("peername") == writer.get_extra_info("sockname")
            assert transport.get_extra_info("sockname") == writer.get_extra_info("peername")
            assert transport.get_extra_info("cipher") == writer.get_extra_info("cipher")
            assert transport.get_extra_info("peercert") is None  # (no client certificate asked)
            assert transport.get_extra_info("compression") is None
            assert transport.get_extra_info("nothing such", "d") == "d"
            assert transport.get_extra_info("socket").fileno() == transport._fd
        finally:
            await close_writer(writer)


async def _answered_then_lingering(site: Any, client_ctx: ssl.SSLContext) -> ssl.SSLSocket:
    """A blocking TLS client (in a thread: asyncio's and uvloop's close as soon as the close_notify
    comes) that asked with ``Connection: close`` and read the answer, once the server lingers."""

    def connect() -> ssl.SSLSocket:
        raw = socket.create_connection((site.host, site.port))
        return client_ctx.wrap_socket(raw, server_hostname="localhost")  # (the handshake blocks)

    client = await asyncio.to_thread(connect)
    try:
        await asyncio.to_thread(client.sendall, get("/small.txt", "Connection: close\r\n"))
        got = b""
        while len(got) < 4096 or b"\r\n\r\n" not in got:
            got += await asyncio.to_thread(client.recv, 65536)
        await until(lambda: bool(site.server._lingering))
    except BaseException:
        client.close()
        raise
    return client


async def test_a_closed_connection_lingers_until_its_client_ends(tmp_path: Path, tls_contexts: Any) -> None:
    """After ``Connection: close`` the server sends its close_notify and end of stream, and keeps
    reading until the client's end: closed at once, a client's late close_notify would be answered
    with a reset, and a client still reading the answer would lose its tail; a client that sends
    more meanwhile is read on, wakeup after wakeup, not cut. (The client is a
    blocking socket in a thread: asyncio's and uvloop's close as soon as the close_notify comes.)"""
    async with serving(tmp_path, tls=tls_contexts) as site:
        listener = site.server
        client = await _answered_then_lingering(site, tls_contexts[1])
        try:
            assert not engine()._engines[site.server].connections  # the protocol is done with it
            await asyncio.sleep(0.2)
            assert listener._lingering  # still waiting for the client's end
            # More than one wakeup reads (16 x 16 KiB): read on at the next, not cut with a reset.
            await asyncio.to_thread(client.sendall, b"x" * 2**21)
            await asyncio.sleep(0.2)
            assert listener._lingering
        finally:
            client.close()
        await until(lambda: not listener._lingering)  # the client's end came: closed


async def test_a_lingering_connection_whose_client_sends_nothing_is_closed_after_a_while(
    tmp_path: Path, tls_contexts: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that keeps its socket open and sends nothing after the answer (no close_notify)
    held it for the whole ``LINGER`` (30 s): it is closed once it has sent nothing for
    ``LINGER_IDLE``, as nginx's ``lingering_timeout``; what it sends meanwhile starts it again."""
    from aiosendfile._serve import _tls

    monkeypatch.setattr(_tls, "LINGER_IDLE", 0.5, raising=False)
    async with serving(tmp_path, tls=tls_contexts) as site:
        listener = site.server
        client = await _answered_then_lingering(site, tls_contexts[1])
        try:
            for _ in range(3):  # (bytes within the idle time each: read on)
                await asyncio.sleep(0.3)
                await asyncio.to_thread(client.sendall, b"x")
            assert listener._lingering
            began = asyncio.get_running_loop().time()
            await until(lambda: not listener._lingering, timeout=10)
            assert asyncio.get_running_loop().time() - began < 5  # (not the 30 s of LINGER)
        finally:
            client.close()


class _CountingLoop:
    """The running loop, with its reader registrations counted (uvloop's loop takes no attributes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.added = 0
        self.removed = 0

    def add_reader(self, fd: int, callback: Any) -> None:
        self.added += 1
        self.loop.add_reader(fd, callback)

    def remove_reader(self, fd: int) -> bool:
        self.removed += 1
        return self.loop.remove_reader(fd)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)


def _client_hello(client_ctx: ssl.SSLContext) -> bytes:
    """The first flight of a client, as a memory-BIO client writes it."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


async def test_an_accepted_connection_begins_its_handshake_in_its_own_turn(tls_contexts: Any) -> None:
    """A transport made with the client's hello already waiting does no handshake then: its key
    exchange and signature (~0.4 ms each) would run inside the accept batch, and a burst of new
    connections would hold every connection already set up (256 a batch: ~100 ms). The socket's
    readiness starts it, in the loop's turn for it, as nginx does."""
    loop = asyncio.get_running_loop()
    server, client = socket.socketpair()
    with server, client:
        client.sendall(_client_hello(tls_contexts[1]))
        transport = tls_module().TLSTransport(loop, server, tls_contexts[0], asyncio.Protocol)
        try:
            assert transport.in_setup
            assert not _readable(client)  # no server hello yet
            await until(lambda: _readable(client))  # the loop's turn for the socket began it
        finally:
            transport.abort()
        # The peer's address was taken as it came: a client gone before its first request is read
        # is still told apart (the lockout's key, the log).
        assert transport.get_extra_info("peername") == ""  # (a socketpair's peer has no name)


async def test_a_closed_connection_keeps_its_reader_for_the_linger(tls_contexts: Any) -> None:
    """``close()`` with nothing left to write goes to the lingering close with the reader it has
    (its callback replaced): no reader removed and added again (on uvloop each is a poll handle
    freed or made, four system calls), one removal at the very end. The request right behind the
    last handshake record is read as the handshake ends, and answered."""
    counting = _CountingLoop(asyncio.get_running_loop())
    server, raw_client = socket.socketpair()
    answered: list[bytes] = []

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            answered.append(data)
            self.transport.write(b"pong")
            self.transport.close()

    lingering: set[Any] = set()
    with server:
        transport = tls_module().TLSTransport(
            counting,
            server,
            tls_contexts[0],
            Answer,
            lingering=lingering,  # type: ignore[arg-type]
        )

        def client_side() -> bytes:
            with tls_contexts[1].wrap_socket(raw_client, server_hostname="localhost") as client:
                client.sendall(b"ping")
                got = b""
                while chunk := client.recv(1024):
                    got += chunk
                return got

        assert await asyncio.wait_for(asyncio.to_thread(client_side), 10) == b"pong"
        await until(lambda: not lingering)
        assert answered == [b"ping"]
        assert transport.is_closing()
        assert (counting.added, counting.removed) == (2, 1)  # set up, the linger's; the end
