"""The engine's HTTP/1.1 protocol (``aiosendfile._serve``) on raw sockets, on both loops.

Keep-alive, pipelining in order, HTTP/1.0, 405, ``Expect: 100-continue``, request bodies on
``GET``, absolute-form targets, the limits (414, 431, 400 then close), the header and keep-alive
timeouts, the ``Date`` format, the access log, TLS, Unix sockets and upgrades. What the core
decides (ranges, preconditions, paths) is the cross-door tests'; here it only has to arrive intact.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import ssl
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest

from ..support.raw_http import all_responses, read_response, read_to_eof
from ..support.serve import (
    BIG,
    SMALL,
    ServeSite,
    at_eof,
    close_writer,
    get,
    serving,
)

pytest.importorskip("httptools")


# -- keep-alive, pipelining, versions -----------------------------------------------------------


async def test_keep_alive_answers_many_requests_on_one_connection(www_site: ServeSite) -> None:
    small = (www_site.public / "small.txt").read_bytes()
    reader, writer = await www_site.open()
    try:
        for _ in range(3):  # the first goes through the core, the next from the memo
            writer.write(get("/small.txt"))
            a = await read_response(reader)
            assert (a.status, a.body) == (200, small)
            assert "connection" not in a.headers  # HTTP/1.1 keep-alive, as aiohttp answers
            assert a.headers["server"] == "aiosendfile"
            assert a.headers["content-length"] == str(SMALL)
        writer.write(get("/big.bin"))
        a = await read_response(reader)
        assert (a.status, a.body) == (200, (www_site.public / "big.bin").read_bytes())
        writer.write(get("/small.txt", method="HEAD"))
        a = await read_response(reader, "HEAD")
        assert (a.status, a.headers["content-length"]) == (200, str(SMALL))
    finally:
        await close_writer(writer)


async def test_pipelined_requests_are_answered_in_order(www_site: ServeSite) -> None:
    root = www_site.public
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
    reader, writer = await www_site.open()
    try:
        writer.write(data)
        raw = await asyncio.wait_for(read_to_eof(reader), 30)
    finally:
        await close_writer(writer)
    answers = all_responses(raw, [m for m, _, _ in requests[:-1]])
    small, big = (root / "small.txt").read_bytes(), (root / "big.bin").read_bytes()
    assert [a.status for a in answers] == [200, 200, 200, 404, 200, 200, 200, 200]
    assert [answers[0].body, answers[1].body, answers[6].body] == [small, big, big]
    assert (answers[2].headers["content-length"], answers[2].body) == (str(BIG), b"")
    assert answers[3].body == b"404: Not Found"
    assert answers[4].body == b"<p>index</p>"
    assert (answers[7].headers["connection"], answers[7].body) == ("close", small)


async def test_a_long_pipeline_of_small_files(www_site: ServeSite) -> None:
    """More requests than wait before reading pauses, arriving in one write."""
    reader, writer = await www_site.open()
    try:
        writer.write(get("/small.txt"))  # warm: later ones take the memo
        await read_response(reader)
        writer.write(get("/small.txt") * 100 + get("/big.bin") + get("/small.txt") * 100)
        for i in range(201):
            a = await read_response(reader)
            assert a.status == 200
            assert len(a.body) == (BIG if i == 100 else SMALL)
    finally:
        await close_writer(writer)


async def test_http_10_closes_unless_asked_to_keep_alive(www_site: ServeSite) -> None:
    raw = await www_site.exchange(b"GET /small.txt HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs no Host
    (a,) = all_responses(raw, ["GET"])
    assert (a.status, a.headers["connection"]) == (200, "close")
    assert a.head.startswith(b"HTTP/1.1 200 OK\r\n")  # the server's version, as nginx answers
    reader, writer = await www_site.open()
    try:
        for _ in range(2):
            writer.write(get("/small.txt", "Connection: keep-alive\r\n", version="1.0"))
            a = await read_response(reader)
            assert (a.status, a.headers["connection"]) == (200, "keep-alive")
    finally:
        await close_writer(writer)


async def test_connection_close_closes_after_the_answer(www_site: ServeSite) -> None:
    for target in ("/small.txt", "/big.bin", "/missing"):
        raw = await www_site.exchange(get(target, "Connection: close\r\n"))
        (a,) = all_responses(raw, ["GET"])
        assert a.headers["connection"] == "close"


async def test_other_methods_get_405_with_allow(www_site: ServeSite) -> None:
    reader, writer = await www_site.open()
    try:
        for method, target in [("DELETE", "/small.txt"), ("POST", "/small.txt"), ("OPTIONS", "*")]:
            writer.write(get(target, "Content-Length: 0\r\n", method))
            a = await read_response(reader)
            assert a.status == 405
            assert a.headers["allow"] == "GET,HEAD"
            assert a.body == b"405: Method Not Allowed"
    finally:
        await close_writer(writer)


# -- Expect, request bodies, targets -----------------------------------------------------------


async def test_expect_100_continue_then_the_answer(www_site: ServeSite) -> None:
    reader, writer = await www_site.open()
    try:
        writer.write(get("/small.txt", "Expect: 100-continue\r\nContent-Length: 5\r\n"))
        a = await read_response(reader)
        assert a.head == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        a = await read_response(reader)
        assert (a.status, len(a.body)) == (200, SMALL)
        writer.write(get("/small.txt"))  # the body was read: the connection goes on
        assert (await read_response(reader)).status == 200
    finally:
        await close_writer(writer)


async def test_expect_on_a_refused_method_answers_at_once_and_closes(www_site: ServeSite) -> None:
    reader, writer = await www_site.open()
    try:
        writer.write(get("/small.txt", "Expect: 100-continue\r\nContent-Length: 100000\r\n", "PUT"))
        a = await read_response(reader)  # no 100 (Continue): the final answer, body never sent
        assert (a.status, a.headers["connection"]) == (405, "close")
        assert await at_eof(reader)
    finally:
        await close_writer(writer)


async def test_an_unknown_expectation_is_417(www_site: ServeSite) -> None:
    raw = await www_site.exchange(get("/small.txt", "Expect: teapot\r\n"))
    (a,) = all_responses(raw, ["GET"])
    assert (a.status, a.headers["connection"]) == (417, "close")


@pytest.mark.parametrize(
    "body",
    [
        b"Content-Length: 11\r\n\r\nhello world",
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_body_on_get_is_read_and_dropped(www_site: ServeSite, body: bytes) -> None:
    reader, writer = await www_site.open()
    try:
        head = get("/small.txt")[:-2]  # without the blank line: the body's fields follow
        writer.write(head + body + get("/small.txt", method="HEAD"))
        a = await read_response(reader)
        assert (a.status, len(a.body)) == (200, SMALL)
        a = await read_response(reader, "HEAD")  # the body was not taken for a request
        assert a.status == 200
    finally:
        await close_writer(writer)


async def test_absolute_form_query_and_percent_decoding(www_site: ServeSite) -> None:
    reader, writer = await www_site.open()
    try:
        for target, body in [
            ("http://localhost/small.txt", (www_site.public / "small.txt").read_bytes()),
            ("http://example.com:8080/sp%20ace.txt?x=1", b"space"),
            ("/small.txt?a=b&c=%2F", (www_site.public / "small.txt").read_bytes()),
            ("/sp%20ace.txt", b"space"),
            ("/a%2520b.txt", b"literal percent"),  # decoded once: the file is named a%20b.txt
            ("/small.txt#frag", (www_site.public / "small.txt").read_bytes()),  # a fragment is no part of it
            ("/sp%20ace.txt?q#f?g", b"space"),
        ]:
            writer.write(get(target))
            a = await read_response(reader)
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
async def test_limits_and_garbage_are_answered_then_closed(
    www_site: ServeSite, data: bytes, status: int
) -> None:
    reader, writer = await www_site.open()
    try:
        writer.write(data + get("/small.txt"))  # nothing after the error is answered
        raw = await asyncio.wait_for(read_to_eof(reader), 20)
    finally:
        await close_writer(writer)
    (a,) = all_responses(raw, ["GET"])
    assert (a.status, a.headers["connection"]) == (status, "close")


@pytest.mark.parametrize(
    "data",
    [
        b"HEAD /small.txt HTTP/1.1\r\n\r\n",  # 400: no Host
        get("/small.txt", method="HEAD", version="2.0"),  # 505
        get("/small.txt", "Expect: teapot\r\n", "HEAD"),  # 417
        get("/small.txt", "X-Big: " + "b" * 20000 + "\r\n", "HEAD"),  # 431
        get("/" + "a" * 9000, method="HEAD"),  # 414
        get("/small.txt", "Transfer-Encoding: gzip\r\n", "HEAD"),  # 501
    ],
    ids=["no-host", "version", "expect", "field", "url", "coding"],
)
async def test_an_error_answering_a_head_has_no_body(www_site: ServeSite, data: bytes) -> None:
    """RFC 9110 9.3.2: an answer to HEAD has no content, an error's included (as nginx)."""
    raw = await www_site.exchange(data)
    (a,) = all_responses(raw, ["HEAD"])  # (no bytes after the head)
    assert a.status >= 400
    assert a.headers["connection"] == "close"
    assert int(a.headers["content-length"]) > 0  # (what a GET's answer would have held)


