"""uvicorn in the test's own loop, for the protocol tests of ``aiosendfile.uvicorn``.

``serve`` runs ``uvicorn.Server`` with a given protocol class over TCP, a Unix socket (``uds``) or
TLS (trustme files, uvicorn's ``ssl_keyfile``/``ssl_certfile``), on the test's loop (``loop="none"``),
logging left to the test (``log_config=None``: ``caplog`` sees ``uvicorn.error``). ``Site`` opens
raw connections to it and finds the server side of one (its protocol and transport).
Its responses are read with ``raw_http``'s reader (``read_response``: framing and chunk sizes kept).
The apps the tests write are ``routes`` of scripts that send ``start`` and the body messages;
``sent_zero_copy`` checks the shim's counters, ``problems`` the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from aiosendfile import _platform

from .connections import trusting
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
        ctx = trusting(tls_ca)
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


def request(target: bytes = b"/", method: bytes = b"GET", extra: bytes = b"") -> bytes:
    return method + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\n" + extra + b"\r\n"


PATHSEND = "http.response.pathsend"
ZEROCOPYSEND = "http.response.zerocopysend"
MIB = 2**20

Script = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def routes(table: dict[str, Script], seen: list[dict[str, Any]] | None = None) -> Any:
    """An ASGI app: each path runs its script (scope, receive, send)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if seen is not None:
            seen.append(scope)
        if scope["type"] != "http":
            return
        await table[scope["path"]](scope, receive, send)

    return app


def start(
    length: int | None = None, status: int = 200, extra: list[tuple[bytes, bytes]] | None = None
) -> Any:
    headers = [(b"content-type", b"application/octet-stream"), *(extra or [])]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": status, "headers": headers}


def sent_zero_copy(kind: str, nbytes: int) -> None:
    """What went through the shim: every file byte zero-copy, or none at all under TLS."""
    if kind == "tls":
        assert _platform.counters.calls == 0
    else:
        assert _platform.counters.bytes == nbytes


def problems(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]
