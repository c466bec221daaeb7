"""``aiosendfile.uvicorn`` as uvicorn: uvicorn's own features around the door (proxy headers,
concurrency limits, lifespan, WebSockets...), a real uvicorn process started by its command line,
and the same bytes as uvicorn's own body messages. The protocol's semantics are
``test_uvicorn_protocol``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trustme

from aiosendfile.uvicorn import H11Protocol, HttpToolsProtocol

from ..support.files import pattern
from ..support.processes import cli_env
from ..support.raw_http import read_response, read_to_eof
from ..support.uvicorn_inproc import (
    MIB,
    PATHSEND,
    request,
    sent_zero_copy,
    serve,
    start,
)
from ..support.waiting import until

# -- uvicorn's own features around the door -------------------------------------------------------


async def test_starlette_file_response_and_static_files_unchanged(
    proto: Any, kind: str, tmp_path: Path, tls_ca: trustme.CA, data_file: tuple[Path, bytes]
) -> None:
    from starlette.applications import Starlette
    from starlette.responses import FileResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    path, data = data_file
    app = Starlette(
        routes=[
            Route("/file", lambda request: FileResponse(path)),
            Mount("/static", StaticFiles(directory=tmp_path)),
        ]
    )
    async with serve(app, proto, kind, tmp_path, tls_ca) as site:
        reader, writer = await site.open()
        for target in (b"/file", b"/static/data.bin"):
            writer.write(request(target))
            assert (await read_response(reader)).body == data
            writer.write(request(target, b"HEAD"))
            assert (await read_response(reader, b"HEAD")).headers["content-length"] == str(len(data))
            writer.write(request(target, extra=b"Range: bytes=10-19\r\n"))  # Starlette's own body messages
            reply = await read_response(reader)
            assert (reply.status, reply.body) == (206, data[10:20])
        writer.close()
    sent_zero_copy(kind, 2 * len(data))


async def test_pathsend_through_starlettes_gzip_and_base_http_middlewares(
    proto: Any, tmp_path: Path, data_file: tuple[Path, bytes]
) -> None:
    """GZipMiddleware sends pathsend on uncompressed; BaseHTTPMiddleware (FastAPI's
    ``@app.middleware("http")``) passes it through: still zero-copy under both."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.middleware.gzip import GZipMiddleware
    from starlette.responses import FileResponse
    from starlette.routing import Route

    path, data = data_file

    async def tag(request: Any, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers["x-tag"] = "1"
        return response

    app = Starlette(
        routes=[Route("/file", lambda request: FileResponse(path, media_type="text/plain"))],
        middleware=[Middleware(GZipMiddleware, minimum_size=1), Middleware(BaseHTTPMiddleware, dispatch=tag)],
    )
    async with serve(app, proto, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/file", extra=b"Accept-Encoding: gzip\r\n"))
        reply = await read_response(reader)
        writer.close()
    assert reply.body == data
    assert "content-encoding" not in reply.headers
    assert reply.headers["x-tag"] == "1"
    sent_zero_copy("tcp", len(data))


async def test_proxy_headers_limit_concurrency_and_lifespan(
    proto: Any, tmp_path: Path, data_file: tuple[Path, bytes]
) -> None:
    path, data = data_file
    seen: list[dict[str, Any]] = []
    hold = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/hold":
            await hold.wait()
        await send(start(len(data)))
        await send({"type": PATHSEND, "path": str(path)})

    config = {"proxy_headers": True, "forwarded_allow_ips": "*", "limit_concurrency": 2, "lifespan": "on"}
    async with serve(app, proto, "tcp", tmp_path, **config) as site:
        reader, writer = await site.open()
        writer.write(request(b"/", extra=b"X-Forwarded-For: 10.1.2.3\r\n"))
        assert (await read_response(reader)).body == data
        writer.write(request(b"/hold"))
        await until(lambda: len(site.server.server_state.tasks) == 1)
        reader2, writer2 = await site.open()
        writer2.write(request(b"/"))
        assert (await read_response(reader2)).status == 503  # uvicorn's service_unavailable, untouched
        writer2.close()
        hold.set()
        assert (await read_response(reader)).body == data
        writer.close()
    lifespan, first, held = seen
    assert lifespan["type"] == "lifespan"
    assert PATHSEND not in lifespan.get("extensions", {})
    assert first["client"][0] == "10.1.2.3"
    assert PATHSEND in first["extensions"]
    assert PATHSEND in held["extensions"]


async def test_the_uvicorn_internals_relied_on_are_there(proto: Any, tmp_path: Path) -> None:
    from aiosendfile._asgi._uvicorn import RELIED_ON

    cycles = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        cycles.append(site.protocol().cycle)
        await send(start(0))
        await send({"type": "http.response.body"})

    async with serve(app, proto, "tcp", tmp_path) as site:
        reader, writer = await site.open()
        writer.write(request(b"/"))
        await read_response(reader)
        writer.close()
    (cycle,) = cycles
    flavour = "h11 cycle" if proto is H11Protocol else "httptools cycle"
    missing = [
        f"cycle.{name}" for name in RELIED_ON["cycle"] + RELIED_ON[flavour] if not hasattr(cycle, name)
    ]
    missing += [f"cycle.flow.{name}" for name in RELIED_ON["flow"] if not hasattr(cycle.flow, name)]
    assert not missing, f"uvicorn changed: {missing} (see aiosendfile/_asgi/_uvicorn.py)"


async def test_extensions_already_in_the_scope_are_kept() -> None:
    from aiosendfile._asgi._uvicorn import _Door

    class Cycle:
        async def send(self, message: Any) -> None:
            pass

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert scope["extensions"]["tls"] == {"version": 1}
        assert PATHSEND in scope["extensions"]

    async def no_carry(cycle: Any, message: Any) -> None:
        raise AssertionError

    await _Door(app, no_carry)({"type": "http", "extensions": {"tls": {"version": 1}}}, None, Cycle().send)


# -- a real uvicorn process -----------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("http", ["HttpToolsProtocol", "H11Protocol"])
def test_uvicorn_process_with_our_protocol(tmp_path: Path, loop: str, http: str) -> None:
    data = pattern(3 * MIB + 1)
    (tmp_path / "data.bin").write_bytes(data)
    uds = str(tmp_path / "s.sock")
    argv = [sys.executable, "-m", "uvicorn", "tests.support.asgi_apps:counted_static_app", "--factory"]
    argv += ["--uds", uds, "--loop", loop, "--http", f"aiosendfile.uvicorn:{http}", "--log-level", "warning"]
    if not cli_takes_a_class():  # uvicorn < 0.36: the class goes through uvicorn.run
        run = f"uvicorn.run(static_app, factory=True, uds={uds!r}, loop={loop!r}, http={http}, log_level=30)"
        argv = [sys.executable, "-c", f"import uvicorn\nfrom aiosendfile.uvicorn import {http}\n"]
        argv[-1] += f"from tests.support.asgi_apps import counted_static_app as static_app\n{run}"
    env = {**cli_env(), "AIOSENDFILE_TEST_ROOT": str(tmp_path)}
    root = Path(__file__).resolve().parent.parent.parent
    with subprocess.Popen(argv, cwd=root, env=env, stderr=subprocess.PIPE, text=True) as server:
        try:
            for _ in range(300):
                if os.path.exists(uds) or server.poll() is not None:
                    break
                time.sleep(0.05)
            got = b""
            for _ in range(100):
                try:
                    got = raw_unix(
                        uds, request(b"/data.bin") + request(b"/counters", extra=b"Connection: close\r\n")
                    )
                    break
                except (ConnectionRefusedError, FileNotFoundError):
                    time.sleep(0.05)
        finally:
            server.terminate()
            _, err = server.communicate(timeout=30)
    first, _, rest = got.partition(b"\r\n\r\n")
    assert b" 200 " in first.split(b"\r\n")[0]
    assert rest[: len(data)] == data
    counters = rest[len(data) :].rpartition(b"\r\n\r\n")[2].split()
    assert int(counters[1]) == len(data)  # every byte through sendfile in the server process
    assert "Traceback" not in err


def cli_takes_a_class() -> bool:
    """``--http module:Class`` on uvicorn's command line: uvicorn 0.36 and later (encode/uvicorn#2658)."""
    import uvicorn

    return tuple(int(part) for part in uvicorn.__version__.split(".")[:2]) >= (0, 36)


def raw_unix(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(MIB):
            chunks.append(chunk)
        return b"".join(chunks)


# -- the same bytes as uvicorn's own body messages ------------------------------------------------


@pytest.mark.parametrize(
    "req",
    [
        request(b"/"),
        request(b"/", b"HEAD"),
        request(b"/", extra=b"Connection: close\r\n"),
        b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n",
    ],
    ids=["get", "head", "close", "http10", "http10-keep-alive"],
)
@pytest.mark.parametrize("length", [True, False], ids=["content-length", "no-length"])
async def test_same_bytes_as_uvicorns_body_messages(tmp_path: Path, req: bytes, length: bool) -> None:
    """A pathsend under our protocol is framed exactly as uvicorn frames the same bytes sent as
    ``http.response.body`` under its stock protocol (Date aside), for both protocols."""
    from uvicorn.protocols.http.h11_impl import H11Protocol as StockH11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as StockHttpTools

    data = pattern(100_000)
    path = tmp_path / "data.bin"
    path.write_bytes(data)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(start(len(data) if length else None))
        if PATHSEND in scope.get("extensions", {}):
            await send({"type": PATHSEND, "path": str(path)})
        else:
            await send({"type": "http.response.body", "body": data})

    async def exchange(http: Any) -> bytes:
        async with serve(app, http, "tcp", tmp_path) as site:
            reader, writer = await site.open()
            # the second and the last are answered only on a kept connection; the last closes it
            writer.write(req + req + request(b"/", extra=b"Connection: close\r\n"))
            raw = await read_to_eof(reader)
            writer.close()
        return b"\r\n".join(line for line in raw.split(b"\r\n") if not line.startswith(b"date: "))

    for stock, ours in ((StockHttpTools, HttpToolsProtocol), (StockH11, H11Protocol)):
        assert await exchange(ours) == await exchange(stock)


async def test_websockets_are_uvicorns(proto: Any, tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close"})

    async with serve(app, proto, "tcp", tmp_path, ws="wsproto") as site:
        reader, writer = await site.open()
        writer.write(
            request(
                b"/ws",
                extra=b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
            )
        )
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101 ")
        writer.close()
    (scope,) = seen
    assert scope["type"] == "websocket"
    assert PATHSEND not in scope.get("extensions", {})
