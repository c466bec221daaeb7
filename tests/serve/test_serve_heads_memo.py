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


# -- head blocks: a new target with the fields of a head parsed before is not parsed ----------------


def blocks_of(www_site: ServeSite) -> Any:
    return engine()._engines[www_site.server].blocks


async def test_a_new_target_with_known_fields_is_not_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client asks for new paths with the same fields each time (a browser, a crawler, a load
    test): the first head is parsed, the next ones, their targets new, are read as that head's
    block with another target, and answered and logged as parsed ones are (a file, a folder's
    index, a percent-encoded name, a query, a missing file, a HEAD's block learned apart)."""
    fed = watch_feeds(monkeypatch)
    log = io.StringIO()
    fields = "Referer: http://r/\r\nUser-Agent: ua\r\nAccept: */*\r\n"
    async with serving(tmp_path, access_log=log) as www_site:
        small = (www_site.public / "small.txt").read_bytes()
        reader, writer = await www_site.open()
        try:
            answers = []
            for target, method in [
                ("/sub/", "GET"),
                ("/small.txt", "GET"),
                ("/sm%61ll.txt?x=1&y=/;:@", "GET"),
                ("/a%2520b.txt", "GET"),
                ("/sp%20ace.txt", "GET"),
                ("/missing.txt", "GET"),
                ("/small.txt", "HEAD"),
                ("/big.bin", "HEAD"),
            ]:
                writer.write(get(target, fields, method=method))
                answers.append(await read_response(reader, method))
        finally:
            await close_writer(writer)
        assert len(blocks_of(www_site)) == 2  # (GET's and HEAD's)
        assert get("/small.txt", fields) in heads_of(www_site)  # (asked again: recognised at once)
    assert fed == [get("/sub/", fields), get("/small.txt", fields, method="HEAD")]
    assert [(a.status, a.body) for a in answers] == [
        (200, b"<p>index</p>"),
        (200, small),
        (200, small),
        (200, b"literal percent"),
        (200, b"space"),
        (404, b"404: Not Found"),
        (200, b""),
        (200, b""),
    ]
    assert answers[-1].header("content-length") == str((www_site.public / "big.bin").stat().st_size)
    lines = [line.split(" [")[0] + line.split("]")[1] for line in log.getvalue().splitlines()]
    assert [line.split('"')[1] for line in lines] == [
        "GET /sub/ HTTP/1.1",
        "GET /small.txt HTTP/1.1",
        "GET /sm%61ll.txt?x=1&y=/;:@ HTTP/1.1",
        "GET /a%2520b.txt HTTP/1.1",
        "GET /sp%20ace.txt HTTP/1.1",
        "GET /missing.txt HTTP/1.1",
        "HEAD /small.txt HTTP/1.1",
        "HEAD /big.bin HTTP/1.1",
    ]
    assert all(line.endswith('"http://r/" "ua"') for line in lines)


@pytest.mark.parametrize(
    ("target", "status"),
    [
        ("/" + "x" * 8191, 414),
        ("/sm all.txt", 400),
        ("/small.txt#frag", 200),
        ("http://localhost/small.txt", 200),
        ("/caf\u00e9.txt", 400),
    ],
    ids=["too-long", "space", "fragment", "absolute", "latin1"],
)
async def test_a_target_not_plain_in_a_known_block_is_parsed(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, target: str, status: int
) -> None:
    """A known block with a target the split does not take is parsed, and answered as the parser
    and the core say (the long one, a read over a parse slice, from the backlog)."""
    reader, writer = await www_site.open()
    try:
        writer.write(get("/small.txt"))
        await read_response(reader)
        fed = watch_feeds(monkeypatch)
        data = get(target)
        writer.write(data)
        answer = await read_response(reader)
    finally:
        await close_writer(writer)
    from aiosendfile._serve._reader import PARSE_SLICE

    assert fed == ([data] if len(data) <= PARSE_SLICE else [])
    assert answer.status == status


async def test_behind_a_password_no_block_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a gate, what a head is allowed depends on its target too (``public_read`` reads, an
    upload's resource): no block is kept, and each new target is parsed and judged."""
    import base64

    from aiosendfile._serve import _auth

    fed = watch_feeds(monkeypatch)
    users = (_auth.parse_entry("bob:pw"),)
    fields = "Authorization: Basic " + base64.b64encode(b"bob:pw").decode() + "\r\n"
    async with serving(tmp_path, auth=users, public_read=True) as www_site:
        assert blocks_of(www_site) is None
        reader, writer = await www_site.open()
        try:
            for target in ("/small.txt", "/sub/", "/sp%20ace.txt"):
                writer.write(get(target, fields))
                assert (await read_response(reader)).status == 200
        finally:
            await close_writer(writer)
    assert len(fed) == 3


async def test_the_blocks_stay_bounded_under_100000_distinct_blocks(tmp_path: Path) -> None:
    """A peer that sends a new block with each head (a new User-Agent each time, near the longest a
    memoised head may be): at most BLOCKS_ENTRIES blocks and BLOCKS_MAX_BYTES of charges, and a
    block is known again only while held."""
    from aiosendfile._serve._protocol import Exchange
    from aiosendfile._serve._server import (
        BLOCKS_ENTRIES,
        BLOCKS_MAX_BYTES,
        HEADS_MAX_KEY,
        Engine,
        ServeConfig,
    )

    engine = Engine(ServeConfig(str(tmp_path)), asyncio.get_running_loop())
    try:
        assert engine.blocks is not None
        for i in range(100_000):
            agent = b"%d" % i * (1 + i % 300)
            data = get("/x")[:-2] + b"User-Agent: " + agent[: HEADS_MAX_KEY - 60] + b"\r\n\r\n"
            engine.learn(data, Exchange(b"GET", b"/x", 1, None, ("1.1", None, agent, None)))
            assert len(engine.blocks) <= BLOCKS_ENTRIES
            assert engine.blocks.size <= BLOCKS_MAX_BYTES
            parsed = (b"GET", b"/y", 1, ("1.1", None, agent, None), None, None)
            assert engine.head_like(data.replace(b"/x", b"/y", 1)) == parsed
        assert len(engine.blocks) > BLOCKS_ENTRIES // 4
        assert engine.head_like(get("/y")[:-2] + b"User-Agent: 0\r\n\r\n") is None  # (long evicted)
    finally:
        engine.stop()
