"""Misuse: a typed error, nothing sent, the file untouched, the connection still usable.

* bad arguments (offset, count, file mode, a closed or write-only file, a descriptor closed
  underneath) and bad targets (not a stream, blocking, closing, unconnected);
* ``fallback=False`` where zero-copy is impossible;
* misuse during a transfer: writes to the transport, a second ``sendfile`` on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import socket
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform

from ..support.connections import Connector, loop_name, zero_copy_expected
from ..support.files import pattern
from ..support.waiting import stalled

# -- bad arguments: a typed error before any byte, file untouched ------------------------------------


@pytest.mark.parametrize(
    ("offset", "count", "error"),
    [
        (-1, None, ValueError),
        (0, -1, ValueError),
        (1.5, None, TypeError),
        (0, 2.0, TypeError),
        (True, None, TypeError),
        (0, False, TypeError),
        ("0", None, TypeError),
        (1001, None, ValueError),  # past EOF
    ],
)
async def test_bad_offset_and_count(
    connect: Connector, make_file: Any, offset: Any, count: Any, error: type
) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        f.seek(17)
        with pytest.raises(error):
            await aiosendfile.sendfile(conn.writer, f, offset, count)
        assert f.tell() == 17
    assert conn.transport.get_write_buffer_size() == 0
    assert _platform.counters.calls == 0


@pytest.mark.parametrize("size", [1000, 8 << 20])
@pytest.mark.parametrize("max_chunk", [0, -1, 4096.0, 1e9, True, "4096"])
async def test_a_bad_max_chunk_is_refused_before_the_first_byte_on_a_known_transport(
    connect: Connector, make_file: Any, max_chunk: Any, size: int
) -> None:
    """The same typed error on a transport a call has already found plain (the straight line takes
    it then), as on a new one: it was sent there, whole or its first 4 MiB, and then refused."""
    conn = await connect()
    path = make_file(size)
    with open(path, "rb") as f:
        assert await aiosendfile.sendfile(conn.writer, f, 0, 10) == 10  # (known now)
    calls = _platform.counters.calls
    with open(path, "rb") as f:
        with pytest.raises((ValueError, TypeError)):
            await aiosendfile.sendfile(conn.writer, f, max_chunk=max_chunk)
        assert f.tell() == 0
    assert _platform.counters.calls == calls
    conn.writer.write(b"end")
    conn.writer.close()
    assert await conn.read_all() == pattern(size)[:10] + b"end"


async def test_count_beyond_eof_is_refused_before_the_first_byte(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        with pytest.raises(aiosendfile.FileTruncatedError) as exc_info:
            await aiosendfile.sendfile(conn.writer, f, 500, 501)
        assert exc_info.value.sent == 0
        assert exc_info.value.expected == 501
        assert f.tell() == 0
    conn.writer.write(b"end")
    conn.writer.close()
    assert await conn.read_all() == b"end"


async def test_text_mode_and_closed_files(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    path = make_file(10)
    with open(path) as text, pytest.raises(ValueError, match="binary mode"):
        await aiosendfile.sendfile(conn.writer, text)
    f = open(path, "rb")  # noqa: SIM115
    f.close()
    with pytest.raises(ValueError, match="closed file"):
        await aiosendfile.sendfile(conn.writer, f)
    with pytest.raises(TypeError):
        await aiosendfile.sendfile(conn.writer, b"not a file")  # type: ignore[arg-type]


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


async def test_fallback_false(connect: Connector, kind: str, make_file: Any) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        if zero_copy_expected(kind):
            assert await aiosendfile.sendfile(conn.writer, f, fallback=False) == 1000
        else:
            with pytest.raises(aiosendfile.SendfileNotAvailableError, match="TLS") as exc_info:
                await aiosendfile.sendfile(conn.writer, f, 5, fallback=False)
            assert isinstance(exc_info.value, asyncio.SendfileNotAvailableError)
            assert exc_info.value.sent == 0
            assert f.tell() == 0
    with pytest.raises(aiosendfile.SendfileNotAvailableError):
        await aiosendfile.sendfile(conn.writer, io.BytesIO(b"abc"), fallback=False)
    conn.writer.write(b"|end")
    conn.writer.close()
    assert await conn.read_all() == (pattern(1000) if zero_copy_expected(kind) else b"") + b"|end"


# -- bad targets -------------------------------------------------------------------------------------


async def test_bad_targets(make_file: Any) -> None:
    with open(make_file(10), "rb") as f:
        with pytest.raises(TypeError, match="target must be"):
            await aiosendfile.sendfile(object(), f)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setblocking(False)
        with udp, pytest.raises(ValueError, match="SOCK_STREAM"):
            await aiosendfile.sendfile(udp, f)
        a, b = socket.socketpair()
        with a, b:
            with pytest.raises(ValueError, match="non-blocking"):
                await aiosendfile.sendfile(a, f)
            with pytest.raises(TypeError):
                await aiosendfile.sock_sendfile("sock", f)  # type: ignore[arg-type]


async def test_datagram_and_pipe_transports_are_refused_in_words(make_file: Any) -> None:
    """Neither is a byte stream ``sendfile`` can frame: refused before any byte, as
    ``loop.sendfile`` refuses them (``RuntimeError``), with what it was given, on both loops (a bare
    ``NotImplementedError`` from the transport before; uvloop's datagram a ``TypeError``)."""
    loop = asyncio.get_running_loop()
    udp, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, remote_addr=("127.0.0.1", 9))
    r, w = os.pipe()
    pipe, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(w, "wb"))
    try:
        with open(make_file(10), "rb") as f:
            for transport, words in ((udp, "a datagram transport"), (pipe, "a pipe")):
                with pytest.raises(
                    RuntimeError, match=f"sendfile is not supported for transport .*: {words}"
                ):
                    await aiosendfile.sendfile(transport, f)
                assert f.tell() == 0
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 1)  # (nothing was written to the pipe)
        child = await asyncio.create_subprocess_exec(
            "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
        )
        assert child.stdin is not None
        try:
            refused = pytest.raises(RuntimeError, match=r"not supported for transport .*: a pipe")
            with open(make_file(10), "rb") as f, refused:  # (uvloop's subprocess pipe: no "pipe" extra)
                await aiosendfile.sendfile(child.stdin, f)
        finally:
            child.stdin.close()
            if await asyncio.wait_for(child.wait(), 10) is None:
                child.kill()
    finally:
        udp.close()
        pipe.close()
        os.close(r)


