"""Differential: the native engine and the plugin (in an aiohttp ``Application``) answer alike.

The requests and the tree are ``tests/support/static_requests.py``'s (the golden table's), run
under each of its policies with both doors mounted at "/". Each answer is compared on its status
line, its headers but ``Date`` and ``Server`` (names case-insensitive; order not compared:
aiohttp orders some fields its own way) and its body, with multipart boundaries normalised. The
requests ``KNOWN_DIFFERENCES`` names (an aiohttp quirk the recorded table keeps) are compared on
status and body only. Then seeded random requests (validators, ranges, encodings combined) go
to both doors the same way.

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
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import aiosendfile.aiohttp as sf
from aiosendfile._static import _hot

from ..support.raw_http import raw_async, read_response
from ..support.serve import serve_site
from ..support.static_requests import (
    EARLIER_HTTP,
    KNOWN_DIFFERENCES,
    LARGE_SIZE,
    LATER_HTTP,
    POLICIES,
    SMALL,
    STAMP_HTTP,
    build_tree,
    etag_of,
    normalise,
    requests,
)

pytest.importorskip("aiosendfile._serve._server")


def comparable(raw: bytes, asked: bytes, *, keep_alive: bool = False) -> dict[str, Any]:
    """normalise()'s dict with headers as a sorted list of (lower-case name, value), a
    ``Location`` resolved against the target *asked* (as a client resolves it: serve's are
    relative, the plugin's absolute paths)."""
    answer = normalise(raw)
    # (serve says nosniff on every answer, as its own rule: the plugin leaves it to the app)
    dropped = {"keep-alive", "x-content-type-options"} | ({"connection"} if keep_alive else set())
    target = asked.split(b" ", 2)[1].decode("latin-1")
    answer["headers"] = sorted(
        (name.lower(), urljoin(target, value) if name.lower() == "location" else value)
        for name, value in answer["headers"]
        if name.lower() not in dropped
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
        cm = serve_site(public, **POLICIES[policy])
        natives.append(cm)
        site = await cm.__aenter__()
        assert server.host is not None
        assert server.port is not None
        return (server.host, server.port), site

    _hot.hot_files.clear()
    yield make
    for cm in natives:
        await cm.__aexit__(None, None, None)
    for server in servers:
        await server.close()
    _hot.hot_files.clear()


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_native_and_plugin_answer_alike(doors: Any, policy: str) -> None:
    (host, port), native = await doors(policy)
    cases = requests(policy, b"")
    assert len(cases) >= 5
    differ = []
    for name, raw in cases:
        plugin = comparable(await raw_async(host, port, raw, None), raw)
        ours = comparable((await native.fetch(raw)).raw, raw)
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
                answers.append(
                    comparable((await read_response(reader, _method(raw))).raw, raw, keep_alive=True)
                )
            if found := compare(name, *answers):
                differ.append((name, found))
        assert not native_conn[0].at_eof()
    finally:
        for _, writer in (plugin_conn, native_conn):
            writer.close()
    assert not differ, differ


# -- random requests ----------------------------------------------------------------------------------


def random_request(rng: random.Random) -> bytes:
    """A GET/HEAD (sometimes another method) of a tree path with random validators, ranges and
    Accept-Encoding: the combinations the table spells one at a time."""
    paths = sorted({raw.split(b" ", 2)[1].partition(b"?")[0] for _, raw in requests("default", b"")})
    etags = [etag_of(size) for size in (len(SMALL), LARGE_SIZE, 0, 17)] + [
        '"x"',
        "*",
        "W/" + etag_of(len(SMALL)),
    ]
    dates = [STAMP_HTTP, EARLIER_HTTP, LATER_HTTP, "garbage"]

    def spec() -> str:
        a, roll = rng.randint(0, LARGE_SIZE + 100), rng.random()
        if roll < 0.4:
            return f"{a}-{a + rng.randint(0, 5000)}"
        if roll < 0.6:
            return f"{a}-"
        if roll < 0.8:
            return f"-{rng.randint(0, 3000)}"
        return rng.choice(["x", "5-1", ""])

    method = rng.choice([b"GET"] * 6 + [b"HEAD"] * 2 + [b"POST", b"OPTIONS"])
    target = rng.choice(paths) + (b"?q=" + rng.choice([b"1", b""]) if rng.random() < 0.15 else b"")
    fields = []
    if rng.random() < 0.4:
        fields.append("Range: bytes=" + ",".join(spec() for _ in range(rng.randint(1, 4))))
    for name, values, chance in (
        ("If-Range", etags + dates, 0.2),
        ("If-None-Match", etags, 0.25),
        ("If-Match", etags, 0.15),
        ("If-Modified-Since", dates, 0.15),
        ("If-Unmodified-Since", dates, 0.15),
        (
            "Accept-Encoding",
            ["gzip", "br", "gzip, br", "br;q=0", "identity", "*", "gzip;q=0.5, br;q=0.6"],
            0.4,
        ),
    ):
        if rng.random() < chance:
            fields.append(f"{name}: {rng.choice(values)}")
    if method == b"POST":
        fields.append("Content-Length: 0")
    head = method + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    return head + "".join(f + "\r\n" for f in fields).encode() + b"\r\n"


@pytest.mark.parametrize("policy", ["default", "open"])
async def test_native_and_plugin_answer_random_requests_alike(doors: Any, policy: str) -> None:
    """Seeded random requests (``AIOSENDFILE_DIFF_EXAMPLES`` of them, 150 by default): same answers."""
    (host, port), native = await doors(policy)
    rng = random.Random(f"{policy}-15")
    differ = []
    for _ in range(int(os.environ.get("AIOSENDFILE_DIFF_EXAMPLES", "150"))):
        raw = random_request(rng)
        plugin = comparable(await raw_async(host, port, raw, None), raw)
        ours = comparable((await native.fetch(raw)).raw, raw)
        if found := differences(plugin, ours):
            differ.append((raw, found))
    assert not differ, differ[:5]
