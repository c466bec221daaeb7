"""Differential: the native engine and the plugin (in an aiohttp ``Application``) answer alike.

The requests and the tree are ``tests/support/static_requests.py``'s (the golden table's), run
under each of its policies with both doors mounted at "/". Each answer is compared on its status
line, its headers but ``Date`` and ``Server`` (names case-insensitive; order not compared:
aiohttp orders some fields its own way) and its body, with multipart boundaries normalised. The
requests ``KNOWN_DIFFERENCES`` names (an aiohttp quirk the recorded table keeps) are compared on
status and body only.

Connection handling: every golden request says ``Connection: close``, and both doors must answer
``Connection: close`` and end the connection (compared like any header; ``Keep-Alive`` is
dropped). The same requests are then sent without it, one after another on a single keep-alive
connection per door: there ``Connection``/``Keep-Alive`` are left out of the comparison (aiohttp
says nothing on HTTP/1.1 keep-alive, as the engine does, but that is not the contract) and every
answer must come back on the same connection (methods other than GET and HEAD are left out
there: aiohttp closes after refusing one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import aiosendfile.aiohttp as sf
from aiosendfile._aiohttp import _fileresponse

from .support.native import native_site, read_response
from .support.raw_http import raw_async
from .support.static_requests import KNOWN_DIFFERENCES, POLICIES, build_tree, normalise, requests

pytest.importorskip("aiosendfile._serve._server")


def comparable(raw: bytes, *, keep_alive: bool = False) -> dict[str, Any]:
    """normalise()'s dict with headers as a sorted list of (lower-case name, value)."""
    answer = normalise(raw)
    dropped = {"keep-alive"} | ({"connection"} if keep_alive else set())
    answer["headers"] = sorted(
        (name.lower(), value) for name, value in answer["headers"] if name.lower() not in dropped
    )
    answer["headers"] = [tuple(h) for h in answer["headers"]]
    return answer


@pytest.fixture
async def doors(tmp_path: Path) -> AsyncIterator[Any]:
    """``await doors(policy)``: (the plugin's (host, port), the native site) over one tree."""
    public = build_tree(tmp_path)
    servers: list[TestServer] = []
    natives: list[Any] = []

    async def make(policy: str) -> tuple[tuple[str, int], Any]:
        app = web.Application()
        app.add_routes([sf.static("/", public, **POLICIES[policy])])
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        cm = native_site(public, **POLICIES[policy])
        natives.append(cm)
        site = await cm.__aenter__()
        assert server.host is not None
        assert server.port is not None
        return (server.host, server.port), site

    _fileresponse.hot_files.clear()
    yield make
    for cm in natives:
        await cm.__aexit__(None, None, None)
    for server in servers:
        await server.close()
    _fileresponse.hot_files.clear()


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_native_and_plugin_answer_alike(doors: Any, policy: str) -> None:
    (host, port), native = await doors(policy)
    cases = requests(policy, b"")
    assert len(cases) >= 5
    differ = []
    for name, raw in cases:
        plugin = comparable(await raw_async(host, port, raw, None))
        ours = comparable((await native.fetch(raw)).raw)
        if found := compare(name, plugin, ours):
            differ.append((name, found))
    assert not differ, differ


def differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The fields of two comparable answers that differ: {field: (plugin's, native's)}."""
    out: dict[str, Any] = {k: (a[k], b[k]) for k in ("status", "body") if a[k] != b[k]}
    if a["headers"] != b["headers"]:
        out["headers"] = (
            sorted(set(a["headers"]) - set(b["headers"])),
            sorted(set(b["headers"]) - set(a["headers"])),
        )
    return out


def compare(name: str, plugin: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """What differs; for a request in KNOWN_DIFFERENCES (aiohttp's quirk) the headers are not compared."""
    found = differences(plugin, ours)
    if name in KNOWN_DIFFERENCES:
        found.pop("headers", None)
    return found


def _method(raw: bytes) -> bytes:
    return raw.split(b" ", 1)[0]


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_native_and_plugin_answer_alike_on_one_keep_alive_connection(doors: Any, policy: str) -> None:
    (host, port), native = await doors(policy)
    cases = [
        (name, raw.replace(b"Connection: close\r\n", b""))
        for name, raw in requests(policy, b"")
        if _method(raw) in (b"GET", b"HEAD")  # aiohttp closes after a refused method
    ]
    plugin_conn = await asyncio.open_connection(host, port, limit=2**20)
    native_conn = await native.open()
    differ = []
    try:
        for name, raw in cases:
            answers = []
            for reader, writer in (plugin_conn, native_conn):
                writer.write(raw)
                answers.append(comparable(await read_response(reader, _method(raw)), keep_alive=True))
            if found := compare(name, *answers):
                differ.append((name, found))
        assert not native_conn[0].at_eof()
    finally:
        for _, writer in (plugin_conn, native_conn):
            writer.close()
    assert not differ, differ