async def test_closing_transport(connect: Connector, make_file: Any) -> None:
    conn = await connect()
    with open(make_file(1000), "rb") as f:
        f.seek(3)
        conn.writer.close()
        with pytest.raises(RuntimeError, match="Transport is closing"):
            await aiosendfile.sendfile(conn.writer, f)
        assert f.tell() == 3


async def test_raw_socket_argument_errors(make_file: Any) -> None:
    with open(make_file(1000), "rb") as f:
        a, b = socket.socketpair()
        a.setblocking(False)
        with a, b:
            with pytest.raises(ValueError, match="past the end"):
                await aiosendfile.sock_sendfile(a, f, 1001)
            with pytest.raises(aiosendfile.FileTruncatedError):
                await aiosendfile.sock_sendfile(a, f, 10, 991)
            # A count past an end that came before the offset: the file is shorter than the
            # range asked (a door's later part of a file cut meanwhile), not a bad argument.
            with pytest.raises(aiosendfile.FileTruncatedError):
                await aiosendfile.sock_sendfile(a, f, 2000, 10)
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


# -- misuse during a transfer ------------------------------------------------------------------------


async def test_writes_during_transfer_are_refused(connect: Connector, kind: str, make_file: Any) -> None:
    conn = await connect(rcvbuf=4096)
    size = 8 * 2**20
    with open(make_file(size), "rb") as f:
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f))
        with pytest.raises(RuntimeError, match="sendfile is in progress"):
            conn.writer.write(b"interloper")
        with pytest.raises(RuntimeError, match="sendfile is in progress"):
            conn.writer.writelines([b"interloper"])
        if loop_name() == "asyncio":  # uvloop's compiled transports cannot be guarded
            with pytest.raises(RuntimeError, match="sendfile is in progress"):
                conn.transport.write(b"interloper")
        reader = asyncio.create_task(conn.read_all())
        assert await task == size
        conn.writer.write(b"ok")  # allowed again
        conn.writer.close()
        assert await reader == pattern(size) + b"ok"


async def test_a_sendfile_while_asyncios_own_sends_on_the_transport_is_refused(
    connect: Connector, kind: str, make_file: Any
) -> None:
    """Stock asyncio's ``loop.sendfile`` sending on the transport (a caller that did not go through
    us): ours is refused as a second transfer is (its bytes went into the middle of the other
    file, where ``transport.write`` raises), on the straight line too."""
    if loop_name() != "asyncio":
        pytest.skip("uvloop has no loop.sendfile")
    size = 8 * 2**20
    conn = await connect(rcvbuf=4096)
    loop = asyncio.get_running_loop()
    with open(make_file(size), "rb") as f1, open(make_file(1000, "b.bin"), "rb") as f2:
        assert await aiosendfile.sendfile(conn.writer, f2, 0, 10) == 10  # (known: the straight line)
        theirs = asyncio.ensure_future(loop.sendfile(conn.transport, f1))
        await asyncio.sleep(0.05)
        assert not theirs.done()
        with pytest.raises(RuntimeError, match="in progress"):
            await aiosendfile.sendfile(conn.writer, f2, 0)
        reader = asyncio.create_task(conn.read_all())
        assert await theirs == size
    conn.writer.close()
    assert await reader == pattern(1000)[:10] + pattern(size)


async def test_second_concurrent_sendfile_on_a_transport_is_refused(
    connect: Connector, make_file: Any
) -> None:
    size = 8 * 2**20
    conn = await connect(rcvbuf=4096)
    transport = conn.transport
    protocol, limits = transport.get_protocol(), transport.get_write_buffer_limits()
    with open(make_file(size), "rb") as f1, open(make_file(size, "b.bin"), "rb") as f2:
        first = asyncio.create_task(aiosendfile.sendfile(conn.writer, f1))
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="in progress"):
            await aiosendfile.sendfile(conn.writer, f2)
        assert f2.tell() == 0
        # Nothing of a file to send, only headers or trailers: refused as well, not written into
        # the body under way (uvloop's transport write cannot be guarded).
        f2.seek(5)
        with pytest.raises(RuntimeError, match="in progress"):
            await aiosendfile.sendfile(conn.writer, f2, 0, 0, headers=b"<<INTERLOPER>>")
        assert f2.tell() == 5
        with open(make_file(0, "empty.bin"), "rb") as empty, pytest.raises(RuntimeError, match="in progress"):
            await aiosendfile.sendfile(conn.transport, empty, trailers=b"<<TRAILER>>")
        reader = asyncio.create_task(conn.read_all())
        assert await first == size
    assert transport.get_protocol() is protocol
    assert transport.get_write_buffer_limits() == limits
    conn.writer.close()
    assert await reader == pattern(size)
