"""The native engine's HTTP/1.1 protocol (``aiosendfile._serve``), on raw sockets, on both loops.

Keep-alive, pipelining in order, HTTP/1.0, 405, ``Expect: 100-continue``, request bodies on
``GET``, absolute-form targets, the limits (414, 431, 400 then close), the header and keep-alive
timeouts, the ``Date`` format, the access log, a client vanishing mid-file, TLS, Unix sockets and
a graceful shutdown. What the core decides (ranges, preconditions, paths) is the cross-door
tests'; here it only has to arrive intact.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import io
import logging
import os
import re
import socket
import ssl
import struct
import sys
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest

from ..support.files import CHANGES, change_file, pattern
from ..support.raw_http import read_to_eof
from ..support.serve_site import (
    BIG,
    SMALL,
    Site,
    at_eof,
    build,
    close_writer,
    engine,
    get,
    read_answer,
    reported,
    serving,
    split_answers,
)
from ..support.tls_duplex import TLSDuplex
from ..support.waiting import until

pytest.importorskip("httptools")


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    async with serving(tmp_path) as s:
        yield s


# -- reading answers -----------------------------------------------------------------------------


# -- keep-alive, pipelining, versions -----------------------------------------------------------


async def test_keep_alive_answers_many_requests_on_one_connection(site: Site) -> None:
    small = (site.root / "small.txt").read_bytes()
    reader, writer = await site.open()
    try:
        for _ in range(3):  # the first goes through the core, the next from the memo
            writer.write(get("/small.txt"))
            a = await read_answer(reader)
            assert (a.status, a.body) == (200, small)
            assert "connection" not in a.headers  # HTTP/1.1 keep-alive, as aiohttp answers
            assert a.headers["server"] == "aiosendfile"
            assert a.headers["content-length"] == str(SMALL)
        writer.write(get("/big.bin"))
        a = await read_answer(reader)
        assert (a.status, a.body) == (200, (site.root / "big.bin").read_bytes())
        writer.write(get("/small.txt", method="HEAD"))
        a = await read_answer(reader, "HEAD")
        assert (a.status, a.headers["content-length"]) == (200, str(SMALL))
    finally:
        await close_writer(writer)


async def test_pipelined_requests_are_answered_in_order(site: Site) -> None:
    root = site.root
    requests = [
        ("GET", "/small.txt", ""),
        ("GET", "/big.bin", ""),
        ("HEAD", "/big.bin", ""),
        ("GET", "/missing", ""),
        ("GET", "/sub/", ""),
        ("HEAD", "/small.txt", ""),
        ("GET", "/big.bin", ""),
        ("GET", "/small.txt", "Connection: close\r\n"),
        ("GET", "/small.txt", ""),  # after Connection: close: never answered
    ]
    data = b"".join(get(target, extra, method) for method, target, extra in requests)
    reader, writer = await site.open()
    try:
        writer.write(data)
        raw = await asyncio.wait_for(read_to_eof(reader), 30)
    finally:
        await close_writer(writer)
    answers = split_answers(raw, [m for m, _, _ in requests[:-1]])
    small, big = (root / "small.txt").read_bytes(), (root / "big.bin").read_bytes()
    assert [a.status for a in answers] == [200, 200, 200, 404, 200, 200, 200, 200]
    assert [answers[0].body, answers[1].body, answers[6].body] == [small, big, big]
    assert (answers[2].headers["content-length"], answers[2].body) == (str(BIG), b"")
    assert answers[3].body == b"404: Not Found"
    assert answers[4].body == b"<p>index</p>"
    assert (answers[7].headers["connection"], answers[7].body) == ("close", small)


async def test_a_long_pipeline_of_small_files(site: Site) -> None:
    """More requests than wait before reading pauses, arriving in one write."""
    reader, writer = await site.open()
    try:
        writer.write(get("/small.txt"))  # warm: later ones take the memo
        await read_answer(reader)
        writer.write(get("/small.txt") * 100 + get("/big.bin") + get("/small.txt") * 100)
        for i in range(201):
            a = await read_answer(reader)
            assert a.status == 200
            assert len(a.body) == (BIG if i == 100 else SMALL)
    finally:
        await close_writer(writer)


async def test_http_10_closes_unless_asked_to_keep_alive(site: Site) -> None:
    raw = await site.exchange(b"GET /small.txt HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs no Host
    (a,) = split_answers(raw, ["GET"])
    assert (a.status, a.headers["connection"]) == (200, "close")
    assert a.head.startswith(b"HTTP/1.1 200 OK\r\n")  # the server's version, as nginx answers
    reader, writer = await site.open()
    try:
        for _ in range(2):
            writer.write(get("/small.txt", "Connection: keep-alive\r\n", version="1.0"))
            a = await read_answer(reader)
            assert (a.status, a.headers["connection"]) == (200, "keep-alive")
    finally:
        await close_writer(writer)


async def test_connection_close_closes_after_the_answer(site: Site) -> None:
    for target in ("/small.txt", "/big.bin", "/missing"):
        raw = await site.exchange(get(target, "Connection: close\r\n"))
        (a,) = split_answers(raw, ["GET"])
        assert a.headers["connection"] == "close"


async def test_other_methods_get_405_with_allow(site: Site) -> None:
    reader, writer = await site.open()
    try:
        for method, target in [("DELETE", "/small.txt"), ("POST", "/small.txt"), ("OPTIONS", "*")]:
            writer.write(get(target, "Content-Length: 0\r\n", method))
            a = await read_answer(reader)
            assert a.status == 405
            assert a.headers["allow"] == "GET,HEAD"
            assert a.body == b"405: Method Not Allowed"
    finally:
        await close_writer(writer)


# -- Expect, request bodies, targets -----------------------------------------------------------


async def test_expect_100_continue_then_the_answer(site: Site) -> None:
    reader, writer = await site.open()
    try:
        writer.write(get("/small.txt", "Expect: 100-continue\r\nContent-Length: 5\r\n"))
        a = await read_answer(reader)
        assert a.head == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        a = await read_answer(reader)
        assert (a.status, len(a.body)) == (200, SMALL)
        writer.write(get("/small.txt"))  # the body was read: the connection goes on
        assert (await read_answer(reader)).status == 200
    finally:
        await close_writer(writer)


async def test_expect_on_a_refused_method_answers_at_once_and_closes(site: Site) -> None:
    reader, writer = await site.open()
    try:
        writer.write(get("/small.txt", "Expect: 100-continue\r\nContent-Length: 100000\r\n", "PUT"))
        a = await read_answer(reader)  # no 100 (Continue): the final answer, body never sent
        assert (a.status, a.headers["connection"]) == (405, "close")
        assert await at_eof(reader)
    finally:
        await close_writer(writer)


async def test_an_unknown_expectation_is_417(site: Site) -> None:
    raw = await site.exchange(get("/small.txt", "Expect: teapot\r\n"))
    (a,) = split_answers(raw, ["GET"])
    assert (a.status, a.headers["connection"]) == (417, "close")


@pytest.mark.parametrize(
    "body",
    [
        b"Content-Length: 11\r\n\r\nhello world",
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_body_on_get_is_read_and_dropped(site: Site, body: bytes) -> None:
    reader, writer = await site.open()
    try:
        head = get("/small.txt")[:-2]  # without the blank line: the body's fields follow
        writer.write(head + body + get("/small.txt", method="HEAD"))
        a = await read_answer(reader)
        assert (a.status, len(a.body)) == (200, SMALL)
        a = await read_answer(reader, "HEAD")  # the body was not taken for a request
        assert a.status == 200
    finally:
        await close_writer(writer)


async def test_absolute_form_query_and_percent_decoding(site: Site) -> None:
    reader, writer = await site.open()
    try:
        for target, body in [
            ("http://localhost/small.txt", (site.root / "small.txt").read_bytes()),
            ("http://example.com:8080/sp%20ace.txt?x=1", b"space"),
            ("/small.txt?a=b&c=%2F", (site.root / "small.txt").read_bytes()),
            ("/sp%20ace.txt", b"space"),
            ("/a%2520b.txt", b"literal percent"),  # decoded once: the file is named a%20b.txt
            ("/small.txt#frag", (site.root / "small.txt").read_bytes()),  # a fragment is no part of it
            ("/sp%20ace.txt?q#f?g", b"space"),
        ]:
            writer.write(get(target))
            a = await read_answer(reader)
            assert (a.status, a.body) == (200, body), target
    finally:
        await close_writer(writer)


# -- limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (get("/" + "a" * 9000), 414),
        (get("/small.txt", "X-Big: " + "b" * 20000 + "\r\n"), 431),
        (get("/small.txt", "Range: bytes=" + "0-," * 3000 + "0-\r\n"), 431),  # one field over 8190
        (get("/small.txt", "".join(f"X-{i}: {'c' * 100}\r\n" for i in range(200))), 431),
        (b"GET /small.txt HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 40, 400),  # a TLS hello
        (b"GET /small.txt HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /small.txt HTTP/1.1\r\n\r\n", 400),  # RFC 9112 3.2: HTTP/1.1 needs a Host
        (b"GET /small.txt HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n", 400),  # and none has two
    ],
    ids=[
        "url",
        "one-header",
        "one-field",
        "many-headers",
        "malformed",
        "tls-hello",
        "two-lengths",
        "asterisk",
        "no-host",
        "two-hosts",
    ],
)
async def test_limits_and_garbage_are_answered_then_closed(site: Site, data: bytes, status: int) -> None:
    reader, writer = await site.open()
    try:
        writer.write(data + get("/small.txt"))  # nothing after the error is answered
        raw = await asyncio.wait_for(read_to_eof(reader), 20)
    finally:
        await close_writer(writer)
    (a,) = split_answers(raw, ["GET"])
    assert (a.status, a.headers["connection"]) == (status, "close")


async def test_an_error_after_pipelined_requests_comes_after_their_answers(site: Site) -> None:
    reader, writer = await site.open()
    try:
        writer.write(get("/big.bin") + get("/small.txt") + b"NOT HTTP\r\n\r\n")
        raw = await asyncio.wait_for(read_to_eof(reader), 20)
    finally:
        await close_writer(writer)
    answers = split_answers(raw, ["GET", "GET", "GET"])
    assert [a.status for a in answers] == [200, 200, 400]
    assert len(answers[0].body) == BIG


# -- timeouts -------------------------------------------------------------------------------------


async def test_a_slow_head_gets_408_and_is_closed(tmp_path: Path) -> None:
    async with serving(tmp_path, header_timeout=0.2) as site:
        reader, writer = await site.open()
        try:
            writer.write(b"GET /small.txt HTTP/1.1\r\nHost: x\r\n")  # never finished
            raw = await asyncio.wait_for(read_to_eof(reader), 20)
        finally:
            await close_writer(writer)
    (a,) = split_answers(raw, ["GET"])
    assert (a.status, a.headers["connection"]) == (408, "close")


async def test_a_silent_new_connection_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    async with serving(tmp_path, header_timeout=0.2) as site:
        reader, writer = await site.open()
        try:
            assert await at_eof(reader)  # nothing sent, nothing to answer: closed silently
        finally:
            await close_writer(writer)


async def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path) -> None:
    async with serving(tmp_path, keepalive_timeout=0.2) as site:
        reader, writer = await site.open()
        try:
            writer.write(get("/small.txt"))
            assert (await read_answer(reader)).status == 200
            assert await at_eof(reader)
        finally:
            await close_writer(writer)


# -- the heads memo: a read that is a request parsed before is not parsed again ----------------------


def heads_of(site: Site) -> Any:
    return engine()._engines[site.server].heads


async def test_a_plain_request_is_parsed_once_then_its_head_is_recognised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same plain request three times on one connection (``Accept: */*`` is plain: only JSON
    in it is read): parsed once, answered three times alike, logged three times alike (the
    Referer and User-Agent come back from the memo)."""
    from aiosendfile._serve import _protocol

    fed: list[bytes] = []
    real = _protocol.HttpProtocol._feed

    def feed(self: Any, data: Any) -> None:
        fed.append(bytes(data))
        real(self, data)

    monkeypatch.setattr(_protocol.HttpProtocol, "_feed", feed)
    log = io.StringIO()
    plain = get("/small.txt", "Referer: http://r/\r\nUser-Agent: ua\r\nAccept: */*\r\n")  # (curl's)
    async with serving(tmp_path, access_log=log) as site:
        small = (site.root / "small.txt").read_bytes()
        reader, writer = await site.open()
        try:
            answers = []
            for _ in range(3):
                writer.write(plain)
                answers.append(await read_answer(reader))
        finally:
            await close_writer(writer)
        assert plain in heads_of(site)
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
        (get("/small.txt", "Connection: close\r\n"), ["GET"]),
        (get("/small.txt", version="1.0"), ["GET"]),
        (get("/small.txt")[:-2] + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", ["GET"]),
        (get("/small.txt", "Expect: 100-continue\r\n"), ["HEAD", "GET"]),  # (the 100 has no body)
        (get("/small.txt", "X-Long: " + "x" * 2100 + "\r\n"), ["GET"]),
        (get("/small.txt", method="POST"), ["POST"]),
    ],
    ids=["pipelined", "range", "json", "close", "http10", "chunked", "expect", "long", "post"],
)
async def test_what_the_heads_memo_never_holds(site: Site, data: bytes, methods: list[str]) -> None:
    """Two requests in one read, a request with fields the core reads, one that closes, one with a
    body's framing or an expectation, a head over HEADS_MAX_KEY, a method other than GET or HEAD:
    parsed every time, never remembered."""
    for _ in range(2):
        reader, writer = await site.open()
        try:
            writer.write(data)
            for method in methods:
                await read_answer(reader, method)
        finally:
            await close_writer(writer)
    assert len(heads_of(site)) == 0


