"""aiosendfile.sock_sendfile (and sendfile with a raw socket) on both loops."""

from __future__ import annotations

import asyncio
import io
import socket
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform

from ..support.files import pattern


async def _recv_all(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    chunks = []
    while chunk := await loop.sock_recv(sock, 2**20):
        chunks.append(chunk)
    return b"".join(chunks)


async def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.socket()
        client.setblocking(False)
        await loop.sock_connect(client, listener.getsockname())
        server, _ = listener.accept()
    server.setblocking(False)
    return server, client


@pytest.mark.parametrize("family", ["unix", "tcp"])
@pytest.mark.parametrize("size", [0, 1, 5 * 2**20 + 1])
@pytest.mark.parametrize("api", ["sock_sendfile", "sendfile"])
async def test_raw_socket_byte_exact_zero_copy(make_file: Any, family: str, size: int, api: str) -> None:
    path = make_file(size)
    if family == "unix":
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
    else:
        a, b = await _tcp_pair()
    fn = getattr(aiosendfile, api)
    with a, b, open(path, "rb") as f:
        reader = asyncio.create_task(_recv_all(b))
        await asyncio.get_running_loop().sock_sendall(a, b"H")
        assert await fn(a, f, 0, None) == size
        assert f.tell() == size
        await asyncio.get_running_loop().sock_sendall(a, b"T")
        a.shutdown(socket.SHUT_WR)
        assert await reader == b"H" + pattern(size) + b"T"
    assert _platform.counters.bytes == size


async def test_raw_socket_fallback_for_bytesio() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    payload = pattern(3 * 2**20 + 5)
    with a, b:
        reader = asyncio.create_task(_recv_all(b))
        assert await aiosendfile.sock_sendfile(a, io.BytesIO(payload), 5, 2**20) == 2**20
        with pytest.raises(aiosendfile.SendfileNotAvailableError):
            await aiosendfile.sock_sendfile(a, io.BytesIO(payload), fallback=False)
        a.shutdown(socket.SHUT_WR)
        assert await reader == payload[5 : 5 + 2**20]


@pytest.mark.parametrize("api", ["sock_sendfile", "sendfile"])
async def test_raw_socket_copy_cancelled_counts_what_went(api: str) -> None:
    """The copy path (a ``BytesIO``) cancelled while the peer reads nothing: the file's position
    tells exactly what the peer gets, so a caller resumes there (a chunk was counted only once
    all of it went: 0 told, 219,264 bytes sent)."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    payload = pattern(4 << 20)
    with a, b:
        f = io.BytesIO(payload)
        task = asyncio.ensure_future(getattr(aiosendfile, api)(a, f, 100))
        await asyncio.sleep(0.1)  # (the socket fills; nobody reads)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        told = f.tell() - 100
        assert told > 0
        ending = asyncio.ensure_future(loop.sock_sendall(a, b"<END>"))
        got = bytearray()
        while not got.endswith(b"<END>"):
            got += await asyncio.wait_for(loop.sock_recv(b, 1 << 20), 10)
        await ending
    assert bytes(got[:-5]) == payload[100 : 100 + told]


async def test_raw_socket_peer_gone(make_file: Any) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    with a, open(make_file(8 * 2**20), "rb") as f:
        b.close()
        with pytest.raises(aiosendfile.ConnectionLostError) as exc_info:
            await aiosendfile.sock_sendfile(a, f, 3)
        assert exc_info.value.sent == 0
        assert f.tell() == 3


async def test_ssl_socket_is_refused(tmp_path: Path, make_file: Any) -> None:
    import ssl

    ctx = ssl.create_default_context()
    raw = socket.socket()
    sslsock = ctx.wrap_socket(raw, do_handshake_on_connect=False, server_hostname="x")
    with sslsock, open(make_file(1), "rb") as f, pytest.raises(TypeError, match="SSLSocket"):
        await aiosendfile.sock_sendfile(sslsock, f)
