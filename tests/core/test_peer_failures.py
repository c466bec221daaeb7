"""The peer or the connection fails during a transfer, on both loops, over TCP, Unix and TLS.

The peer resets, half-closes, or stops reading (the transfer waits without spinning the
CPU, and a timeout ends it cleanly); another task aborts or closes the transport. After
each: a ``ConnectionError`` carrying ``.sent`` (or the whole file, for a half-close), the file
position ``offset + sent``, and the peer has exactly the bytes reported sent.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform

from ..support.connections import Connector, loop_name
from ..support.files import pattern
from ..support.waiting import stalled, until

MiB = 2**20


# -- the peer resets or half-closes ------------------------------------------------------------------


async def test_peer_reset_during_transfer(connect: Connector, kind: str, make_file: Any) -> None:
    size = 16 * 2**20
    conn = await connect(rcvbuf=4096)
    with open(make_file(size), "rb") as f:
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f, offset=10))
        # The client vanishes with a RST (SO_LINGER 0).
        conn.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert conn.client_writer is not None
        conn.client_writer.transport.abort()
        with pytest.raises(ConnectionError) as exc_info:
            await asyncio.wait_for(task, 10)
        assert isinstance(exc_info.value, aiosendfile.ConnectionLostError)
        assert f.tell() == 10 + exc_info.value.sent


@pytest.mark.parametrize("when", ["before", "during"])
async def test_peer_half_close_does_not_stop_the_transfer(
    connect: Connector, kind: str, make_file: Any, when: str, request: pytest.FixtureRequest
) -> None:
    """A peer that shuts its write side still reads: the whole file (and later writes) reach it.

    TLS has no half-close (a FIN without close_notify ends the session), so there
    the transfer may instead fail with a ConnectionError; it must never report
    success for bytes the peer never gets.
    """
    size = 4 * MiB
    conn = await connect(rcvbuf=4096)
    client_sock: socket.socket = conn.client
    if when == "before":
        client_sock.shutdown(socket.SHUT_WR)
        await asyncio.sleep(0.05)  # the server's transport sees the EOF first
        if kind == "tls":
            # TLS has no half-close: the loop ends the session on the peer's FIN (the transport
            # is closing; on 3.10 its TLS layer is gone). The call refuses to start.
            with open(make_file(size), "rb") as f:
                f.seek(5)
                with pytest.raises((RuntimeError, ConnectionError)) as exc_info:
                    await aiosendfile.sendfile(conn.writer, f, 3)
                # Refused before the transfer (untouched), or as it began (offset + 0 sent: 3.10's
                # broken TLS transport raises "SSL transport has not been initialized yet").
                assert f.tell() in (5, 3), exc_info.value
                assert getattr(exc_info.value, "sent", 0) == 0
            return
        assert not conn.transport.is_closing()
    with open(make_file(size), "rb") as f:
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f, 3))
        if when == "during":
            client_sock.shutdown(socket.SHUT_WR)
            await asyncio.sleep(0.05)
        reader = asyncio.create_task(conn.read_all())
        error: ConnectionError | None = None
        try:
            sent = await asyncio.wait_for(task, 20)
        except ConnectionError as exc:
            error = exc
        if error is not None:
            assert kind == "tls", f"a half-close is not a lost connection on {kind}: {error!r}"
            sent = f.tell() - 3
            assert sent == getattr(error, "sent", sent)
            conn.writer.close()
            data = await asyncio.wait_for(reader, 10)
            assert data == pattern(size)[3 : 3 + len(data)]
            return
        assert sent == size - 3
        assert f.tell() == size
    if not conn.transport.is_closing():
        conn.writer.write(b"AFTER")
    conn.writer.close()
    data = await asyncio.wait_for(reader, 20)
    if kind == "tls":
        # Whatever asyncio does with TLS after the FIN, the file itself must have arrived.
        assert data[: size - 3] == pattern(size)[3:], f"{len(data)} of {size - 3} file bytes arrived"
    else:
        assert data == pattern(size)[3:] + b"AFTER"


# -- the peer stops reading --------------------------------------------------------------------------


async def test_stalled_peers_cost_no_cpu_and_a_timeout_ends_each_cleanly(
    tmp_path: Path, make_file: Any, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """TCP, Unix and TLS transfers to peers that stopped reading, all waiting in the same second."""
    size = 4 * MiB
    path = make_file(size)
    connectors = [
        Connector(kind, tmp_path, tls_server_ctx, tls_client_ctx) for kind in ("tcp", "unix", "tls")
    ]
    try:
        conns = [await c(rcvbuf=4096) for c in connectors]
        saved = [(c.transport.get_protocol(), c.transport.get_write_buffer_limits()) for c in conns]
        files = [open(path, "rb") for _ in conns]  # noqa: SIM115 - closed below
        try:
            tasks = [
                asyncio.ensure_future(asyncio.wait_for(aiosendfile.sendfile(c.writer, f, 100), timeout=1.3))
                for c, f in zip(conns, files, strict=True)
            ]
            await until(
                lambda: all(
                    c.transport.get_write_buffer_size() > 0 or _platform.counters.waits > 0 for c in conns
                )
            )
            await asyncio.sleep(0.05)
            cpu, wall = time.process_time(), time.monotonic()
            await asyncio.sleep(1.0)
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            assert not any(t.done() for t in tasks)
            print(f"\n[faults] {loop_name()}: {cpu:.3f}s of CPU in {wall:.2f}s with 3 stalled transfers")
            # No spinning: a second of waiting on full sockets costs (next to) no CPU.
            assert cpu < 0.2, f"{cpu:.3f}s of CPU in {wall:.2f}s of waiting"
            for task in tasks:
                with pytest.raises(asyncio.TimeoutError):
                    await task
            positions = [f.tell() for f in files]
        finally:
            for f in files:
                f.close()
        for conn, (protocol, limits), position in zip(conns, saved, positions, strict=True):
            sent = position - 100
            assert 0 < sent < size - 100
            assert conn.transport.get_protocol() is protocol
            assert conn.transport.get_write_buffer_limits() == limits
            conn.writer.write(b"AFTER")
            conn.writer.close()
            assert await asyncio.wait_for(conn.read_all(), 20) == pattern(size)[100 : 100 + sent] + b"AFTER"
    finally:
        for c in connectors:
            await c.close()


# -- another task closes the transport ---------------------------------------------------------------


async def test_transport_closed_by_another_task(connect: Connector, make_file: Any) -> None:
    conn = await connect(rcvbuf=4096)
    with open(make_file(16 * 2**20), "rb") as f:
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f))
        conn.transport.abort()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(task, 10)
        assert f.tell() == getattr(task.exception(), "sent", -1)


async def test_graceful_close_by_another_task(connect: Connector, kind: str, make_file: Any) -> None:
    """``writer.close()`` (not abort) mid-transfer: a ConnectionError, and the peer gets exactly ``sent``."""
    size = 4 * MiB
    conn = await connect(rcvbuf=4096)
    with open(make_file(size), "rb") as f:
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f, 50))

        async def closer() -> None:
            conn.writer.close()

        await asyncio.create_task(closer())
        reader = asyncio.create_task(conn.read_all())
        with pytest.raises(ConnectionError) as exc_info:
            await asyncio.wait_for(task, 20)
        assert isinstance(exc_info.value, aiosendfile.ConnectionLostError)
        sent = exc_info.value.sent
        assert f.tell() == 50 + sent
    data = await asyncio.wait_for(reader, 20)
    assert data == pattern(size)[50 : 50 + sent]