@pytest.mark.parametrize(
    "behind",
    [
        get("/small.txt", "Expect: 100-continue\r\n"),
        get("/small.txt", "Expect: 100-continue\r\nContent-Length: 3\r\n", "PUT"),
        get("/small.txt", "Expect: 100-continue\r\nContent-Length: 3\r\n", "POST"),
    ],
    ids=["get", "put", "post"],
)
@pytest.mark.parametrize(
    "closing",
    [b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", get("/small.txt", "Connection: close\r\n")],
    ids=["error", "connection-close"],
)
async def test_nothing_is_answered_after_an_answer_that_closes(
    www_site: ServeSite, closing: bytes, behind: bytes
) -> None:
    """RFC 9112 9.6: once an answer said close, no later request in the same read is processed,
    not even its head (no 100 Continue, no 405 for a refused method's expectation)."""
    raw = await www_site.exchange(closing + behind + behind)
    (a,) = all_responses(raw, ["GET"])
    assert a.headers["connection"] == "close"


async def test_a_trailer_section_judges_no_request(www_site: ServeSite) -> None:
    """Trailer fields are dropped (RFC 9110 6.5.1): a trailer's Host does not stand for the next
    request's missing one, on this connection or, through the heads memo, on another."""
    chunked = get("/small.txt", "Transfer-Encoding: chunked\r\n")
    trailer = b"3\r\nabc\r\n0\r\nHost: localhost\r\nRange: bytes=0-1\r\nIf-None-Match: *\r\n\r\n"
    hostless = b"GET /small.txt HTTP/1.1\r\n\r\n"
    raw = await www_site.exchange(chunked + trailer + hostless)
    a, b = all_responses(raw, ["GET", "GET"])
    assert (a.status, len(a.body)) == (200, SMALL)  # (no Range, no If-None-Match from the trailer)
    assert (b.status, b.headers["connection"]) == (400, "close")
    raw = await www_site.exchange(hostless)
    (c,) = all_responses(raw, ["GET"])
    assert c.status == 400


async def test_an_error_after_pipelined_requests_comes_after_their_answers(www_site: ServeSite) -> None:
    reader, writer = await www_site.open()
    try:
        writer.write(get("/big.bin") + get("/small.txt") + b"NOT HTTP\r\n\r\n")
        raw = await asyncio.wait_for(read_to_eof(reader), 20)
    finally:
        await close_writer(writer)
    answers = all_responses(raw, ["GET", "GET", "GET"])
    assert [a.status for a in answers] == [200, 200, 400]
    assert len(answers[0].body) == BIG


# -- timeouts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_slow_head_gets_408_and_is_closed(tmp_path: Path, method: str) -> None:
    async with serving(tmp_path, header_timeout=0.2) as www_site:
        unfinished = f"{method} /small.txt HTTP/1.1\r\nHost: x\r\n".encode()  # never finished
        raw = await www_site.exchange(unfinished)
    (a,) = all_responses(raw, [method])  # (a HEAD's: no body, RFC 9110 9.3.2)
    assert (a.status, a.headers["connection"]) == (408, "close")


async def test_a_silent_new_connection_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    async with serving(tmp_path, header_timeout=0.2) as www_site:
        reader, writer = await www_site.open()
        try:
            assert await at_eof(reader)  # nothing sent, nothing to answer: closed silently
        finally:
            await close_writer(writer)


async def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path) -> None:
    async with serving(tmp_path, keepalive_timeout=0.2) as www_site:
        reader, writer = await www_site.open()
        try:
            writer.write(get("/small.txt"))
            assert (await read_response(reader)).status == 200
            assert await at_eof(reader)
        finally:
            await close_writer(writer)


