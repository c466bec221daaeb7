"""``sendfile`` as the first thing a server's handler does on a fresh connection (issue #13).

The push pattern: ``asyncio.start_server(handler, ssl=ctx)`` and a handler whose first await is
``aiosendfile.sendfile(writer, file)``. On uvloop the handler then starts before the TLS layer has
sent what its handshake left buffered (see ``aiosendfile/_lease.py``, "A TLS connection fresh from
its handshake"); 0 bytes used to leave. Each case runs on both loops (conftest), over TCP, Unix,
TLS and TLS 1.2, with the client in another process and in the same loop, a fast reader and a slow
one (``SO_RCVBUF`` 4 KiB, a pause before reading, 4 KiB reads), with and without a request line
read first. After the file the handler writes a tail and drains: byte order and flow control
survive the transfer. Every wait has a timeout: a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import ssl
import sys
from pathlib import Path

import pytest
import trustme

import aiosendfile
from aiosendfile import _platform

from ..support.files import pattern

#: Seconds a whole case may take (a fresh connection, a file of a few MiB). Only a hang reaches it.
DEADLINE = 20.0
REQUEST = b"GET /file\r\n"
TAIL = b"\r\nEND\r\n"
BIG = 3 * 2**20 + 7
#: (size, slow reader): a slow reader matters only where the file outgrows the socket buffers.
TRANSFERS = [(1000, False), (BIG, False), (BIG, True)]

CLIENT = r"""
import hashlib, socket, ssl, sys, time
kind, address, cafile, request, slow = sys.argv[1:]
family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
sock = socket.socket(family, socket.SOCK_STREAM)
if slow == "1":
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
sock.settimeout(10)  # per call: a server that never sends fails the case
sock.connect(address if kind == "unix" else ("127.0.0.1", int(address)))
if kind.startswith("tls"):
    sock = ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname="localhost")
if request:
    sock.sendall(request.encode())
if slow == "1":
    time.sleep(0.1)  # let the server fill every buffer first
digest, n = hashlib.sha256(), 0
while True:
    data = sock.recv(4096 if slow == "1" else 1 << 20)
    if not data:
        break
    digest.update(data)
    n += len(data)
sock.close()
print(n, digest.hexdigest())
"""


@pytest.fixture(params=["tcp", "unix", "tls", "tls12"])
def push_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server_ctx(push_kind: str, tls_ca: trustme.CA) -> ssl.SSLContext | None:
    if not push_kind.startswith("tls"):
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca.issue_cert("localhost", "127.0.0.1").configure_cert(ctx)
    if push_kind == "tls12":  # the handshake leaves the server's Finished itself unsent
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class PushServer:
    """A server whose handler reads the request line (if asked), then sends *path* first thing."""

    def __init__(self, path: Path, read_request: bool) -> None:
        self.path = path
        self.read_request = read_request
        self.result: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            if self.read_request:
                line = await reader.readline()
                assert line == REQUEST, line
            with open(self.path, "rb") as f:
                sent = await aiosendfile.sendfile(writer, f)  # the first await (without a request)
                position = f.tell()
            writer.write(TAIL)  # after the file, and the writer's flow control works again
            await writer.drain()
            if not self.result.done():
                self.result.set_result((sent, position))
        except Exception as exc:  # reported through the test, not the loop's exception handler
            if not self.result.done():
                self.result.set_exception(exc)
        finally:
            writer.close()

    async def start(self, kind: str, tmp_path: Path, ctx: ssl.SSLContext | None) -> str:
        if kind == "unix":
            address = str(tmp_path / "push.sock")
            self.server = await asyncio.start_unix_server(self.handler, address)
            return address
        self.server = await asyncio.start_server(self.handler, "127.0.0.1", 0, ssl=ctx)
        return str(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for writer in self.writers:
            if not writer.transport.is_closing():
                writer.transport.abort()  # only after a failure: lets a stuck handler end
        for writer in self.writers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 5)
        if self.result.done() and not self.result.cancelled():
            self.result.exception()  # retrieved: the test has failed already if it is set
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def process_client(
    kind: str, address: str, cafile: Path, read_request: bool, slow: bool
) -> tuple[int, str]:
    """The client in another process: returns (bytes received, their sha256)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        kind,
        address,
        str(cafile),
        REQUEST.decode() if read_request else "",
        "1" if slow else "0",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate()
    except BaseException:
        proc.kill()
        await proc.communicate()
        raise
    assert proc.returncode == 0, err.decode()
    n, digest = out.split()
    return int(n), digest.decode()


async def loop_client(
    kind: str, address: str, client_ctx: ssl.SSLContext, read_request: bool, slow: bool
) -> tuple[int, str]:
    """The client in the same loop: returns (bytes received, their sha256)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX if kind == "unix" else socket.AF_INET, socket.SOCK_STREAM)
    if slow:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    limit = 4096 if slow else 2**16
    try:
        if kind == "unix":
            await loop.sock_connect(sock, address)
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=limit)
        else:
            await loop.sock_connect(sock, ("127.0.0.1", int(address)))
            tls = kind.startswith("tls")
            reader, writer = await asyncio.open_connection(
                sock=sock,
                ssl=client_ctx if tls else None,
                server_hostname="localhost" if tls else None,
                limit=limit,
            )
    except BaseException:
        sock.close()
        raise
    try:
        if read_request:
            writer.write(REQUEST)
        if slow:
            await asyncio.sleep(0.1)  # let the server fill every buffer first
        digest, n = hashlib.sha256(), 0
        while data := await reader.read(4096 if slow else 1 << 20):
            digest.update(data)
            n += len(data)
        return n, digest.hexdigest()
    finally:
        writer.close()
        with contextlib.suppress(Exception):  # the server may be gone first
            await asyncio.wait_for(writer.wait_closed(), 5)


@pytest.mark.parametrize("read_request", [False, True], ids=["push", "request"])
@pytest.mark.parametrize("client", ["process", "loop"])
@pytest.mark.parametrize(("size", "slow"), TRANSFERS, ids=["1000-fast", "big-fast", "big-slow"])
async def test_sendfile_first_await(
    push_kind: str,
    server_ctx: ssl.SSLContext | None,
    tls_ca: trustme.CA,
    tls_client_ctx: ssl.SSLContext,
    tmp_path: Path,
    client: str,
    read_request: bool,
    size: int,
    slow: bool,
) -> None:
    path = tmp_path / "file.bin"
    path.write_bytes(pattern(size))
    cafile = tmp_path / "ca.pem"
    tls_ca.cert_pem.write_to_path(str(cafile))
    server = PushServer(path, read_request)
    address = await server.start(push_kind, tmp_path, server_ctx)
    try:
        if client == "process":
            receiving = process_client(push_kind, address, cafile, read_request, slow)
        else:
            receiving = loop_client(push_kind, address, tls_client_ctx, read_request, slow)
        received, (sent, position) = await asyncio.wait_for(
            asyncio.gather(receiving, asyncio.shield(server.result)), DEADLINE
        )
    finally:
        await server.stop()
    assert received == (size + len(TAIL), hashlib.sha256(pattern(size) + TAIL).hexdigest())
    assert sent == size
    assert position == size
    assert _platform.counters.bytes == (0 if push_kind.startswith("tls") else size)
