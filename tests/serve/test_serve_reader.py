"""serve's request reader (``_serve._reader``) by tables, without sockets: bytes in, events out.

Each row feeds bytes to a reader with a recording consumer and compares the events it tells:
``("refused", status)``, ``("head", method, expects_continue)``, ``("body", bytes)``,
``("request", method, target, mode)``. The same rules are exercised over real sockets, on both
loops, by the serve tests (``test_serve_hostile_http``, the engine's tests).
"""

from __future__ import annotations

from typing import Any

import pytest

from aiosendfile._serve._auth import TrustedProxies
from aiosendfile._serve._date import CLOSE, KEEP10, KEEP11
from aiosendfile._serve._exchange import Exchange
from aiosendfile._serve._reader import (
    PARSE_SLICE,
    EarlyHead,
    ReaderRules,
    RequestReader,
    Stop,
    header_kinds,
)
from aiosendfile._serve._rules import HostRule
from aiosendfile._serve._target import split_head, split_target

MAX_URL, MAX_HEAD = 1024, 4096


class Recorder:
    """A consumer that records what the reader tells it; *stop_at_head* raises ``Stop`` there."""

    def __init__(self, stop_at_head: Stop | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.exchanges: list[Exchange] = []
        self.heads: list[EarlyHead] = []
        self.stop_at_head = stop_at_head

    def refused(self, status: int | None, extra: tuple[tuple[str, str], ...]) -> None:
        self.events.append(("refused", status))

    def head(self, head: EarlyHead) -> None:
        self.heads.append(head)
        self.events.append(("head", head.method, head.expects_continue))
        if self.stop_at_head is not None:
            raise self.stop_at_head

    def body(self, data: bytes) -> None:
        self.events.append(("body", bytes(data)))

    def request(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)
        self.events.append(("request", exchange.method, exchange.url, exchange.mode))


def reader(recorder: Recorder | None = None, **rules: Any) -> tuple[RequestReader, Recorder]:
    logging = rules.pop("logging", False)
    wanted = header_kinds(logging, rules.get("gated", False), rules.get("uploads", False), "trusted" in rules)
    recorder = recorder or Recorder()
    return RequestReader(recorder, ReaderRules(wanted, MAX_URL, MAX_HEAD, log=logging, **rules)), recorder


def events(data: bytes, **rules: Any) -> list[tuple[Any, ...]]:
    r, rec = reader(**rules)
    r.feed(data)
    return rec.events


GET = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"

FRAMING = [
    ("one GET", GET, [("request", b"GET", b"/", KEEP11)]),
    ("HTTP/1.0, no Host", b"GET /x HTTP/1.0\r\n\r\n", [("request", b"GET", b"/x", CLOSE)]),
    (
        "HTTP/1.0 keep-alive",
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        [("request", b"GET", b"/", KEEP10)],
    ),
    (
        "HTTP/1.1 closing",
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        [("request", b"GET", b"/", CLOSE)],
    ),
    ("HTTP/1.1 without Host", b"GET / HTTP/1.1\r\n\r\n", [("refused", 400)]),
    ("two Hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", [("refused", 400)]),
    ("HTTP/1.0 with two Hosts", b"GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", [("refused", 400)]),
    ("HTTP/2.0 request line", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", [("refused", 505)]),
    ("HTTP/0.9", b"GET / HTTP/0.9\r\n\r\n", [("refused", 505)]),
    # A later HTTP/1.x is read as HTTP/1.1 (RFC 9112 2.3; nginx and Go); another major is 505.
    ("HTTP/1.2 as HTTP/1.1", b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", [("request", b"GET", b"/", KEEP11)]),
    ("HTTP/1.9 needs a Host", b"GET / HTTP/1.9\r\n\r\n", [("refused", 400)]),
    ("HTTP/3.0 request line", b"GET / HTTP/3.0\r\nHost: a\r\n\r\n", [("refused", 505)]),
    ("HTTP/9.9 request line", b"GET / HTTP/9.9\r\nHost: a\r\n\r\n", [("refused", 505)]),
    ("a version of two digits", b"GET / HTTP/1.10\r\nHost: a\r\n\r\n", [("refused", 400)]),
    ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", [("refused", 400)]),
    # A method llhttp does not know: 501 if it is a token (RFC 9110 9.1), else 400; one llhttp
    # knows reaches the server (405 there).
    ("an unknown method", b"BREW / HTTP/1.1\r\nHost: a\r\n\r\n", [("refused", 501)]),
    ("a known method's prefix", b"PROPFINDX / HTTP/1.1\r\nHost: a\r\n\r\n", [("refused", 501)]),
    ("a method in lowercase", b"get / HTTP/1.1\r\nHost: a\r\n\r\n", [("refused", 501)]),
    (
        "an unknown method after empty lines",
        b"\r\n\r\nBREW / HTTP/1.1\r\nHost: a\r\n\r\n",
        [("refused", 501)],
    ),
    ("a method that is no token", b"GE(T / HTTP/1.1\r\nHost: a\r\n\r\n", [("refused", 400)]),
    ("a method alone", b"BREW\r\n\r\n", [("refused", 400)]),
    (
        "an unknown method behind another request",
        GET + b"BREW / HTTP/1.1\r\nHost: a\r\n\r\n",
        [("request", b"GET", b"/", KEEP11), ("refused", 400)],
    ),
    (
        "chunked body",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        [("body", b"abc"), ("request", b"POST", b"/", KEEP11)],
    ),
    (
        "Content-Length body",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
        [("body", b"abc"), ("request", b"GET", b"/", KEEP11)],
    ),
    (
        "a coding other than chunked",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        [("refused", 501)],
    ),
    (
        "Transfer-Encoding in HTTP/1.0",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        [("refused", 400)],
    ),
    (
        "Transfer-Encoding in two fields, joined",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
        [("refused", 501)],
    ),
    (
        "Expect: 100-continue",
        b"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
        [("head", b"GET", True), ("request", b"GET", b"/", KEEP11)],
    ),
    ("another Expect", b"GET / HTTP/1.1\r\nHost: a\r\nExpect: teapot\r\n\r\n", [("refused", 417)]),
    (
        "Expect in HTTP/1.0: ignored",
        b"GET / HTTP/1.0\r\nExpect: teapot\r\n\r\n",
        [("request", b"GET", b"/", CLOSE)],
    ),
    (
        "an upgrade: answered as HTTP/1.1 with the connection closing, then nothing more is read",
        b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n" + GET,
        [("request", b"GET", b"/", CLOSE), ("refused", None)],
    ),
    (
        "CONNECT: the same",
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n" + GET,
        [("request", b"CONNECT", b"a:443", CLOSE), ("refused", None)],
    ),
    (
        "Upgrade without Connection: upgrade is no upgrade",
        b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n" + GET,
        [("request", b"GET", b"/", KEEP11), ("request", b"GET", b"/", KEEP11)],
    ),
    (
        "trailer fields: not merged into the head, nor counted in the next one's",
        b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
        b"Host: a\r\nRange: bytes=0-1\r\n\r\n" + GET,
        [("body", b"abc"), ("request", b"GET", b"/", KEEP11), ("request", b"GET", b"/", KEEP11)],
    ),
    (
        "a trailer's Host does not stand for a missing one",
        b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nHost: a\r\n\r\n"
        b"GET / HTTP/1.1\r\n\r\n",
        [("request", b"GET", b"/", KEEP11), ("refused", 400)],
    ),
    (
        "pipelined",
        GET + b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n" + GET,
        [
            ("request", b"GET", b"/", KEEP11),
            ("request", b"GET", b"/b", KEEP11),
            ("request", b"GET", b"/", KEEP11),
        ],
    ),
    (
        "pipelined behind a refusal: not read",
        b"GET / HTTP/1.1\r\n\r\n" + GET,
        [("refused", 400)],
    ),
]


@pytest.mark.parametrize(("data", "expected"), [row[1:] for row in FRAMING], ids=[row[0] for row in FRAMING])
def test_framing(data: bytes, expected: list[tuple[Any, ...]]) -> None:
    assert events(data) == expected


LIMITS = [
    ("target at the limit", b"GET /" + b"a" * (MAX_URL - 1) + b" HTTP/1.1\r\nHost: a\r\n\r\n", None),
    ("target over the limit", b"GET /" + b"a" * MAX_URL + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414),
    (
        "one field over the target's limit",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * MAX_URL + b"\r\n\r\n",
        431,
    ),
    (
        "fields over the head's limit together",
        b"GET / HTTP/1.1\r\nHost: a\r\n"
        + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 500) for i in range(10))
        + b"\r\n",
        431,
    ),
    (
        "fields under it",
        b"GET / HTTP/1.1\r\nHost: a\r\n"
        + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 300) for i in range(10))
        + b"\r\n",
        None,
    ),
]


