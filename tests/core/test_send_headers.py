"""Headers and trailers around a zero-copy file: joining the file on the wire, resuming, starting now.

On Linux the headers go with ``send(MSG_MORE)`` and the file with ``sendfile``: no ``TCP_CORK``
pair. A transfer that ends right after a held send pushes what is held at once. Headers the
socket cannot take at once are resumed where they stopped. What the socket takes before the
call's first await goes without a lease or a waiter. Each test runs on both loops, over
TCP and Unix sockets (and TLS where the fallback is the point).
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import sys
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform
from aiosendfile._lease import TransportLease

from ..support.connections import Conn, Connector, zero_copy_expected
from ..support.files import evict, pattern

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MSG_MORE is Linux's")

SIOCOUTQNSD = 0x894B  # Linux: bytes in a TCP socket's send queue not yet sent


def unsent_bytes(sock: Any) -> int:
    return int.from_bytes(fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, bytes(4)), sys.byteorder)


async def read_exactly_slowly(conn: Conn, n: int) -> bytes:
    """*n* bytes in 8 KiB reads with a pause between, so the sender's socket fills."""
    assert conn.client_reader is not None
    chunks, got = [], 0
    while got < n:
        chunk = await conn.client_reader.read(min(8192, n - got))
        assert chunk, "the connection ended early"
        chunks.append(chunk)
        got += len(chunk)
        await asyncio.sleep(0.0005)
    return b"".join(chunks)