# -- Date, access log -----------------------------------------------------------------------------


async def test_date_is_an_imf_fixdate(www_site: ServeSite) -> None:
    raw = await www_site.exchange(get("/small.txt", "Connection: close\r\n"))
    (a,) = all_responses(raw, ["GET"])
    date = a.headers["date"]
    day, month = "(Mon|Tue|Wed|Thu|Fri|Sat|Sun)", "(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    assert re.fullmatch(rf"{day}, \d\d {month} \d{{4}} \d\d:\d\d:\d\d GMT", date), date
    assert parsedate_to_datetime(date).tzinfo is not None


async def test_access_log_lines_are_combined_log_format(tmp_path: Path) -> None:
    log = io.StringIO()
    async with serving(tmp_path, access_log=log) as www_site:
        reader, writer = await www_site.open()
        try:
            writer.write(get("/small.txt", 'Referer: http://r/\r\nUser-Agent: t"est\xe9\r\n'))
            await read_response(reader)
            writer.write(get("/small.txt", method="HEAD"))
            await read_response(reader, "HEAD")
            writer.write(get("/big.bin?q=1"))
            await read_response(reader)
            writer.write(get("/missing", "Connection: close\r\n"))
            await read_response(reader)
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


@pytest.mark.parametrize("form", ["common", "json"])
async def test_access_log_lines_in_the_common_format_and_json(tmp_path: Path, form: str) -> None:
    log = io.StringIO()
    async with serving(tmp_path, access_log=log, access_log_format=form) as www_site:
        hostile = 'Referer: http://r/\r\nUser-Agent: t"est\xe9\\x\r\n'
        await www_site.exchange(get("/small.txt", hostile + "Connection: close\r\n"))
        await www_site.exchange(get("/missing", "Connection: close\r\n", method="HEAD"))
    lines = log.getvalue().splitlines()
    assert len(lines) == 2, lines
    if form == "common":
        stamp = r"\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000\]"
        assert re.fullmatch(rf'127\.0\.0\.1 - - {stamp} "GET /small\.txt HTTP/1\.1" 200 4096', lines[0]), (
            lines[0]
        )
        assert re.fullmatch(rf'127\.0\.0\.1 - - {stamp} "HEAD /missing HTTP/1\.1" 404 -', lines[1]), lines[1]
        return
    first, second = (json.loads(line) for line in lines)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", first.pop("time"))
    assert first == {
        "remote_addr": "127.0.0.1",
        "request": "GET /small.txt HTTP/1.1",
        "status": 200,
        "body_bytes_sent": 4096,
        "http_referer": "http://r/",
        "http_user_agent": "t\\x22est\\xE9\\x5Cx",  # (the client's bytes escaped as in the other formats)
    }
    second.pop("time")
    assert second == {
        "remote_addr": "127.0.0.1",
        "request": "HEAD /missing HTTP/1.1",
        "status": 404,
        "body_bytes_sent": 0,
        "http_referer": "",
        "http_user_agent": "",
    }