async def test_a_known_head_arriving_inside_a_request_is_parsed_as_part_of_it(site: Site) -> None:
    """A read equal to a known head, while the parser is inside another request's head, is that
    request's continuation (here a header's value), not a request of its own."""
    known = get("/small.txt")
    reader, writer = await site.open()
    try:
        writer.write(known)
        await read_answer(reader)
        assert known in heads_of(site)
        writer.write(b"GET /sub/ HTTP/1.1\r\nX-Pad: ")
        await asyncio.sleep(0.1)  # (two reads)
        writer.write(known)  # the value "GET /small.txt HTTP/1.1", then Host: the request ends
        a = await read_answer(reader)
        assert (a.status, a.body) == (200, b"<p>index</p>")
        writer.write(known)
        assert (await read_answer(reader)).body == (site.root / "small.txt").read_bytes()
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
            engine.learn(data, Exchange(b"GET", bytes(url), 1, None, ("1.1", None, bytes(agent))))
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert engine.heads.size <= HEADS_MAX_BYTES
        assert held <= 1.25 * HEADS_MAX_BYTES, f"{held / 2**20:.1f} MiB held"
    finally:
        engine.stop()


# -- the loop's iteration budget: answering stops when an iteration's time is spent --------------------


class _Transport:
    """Enough of a transport for a protocol driven by hand: what it was given, and whether it reads."""

    def __init__(self, tls: bool = False) -> None:
        self.data = b""
        self.reading = True
        self.extra = {"sslcontext": object()} if tls else {}

    def write(self, data: bytes) -> None:
        self.data += data

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        pass


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_requests_past_the_iterations_budget_wait_for_the_next_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls: bool
) -> None:
    """With the budget spent at once, each iteration answers one request: the first read is
    answered, the others wait and are answered in the following iterations, each whole. A held
    read leaves reading on, over TLS too (an end of stream waits in eof_received); a backlog
    pauses it. Reading is on for all once all is answered."""
    mod = engine()
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    root = build(tmp_path / "www")
    small = (root / "small.txt").read_bytes()
    eng = mod.Engine(mod.ServeConfig(str(root)), asyncio.get_running_loop())
    try:
        # (warm: the first sight of a path is decided in the cold pool)
        warm = eng.protocol()
        warm.connection_made(_Transport())
        warm.data_received(get("/small.txt"))
        for _ in range(200):
            if warm.transport.data:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        protocols = [eng.protocol() for _ in range(3)]
        transports = [_Transport(tls) for _ in protocols]
        for p, t in zip(protocols, transports, strict=True):
            p.connection_made(t)
        flood = get("/small.txt") * 300  # past PARSE_SLICE
        for p, data in zip(protocols, [get("/small.txt"), get("/small.txt"), flood], strict=True):
            p.data_received(data)
        assert [bool(t.data) for t in transports] == [True, False, False]
        assert [t.reading for t in transports] == [True, True, False]
        answered = []
        for _ in range(50):
            await asyncio.sleep(0)
            answered.append(sum(1 for t in transports[:2] if t.data))
            if all(t.data.count(small) == n for t, n in zip(transports, [1, 1, 300], strict=True)):
                break
        assert answered[0] == 2  # the second read: answered in the next iteration
        assert [t.data.count(small) for t in transports] == [1, 1, 300]
        assert [t.data.count(b"HTTP/1.1 200 OK\r\n") for t in transports] == [1, 1, 300]
        assert all(t.reading for t in transports)
        for p in [warm, *protocols]:
            p.connection_lost(None)
    finally:
        eng.stop()


