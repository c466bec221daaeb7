"""Faults during a transfer that ``test_failures``/``test_edge_cases`` do not cover.

On both loops, over TCP, Unix and TLS:

* the peer half-closes (shuts its write side) before or during the transfer;
* the peer stops reading: the transfer waits without spinning the CPU, and
  ``asyncio.timeout``/``wait_for`` end it with the file position consistent;
* the file is replaced by rename, or unlinked, mid-transfer: the open file's
  bytes are sent, whole;
* another task closes the transport gracefully (``close()``, not ``abort()``);
* cancellation at random points, many times on one connection: what the peer
  got is exactly ``file[offset:f.tell()]`` followed by what was written later,
  and no fd, task or poller registration is left behind;
* argument errors the other modules do not check.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform
from aiosendfile._recv import _defuse_py310_tls_resume

from .conftest import Connector, loop_name, open_fds, pattern

MiB = 2**20


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def _stalled(conn: Any, coro: Any) -> asyncio.Task[Any]:
    """Run *coro* (a transfer to a client that does not read) until it is stuck."""
    task = asyncio.ensure_future(coro)
    await _until(
        lambda: _platform.counters.waits > 0 or conn.transport.get_write_buffer_size() > 0 or task.done()
    )
    await asyncio.sleep(0.05)
    assert not task.done(), "the transfer should be waiting for the slow peer"
    return task


# -- the peer half-closes -------------------------------------------------------------------


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
        task = await _stalled(conn, aiosendfile.sendfile(conn.writer, f, 3))
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


# -- the peer stops reading ------------------------------------------------------------------


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
            await _until(
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


@pytest.mark.skipif(not hasattr(asyncio, "timeout"), reason="asyncio.timeout is 3.11+")
@pytest.mark.parametrize("kind", ["tcp", "tls"], indirect=True)
async def test_asyncio_timeout_block_around_a_stalled_transfer(
    connect: Connector, kind: str, make_file: Any
) -> None:
    size = 4 * MiB
    conn = await connect(rcvbuf=4096)
    with open(make_file(size), "rb") as f:
        f.seek(12345)  # the call's offset wins; the final position is offset + sent
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.25):
                await aiosendfile.sendfile(conn.writer, f, 7, size - 7)
        sent = f.tell() - 7
        assert 0 < sent < size - 7
        # The same connection carries a second, complete transfer.
        reader = asyncio.create_task(conn.read_all())
        assert await aiosendfile.sendfile(conn.writer, f, 0, 1000) == 1000
        assert f.tell() == 1000
    conn.writer.close()
    assert await asyncio.wait_for(reader, 20) == pattern(size)[7 : 7 + sent] + pattern(1000)


# -- the file changes name or disappears -------------------------------------------------------


@pytest.mark.parametrize("change", ["replaced-by-rename", "unlinked"])
@pytest.mark.parametrize("kind", ["tcp", "tls"], indirect=True)  # zero-copy and the fallback
async def test_file_renamed_over_or_unlinked_mid_transfer(
    connect: Connector, kind: str, make_file: Any, tmp_path: Path, change: str
) -> None:
    """The open descriptor keeps its inode: its bytes go out, whole and consistent (nginx's advice)."""
    size = 6 * MiB
    path = make_file(size)
    conn = await connect(rcvbuf=4096)
    with open(path, "rb") as f:
        task = await _stalled(conn, aiosendfile.sendfile(conn.writer, f))
        if change == "unlinked":
            path.unlink()
        else:
            new = tmp_path / "new.bin"
            new.write_bytes(pattern(size + 4096, seed=99))
            os.replace(new, path)
        reader = asyncio.create_task(conn.read_all())
        assert await asyncio.wait_for(task, 30) == size
        assert f.tell() == size
    conn.writer.close()
    data = await asyncio.wait_for(reader, 30)
    assert len(data) == size
    assert data == pattern(size)


# -- another task closes the transport gracefully -------------------------------------------------


async def test_graceful_close_by_another_task(connect: Connector, kind: str, make_file: Any) -> None:
    """``writer.close()`` (not abort) mid-transfer: a ConnectionError, and the peer gets exactly ``sent``."""
    size = 4 * MiB
    conn = await connect(rcvbuf=4096)
    with open(make_file(size), "rb") as f:
        task = await _stalled(conn, aiosendfile.sendfile(conn.writer, f, 50))

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


# -- cancellation at random points --------------------------------------------------------------


def _selector_fds() -> set[int] | None:
    """The fds registered in a stock asyncio loop's selector (None on uvloop)."""
    selector = getattr(asyncio.get_running_loop(), "_selector", None)
    if selector is None:
        return None
    return set(selector.get_map())


async def random_cancellations(
    conn: Any, path: Path, size: int, iterations: int, seed: int
) -> dict[str, int]:
    """Start and cancel transfers at random moments on one connection; check everything after each.

    Returns counts of how the iterations ended (for the caller to check the mix).
    """
    rng = random.Random(seed)
    transport = conn.transport
    protocol, limits = transport.get_protocol(), transport.get_write_buffer_limits()
    server_fd = transport.get_extra_info("socket").fileno()
    received: list[bytes] = []

    async def read_slowly() -> None:
        client = conn.client_reader
        assert client is not None
        # CPython 3.10's TLS StreamReader crashes resuming a torn-down TLS layer, and the bytes
        # of that read are lost inside asyncio. recvfile's workaround, applied at every resume,
        # keeps this client reading what arrived.
        resume = client._maybe_resume_transport  # type: ignore[attr-defined]

        def resume_safely() -> None:
            _defuse_py310_tls_resume(client)
            resume()

        client._maybe_resume_transport = resume_safely  # type: ignore[attr-defined]
        while chunk := await client.read(65536):
            received.append(chunk)
            if rng.random() < 0.5:
                await asyncio.sleep(0.002)

    reader = asyncio.create_task(read_slowly())
    await asyncio.sleep(0.01)
    me = asyncio.current_task()
    expected: list[bytes] = []
    outcomes = {"cancelled": 0, "completed": 0, "cancelled-before-start": 0}
    data = pattern(size)
    untouched = size + 12345  # a position no transfer leaves behind: tells "never started"
    with open(path, "rb") as f:
        base_fds = open_fds()
        base_selector = _selector_fds()
        for i in range(iterations):
            if rng.random() < 0.25:  # something to flush first: cancel may land in the lease's flush
                prefix = b"P" * rng.randrange(1, 400_000)
                conn.writer.write(prefix)
                expected.append(prefix)
            offset = rng.randrange(0, size)
            count = None if rng.random() < 0.5 else rng.randrange(0, size - offset + 1)
            kwargs: dict[str, Any] = {}
            if rng.random() < 0.5:
                kwargs["max_chunk"] = rng.choice([4096, 65536, 300_001])
            f.seek(untouched)  # the call's offset must win over the file's position
            task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, offset, count, **kwargs))
            how = rng.random()
            if how < 0.15:
                pass  # cancelled before it ever ran
            elif how < 0.5:
                for _ in range(rng.randrange(1, 6)):
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(rng.uniform(0, 0.006))
            task.cancel()
            try:
                result: int | None = await task
            except asyncio.CancelledError:
                result = None
            position = f.tell()
            if position == untouched:
                assert result is None
                outcomes["cancelled-before-start"] += 1
                sent = 0
            else:
                sent = position - offset
                assert 0 <= sent <= (size - offset if count is None else count), (i, offset, count, position)
                if result is not None:
                    assert result == sent
                    outcomes["completed"] += 1
                else:
                    outcomes["cancelled"] += 1
            expected.append(data[offset : offset + sent])
            marker = b"<%d>" % i
            conn.writer.write(marker)
            expected.append(marker)
            # Nothing left behind: tasks, fds (the dup'd socket), poller registrations.
            await asyncio.sleep(0)
            assert asyncio.all_tasks() - {me, reader} == set(), i
            assert open_fds() == base_fds, (i, open_fds() ^ base_fds)
            if base_selector is not None:
                now = _selector_fds()
                assert now is not None
                assert now - base_selector == set(), (i, now - base_selector)
                assert server_fd in now  # reading resumed
            assert transport.get_protocol() is protocol
            assert transport.get_write_buffer_limits() == limits
            assert transport.is_reading()
            assert not transport.is_closing()
    conn.writer.close()
    await asyncio.wait_for(reader, 30)
    got, want = b"".join(received), b"".join(expected)
    if got != want:
        at = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        raise AssertionError(f"stream differs at byte {at} (got {len(got)}, expected {len(want)} bytes)")
    return outcomes