@pytest.mark.parametrize(
    ("raw", "request_line", "status"),
    [
        (b"GET /small.txt HTTP/1.1\r\nUser-Agent: t\r\n\r\n", "GET /small.txt HTTP/1.1", 400),  # no Host
        (b"GET /small.txt HTTP/3.0\r\nHost: x\r\nUser-Agent: t\r\n\r\n", "GET /small.txt HTTP/3.0", 505),
        (b"GET /a HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\nExpect: x\r\n\r\n", "GET /a HTTP/1.1", 417),
        (b"GET /a HTTP/1.1\r\nUser-Agent: t\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", "GET /a HTTP/1.1", 431),
        (b"GET /" + b"a" * 9_000 + b" HTTP/1.1\r\n\r\n", "GET /" + "a" * 992 + "...", 414),  # (cut)
        (b"\x16\x03\x01\x02\x00", "-", 400),  # (no request line to log)
    ],
)
async def test_access_log_lines_of_refused_requests_have_their_request_line(
    tmp_path: Path, raw: bytes, request_line: str, status: int
) -> None:
    """A request refused once its request line is read is logged with it (and the user agent
    read before the refusal), as nginx logs its 400s, and with the error page's size: not as
    ``"-" 400 -``, which told nothing of what was refused."""
    log = io.StringIO()
    async with serving(tmp_path, access_log=log) as www_site:
        answer = await www_site.exchange(raw)
    (line,) = log.getvalue().splitlines()
    assert f'"{request_line}" {status} ' in line, line
    size = len(answer.partition(b"\r\n\r\n")[2])
    assert line.split('"')[2].split() == [str(status), str(size)], line
    if request_line != "-" and status != 414:
        assert line.endswith('"-" "t"'), line


async def test_access_log_writes_the_client_a_trusted_proxy_names(tmp_path: Path) -> None:
    """Behind a trusted proxy the log has the client it names; a client that is not a trusted
    proxy cannot put another address in the log with its own X-Forwarded-For."""
    log = io.StringIO()
    xff = "X-Forwarded-For: 198.51.100.1, 203.0.113.9\r\nConnection: close\r\n"
    async with serving(tmp_path, access_log=log, trusted_proxies=("127.0.0.1",)) as www_site:
        await www_site.exchange(get("/small.txt", xff))
    (tmp_path / "untrusted").mkdir()
    async with serving(tmp_path / "untrusted", access_log=log, trusted_proxies=("10.0.0.0/8",)) as www_site:
        await www_site.exchange(get("/small.txt", xff))
    first, second = log.getvalue().splitlines()
    assert first.startswith("203.0.113.9 - - ")
    assert second.startswith("127.0.0.1 - - ")


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