async def _warmed(site: Site) -> bytes:
    """small.txt asked for once, so that it is memoised (a first sight is decided in the cold
    pool); its bytes."""
    small = (site.root / "small.txt").read_bytes()
    reader, writer = await site.open()
    writer.write(get("/small.txt"))
    assert (await read_answer(reader)).body == small
    await close_writer(writer)
    return small


async def _holding(eng: Any, n: int) -> None:
    """Wait (up to 2 s) until the engine holds exactly *n* connections."""
    for _ in range(200):
        if len(eng.connections) == n:
            break
        await asyncio.sleep(0.01)


async def _connected(site: Site, eng: Any, n: int) -> list[socket.socket]:
    """*n* blocking client sockets, once the engine holds exactly *n* connections (the warm-up's
    is gone)."""
    clients = [socket.create_connection((site.host, site.port)) for _ in range(n)]
    await _holding(eng, n)
    return clients


async def test_connections_ready_together_are_answered_one_per_iteration_when_the_budget_is_spent(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over real sockets: three connections whose requests arrive in one iteration, with the budget
    spent at once, are answered in three iterations, each answer whole."""
    mod = engine()
    from aiosendfile._serve import _protocol

    eng = mod._engines[site.server]
    iteration = [0]
    at: list[int] = []
    real_over, real_known = mod.Engine._iteration_over, _protocol.HttpProtocol._known

    def over(self: Any) -> None:
        iteration[0] += 1
        real_over(self)

    def known(self: Any, *args: Any) -> bool:  # (every answer of a memoised file, straight or not)
        at.append(iteration[0])
        return bool(real_known(self, *args))

    small = await _warmed(site)
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    monkeypatch.setattr(mod.Engine, "_iteration_over", over)
    monkeypatch.setattr(_protocol.HttpProtocol, "_known", known)
    clients = await _connected(site, eng, 3)
    try:
        for c in clients:  # (the loop does not run in between: the three reads are ready together)
            c.sendall(get("/small.txt"))
        for _ in range(200):
            if len(at) == 3:
                break
            await asyncio.sleep(0.005)
        assert len(set(at)) == 3, at
        for c in clients:
            c.settimeout(10)
            data = b""
            while not data.endswith(small):
                chunk = c.recv(65536)
                assert chunk
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 OK\r\n")
            assert data.count(small) == 1
    finally:
        for c in clients:
            c.close()


async def test_a_request_then_end_of_stream_is_answered_when_its_turn_comes(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients that send a request and half-close (``nc``, health checks), with the iteration's
    budget spent at once: each request is answered in its turn, then the connection closes (the
    end of stream is not read before the request is answered)."""
    mod = engine()
    eng = mod._engines[site.server]
    small = await _warmed(site)
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    clients = await _connected(site, eng, 4)
    try:
        for c in clients:
            c.sendall(get("/small.txt"))
            c.shutdown(socket.SHUT_WR)
        for c in clients:
            c.setblocking(False)
        got = [b""] * 4
        done = [False] * 4
        for _ in range(400):
            await asyncio.sleep(0.005)
            for i, c in enumerate(clients):
                while not done[i]:
                    try:
                        chunk = c.recv(65536)
                    except BlockingIOError:
                        break
                    if not chunk:
                        done[i] = True
                    got[i] += chunk
            if all(done):
                break
        assert done == [True] * 4
        assert [g.count(small) for g in got] == [1] * 4
    finally:
        for c in clients:
            c.close()


async def test_end_of_stream_waits_for_the_answers_over_a_unix_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above over a Unix socket, with a large body asked for too: every request is answered
    whole before the connection closes."""
    mod = engine()
    async with serving(tmp_path, kind="unix") as site:
        eng = mod._engines[site.server]
        small = await _warmed(site)
        big = (site.root / "big.bin").read_bytes()
        monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
        conns = [await site.open() for _ in range(4)]
        await _holding(eng, 4)
        try:
            for i, (_, writer) in enumerate(conns):
                writer.write(get("/big.bin" if i == 3 else "/small.txt"))
                writer.write_eof()
            raws = [await asyncio.wait_for(read_to_eof(reader), 20) for reader, _ in conns]
        finally:
            for _, writer in conns:
                await close_writer(writer)
    answers = [split_answers(raw, ["GET"]) for raw in raws]
    assert [[a.body for a in got] for got in answers] == [[small], [small], [small], [big]]


def _ask_then_end(host: str, port: int, ctx: ssl.SSLContext, request: bytes, close_notify: bool) -> bytes:
    """(A blocking TLS client, for a thread.) Send *request*, then end: our ``close_notify``
    (*close_notify*) or a bare end of stream, with no ``close_notify`` (a half-close); what the
    server answers, to its end.

    TLS runs over memory BIOs (:class:`TLSDuplex`): OpenSSL's shutdown, called on a socket, also
    reads, and fails with ``APPLICATION_DATA_AFTER_CLOSE_NOTIFY`` when the server's answer is
    already there (a race the test once lost)."""
    with TLSDuplex(socket.create_connection((host, port), timeout=20), ctx) as tls:
        tls.sendall(request)
        if close_notify:
            tls.close_notify()  # (the server's comes after its answer)
        else:
            tls.raw.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := tls.recv(65536):
            got += chunk
        return got


@pytest.mark.parametrize("close_notify", [True, False], ids=["close_notify", "half_close"])
async def test_end_of_stream_over_tls_waits_for_the_answers(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tls_ca: Any,
    tls_client_ctx: ssl.SSLContext,
    close_notify: bool,
) -> None:
    """Over TLS as over TCP: clients that send a request then end (a ``close_notify``, or a bare
    half-close: the context ``serve`` makes lets OpenSSL take it as an end of stream), with the
    iteration's budget spent at once, get every answer whole in its turn, then the server's end;
    nothing is logged, and the server goes on answering others."""
    from aiosendfile._cli._serve_run import tls_context

    cert = tls_ca.issue_cert("localhost", "127.0.0.1")
    with cert.private_key_pem.tempfile() as key, cert.cert_chain_pems[0].tempfile() as chain:
        server_ctx = tls_context(argparse.Namespace(tls_cert=chain, tls_key=key))
    mod = engine()
    async with serving(tmp_path, tls=(server_ctx, tls_client_ctx)) as site:
        eng = mod._engines[site.server]
        small = await _warmed(site)
        big = (site.root / "big.bin").read_bytes()
        monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
        targets = ["/small.txt", "/small.txt", "/small.txt", "/big.bin"]
        with caplog.at_level(logging.WARNING):
            raws = await asyncio.gather(
                *(
                    asyncio.to_thread(
                        _ask_then_end, site.host, site.port, tls_client_ctx, get(t), close_notify
                    )
                    for t in targets
                )
            )
            await _holding(eng, 0)
            assert not eng.connections
            monkeypatch.setattr(mod, "ITERATION_BUDGET", 0.0005)
            assert (await site.exchange(get("/small.txt", "Connection: close\r\n"))).endswith(small)
    answers = [split_answers(raw, ["GET"]) for raw in raws]
    assert [[a.body for a in got] for got in answers] == [[small], [small], [small], [big]]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_connection_that_ends_is_closed_once(
    tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """asyncio's TLS transport tears its TLS layer down at a second ``close()`` (its
    ``get_write_buffer_size()`` then raises AttributeError until ``connection_lost``): a
    connection that ends is closed once, however often it goes on before it is gone, and the
    engine's timer finds it whole (it once raised in the timer, in CI)."""
    mod = engine()
    async with serving(tmp_path, tls=(tls_server_ctx, tls_client_ctx)) as site:
        eng = mod._engines[site.server]
        _, writer = await site.open()
        await _holding(eng, 1)
        (conn,) = eng.connections
        conn.dead = True
        conn._resume()  # (closes it: dead, nothing in flight)
        conn._resume()  # (goes on again before connection_lost: a read held for a turn, ...)
        conn.expire(eng.now, eng.config)
        await close_writer(writer)
        await _holding(eng, 0)


