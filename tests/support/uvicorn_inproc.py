"""uvicorn in the test's own loop, for the protocol tests of ``aiosendfile.uvicorn``.

``serve`` runs ``uvicorn.Server`` with a given protocol class over TCP, a Unix socket (``uds``) or
TLS (trustme files, uvicorn's ``ssl_keyfile``/``ssl_certfile``), on the test's loop (``loop="none"``),
logging left to the test (``log_config=None``: ``caplog`` sees ``uvicorn.error``). ``Site`` opens
raw connections to it and finds the server side of one (its protocol and transport).
``read_response`` reads one HTTP/1.1 response off a keep-alive connection, keeping its framing
(Content-Length, chunk sizes, or to the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from .raw_http import connect


@dataclass
class Site:
    server: uvicorn.Server
    host: str
    port: int
    uds: str | None
    ctx: ssl.SSLContext | None

    async def open(self, **kw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await connect(self.host, self.port, self.ctx, self.uds, **kw)

    def protocol(self) -> Any:
        """The server side of the one open connection (uvicorn's protocol object)."""
        (connection,) = self.server.server_state.connections
        return connection


@contextlib.asynccontextmanager
async def serve(
    app: Any, http: Any, kind: str, tmp_path: Path, tls_ca: Any = None, **config: Any
) -> AsyncIterator[Site]:
    """Serve *app* with protocol class *http* over *kind* ("tcp", "unix", "tls") until the block ends."""
    where: dict[str, Any] = {"host": "127.0.0.1", "port": 0}
    ctx = None
    if kind == "unix":
        where = {"uds": str(tmp_path / "uvicorn.sock")}
    elif kind == "tls":
        pem = tmp_path / "server.pem"
        tls_ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
        where.update(ssl_keyfile=str(pem), ssl_certfile=str(pem))
        ctx = ssl.create_default_context()
        tls_ca.configure_trust(ctx)
    config.setdefault("lifespan", "off")
    cfg = uvicorn.Config(app, http=http, loop="none", log_config=None, **where, **config)
    server = uvicorn.Server(cfg)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = 0
    if kind != "unix":
        port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Site(server, "127.0.0.1", port, where.get("uds"), ctx)
    finally:
        server.should_exit = True
        await task
        while server.server_state.tasks:  # tasks cancelled at shutdown finish their cleanup
            await asyncio.sleep(0.01)


@dataclass
class Reply:
    status: int
    head: bytes
    headers: dict[bytes, bytes]
    body: bytes
    chunks: list[int] = field(default_factory=list)  # chunk sizes, when chunked


async def read_response(reader: asyncio.StreamReader, method: bytes = b"GET") -> Reply:
    """One response: its head, then its body framed as the head says (and the chunk sizes)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    reply = Reply(status, head, headers, b"")
    if method == b"HEAD" or status in (204, 304):
        return reply
    if b"content-length" in headers:
        reply.body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            reply.chunks.append(size)
            if size == 0:
                assert await reader.readexactly(2) == b"\r\n"
                break
            parts.append(await reader.readexactly(size))
            assert await reader.readexactly(2) == b"\r\n"
        reply.body = b"".join(parts)
    else:
        reply.body = await reader.read()
    return reply


def request(target: bytes = b"/", method: bytes = b"GET", extra: bytes = b"") -> bytes:
    return method + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\n" + extra + b"\r\n"