async def test_cancellation_at_random_points(connect: Connector, kind: str, make_file: Any) -> None:
    size = 2 * MiB + 17
    path = make_file(size)
    conn = await connect(rcvbuf=16384)
    seed = int(os.environ.get("AIOSENDFILE_TEST_SEED", "0")) or random.randrange(2**32)
    try:
        outcomes = await random_cancellations(conn, path, size, iterations=40, seed=seed)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (reproduce with AIOSENDFILE_TEST_SEED={seed})") from exc
    assert outcomes["cancelled"] >= 5, outcomes


# -- argument errors not covered elsewhere -------------------------------------------------------


async def test_write_only_file_is_refused_before_anything_is_sent(
    connect: Connector, kind: str, make_file: Any
) -> None:
    path = make_file(1000)
    conn = await connect()
    fd = os.open(path, os.O_WRONLY)
    with open(fd, "wb", buffering=0) as f:
        f.seek(9)
        with pytest.raises((ValueError, OSError)) as exc_info:
            await aiosendfile.sendfile(conn.writer, f, headers=b"HEADERS", trailers=b"TRAILERS")
        assert getattr(exc_info.value, "sent", 0) == 0
        assert f.tell() == 9
    conn.writer.write(b"|end")
    conn.writer.close()
    # Nothing of the failed call reached the peer, its headers included.
    assert await asyncio.wait_for(conn.read_all(), 10) == b"|end"