async def test_a_slow_head_gets_408_also_while_the_iterations_budget_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head's later bytes arriving while the iteration's budget is spent wait for a turn, and
    do not restart the header timeout (a slowloris client is still cut when the server is busy)."""
    mod = engine()
    monkeypatch.setattr(mod, "ITERATION_BUDGET", -1.0)
    root = build(tmp_path / "www")
    config = mod.ServeConfig(str(root), header_timeout=1.0)
    eng = mod.Engine(config, asyncio.get_running_loop())
    try:
        other, slow = eng.protocol(), eng.protocol()
        other.connection_made(_Transport())
        slow.connection_made(t := _Transport())
        await asyncio.sleep(0)
        slow.data_received(b"GET /small.txt HTTP/1.1\r\n")  # (the first read of this iteration)
        began = slow.since
        for _ in range(3):
            await asyncio.sleep(0)
            eng.now += 0.4  # (time passes; the engine's clock is its timer's)
            other.data_received(b"\r\n")  # opens this iteration's window and spends it
            slow.data_received(b"X-Slow: x\r\n")  # held for a turn
            assert slow.held is not None or slow.backlog
        assert slow.since == began
        slow.expire(eng.now, config)
        assert t.data.startswith(b"HTTP/1.1 408 ")
        for p in (other, slow):
            p.connection_lost(None)
    finally:
        eng.stop()


async def test_stock_asyncio_answers_for_half_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock asyncio runs the turns deferred from one iteration before the next one's timers (a
    sleeping task waits through two batches; uvloop runs timers first): the connections answer
    for half the budget there. An iteration whose answers took 0.3 ms is spent on asyncio only."""
    mod = engine()
    eng = mod.Engine(mod.ServeConfig(str(build(tmp_path / "www"))), asyncio.get_running_loop())
    try:
        stock = isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)
        clock = [100.0]
        monkeypatch.setattr(mod.time, "perf_counter", lambda: clock[0])
        assert not eng.spent()  # (opens the iteration)
        clock[0] += 0.0003
        assert eng.spent() is stock
        clock[0] += 0.0003
        assert eng.spent()
    finally:
        eng.stop()


# -- Date, access log -----------------------------------------------------------------------------


async def test_date_is_an_imf_fixdate(site: Site) -> None:
    raw = await site.exchange(get("/small.txt", "Connection: close\r\n"))
    (a,) = split_answers(raw, ["GET"])
    date = a.headers["date"]
    day, month = "(Mon|Tue|Wed|Thu|Fri|Sat|Sun)", "(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    assert re.fullmatch(rf"{day}, \d\d {month} \d{{4}} \d\d:\d\d:\d\d GMT", date), date
    assert parsedate_to_datetime(date).tzinfo is not None


async def test_access_log_lines_are_combined_log_format(tmp_path: Path) -> None:
    log = io.StringIO()
    async with serving(tmp_path, access_log=log) as site:
        reader, writer = await site.open()
        try:
            writer.write(get("/small.txt", 'Referer: http://r/\r\nUser-Agent: t"est\xe9\r\n'))
            await read_answer(reader)
            writer.write(get("/small.txt", method="HEAD"))
            await read_answer(reader, "HEAD")
            writer.write(get("/big.bin?q=1"))
            await read_answer(reader)
            writer.write(get("/missing", "Connection: close\r\n"))
            await read_answer(reader)
        finally:
            await close_writer(writer)
    lines = log.getvalue().splitlines()
    stamp = r"\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000\]"
    assert len(lines) == 4, lines
    assert re.fullmatch(
        rf'127\.0\.0\.1 - - {stamp} "GET /small\.txt HTTP/1\.1" 200 4096 "http://r/" "t\\x22est\\xE9"',
        lines[0],
    ), lines[0]
    assert re.fullmatch(rf'127\.0\.0\.1 - - {stamp} "HEAD /small\.txt HTTP/1\.1" 200 - "-" "-"', lines[1])
    assert re.fullmatch(
        rf'127\.0\.0\.1 - - {stamp} "GET /big\.bin\?q=1 HTTP/1\.1" 200 {BIG} "-" "-"', lines[2]
    )
    assert re.fullmatch(rf'127\.0\.0\.1 - - {stamp} "GET /missing HTTP/1\.1" 404 14 "-" "-"', lines[3])


# -- a client that vanishes, shutdown ---------------------------------------------------------------


async def _reset_mid_body(site: Site, requests: bytes) -> None:
    """A client with a 4 KiB window sends *requests*, reads 10,000 bytes, and resets (RST)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (site.host, site.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(requests)
    await reader.readexactly(10000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST mid-body


async def test_a_client_vanishing_mid_file_leaves_nothing_behind(site: Site) -> None:
    """The fd and loop guards of the conftest check that nothing leaked or was reported."""
    for _ in range(3):
        await _reset_mid_body(site, get("/big.bin") + get("/big.bin"))
    raw = await site.exchange(get("/small.txt", "Connection: close\r\n"))
    assert split_answers(raw, ["GET"])[0].status == 200


async def test_cold_chunks_go_through_the_pool_in_order_and_vanishing_leaves_nothing(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every chunk probed cold: the outlet sends each from the cold pool. Pipelined answers around
    a big file are byte-exact; a client gone while a pool thread sends leaves no fd behind (the fd
    guard) and nothing reported (the loop guard)."""
    from aiosendfile import _outlet, _platform

    monkeypatch.setattr(_outlet, "_is_cold", lambda *args: True)
    small, big = (site.root / "small.txt").read_bytes(), (site.root / "big.bin").read_bytes()
    before = _platform.counters.cold
    raw = await site.exchange(
        get("/small.txt") + get("/big.bin") + get("/small.txt", "Connection: close\r\n")
    )
    answers = split_answers(raw, ["GET"] * 3)
    assert [a.body for a in answers] == [small, big, small]
    assert _platform.counters.cold > before
    for _ in range(3):
        await _reset_mid_body(site, get("/big.bin"))
    raw = await site.exchange(get("/small.txt", "Connection: close\r\n"))
    assert split_answers(raw, ["GET"])[0].status == 200


async def test_shutdown_closes_idle_connections_and_finishes_answers_in_flight(tmp_path: Path) -> None:
    mod = engine()
    async with serving(tmp_path) as site:
        idle_r, idle_w = await site.open()
        idle_w.write(get("/small.txt"))
        await read_answer(idle_r)
        busy_r, busy_w = await site.open()
        busy_w.write(get("/big.bin"))
        head = await busy_r.readuntil(b"\r\n\r\n")  # the big answer has begun
        try:
            await mod.shutdown(site.server, 20.0)
            assert await at_eof(idle_r)
            body = await asyncio.wait_for(busy_r.readexactly(BIG), 20)
            assert head.startswith(b"HTTP/1.1 200")
            assert body == (site.root / "big.bin").read_bytes()
            assert await at_eof(busy_r)
        finally:
            await close_writer(idle_w)
            await close_writer(busy_w)


def _stop_when_made(monkeypatch: pytest.MonkeyPatch, server: Any) -> list[asyncio.Task[None]]:
    """Begin stopping *server* from each protocol's connection_made (after it, before the
    set-up task resumes); the stops begun, in a list."""
    from aiosendfile._serve import _protocol

    mod = engine()
    stops: list[asyncio.Task[None]] = []
    made = _protocol.HttpProtocol.connection_made

    def made_then_stop(self: Any, transport: Any) -> None:
        made(self, transport)
        stops.append(asyncio.ensure_future(mod.shutdown(server, 30.0)))

    monkeypatch.setattr(_protocol.HttpProtocol, "connection_made", made_then_stop)
    return stops


