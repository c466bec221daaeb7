"""patch_loop / loop_factory: unmodified callers of loop.sendfile get aiosendfile on both loops.

The acceptance test is aiohttp's stock ``web.FileResponse``: under uvloop it
copies through userspace unless the loop is patched.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import uvloop
from aiohttp import ClientSession, TCPConnector, web
from aiohttp.test_utils import TestServer

import aiosendfile
from aiosendfile import _platform
from aiosendfile._patch import unpatch

from ..support.fds import describe_fd, open_fds
from ..support.files import pattern
from ..support.waiting import until


@pytest.fixture
async def patched_loop() -> Any:
    loop = aiosendfile.patch_loop()
    yield loop
    unpatch(loop)


async def test_patch_is_idempotent_and_replaces_both_methods(patched_loop: Any) -> None:
    first_sendfile = patched_loop.sendfile
    assert aiosendfile.patch_loop(patched_loop) is patched_loop
    assert patched_loop.sendfile is first_sendfile
    assert patched_loop.sock_sendfile.__qualname__.startswith("patch_loop")


async def test_patched_loop_sock_sendfile_works_on_uvloop_too(patched_loop: Any, make_file: Any) -> None:
    path = make_file(3 * 2**20)
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    with a, b, open(path, "rb") as f:

        async def recv() -> bytes:
            chunks = []
            while chunk := await patched_loop.sock_recv(b, 2**20):
                chunks.append(chunk)
            return b"".join(chunks)

        reader = asyncio.create_task(recv())
        assert await patched_loop.sock_sendfile(a, f) == 3 * 2**20
        a.shutdown(socket.SHUT_WR)
        assert await reader == pattern(3 * 2**20)
    assert _platform.counters.bytes == 3 * 2**20


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_aiohttp_stock_file_response_goes_zero_copy(
    patched_loop: Any,
    tmp_path: Path,
    tls: bool,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
) -> None:
    size = 5 * 2**20 + 7
    (tmp_path / "big.bin").write_bytes(pattern(size))

    async def handler(request: web.Request) -> web.FileResponse:
        return web.FileResponse(tmp_path / "big.bin")

    app = web.Application()
    app.router.add_get("/big", handler)
    server = TestServer(app, scheme="https" if tls else "http")
    await server.start_server(ssl=tls_server_ctx if tls else None)
    try:
        connector = TCPConnector(ssl=tls_client_ctx if tls else False)
        async with ClientSession(connector=connector) as session:
            for _ in range(2):  # keep-alive: the connection is usable after the lease
                async with session.get(server.make_url("/big")) as resp:
                    assert resp.status == 200
                    body = await resp.read()
                assert body == pattern(size)
            async with session.get(server.make_url("/big"), headers={"Range": "bytes=100-199"}) as resp:
                assert resp.status == 206
                assert await resp.read() == pattern(size)[100:200]
    finally:
        await server.close()
        # aiohttp closes the file from its default executor without waiting for it (so the
        # connection can go on): wait for that close, as the fd-leak check would not.
        await until(lambda: not any(describe_fd(fd) == str(tmp_path / "big.bin") for fd in open_fds()))
    assert _platform.counters.bytes == (0 if tls else 2 * size + 100)


def test_loop_factory_patches_new_loops() -> None:
    for base in (None, uvloop.new_event_loop):
        factory = aiosendfile.loop_factory(base)
        loop = factory()
        try:
            assert getattr(loop, "_aiosendfile_patched", False)
            if base is uvloop.new_event_loop:
                assert isinstance(loop, uvloop.Loop)

            async def probe() -> str:
                return asyncio.get_running_loop().sendfile.__qualname__

            assert loop.run_until_complete(probe()).startswith("patch_loop")
        finally:
            loop.close()


def test_unpatched_uvloop_really_lacks_sendfile() -> None:
    """The fact the patch exists for (if uvloop ever implements it, revisit the defaults)."""
    loop = uvloop.new_event_loop()
    try:

        async def probe() -> None:
            a, b = socket.socketpair()
            a.setblocking(False)
            with a, b, open(__file__, "rb") as f:
                await loop.sock_sendfile(a, f, fallback=False)

        with pytest.raises((NotImplementedError, asyncio.SendfileNotAvailableError)):
            loop.run_until_complete(probe())
    finally:
        loop.close()