@linux_only
@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_headers_go_with_msg_more_not_cork(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    corks: list[bool] = []
    real_set_cork = _platform.set_cork

    def set_cork(sock: socket.socket, on: bool) -> bool:
        corks.append(on)
        return real_set_cork(sock, on)

    monkeypatch.setattr(_platform, "set_cork", set_cork)
    path = make_file(300_000)
    conn = await connect()
    with open(path, "rb") as f:
        sent, data = await asyncio.gather(
            aiosendfile.sendfile(conn.writer, f, headers=b"H" * 100, trailers=b"T" * 10),
            conn.read_exactly(300_110),
        )
        assert f.tell() == 300_000
    assert sent == 300_000
    assert data == b"H" * 100 + pattern(300_000) + b"T" * 10
    assert corks == []
    assert _platform.counters.bytes == 300_000


@linux_only
@pytest.mark.parametrize("kind", ["tcp"])
async def test_held_headers_are_pushed_when_the_transfer_fails(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file ends (sendfile returns 0) right after headers sent with MSG_MORE: they leave now,
    not after the kernel's 200 ms (nothing is left unsent in the socket once the call returns)."""
    monkeypatch.setattr(_platform, "sendfile_once", lambda *args: 0)
    path = make_file(1000)
    conn = await connect()
    with open(path, "rb") as f, pytest.raises(aiosendfile.FileTruncatedError) as info:
        await aiosendfile.sendfile(conn.writer, f, headers=b"HEAD" * 10)
    assert info.value.sent == 0
    assert unsent_bytes(conn.writer.get_extra_info("socket")) == 0
    assert await conn.read_exactly(40) == b"HEAD" * 10


@pytest.mark.parametrize("headers_size", [1, 3 * 2**20 + 5])
@pytest.mark.parametrize("trailers_size", [0, 2**20 + 3])
async def test_headers_and_trailers_larger_than_the_socket_resume_where_they_stopped(
    connect: Connector, kind: str, make_file: Any, headers_size: int, trailers_size: int
) -> None:
    """Headers (or trailers) the socket takes only in part, with a slow reader: every byte once, in order."""
    size = 2**20 + 7
    path = make_file(size)
    conn = await connect(rcvbuf=16384)
    conn.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
    headers, trailers = pattern(headers_size, seed=1), pattern(trailers_size, seed=2)
    expected = headers + pattern(size) + trailers

    async def send() -> int:
        with open(path, "rb") as f:
            sent = await aiosendfile.sendfile(conn.writer, f, headers=headers, trailers=trailers)
            assert f.tell() == size
            return sent

    sent, data = await asyncio.gather(send(), read_exactly_slowly(conn, len(expected)))
    assert sent == size
    assert data == expected
    assert _platform.counters.bytes == (size if zero_copy_expected(kind) else 0)


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_a_write_before_and_after_keeps_its_place_around_headers(
    connect: Connector, kind: str, make_file: Any
) -> None:
    path = make_file(200_000)
    conn = await connect()

    async def send() -> None:
        with open(path, "rb") as f:
            conn.writer.write(b"before")
            await aiosendfile.sendfile(conn.writer, f, 10, 100_000, headers=b"H", trailers=b"T")
            conn.writer.write(b"after")
            assert f.tell() == 100_010

    _, data = await asyncio.gather(send(), conn.read_exactly(100_013))
    assert data == b"beforeH" + pattern(200_000)[10:100_010] + b"Tafter"


# -- starting at once: no lease, no waiter, when the socket takes it all ----------------------


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_a_file_the_socket_takes_at_once_needs_no_lease(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases: list[object] = []
    real_acquire = TransportLease.acquire

    def acquire(self: TransportLease) -> None:
        leases.append(self)
        real_acquire(self)

    monkeypatch.setattr(TransportLease, "acquire", acquire)
    path = make_file(50_000)
    conn = await connect()
    with open(path, "rb") as f:
        sent = await aiosendfile.sendfile(conn.writer, f, 100, headers=b"H" * 10, trailers=b"T")
        assert f.tell() == 50_000
    conn.writer.write(b"after")
    assert sent == 49_900
    assert await conn.read_exactly(49_916) == b"H" * 10 + pattern(50_000)[100:] + b"Tafter"
    assert leases == []
    assert _platform.counters.waits == 0
    assert _platform.counters.bytes == 49_900


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_a_transfer_in_progress_is_not_joined_at_once(
    connect: Connector, kind: str, make_file: Any
) -> None:
    """A second sendfile while the first holds the transport refuses, and sends nothing.

    (The transport's buffer is empty then: the first sends on its own fd.)
    """
    size = 4 * 2**20
    big, small = make_file(size, "big"), make_file(1000, "small")
    conn = await connect(rcvbuf=16384)

    async def first() -> int:
        with open(big, "rb") as f:
            return await aiosendfile.sendfile(conn.writer, f, max_chunk=65536)

    task = asyncio.create_task(first())
    while not TransportLease.held_on(conn.transport):
        await asyncio.sleep(0)
    with open(small, "rb") as f, pytest.raises(RuntimeError, match="in progress"):
        await aiosendfile.sendfile(conn.writer, f, headers=b"X")
    data, sent = await asyncio.gather(conn.read_exactly(size), task)
    assert sent == size
    assert data == pattern(size)


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_a_cold_first_chunk_goes_to_the_pool_after_headers_at_once(
    connect: Connector, kind: str, make_file: Any
) -> None:
    if not (_platform.HAS_RWF_NOWAIT or _platform.range_cached_available()):
        pytest.skip("the probe cannot tell here: every chunk goes to the pool anyway")
    size = 300_000
    path = make_file(size)
    evict(path)
    conn = await connect()

    async def send() -> int:
        with open(path, "rb") as f:
            return await aiosendfile.sendfile(conn.writer, f, headers=b"HEAD")

    sent, data = await asyncio.gather(send(), conn.read_exactly(size + 4))
    assert sent == size
    assert data == b"HEAD" + pattern(size)
    assert _platform.counters.cold >= 1


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_cancelled_in_the_middle_of_headers_begun_at_once(
    connect: Connector, kind: str, make_file: Any
) -> None:
    """Headers the socket took only in part before the first await, then a cancel while waiting:
    the file position is untouched (nothing of the file went), the transport is given back."""
    path = make_file(1000)
    conn = await connect(rcvbuf=16384)
    with open(path, "rb") as f:
        f.seek(7)
        task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, 100, headers=b"H" * 2**23))
        while not TransportLease.held_on(conn.transport):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert f.tell() == 100
    assert not TransportLease.held_on(conn.transport)
    assert _platform.counters.bytes == 0


@pytest.mark.parametrize("kind", ["tcp"])
async def test_a_write_from_on_progress_is_refused_where_writes_can_be_guarded(
    connect: Connector, kind: str, make_file: Any
) -> None:
    """Starting at once must not lose the guard: a StreamWriter's write during the call raises."""
    path = make_file(1000)
    conn = await connect()

    def on_progress(sent: int, total: int | None) -> None:
        conn.writer.write(b"too early")

    with open(path, "rb") as f, pytest.raises(RuntimeError, match="sendfile is in progress"):
        await aiosendfile.sendfile(conn.writer, f, headers=b"H", on_progress=on_progress)