# -- transports ---------------------------------------------------------------------------------------


async def test_tls(tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext) -> None:
    async with serving(tmp_path, tls=(tls_server_ctx, tls_client_ctx)) as www_site:
        reader, writer = await www_site.open()
        try:
            writer.write(get("/small.txt") + get("/big.bin") + get("/missing"))
            answers = [await read_response(reader) for _ in range(3)]
        finally:
            await close_writer(writer)
    assert [a.status for a in answers] == [200, 200, 404]
    assert answers[1].body == (www_site.public / "big.bin").read_bytes()


async def test_unix_socket(tmp_path: Path) -> None:
    async with serving(tmp_path, kind="unix") as www_site:
        raw = await www_site.exchange(get("/small.txt") + get("/big.bin", "Connection: close\r\n"))
    answers = all_responses(raw, ["GET", "GET"])
    assert [len(a.body) for a in answers] == [SMALL, BIG]


async def test_an_upgrade_request_is_answered_and_the_connection_closed(www_site: ServeSite) -> None:
    upgrade = get("/small.txt", "Connection: Upgrade\r\nUpgrade: websocket\r\n")
    raw = await www_site.exchange(upgrade + b"\x81\x85not http at all")
    (a,) = all_responses(raw, ["GET"])
    assert (a.status, len(a.body)) == (200, SMALL)
    assert a.headers["connection"] == "close"  # (no 101: said to close, as it does)


@pytest.mark.parametrize("form", ["combined", "common", "json"])
def test_access_log_lines_of_hostile_length_stay_within_pipe_buf(form: str) -> None:
    """A client sets a line's length (a target of 8 KiB, a User-Agent of 8 KiB, each up to four
    times longer escaped): every line stays within PIPE_BUF, so workers sharing a pipe never tear
    each other's (a torn JSON line is no JSON); a field cut short ends with ``...``."""
    from aiosendfile._serve._accesslog import AccessLog

    stream = io.StringIO()
    log = AccessLog(stream, form)
    long = b"\x01" * 8190  # (each byte escaped as four characters)
    log.line(
        "2001:db8::1", "[24/Nov/2026:08:09:07 +0000]", b"GET /" + long + b" HTTP/1.1", 200, 1, long, long
    )
    log.line(
        "127.0.0.1", "[24/Nov/2026:08:09:07 +0000]", b"GET /" + b"a" * 5000 + b" HTTP/1.1", 200, 1, b"r", b"u"
    )
    log.flush()
    lines = stream.getvalue().splitlines(keepends=True)
    assert len(lines) == 2
    for line in lines:
        assert len(line.encode()) <= 4096, len(line)
        if form == "json":
            json.loads(line)
    assert "GET /aaaa" in lines[1]
    assert "a..." in lines[1]


@pytest.mark.parametrize("over", ["tcp", "tls"])
async def test_access_log_writes_a_body_its_client_left(
    tmp_path: Path, over: str, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> None:
    """A client that leaves while its file body waits for it to read (a reset): the answer is
    logged with the bytes that went, as nginx logs it. Over TLS, the transport saw the reset
    before the body and stopped it, which left no line (a review: 1-6 of 40 lines missing)."""
    from ..support.serve import engine

    log = io.StringIO()
    tls = (tls_server_ctx, tls_client_ctx) if over == "tls" else None
    async with serving(tmp_path, access_log=log, tls=tls) as www_site:
        with open(www_site.public / "huge.bin", "wb") as f:
            f.truncate(64 << 20)  # (more than loopback's buffers take)
        _, writer = await www_site.open()
        writer.transport.pause_reading()
        writer.write(get("/huge.bin"))
        connections = engine()._engines[www_site.server].connections
        for _ in range(500):  # (its body waits for the client: the socket's buffers are full)
            conn = next(iter(connections), None)
            waiting = conn is not None and conn.owned is not None
            if waiting and (over == "tcp" or conn.transport._drained is not None):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()
        for _ in range(500):
            if log.getvalue():
                break
            await asyncio.sleep(0.01)
    (line,) = log.getvalue().splitlines()
    assert '"GET /huge.bin HTTP/1.1" 200 ' in line, line