@pytest.mark.parametrize(
    "moment", ["before its set-up starts", "before connection_made", "after connection_made"]
)
async def test_a_stop_during_a_connections_set_up_closes_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """A stop that comes while a new connection is being set up (accepted, its
    connect_accepted_socket not finished) closes that connection at once, and leaks no socket.
    Each moment is made exact: the listener closed after the accept, before the set-up task's
    first step (its socket was left open: nothing had taken it over); the stop begun when the loop
    makes the protocol, before its connection_made (the connection came after the stop had closed
    the others, and stayed open, idle, until the stop's timeout); the stop begun from the
    protocol's connection_made, before the set-up task resumes (cancelling it there left uvloop's
    transport closed without connection_lost, and the stop waited its whole timeout)."""
    from aiosendfile._serve import _listener

    mod = engine()
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    server = await mod.start_server(mod.ServeConfig(directory=str(tmp_path)), sock=listening)
    eng = mod._engines[server]
    stops: list[asyncio.Task[None]] = []
    if moment == "before its set-up starts":
        attach = _listener.Listener._attach

        def close_then_attach(self: Any, conn: socket.socket) -> None:
            asyncio.get_running_loop().call_soon(self.close)  # (runs before the set-up's first step)
            attach(self, conn)

        monkeypatch.setattr(_listener.Listener, "_attach", close_then_attach)
    elif moment == "before connection_made":
        factory = server._factory

        def protocol_then_stop() -> Any:  # (called within connect_accepted_socket)
            stops.append(asyncio.ensure_future(mod.shutdown(server, 30.0)))  # (runs before connection_made)
            return factory()

        monkeypatch.setattr(server, "_factory", protocol_then_stop)
    else:
        stops = _stop_when_made(monkeypatch, server)
    client = socket.create_connection(listening.getsockname())
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        assert await asyncio.wait_for(loop.sock_recv(client, 1), 5) == b""  # closed by the server
        await asyncio.wait_for(stops[0] if stops else mod.shutdown(server, 30.0), 5)
        assert not eng.connections
    finally:
        client.close()
    gc.collect()  # (an accepted socket nobody closed would warn here: the test fails on warnings)


async def test_a_stop_right_after_a_tls_connection_is_made_closes_it_at_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
) -> None:
    """As above over TLS, the stop begun from the protocol's connection_made (right after the
    handshake): the connection is closed at once and the stop does not wait for it. The engine's
    timer ticks every half millisecond (a 2 ms send timeout; a header timeout would bound the
    handshake too), so that it looks at the connection while it closes. (When the engine used
    asyncio's TLS transport, the listener cancelled such a set-up as a handshake, and stock
    asyncio then closed the transport a second time, which dropped its TLS layer: the tick
    raised on its get_write_buffer_size().)"""
    mod = engine()
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    config = mod.ServeConfig(directory=str(tmp_path), send_timeout=0.002)
    server = await mod.start_server(config, sock=listening, ssl=tls_server_ctx)
    eng = mod._engines[server]
    stops = _stop_when_made(monkeypatch, server)
    reader, writer = await asyncio.open_connection(*listening.getsockname(), ssl=tls_client_ctx)
    try:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            assert await asyncio.wait_for(reader.read(), 5) == b""
        await asyncio.wait_for(stops[0], 5)
        assert not eng.connections
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


# -- transports ---------------------------------------------------------------------------------------


async def test_tls(tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext) -> None:
    async with serving(tmp_path, tls=(tls_server_ctx, tls_client_ctx)) as site:
        reader, writer = await site.open()
        try:
            writer.write(get("/small.txt") + get("/big.bin") + get("/missing"))
            answers = [await read_answer(reader) for _ in range(3)]
        finally:
            await close_writer(writer)
    assert [a.status for a in answers] == [200, 200, 404]
    assert answers[1].body == (site.root / "big.bin").read_bytes()


async def test_unix_socket(tmp_path: Path) -> None:
    async with serving(tmp_path, kind="unix") as site:
        raw = await site.exchange(get("/small.txt") + get("/big.bin", "Connection: close\r\n"))
    answers = split_answers(raw, ["GET", "GET"])
    assert [len(a.body) for a in answers] == [SMALL, BIG]


async def test_an_upgrade_request_is_answered_and_the_connection_closed(site: Site) -> None:
    upgrade = get("/small.txt", "Connection: Upgrade\r\nUpgrade: websocket\r\n")
    raw = await site.exchange(upgrade + b"\x81\x85not http at all")
    (a,) = split_answers(raw, ["GET"])
    assert (a.status, len(a.body)) == (200, SMALL)


# -- bugs are reported, never hidden behind a hung or short answer ----------------------------------


