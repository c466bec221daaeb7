"""Connected server/client pairs over TCP, a Unix socket or TLS, and what each kind allows.

``trusting`` is a client's TLS context for a test CA. ``Connector`` opens pairs of one kind (the
``connect`` fixture in conftest makes one per test and closes it after); ``Conn`` is one pair: the
server side's ``StreamWriter`` the test sends with, and the client the test reads.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
import uvloop


@functools.cache
def trusting(ca: trustme.CA) -> ssl.SSLContext:
    """A client context that trusts *ca* alone, one per CA: one that loads the system's CAs as
    well costs ~30 ms to make (more under load), too much for a context per request."""
    return ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())


@dataclass
class Conn:
    """A server-side StreamWriter connected to a client socket the test reads."""

    writer: asyncio.StreamWriter
    client: socket.socket | ssl.SSLObject | Any
    client_reader: asyncio.StreamReader | None
    client_writer: asyncio.StreamWriter | None
    closers: list[Any] = field(default_factory=list)

    @property
    def transport(self) -> Any:
        return self.writer.transport

    async def read_all(self) -> bytes:
        """Read until the server closes the connection."""
        assert self.client_reader is not None
        return await self.client_reader.read()

    async def read_exactly(self, n: int) -> bytes:
        assert self.client_reader is not None
        return await self.client_reader.readexactly(n)


class Connector:
    """Opens server/client pairs of one kind; closes everything at teardown."""

    def __init__(self, kind: str, tmp_path: Path, server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext):
        self.kind = kind
        self.tmp_path = tmp_path
        self.server_ctx = server_ctx
        self.client_ctx = client_ctx
        self.servers: list[asyncio.Server] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def __call__(self, *, rcvbuf: int | None = None, limit: int = 2**16) -> Conn:
        accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

        async def on_client(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            accepted.set_result(w)

        sock = self._client_socket(rcvbuf)
        if self.kind == "unix":
            path = str(self.tmp_path / f"s{len(self.servers)}.sock")
            server = await asyncio.start_unix_server(on_client, path)
            await asyncio.get_running_loop().sock_connect(sock, path)
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=limit)
        else:
            ssl_ctx = self.server_ctx if self.kind == "tls" else None
            server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=ssl_ctx)
            port = server.sockets[0].getsockname()[1]
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            client_ssl = self.client_ctx if self.kind == "tls" else None
            reader, writer = await asyncio.open_connection(
                sock=sock, ssl=client_ssl, server_hostname="localhost" if client_ssl else None, limit=limit
            )
        self.servers.append(server)
        server_writer = await accepted
        self.writers += [server_writer, writer]
        return Conn(server_writer, sock, reader, writer)

    def _client_socket(self, rcvbuf: int | None) -> socket.socket:
        family = socket.AF_UNIX if self.kind == "unix" else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        return sock

    async def close(self) -> None:
        """Close every connection; abort those that cannot finish closing in a second.

        (Python 3.10's TLS transport never finishes close() when reading is paused
        and the peer is gone, and its wait_for() can turn that timeout into a
        CancelledError. asyncio.wait() cancels nothing, so it is used here.)
        """
        for w in self.writers:
            w.close()
        waits = {asyncio.ensure_future(w.wait_closed()): w for w in self.writers}
        if waits:
            _, pending = await asyncio.wait(waits, timeout=1)
            for fut in pending:
                waits[fut].transport.abort()
            if pending:
                _, still = await asyncio.wait(pending, timeout=1)
                for fut in still:
                    fut.cancel()
            for fut in waits:
                if fut.done() and not fut.cancelled():
                    fut.exception()  # retrieved: a peer that reset is expected here
        for s in self.servers:
            s.close()
            await s.wait_closed()


def zero_copy_expected(kind: str) -> bool:
    return kind != "tls"


def loop_name() -> str:
    return "uvloop" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "asyncio"