async def test_file_whose_descriptor_was_closed_underneath(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    f = open(make_file(1000), "rb")  # noqa: SIM115
    os.close(f.fileno())  # closed behind the file object's back
    try:
        with pytest.raises(OSError, match="Bad file descriptor") as exc_info:
            await aiosendfile.sendfile(conn.writer, f)
        assert exc_info.value.errno == errno.EBADF
    finally:
        with contextlib.suppress(OSError):
            f.close()
    conn.writer.write(b"ok")
    conn.writer.close()
    assert await asyncio.wait_for(conn.read_all(), 10) == b"ok"


async def test_raw_socket_argument_errors(make_file: Any) -> None:
    with open(make_file(1000), "rb") as f:
        a, b = socket.socketpair()
        a.setblocking(False)
        with a, b:
            with pytest.raises(ValueError, match="past the end"):
                await aiosendfile.sock_sendfile(a, f, 1001)
            with pytest.raises(aiosendfile.FileTruncatedError):
                await aiosendfile.sock_sendfile(a, f, 10, 991)
            assert f.tell() == 0
        # a closed socket: refused before anything, file untouched
        with pytest.raises(OSError, match="closed"):
            await aiosendfile.sock_sendfile(a, f)
        seq = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seq.setblocking(False)
        with seq, pytest.raises(ValueError, match="SOCK_STREAM"):
            await aiosendfile.sock_sendfile(seq, f)
        assert f.tell() == 0


async def test_unconnected_socket_is_a_connection_error(make_file: Any) -> None:
    sock = socket.socket()
    sock.setblocking(False)
    with sock, open(make_file(1000), "rb") as f:
        with pytest.raises(ConnectionError) as exc_info:
            await aiosendfile.sock_sendfile(sock, f)
        assert exc_info.value.sent == 0  # type: ignore[attr-defined]
        assert f.tell() == 0