async def test_a_failing_core_gives_500_and_is_reported(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiosendfile._serve import _protocol

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("core bug")

    monkeypatch.setattr(_protocol, "answer", broken)
    monkeypatch.setattr(_protocol, "decide", broken)
    with reported() as errors:
        for target in ("/first-sight", "/first-sight"):  # in the cold pool, then inline
            raw = await site.exchange(get(target))
            (a,) = split_answers(raw, ["GET"])
            assert (a.status, a.headers["connection"]) == (500, "close")
    assert [type(e["exception"]) for e in errors] == [ZeroDivisionError] * 2


@pytest.mark.parametrize("error", [ZeroDivisionError, RuntimeError])
async def test_a_failing_body_send_aborts_the_connection_and_is_reported(
    site: Site, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    from aiosendfile import _outlet

    def broken(*args: Any, **kwargs: Any) -> int:
        raise error("send bug")  # a RuntimeError with the connection alive is a bug too

    monkeypatch.setattr(_outlet, "sendfile_once", broken)
    with reported() as errors:
        raw = await site.exchange(get("/big.bin"))  # aborted: no complete answer, no hang
    assert len(raw.partition(b"\r\n\r\n")[2]) < BIG
    assert [type(e["exception"]) for e in errors] == [error]


# -- the hot memo and the cold pool -----------------------------------------------------------------


async def test_a_changed_file_is_never_answered_from_the_memo(site: Site) -> None:
    path = site.root / "small.txt"
    reader, writer = await site.open()
    try:
        for _ in range(2):
            writer.write(get("/small.txt"))
            assert (await read_answer(reader)).body == path.read_bytes()
        path.write_bytes(b"rewritten in place")  # same inode, new size and mtime
        writer.write(get("/small.txt"))
        assert (await read_answer(reader)).body == b"rewritten in place"
        fresh = site.root / "fresh.tmp"
        fresh.write_bytes(b"renamed over it!!!")  # same size: another inode
        fresh.replace(path)
        writer.write(get("/small.txt"))
        assert (await read_answer(reader)).body == b"renamed over it!!!"
        path.unlink()
        writer.write(get("/small.txt"))
        assert (await read_answer(reader)).status == 404
    finally:
        await close_writer(writer)


@pytest.mark.parametrize("name", ["big.bin", "small.txt"])
@pytest.mark.parametrize("change", CHANGES)
async def test_a_changed_file_is_never_sent_from_the_answer_cache(site: Site, change: str, name: str) -> None:
    """A file's plain 200 is kept in the engine's answer cache without its body (a big file is
    opened again and checked by fstat each time; a small one's bytes are the hot-file cache's,
    checked by a stat of its path): whatever happens to the file between two requests, the answer
    is the new one."""
    path = site.root / name
    size = path.stat().st_size
    outside = site.root.parent / f"outside-{site.root.name}.bin"
    outside.write_bytes(pattern(size, seed=9))
    reader, writer = await site.open()
    try:
        for _ in range(3):  # decided, then answered from the cache
            writer.write(get("/" + name))
            first = await read_answer(reader)
            assert first.body == path.read_bytes()
        assert b"/" + name.encode() in engine()._engines[site.server].answers
        change_file(path, change, outside)
        expected = None if change in ("chmod", "symlink out") else path.read_bytes()
        writer.write(get("/" + name))
        a = await read_answer(reader)
        if change == "symlink out":
            assert a.status == 404
        elif change == "chmod" and os.geteuid() != 0:
            assert a.status == 403
        else:
            assert a.status == 200
            if expected is not None:
                assert a.body == expected
            assert a.headers["etag"] != first.headers["etag"]  # the fields describe the file as it is now
    finally:
        await close_writer(writer)
        outside.unlink()


@pytest.mark.parametrize("cached", [False, True], ids=["lookup-needs-disk", "lookup-cached"])
async def test_a_path_is_decided_in_the_cold_pool_at_first_sight_then_inline(
    site: Site, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """At first sight a path whose lookup would read the disk is looked up in the cold pool, once;
    one the kernel's caches hold (``open_cached``, ``lookup_cached``) is decided inline at once,
    with no hop."""
    from aiosendfile import _platform

    monkeypatch.setattr(_platform, "lookup_cached", lambda path: cached)
    real_open = _platform.open_cached
    if cached:  # (a name never looked up has no dentry yet: EAGAIN from the real call)
        monkeypatch.setattr(
            _platform, "open_cached", lambda path: real_open(path) if os.path.exists(path) else -errno.ENOENT
        )
    else:
        monkeypatch.setattr(_platform, "open_cached", lambda path: -errno.EAGAIN)
    engine_ = engine()._engines[site.server]
    pool = engine_.executor
    submitted: list[object] = []

    class Counting:
        def submit(self, fn: Any, *args: Any) -> Any:
            submitted.append(args[0].raw_path)
            return pool.submit(fn, *args)

    engine_.executor = Counting()
    reader, writer = await site.open()
    try:
        for target in ("/big.bin", "/big.bin", "/missing", "/missing", "/small.txt", "/small.txt"):
            writer.write(get(target))
            await read_answer(reader)
    finally:
        await close_writer(writer)
    assert submitted == ([] if cached else [b"/big.bin", b"/missing", b"/small.txt"])


@pytest.mark.parametrize("size", [1000, 200_000])
async def test_a_first_sight_is_opened_by_its_lookup_alone(
    site: Site, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A path's first sight whose lookup the kernel's caches hold is opened by that lookup
    (``open_cached``: ``openat2`` with ``RESOLVE_CACHED | RESOLVE_NO_SYMLINKS``): the core takes
    the descriptor and neither ``stat``s the path nor opens it again (nor reads where the
    descriptor leads). Byte-exact; a symlinked path still takes the checked open."""
    from aiosendfile import _platform
    from aiosendfile._static._fs import RealFS

    probe = _platform.open_cached("/")
    if probe is None:
        pytest.skip("no openat2(RESOLVE_CACHED) here")
    if probe >= 0:
        os.close(probe)
    body = pattern(size, seed=3)
    (site.root / "fresh.bin").write_bytes(body)
    (site.root / "linked.bin").symlink_to(site.root / "fresh.bin")
    for name in ("fresh.bin", "linked.bin"):
        os.stat(site.root / name)  # (its lookup cached, as after the pool's look)
    opened: list[str] = []
    stated: list[str] = []
    real_open, real_stat = RealFS.open_regular, RealFS.stat

    def open_regular(self: Any, path: str, *args: Any) -> Any:
        opened.append(os.path.basename(path))
        return real_open(self, path, *args)

    def stat(self: Any, path: str) -> Any:
        stated.append(os.path.basename(path))
        return real_stat(self, path)

    monkeypatch.setattr(RealFS, "open_regular", open_regular)
    monkeypatch.setattr(RealFS, "stat", stat)
    raw = await site.exchange(get("/fresh.bin", "Connection: close\r\n"))
    assert split_answers(raw, ["GET"])[0].body == body
    assert (opened, stated) == ([], [])
    raw = await site.exchange(get("/linked.bin", "Connection: close\r\n"))
    assert split_answers(raw, ["GET"])[0].body == body
    assert opened == ["linked.bin"]


async def test_the_engines_answers_are_not_tracked_by_the_garbage_collector(site: Site) -> None:
    """What the engine keeps of an answer is a tuple of atomic values: after the collector's first
    passes (the inner identity tuple, then the entry) it is no longer tracked, so a working set of
    thousands adds nothing to its passes."""
    import gc

    for name in ("small.txt", "big.bin"):
        raw = await site.exchange(get("/" + name, "Connection: close\r\n"))
        assert split_answers(raw, ["GET"])[0].body == (site.root / name).read_bytes()
    gc.collect()
    gc.collect()
    answers = engine()._engines[site.server].answers
    for key in (b"/small.txt", b"/big.bin"):
        known = answers.get(key)
        assert known is not None
        assert not gc.is_tracked(known), known


async def test_a_small_file_is_memoised_at_its_first_answer(site: Site) -> None:
    """A small file read into the hot-file cache by its first request is memoised by that request
    (before: only by the next, which found it in the hot cache; a working set larger than the hot
    cache was then never memoised and every request paid the whole decision)."""
    memo = engine()._engines[site.server].answers
    raw = await site.exchange(get("/small.txt", "Connection: close\r\n"))
    assert split_answers(raw, ["GET"])[0].body == (site.root / "small.txt").read_bytes()
    assert b"/small.txt" in memo


@pytest.mark.parametrize("size", [1000, 20_000])
async def test_a_full_hot_cache_sends_memoised_small_files_from_their_files(
    site: Site, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """With the hot-file cache full, a memoised small file dropped from it is sent from its file,
    byte-exact, and read back in only one time in ``READMIT_EVERY``: up to ``READ_MAX`` bytes
    read with one ``RWF_NOWAIT`` read and written from memory (no ``sendfile``), above it sent
    with ``sendfile``."""
    from aiosendfile import _outlet, _platform
    from aiosendfile._static import _hot

    names = [f"s{i}.txt" for i in range(6)]
    for i, name in enumerate(names):
        (site.root / name).write_bytes(pattern(size + i, seed=i))
    hot = _hot.HotFiles(max_entries=2)
    monkeypatch.setattr(_hot, "hot_files", hot)
    from aiosendfile._serve import _protocol

    monkeypatch.setattr(_protocol, "hot_files", hot)
    puts = []
    real_put = hot.put
    monkeypatch.setattr(hot, "put", lambda path, *a: puts.append(path) or real_put(path, *a))
    with open(site.root / names[0], "rb") as f:
        can_tell = _platform.read_nowait(f.fileno(), 1, 0) is not None  # (not where it is refused)
    reader, writer = await site.open()
    try:
        for turn in range(3):
            calls = _platform.counters.calls
            for name in names:
                writer.write(get("/" + name))
                assert (await read_answer(reader)).body == (site.root / name).read_bytes()
            if turn and can_tell:
                sendfiles = _platform.counters.calls - calls
                assert sendfiles == 0 if size <= _outlet.READ_MAX else sendfiles >= 3, (
                    sendfiles
                )  # (2 hot, 1 read back)
    finally:
        await close_writer(writer)
    assert len(hot._entries) == 2
    assert len(puts) <= len(names) + 1  # the first answers, then at most one read back in 12


async def test_a_file_truncated_while_sent_aborts_the_connection(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiosendfile import _outlet

    real = _outlet.sendfile_once

    def truncating(*args: Any, **kwargs: Any) -> int:
        (site.root / "big.bin").write_bytes(b"short")  # after the core's fstat: the length is promised
        return real(*args, **kwargs)

    monkeypatch.setattr(_outlet, "sendfile_once", truncating)
    with reported() as errors:
        raw = await site.exchange(get("/big.bin") + get("/small.txt"))
    body = raw.partition(b"\r\n\r\n")[2]
    assert len(body) < BIG  # never passed off as complete; nothing answered after it
    assert errors == []  # a file that shrank is no bug: one line in the log, no report


async def test_a_client_that_stops_reading_a_file_is_cut_off(tmp_path: Path) -> None:
    async with serving(tmp_path, send_timeout=0.2) as site:
        with open(site.root / "huge.bin", "wb") as f:
            f.truncate(256 * 1024 * 1024)  # more than any socket buffers hold
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (site.host, site.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(get("/huge.bin"))
            connections = engine()._engines[site.server].connections
            for _ in range(400):  # never reading: the server gives up and aborts
                if not connections:
                    break
                await asyncio.sleep(0.05)
            assert not connections
            rest = await asyncio.wait_for(read_to_eof(reader), 20)
            assert len(rest) < 256 * 1024 * 1024
        finally:
            await close_writer(writer)


def test_access_log_writes_whole_lines_in_batches_up_to_pipe_buf() -> None:
    """Lines reach the stream batched (not a write per line), each write whole lines of at most
    4096 bytes (a pipe shared by workers never interleaves them), the rest on flush."""
    from aiosendfile._serve._accesslog import AccessLog

    class Recorder(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return super().write(text)

    stream = Recorder()
    log = AccessLog(stream)
    for i in range(200):
        log.line("127.0.0.1", "[24/Nov/2026:08:09:07 +0000]", b"GET /%d HTTP/1.1" % i, 200, i, None, None)
    written = len(stream.writes)
    assert 0 < written < 20
    log.flush()
    assert len(stream.writes) == written + 1
    assert all(len(w) <= 4096 and w.endswith("\n") for w in stream.writes)
    lines = stream.getvalue().splitlines()
    assert [line.split('"')[1] for line in lines] == [f"GET /{i} HTTP/1.1" for i in range(200)]
    log.flush()
    assert len(stream.writes) == written + 1  # nothing left: no empty write


# -- accepting and cold pages on the engine's own paths ----------------------------------------------


async def test_a_burst_of_connections_is_accepted_in_a_few_turns(site: Site) -> None:
    """300 connections already queued in the kernel are all accepted within a few turns of the
    loop (uvloop's ``create_server`` took one per turn: under load, 3-20 a second)."""
    engine_ = engine()._engines[site.server]
    # The kernel completes the handshakes and queues the connections; the loop has not run yet.
    clients = [socket.create_connection((site.host, site.port)) for _ in range(300)]
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(engine_.connections) == 300
    finally:
        for c in clients:
            c.close()


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("over", ["tcp", "tls", "ipv6"])
@pytest.mark.parametrize("proto", [0, socket.IPPROTO_TCP])
async def test_an_accepted_connection_is_non_blocking_with_nodelay(
    tmp_path: Path, proto: int, over: str, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """The listener leaves the socket's set-up to the loop's connect_accepted_socket where the
    loop does it (both make it non-blocking; uvloop sets TCP_NODELAY, asyncio where the socket's
    proto is TCP): a served connection has both, whatever proto its listening socket was made with
    (``socket.socket()`` makes 0, ``getaddrinfo`` gives IPPROTO_TCP), over IPv4, TLS and IPv6."""
    if over == "ipv6" and not _has_ipv6():
        pytest.skip("no IPv6 loopback here")
    mod = engine()
    family, host = (socket.AF_INET6, "::1") if over == "ipv6" else (socket.AF_INET, "127.0.0.1")
    listening = socket.socket(family, socket.SOCK_STREAM, proto)
    listening.bind((host, 0))
    tls = over == "tls"
    server = await mod.start_server(
        mod.ServeConfig(directory=str(tmp_path)), sock=listening, ssl=tls_server_ctx if tls else None
    )
    try:
        eng = mod._engines[server]
        _, writer = await asyncio.open_connection(
            host, listening.getsockname()[1], ssl=tls_client_ctx if tls else None
        )
        try:
            await _holding(eng, 1)
            (conn,) = eng.connections
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            assert os.get_blocking(sock.fileno()) is False
        finally:
            writer.close()
    finally:
        await mod.shutdown(server)


async def test_accepting_pauses_when_out_of_descriptors_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    """EMFILE from accept: the listener stops reading the listening socket for a while (the queue
    keeps the connection), says so once, then accepts it."""
    from aiosendfile._serve import _listener

    monkeypatch.setattr(_listener, "ACCEPT_RETRY_DELAY", 0.05)
    failures = [OSError(errno.EMFILE, "Too many open files")]

    class Scarce(socket.socket):
        def accept(self) -> tuple[socket.socket, Any]:
            if failures:
                raise failures.pop()
            return super().accept()

    loop = asyncio.get_running_loop()
    made = loop.create_future()

    class P(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            made.set_result(transport)

    sock = Scarce(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    with reported() as errors:
        listener = _listener.Listener(loop, sock, P, None)
        client = socket.create_connection(sock.getsockname())
        try:
            transport = await asyncio.wait_for(made, 5)
            transport.close()
        finally:
            client.close()
            listener.close()
            await listener.wait_closed()
    assert [e["exception"].errno for e in errors] == [errno.EMFILE]


@pytest.mark.parametrize("cold", ["once", "always"])
async def test_a_cold_medium_chunk_waits_on_a_timer_then_the_pool(
    site: Site, monkeypatch: pytest.MonkeyPatch, cold: str
) -> None:
    """A cold chunk up to READ_AHEAD_MAX is read ahead by the kernel and probed again from a timer
    (no pool thread) ; one still cold after COLD_WAITS goes to the pool. Byte-exact either way."""
    from aiosendfile import _outlet, _platform

    body = pattern(100_000, seed=5)
    (site.root / "medium.bin").write_bytes(body)
    probes: list[int] = []

    def is_cold(*args: Any) -> bool:
        probes.append(1)
        return cold == "always" or len(probes) == 1

    hints: list[tuple[int, int]] = []
    monkeypatch.setattr(_outlet, "_is_cold", is_cold)
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: hints.append((offset, size)))
    before = _platform.counters.cold
    raw = await site.exchange(get("/medium.bin", "Connection: close\r\n"))
    assert split_answers(raw, ["GET"])[0].body == body
    await until(lambda: hints)  # (asked from the read-ahead thread: it may come after the body)
    assert hints == [(0, len(body))]
    if cold == "once":
        assert len(probes) == 2
        assert _platform.counters.cold == before
    else:
        assert len(probes) == 1 + _outlet.COLD_WAITS
        assert _platform.counters.cold == before + 1


async def test_a_chunk_whose_pages_came_in_while_the_iteration_is_spent_takes_a_turn(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer that finds a cold chunk's pages in does not send it in an iteration whose time
    is spent: the transfer waits in the engine's queue with the connections and takes its turn
    in the next iteration. Byte-exact."""
    from aiosendfile import _outlet, _platform

    body = pattern(100_000, seed=7)
    (site.root / "medium.bin").write_bytes(body)
    probes: list[int] = []

    def is_cold(*args: Any) -> bool:
        probes.append(1)
        return len(probes) == 1

    monkeypatch.setattr(_outlet, "_is_cold", is_cold)
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: None)
    eng = engine()._engines[site.server]
    in_timer = [False]
    real_spent, real_wait_turn, real_waited = eng.spent, eng.wait_turn, _outlet.Transfer._waited

    def spent() -> bool:
        opened = real_spent()  # (opens the iteration: its queue is then served next iteration)
        return True if in_timer[0] else opened

    turns: list[object] = []

    def wait_turn(item: Any) -> None:
        turns.append(item)
        real_wait_turn(item)

    def waited(self: Any) -> None:
        in_timer[0] = True
        try:
            real_waited(self)
        finally:
            in_timer[0] = False

    monkeypatch.setattr(eng, "spent", spent)
    monkeypatch.setattr(eng, "wait_turn", wait_turn)
    monkeypatch.setattr(_outlet.Transfer, "_waited", waited)
    raw = await site.exchange(get("/medium.bin", "Connection: close\r\n"))
    assert split_answers(raw, ["GET"])[0].body == body
    assert [type(t) for t in turns] == [_outlet.Transfer]
    assert len(probes) == 2


async def test_a_client_gone_while_its_chunk_waits_for_pages_leaves_nothing(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset while a cold chunk waits on its timer: the timer is cancelled and the file closed
    (the fd guard), nothing reported (the loop guard)."""
    from aiosendfile import _outlet

    (site.root / "medium.bin").write_bytes(pattern(100_000, seed=6))
    waiting = asyncio.get_running_loop().create_future()
    real = _outlet.Transfer._wait_for_pages

    def wait_for_pages(self: Any, size: int) -> None:
        real(self, size)
        if not waiting.done():
            waiting.set_result(None)

    monkeypatch.setattr(_outlet, "_is_cold", lambda *args: True)
    monkeypatch.setattr(_outlet.Transfer, "_wait_for_pages", wait_for_pages)
    sock = socket.create_connection((site.host, site.port))
    try:
        sock.sendall(get("/medium.bin"))
        await asyncio.wait_for(waiting, 5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()  # RST while the chunk waits
    for _ in range(50):
        await asyncio.sleep(0.01)
        if not engine()._engines[site.server].connections:
            break
    assert not engine()._engines[site.server].connections


async def test_a_slow_reader_costs_one_probe_per_chunk(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page-cache probe runs once per 2 MiB chunk: the rest of a chunk the socket took only
    part of is sent without probing again (a client with a small window made one probe per wakeup)."""
    from aiosendfile import _outlet

    probes: list[int] = []

    def is_cold(fd: int, position: int, size: int, *args: Any) -> bool:
        probes.append(position)
        return False

    monkeypatch.setattr(_outlet, "_is_cold", is_cold)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (site.host, site.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(get("/big.bin"))
        a = await read_answer(reader)
    finally:
        await close_writer(writer)
    assert a.body == (site.root / "big.bin").read_bytes()
    assert probes == [0, _outlet.MAX_CHUNK]


async def test_a_hot_client_is_answered_while_a_cold_file_waits_for_the_disk(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold chunk's disk read blocks a pool thread, never the loop: while one client's big file
    waits for the "disk" (a pool send held on an event), another client's small requests are all
    answered; then the big file arrives whole."""
    import threading

    from aiosendfile import _outlet

    disk, in_pool = threading.Event(), threading.Event()
    real_send = _outlet.sendfile_once
    big = site.root / "big.bin"

    def held_in_the_pool(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        if threading.current_thread() is not threading.main_thread():
            in_pool.set()
            disk.wait(20)  # the slow disk
        return real_send(out_fd, in_fd, offset, count)

    def cold_if_big(fd: int, *args: Any) -> bool:
        return os.readlink(f"/proc/self/fd/{fd}") == str(big)

    if not sys.platform.startswith("linux"):
        pytest.skip("needs /proc/self/fd to tell the files apart")
    monkeypatch.setattr(_outlet, "sendfile_once", held_in_the_pool)
    monkeypatch.setattr(_outlet, "_is_cold", cold_if_big)
    cold_r, cold_w = await site.open()
    hot_r, hot_w = await site.open()
    try:
        cold_w.write(get("/big.bin"))
        for _ in range(2000):  # until a pool thread is in the "disk" read
            if in_pool.is_set():
                break
            await asyncio.sleep(0.01)
        assert in_pool.is_set()
        small = (site.root / "small.txt").read_bytes()
        for _ in range(20):
            hot_w.write(get("/small.txt"))
            assert (await read_answer(hot_r)).body == small
        assert not disk.is_set()  # all answered while the big file waited for the disk
        disk.set()
        a = await read_answer(cold_r)
        assert (a.status, a.body) == (200, big.read_bytes())
    finally:
        disk.set()
        await close_writer(cold_w)
        await close_writer(hot_w)


# -- the straight line for memoised files ------------------------------------------------------------


def _admit_no_hot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hot-file cache that admits nothing, so the core answers a small file with its descriptor."""
    from aiosendfile._serve import _protocol
    from aiosendfile._static import _hot

    class Full(_hot.HotFiles):
        def admits(self, size: int) -> bool:
            return False

    hot = Full()
    monkeypatch.setattr(_hot, "hot_files", hot)
    monkeypatch.setattr(_protocol, "hot_files", hot)


def _count_transfers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, one item in the list returned for each transfer object the engine makes."""
    from aiosendfile import _outlet
    from aiosendfile._serve import _protocol

    transfers: list[int] = []
    real_transfer = _outlet.Transfer

    def counting(*args: Any) -> Any:
        transfers.append(1)
        return real_transfer(*args)

    monkeypatch.setattr(_protocol, "Transfer", counting)
    return transfers


@pytest.mark.parametrize("cut", ["whole", "part of the file", "part of the head", "nothing of the file"])
async def test_a_memoised_file_goes_straight_or_on_from_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """A memoised file of one chunk, with the socket taking it whole, is sent with no transfer
    object; when the socket takes only part of the head or the file (or nothing of the file), a
    transfer goes on from exactly there. Byte-exact, the file closed (the fd guard), and the
    access log counts every byte of the body."""
    from aiosendfile import _outlet

    log = io.StringIO()
    async with serving(tmp_path, access_log=log) as site:
        body = pattern(300_000, seed=8)
        (site.root / "mid.bin").write_bytes(body)
        reader, writer = await site.open()
        try:
            for _ in range(2):  # decided, then memoised (the connection's outlet made)
                writer.write(get("/mid.bin"))
                assert (await read_answer(reader)).body == body
            transfers = _count_transfers(monkeypatch)
            outlet = next(iter(engine()._engines[site.server].connections)).outlet
            real_sock, real_send = outlet.sock, _outlet.sendfile_once
            calls: list[int] = []

            class HalfHead:  # the socket takes half the head, once
                def send(self, data: Any, flags: int = 0) -> int:
                    outlet.sock = real_sock
                    return real_sock.send(bytes(data[: len(data) // 2]), flags)

            def partly(out_fd: int, in_fd: int, offset: int, count: int) -> int:
                calls.append(offset)
                if len(calls) == 1 and cut == "part of the file":
                    return real_send(out_fd, in_fd, offset, 1000)
                if len(calls) == 1 and cut == "nothing of the file":
                    raise BlockingIOError
                return real_send(out_fd, in_fd, offset, count)

            monkeypatch.setattr(_outlet, "sendfile_once", partly)
            if cut == "part of the head":
                outlet.sock = HalfHead()
            writer.write(get("/mid.bin"))
            a = await read_answer(reader)
            assert a.body == body
        finally:
            await close_writer(writer)
    assert len(transfers) == (0 if cut == "whole" else 1)
    if cut == "part of the file":
        assert calls[:2] == [0, 1000]
    assert log.getvalue().splitlines()[-1].endswith(f'200 {len(body)} "-" "-"')


@pytest.mark.parametrize("size", [1000, 300_000])
async def test_a_first_sight_goes_straight_as_a_memoised_file_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A file's first GET (the core's plain 200, from its descriptor) is sent as a memoised one
    is: a small one read and written with its head, a larger one's head and file sent straight
    where the socket takes them, with no transfer object. Byte-exact, the descriptor closed (the
    fd guard), the access log counts the body, and the answer is memoised."""
    _admit_no_hot_files(monkeypatch)
    log = io.StringIO()
    async with serving(tmp_path, access_log=log) as site:
        body = pattern(size, seed=9)
        (site.root / "first.bin").write_bytes(body)
        (site.root / "opener.bin").write_bytes(pattern(300_000, seed=10))
        reader, writer = await site.open()
        try:
            writer.write(get("/opener.bin"))  # (the connection's outlet is made at its first body)
            await read_answer(reader)
            transfers = _count_transfers(monkeypatch)
            writer.write(get("/first.bin"))
            assert (await read_answer(reader)).body == body
        finally:
            await close_writer(writer)
        assert b"/first.bin" in engine()._engines[site.server].answers
    assert transfers == []
    assert log.getvalue().splitlines()[-1].endswith(f'200 {size} "-" "-"')


async def test_a_first_sights_read_that_fails_leaves_the_file_to_the_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small file's first read failing (EIO from the read that is also its probe) is not an
    error of the connection: the file goes on to the send, which answers it whole (or aborts the
    connection if the file cannot be read); no descriptor is left open (the fd guard)."""
    from aiosendfile import _platform

    _admit_no_hot_files(monkeypatch)
    async with serving(tmp_path) as site:
        body = pattern(1000, seed=11)
        (site.root / "first.bin").write_bytes(body)
        (site.root / "opener.bin").write_bytes(pattern(300_000, seed=10))
        reader, writer = await site.open()
        try:
            writer.write(get("/opener.bin"))
            await read_answer(reader)

            def failing(*args: Any, **kwargs: Any) -> Any:
                raise OSError(errno.EIO, "I/O error")

            monkeypatch.setattr(_platform, "read_nowait", failing)
            writer.write(get("/first.bin"))
            assert (await read_answer(reader)).body == body
        finally:
            await close_writer(writer)


async def test_a_memoised_file_probed_cold_waits_for_its_pages_at_once(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memoised file whose straight line finds its pages cold goes on as a transfer that waits
    for them at once (read ahead, then a timer), without probing them a second time first (a
    probe costs a cachestat and a read). Byte-exact."""
    from aiosendfile import _outlet, _platform

    body = pattern(100_000, seed=9)
    (site.root / "medium.bin").write_bytes(body)
    reader, writer = await site.open()
    try:
        for _ in range(2):  # decided, then memoised (the connection's outlet made)
            writer.write(get("/medium.bin"))
            assert (await read_answer(reader)).body == body
        probes: list[int] = []

        def cold_once(*args: Any) -> bool:
            probes.append(1)
            return len(probes) == 1  # cold at the straight line's probe, warm when probed again

        hints: list[tuple[int, int]] = []
        monkeypatch.setattr(_outlet, "_is_cold", cold_once)
        monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: hints.append((offset, size)))
        writer.write(get("/medium.bin"))
        assert (await read_answer(reader)).body == body
    finally:
        await close_writer(writer)
    await until(lambda: hints)  # (asked from the read-ahead thread: it may come after the body)
    assert hints == [(0, len(body))]  # it waited for the pages
    assert len(probes) == 2  # the straight line's, then the one after the wait
