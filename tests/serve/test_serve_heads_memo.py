"""The engine's memo of request heads (``aiosendfile._serve``), on raw sockets, on both loops: a read
that is a request parsed before is recognised instead of parsed again, and what the memo never
holds, how big it grows and what it charges.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from ..support.raw_http import read_response
from ..support.serve import (
    ServeSite,
    close_writer,
    engine,
    get,
    serving,
    watch_feeds,
)

pytest.importorskip("httptools")


# -- the heads memo: a read that is a request parsed before is not parsed again ----------------------


def heads_of(www_site: ServeSite) -> Any:
    return engine()._engines[www_site.server].heads


async def test_a_plain_request_is_parsed_once_then_its_head_is_recognised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same plain request three times on one connection (``Accept: */*`` is plain: only JSON
    in it is read): parsed once, answered three times alike, logged three times alike (the
    Referer and User-Agent come back from the memo)."""
    fed = watch_feeds(monkeypatch)
    log = io.StringIO()
    plain = get("/small.txt", "Referer: http://r/\r\nUser-Agent: ua\r\nAccept: */*\r\n")  # (curl's)
    async with serving(tmp_path, access_log=log) as www_site:
        small = (www_site.public / "small.txt").read_bytes()
        reader, writer = await www_site.open()
        try:
            answers = []
            for _ in range(3):
                writer.write(plain)
                answers.append(await read_response(reader))
        finally:
            await close_writer(writer)
        assert plain in heads_of(www_site)
    assert fed == [plain]
    assert [(a.status, a.body) for a in answers] == [(200, small)] * 3
    lines = [line.split(" [")[0] + line.split("]")[1] for line in log.getvalue().splitlines()]
    assert lines == ['127.0.0.1 - - "GET /small.txt HTTP/1.1" 200 4096 "http://r/" "ua"'] * 3


@pytest.mark.parametrize(
    ("data", "methods"),
    [
        (get("/small.txt") * 2, ["GET", "GET"]),
        (get("/small.txt", "Range: bytes=0-1\r\n"), ["GET"]),
        (get("/small.txt", "Accept: application/json\r\n"), ["GET"]),  # (a listing's JSON)
        (get("/small.txt")[:-2] + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", ["GET"]),
        (get("/small.txt", "Expect: 100-continue\r\n"), ["HEAD", "GET"]),  # (the 100 has no body)
        (get("/small.txt", "X-Long: " + "x" * 2100 + "\r\n"), ["GET"]),
        (get("/small.txt", method="POST"), ["POST"]),
    ],
    ids=["pipelined", "range", "json", "chunked", "expect", "long", "post"],
)
async def test_what_the_heads_memo_never_holds(www_site: ServeSite, data: bytes, methods: list[str]) -> None:
    """Two requests in one read, a request with fields the core reads, one with a body's framing or
    an expectation, a head over HEADS_MAX_KEY, a method other than GET or HEAD:
    parsed every time, never remembered."""
    for _ in range(2):
        reader, writer = await www_site.open()
        try:
            writer.write(data)
            for method in methods:
                await read_response(reader, method)
        finally:
            await close_writer(writer)
    assert len(heads_of(www_site)) == 0


@pytest.mark.parametrize(
    "head",
    [get("/small.txt", "Connection: close\r\n"), get("/small.txt", version="1.0")],
    ids=["close", "http10"],
)
async def test_a_request_that_closes_is_recognised_and_still_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head: bytes
) -> None:
    """A request that closes its connection (``Connection: close``, HTTP/1.0 without keep-alive:
    a health check, ``curl`` in a loop, each on a new connection) is parsed once; on the next
    connections its head is recognised, answered alike with ``Connection: close``, and the
    connection still closes after the answer."""
    fed = watch_feeds(monkeypatch)
    async with serving(tmp_path) as www_site:
        small = (www_site.public / "small.txt").read_bytes()
        for _ in range(3):
            reader, writer = await www_site.open()
            try:
                writer.write(head)
                answer = await read_response(reader)
                assert (answer.status, answer.body) == (200, small)
                assert answer.header("connection") == "close"
                assert await asyncio.wait_for(reader.read(), 10) == b""  # the server closed it
            finally:
                await close_writer(writer)
        assert head in heads_of(www_site)
    assert fed == [head]  # (the first connection's; the others were recognised)


async def test_a_known_head_arriving_inside_a_request_is_parsed_as_part_of_it(www_site: ServeSite) -> None:
    """A read equal to a known head, while the parser is inside another request's head, is that
    request's continuation (here a header's value), not a request of its own."""
    known = get("/small.txt")
    reader, writer = await www_site.open()
    try:
        writer.write(known)
        await read_response(reader)
        assert known in heads_of(www_site)
        writer.write(b"GET /sub/ HTTP/1.1\r\nX-Pad: ")
        await asyncio.sleep(0.1)  # (two reads)
        writer.write(known)  # the value "GET /small.txt HTTP/1.1", then Host: the request ends
        a = await read_response(reader)
        assert (a.status, a.body) == (200, b"<p>index</p>")
        writer.write(known)
        assert (await read_response(reader)).body == (www_site.public / "small.txt").read_bytes()
    finally:
        await close_writer(writer)


async def test_the_heads_memo_stays_bounded_under_100000_distinct_heads(tmp_path: Path) -> None:
    """100,000 distinct request heads of up to HEADS_MAX_KEY bytes: at most HEADS_ENTRIES entries
    and HEADS_MAX_BYTES of charges; a longer head is never held."""
    from aiosendfile._serve._protocol import Exchange
    from aiosendfile._serve._server import HEADS_ENTRIES, HEADS_MAX_BYTES, HEADS_MAX_KEY, Engine, ServeConfig

    engine = Engine(ServeConfig(str(tmp_path)), asyncio.get_running_loop())
    try:
        for i in range(100_000):
            data = get("/" + str(i) * (1 + i % 200))[:HEADS_MAX_KEY]
            engine.learn(data, Exchange(b"GET", b"/", 1, None, None))
            assert len(engine.heads) <= HEADS_ENTRIES
            assert engine.heads.size <= HEADS_MAX_BYTES
        assert len(engine.heads) > HEADS_ENTRIES // 4  # (it does hold a working set)
        engine.learn(b"G" * (HEADS_MAX_KEY + 1), Exchange(b"GET", b"/", 1, None, None))
        assert b"G" * (HEADS_MAX_KEY + 1) not in engine.heads
    finally:
        engine.stop()


async def test_the_heads_memo_charges_what_it_holds(tmp_path: Path) -> None:
    """Heads whose target and logged User-Agent are long (the values are copies of the key's
    bytes): what the memo holds, measured, stays near its charge and under 1.25 x HEADS_MAX_BYTES."""
    import tracemalloc

    from aiosendfile._serve._protocol import Exchange
    from aiosendfile._serve._server import HEADS_MAX_BYTES, HEADS_MAX_KEY, Engine, ServeConfig

    engine = Engine(ServeConfig(str(tmp_path)), asyncio.get_running_loop())
    try:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            url = b"/%06d" % i + b"u" * 900
            agent = b"a" * 900
            data = b"GET " + url + b" HTTP/1.1\r\nHost: h\r\nUser-Agent: " + agent + b"\r\n\r\n"
            assert len(data) <= HEADS_MAX_KEY
            engine.learn(data, Exchange(b"GET", bytes(url), 1, None, ("1.1", None, bytes(agent), None)))
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert engine.heads.size <= HEADS_MAX_BYTES
        assert held <= 1.25 * HEADS_MAX_BYTES, f"{held / 2**20:.1f} MiB held"
    finally:
        engine.stop()