@pytest.mark.parametrize(("data", "status"), [row[1:] for row in LIMITS], ids=[row[0] for row in LIMITS])
def test_limits(data: bytes, status: int | None) -> None:
    got = events(data)
    if status is None:
        assert got == [("request", b"GET", got[0][2], KEEP11)]
    else:
        assert got == [("refused", status)]


def test_a_head_buffered_past_the_limits_is_refused_before_it_completes() -> None:
    """A field llhttp is still collecting reaches the reader only when complete: what it may buffer
    meanwhile is bounded (the limits plus one read)."""
    r, rec = reader()
    r.feed(b"GET / HTTP/1.1\r\nHost: a\r\nX: ")
    for _ in range(300):
        r.feed(b"v" * 1024)  # (over the field limit, but not complete: llhttp buffers it)
        if rec.events:
            break
    assert rec.events == [("refused", 431)]
    assert r.stopped


def test_the_hosts_a_server_goes_by() -> None:
    rule = HostRule(("files.example",), this_machine=False)
    assert events(b"GET / HTTP/1.1\r\nHost: files.example\r\n\r\n", hosts=rule)[0][0] == "request"
    assert events(b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", hosts=rule) == [("refused", 421)]
    assert events(b"GET / HTTP/1.0\r\n\r\n", hosts=rule)[0][0] == "request"  # (no Host: HTTP/1.0)


def test_an_absolute_form_targets_authority_is_judged_not_its_host_field() -> None:
    """RFC 9112 3.2.2: with an absolute-form target, the server goes by its authority (userinfo
    and port aside as for Host), as nginx and Go do; a Host field is still required of HTTP/1.1."""
    rule = HostRule(("files.example",), this_machine=False)
    ok = events(b"GET http://files.example/a HTTP/1.1\r\nHost: evil.example\r\n\r\n", hosts=rule)
    assert ok == [("request", b"GET", b"http://files.example/a", KEEP11)]
    for target in (b"http://evil.example/a", b"http://files.example@evil.example/a", b"http:///a"):
        got = events(b"GET %s HTTP/1.1\r\nHost: files.example\r\n\r\n" % target, hosts=rule)
        assert got == [("refused", 421)], target
    assert events(b"GET http://files.example/a HTTP/1.1\r\n\r\n", hosts=rule) == [("refused", 400)]
    connect = b"CONNECT files.example:443 HTTP/1.1\r\nHost: evil.example\r\n\r\n"
    assert events(connect, hosts=rule) == [("refused", 421)]  # (authority-form: its Host judged)
    r, rec = reader(uploads=True)
    r.feed(b"PUT http://b.example:8080/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert rec.heads[0].host == b"b.example:8080"  # (the same-origin rule compares this one)


def test_trailer_fields_are_bounded_and_dropped() -> None:
    """A trailer section is read and dropped: its fields reach neither this request (its core
    fields, its credentials) nor the next; one llhttp is still collecting is bounded as a head's
    field is (431), not buffered without end."""
    r, rec = reader(gated=True)
    r.feed(
        b"GET /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
        b"Range: bytes=0-1\r\nIf-None-Match: *\r\nAuthorization: Basic dTpw\r\n\r\n"
    )
    (exchange,) = rec.exchanges
    assert exchange.fields is None
    assert exchange.auth == (None, None)
    r, rec = reader()
    r.feed(b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX: ")
    for _ in range(300):
        r.feed(b"v" * 1024)
        if r.stopped:
            break
    assert rec.events == [("body", b"abc"), ("refused", 431)]


def test_a_chunked_body_of_any_size_is_not_taken_for_a_trailer_section() -> None:
    """Chunks split across many reads, and large ones, pass: only a trailer section is bounded."""
    r, rec = reader()
    r.feed(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b"z" * (1 << 20))
    for _ in range(3):
        for at in range(0, len(chunk), 1000):  # (a read ending just after a size line, too)
            r.feed(chunk[at : at + 1000])
    r.feed(b"0\r\n\r\n")
    assert not r.stopped
    assert sum(len(e[1]) for e in rec.events if e[0] == "body") == 3 << 20
    assert rec.events[-1] == ("request", b"POST", b"/", KEEP11)


@pytest.mark.parametrize(
    ("data", "head"),
    [
        (b"HEAD / HTTP/1.1\r\n\r\n", True),  # (400: no Host)
        (b"HEAD / HTTP/2.0\r\nHost: a\r\n\r\n", True),  # (505)
        (b"HEAD /" + b"a" * MAX_URL + b" HTTP/1.1\r\nHost: a\r\n\r\n", True),  # (414)
        (b"HEAD / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * MAX_URL + b"\r\n\r\n", True),  # (431)
        (b"GET / HTTP/1.1\r\n\r\n", False),
        (b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n\x16\x03\x01", False),  # (the next one's line)
        (b"\x16\x03\x01\x02\x00", False),
    ],
)
def test_a_refusal_knows_whether_it_answers_a_head(data: bytes, head: bool) -> None:
    r, rec = reader()
    r.feed(data)
    assert rec.events[-1][0] == "refused"
    assert r.refused_head() is head


def test_a_refusal_is_told_once_and_stops_the_parse() -> None:
    r, rec = reader()
    r.feed(b"GET / HTTP/1.1\r\n\r\n")
    r.feed(GET)
    assert rec.events == [("refused", 400)]


def test_the_backlog_is_parsed_a_slice_at_a_time_while_the_consumer_has_room() -> None:
    r, rec = reader()
    many = GET * (3 * PARSE_SLICE // len(GET))
    r.to_backlog(many)
    r.parse_backlog(lambda: len(rec.events) < 10)
    first = len(rec.events)
    assert 10 <= first < len(many) // len(GET)  # (one slice's worth, then no room)
    assert r.unparsed()
    r.parse_backlog(lambda: True)
    assert not r.unparsed()
    assert len(rec.events) == len(many) // len(GET)
    assert all(event == ("request", b"GET", b"/", KEEP11) for event in rec.events)


def test_a_small_backlog_is_parsed_at_once() -> None:
    r, rec = reader()
    r.to_backlog(GET * 3)
    r.parse_backlog(lambda: False)
    assert len(rec.events) == 3
    assert not r.backlog


def test_uploads_are_judged_at_their_head_and_a_refused_body_is_never_parsed() -> None:
    put = b"PUT /f HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
    r, rec = reader(uploads=True)
    r.feed(put)
    assert rec.events == [("head", b"PUT", False), ("body", b"hello"), ("request", b"PUT", b"/f", KEEP11)]
    assert rec.heads[0].length == b"5"
    r, rec = reader(Recorder(stop_at_head=Stop(413)), uploads=True)
    r.feed(put)
    assert rec.events == [("head", b"PUT", False), ("refused", 413)]
    # without uploads a PUT's head goes to nobody: the core answers it (405)
    assert events(put)[0] == ("body", b"hello")


def test_what_an_upload_head_carries() -> None:
    r, rec = reader(uploads=True, gated=True, logging=True)
    r.feed(
        b"PUT /f HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n"
        b"Origin: http://a\r\nSec-Fetch-Site: same-origin\r\nAuthorization: Basic eDp5\r\n"
        b"Referer: http://a/\r\nUser-Agent: t\r\n\r\n"
    )
    head = rec.heads[0]
    assert (head.url, head.host, head.ctype, head.origin, head.fetch_site, head.authorization) == (
        b"/f",
        b"a",
        b"text/plain",
        b"http://a",
        b"same-origin",
        b"Basic eDp5",
    )
    assert head.log(r.rules) == ("1.1", b"http://a/", b"t", None)


DOUBLED = [
    ("Authorization twice: neither counts", b"Authorization", b"Basic eDp5", b""),
    ("Origin twice: as a cross-site one", b"Origin", b"http://a", b"null"),
    ("Sec-Fetch-Site twice: cross-site", b"Sec-Fetch-Site", b"same-origin", b"cross-site"),
]


@pytest.mark.parametrize(
    ("name", "value", "kept"), [row[1:] for row in DOUBLED], ids=[row[0] for row in DOUBLED]
)
def test_a_field_that_decides_who_writes_given_twice(name: bytes, value: bytes, kept: bytes) -> None:
    r, rec = reader(uploads=True, gated=True)
    r.feed(
        b"PUT /f HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n%s: %s\r\n%s: %s\r\n\r\n"
        % (name, value, name, value)
    )
    head = rec.heads[0]
    assert {b"Authorization": head.authorization, b"Origin": head.origin, b"Sec-Fetch-Site": head.fetch_site}[
        name
    ] == kept


def test_the_client_a_trusted_proxy_names() -> None:
    proxies = TrustedProxies(("127.0.0.1",))
    r, rec = reader(gated=True, trusted=proxies)
    r.feed(
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.9\r\nX-Forwarded-For: 203.0.113.7\r\n"
        b"Authorization: Basic eDp5\r\n\r\n"
    )
    assert rec.exchanges[0].auth == (b"Basic eDp5", "203.0.113.7")


def test_credentials_go_with_each_request_the_gate_judges() -> None:
    r, rec = reader(gated=True)
    r.feed(b"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Basic eDp5\r\n\r\n" + GET)
    assert [x.auth for x in rec.exchanges] == [(b"Basic eDp5", None), (None, None)]
    r, rec = reader(gated=True, public_read=True)
    r.feed(GET + b"DELETE / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [x.auth for x in rec.exchanges] == [None, (None, None)]


def test_a_plain_request_is_the_one_the_heads_memo_may_keep() -> None:
    for plain in (GET, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", b"GET / HTTP/1.0\r\n\r\n"):
        r, rec = reader()
        r.feed(plain)
        assert r.parsed is rec.exchanges[0], plain  # (one that closes too: its mode goes with it)
        assert r.completed == 1
    for not_plain in (
        b"GET / HTTP/1.1\r\nHost: a\r\nRange: bytes=0-1\r\n\r\n",  # (the core's fields)
        b"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
        b"DELETE / HTTP/1.1\r\nHost: a\r\n\r\n",
    ):
        r, rec = reader()
        r.feed(not_plain)
        assert rec.exchanges
        assert r.parsed is None, not_plain


def test_a_head_split_without_the_parser_has_the_target_the_parser_reads() -> None:
    """``split_head`` (a head block known, a new target: no parse) takes only an origin-form
    target of bytes llhttp gives back as they came: each byte of its set, in a path and a query,
    reads the same through the parser; every other byte, a fragment, another form, a second
    space, no version, a target over the limit: not split (the parser reads it, and refuses
    what it refuses)."""
    from aiosendfile._serve._target import _PLAIN_TARGET_BYTES

    rest = b" HTTP/1.1\r\nHost: a\r\n\r\n"
    for byte in range(256):
        target = b"/a" + bytes([byte]) + b"b?q" + bytes([byte])
        data = b"GET " + target + rest
        split = split_head(data, MAX_URL)
        if byte in _PLAIN_TARGET_BYTES:
            assert split == (b"GET" + rest, target), data
            assert [(e[0], e[2]) for e in events(data)] == [("request", target)], data
        else:
            assert split is None, data
    longest = b"/" + b"x" * (MAX_URL - 1)
    assert split_head(b"HEAD " + longest + rest, MAX_URL) == (b"HEAD" + rest, longest)
    for other in (
        b"GET /" + b"x" * MAX_URL + rest,  # (414 from the parser)
        b"GET http://a/x" + rest,
        b"GET *" + rest,
        b"GET  /x" + rest,
        b"GET /x" + b"\r\nHost: a\r\n\r\n",
        b"GET /x  HTTP/1.1\r\n\r\n",
        b"GET /x HTTP/1.1",
        b"GET",
        b"",
    ):
        assert split_head(other, MAX_URL) is None, other


def test_the_access_log_fields() -> None:
    r, rec = reader(logging=True)
    r.feed(
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nReferer: http://a/\r\nUser-Agent: curl\r\n\r\n" + GET
    )
    assert [x.log for x in rec.exchanges] == [("1.0", b"http://a/", b"curl", None), ("1.1", None, None, None)]
    assert events(GET)[0] == ("request", b"GET", b"/", KEEP11)


def test_the_core_fields_kept_and_accept_only_when_it_matters() -> None:
    r, rec = reader()
    r.feed(b"GET / HTTP/1.1\r\nHost: a\r\nRange: bytes=0-1\r\nAccept: text/html\r\nX-Other: 1\r\n\r\n")
    assert rec.exchanges[0].fields == [(b"Range", b"bytes=0-1")]
    r, rec = reader()
    r.feed(b"GET / HTTP/1.1\r\nHost: a\r\nAccept: application/json\r\n\r\n")
    assert rec.exchanges[0].fields == [(b"Accept", b"application/json")]


def test_a_request_that_ends_outside_the_parser() -> None:
    """An upload's body spliced from the socket: the reader starts afresh after it."""
    r, rec = reader(uploads=True)
    r.feed(b"PUT /big HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
    assert r.in_request
    assert r.restart() == b"/big"
    assert not r.in_request
    r.feed(GET)
    assert rec.events[-1] == ("request", b"GET", b"/", KEEP11)


def test_a_request_begun_is_told_to_start_its_header_timeout() -> None:
    r, _ = reader()
    r.feed(b"GET / HT")
    assert r.began
    assert r.in_request
    r.began = False
    r.feed(b"TP/1.1\r\n")
    assert not r.began


TARGETS = [
    (b"/a/b?q=1", (b"/a/b", b"q=1")),
    (b"/a#frag?x", (b"/a", b"")),
    (b"http://host/p?q", (b"/p", b"q")),
    (b"http://host", (b"/", b"")),
    (b"*", None),
    (b"host:443", None),
]


@pytest.mark.parametrize(("url", "split"), TARGETS)
def test_split_target(url: bytes, split: tuple[bytes, bytes] | None) -> None:
    assert split_target(url) == split


def test_a_trusted_proxys_client_goes_to_the_access_log_without_auth() -> None:
    """Behind a trusted proxy, the client it names is kept for the log, with no gate at all."""
    r, rec = reader(logging=True, trusted=TrustedProxies(("10.0.0.0/8",)))
    r.feed(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.7, 10.0.0.2\r\n\r\n" + GET)
    assert [x.log for x in rec.exchanges] == [("1.1", None, None, "203.0.113.7"), ("1.1", None, None, None)]
