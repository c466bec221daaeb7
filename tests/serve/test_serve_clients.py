"""Real clients against the native engine running in its own process (a client in the server's
own loop hides real bugs: ordering, flow control, a blocked loop).

One server process per (loop, TCP|TLS) for the module (``tests/support/serve.py``'s runner),
and two more that are ``python -m aiosendfile serve`` itself;
against it: curl as a subprocess (ranges, multipart, ``-C -`` resuming a partial download,
``--http1.0``, connection reuse), Python's ``http.client`` (many requests on one keep-alive
connection), aiohttp's client (concurrent downloads, multipart), and a raw socket sending pipelined
requests (the answers in order, byte-exact against the same requests sent one at a time) and
malformed ones (400/414/431, then the connection closes and nothing after it is answered).
Each server must stop on SIGTERM with exit status 0 and no traceback.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import http.client
import re
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import trustme

from ..support.files import pattern
from ..support.raw_http import (
    Blob,
    SocketResponses,
    parse_multipart,
    parse_response,
    split_responses,
    without_date,
)
from ..support.serve import ServeProcess, serve_process
from ..support.tls_duplex import TLSDuplex
from ..support.waiting import wait_for

pytest.importorskip("aiosendfile._serve._server")

BIG = 3 * 2**20 + 11  # through sendfile
SMALL = 4096  # inline with the head
DOC = b"compress me " * 1000


def build(public: Path) -> None:
    public.mkdir()
    (public / "big.bin").write_bytes(pattern(BIG))
    (public / "small.txt").write_bytes(pattern(SMALL, seed=3))
    (public / "doc.txt").write_bytes(DOC)
    (public / "doc.txt.gz").write_bytes(gzip.compress(DOC))
    (public / "dir").mkdir()
    (public / "dir" / "index.html").write_text("index!")


@pytest.fixture(
    scope="module",
    params=[
        ("uvloop", False, False),
        ("asyncio", False, False),
        ("uvloop", True, False),
        ("asyncio", True, False),
        ("uvloop", False, True),
        ("asyncio", True, True),
    ],
    ids=["uvloop-tcp", "asyncio-tcp", "uvloop-tls", "asyncio-tls", "serve-uvloop-tcp", "serve-asyncio-tls"],
)
def engine_process(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """The engine in its own process: the tests' runner, or ``python -m aiosendfile serve`` ("serve-")."""
    loop, tls, cli = request.param
    base = tmp_path_factory.mktemp(f"native-{loop}-{'tls' if tls else 'tcp'}{'-cli' if cli else ''}")
    build(base / "public")
    cert = ca = None
    if tls:
        authority = trustme.CA()
        cert, ca = base / "server.pem", base / "ca.pem"
        authority.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
        authority.cert_pem.write_to_path(str(ca))
    with serve_process(base / "public", loop=loop, cert=cert, ca=ca, cli=cli) as s:
        yield s


# -- curl ---------------------------------------------------------------------------------------------


def curl(server: ServeProcess, *args: str) -> subprocess.CompletedProcess[bytes]:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    tls = ["--cacert", str(server.ca)] if server.tls else []
    return subprocess.run(
        ["curl", "--silent", "--show-error", "--max-time", "60", *tls, *args],
        capture_output=True,
        timeout=90,
        check=False,
    )


def test_curl_downloads_and_ranges(engine_process: ServeProcess, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = curl(engine_process, "-o", str(out), "-D", str(tmp_path / "head"), engine_process.url("/big.bin"))
    assert r.returncode == 0, r.stderr
    assert Blob(out.read_bytes()) == Blob(pattern(BIG))
    assert (tmp_path / "head").read_bytes().startswith(b"HTTP/1.1 200")
    r = curl(engine_process, "-r", "100-199", engine_process.url("/big.bin"))
    assert (r.returncode, r.stdout) == (0, pattern(BIG)[100:200]), r.stderr
    r = curl(engine_process, "-r", "-5", engine_process.url("/small.txt"))
    assert r.stdout == pattern(SMALL, seed=3)[-5:]
    r = curl(engine_process, "-D", "-", "-r", "0-9,2000000-2000099", engine_process.url("/big.bin"))
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 206")
    boundary = re.search(rb"boundary=(\S+)", head)
    assert boundary, head
    parts = parse_multipart(body, boundary[1])
    assert [(cr, payload) for _, cr, payload in parts] == [
        (f"bytes 0-9/{BIG}".encode(), pattern(BIG)[:10]),
        (f"bytes 2000000-2000099/{BIG}".encode(), pattern(BIG)[2000000:2000100]),
    ]


def test_curl_resumes_a_partial_download(engine_process: ServeProcess, tmp_path: Path) -> None:
    out = tmp_path / "partial"
    for have in (1, 123_457, BIG - 1):
        out.write_bytes(pattern(BIG)[:have])
        r = curl(engine_process, "-C", "-", "-o", str(out), engine_process.url("/big.bin"))
        assert r.returncode == 0, r.stderr
        assert Blob(out.read_bytes()) == Blob(pattern(BIG)), have
    # Nothing left to fetch: the server says 416 and curl knows the file is complete.
    r = curl(engine_process, "-C", "-", "-o", str(out), engine_process.url("/big.bin"))
    assert r.returncode == 0, r.stderr
    assert Blob(out.read_bytes()) == Blob(pattern(BIG))


def test_curl_http10_head_and_compressed(engine_process: ServeProcess, tmp_path: Path) -> None:
    r = curl(engine_process, "--http1.0", "-D", "-", engine_process.url("/small.txt"))
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    assert (r.returncode, body) == (0, pattern(SMALL, seed=3)), r.stderr
    assert re.match(rb"HTTP/1\.[01] 200", head), head
    r = curl(
        engine_process,
        "--http1.0",
        "-H",
        "Connection: keep-alive",
        "-v",
        engine_process.url("/small.txt"),
        engine_process.url("/doc.txt"),
    )
    assert r.stdout == pattern(SMALL, seed=3) + DOC
    assert b"Re-using existing connection" in r.stderr or b"Reusing existing connection" in r.stderr
    r = curl(engine_process, "-I", engine_process.url("/big.bin"))
    assert r.stdout.startswith(b"HTTP/1.1 200")
    assert f"content-length: {BIG}".encode() in r.stdout.lower()
    r = curl(engine_process, "--compressed", "-D", "-", engine_process.url("/doc.txt"))
    assert b"content-encoding: gzip" in r.stdout.lower()
    assert r.stdout.endswith(DOC)  # curl decompressed the .gz sibling


def test_curl_reuses_one_connection_for_many_urls(engine_process: ServeProcess, tmp_path: Path) -> None:
    urls = [engine_process.url(p) for p in ("/small.txt", "/big.bin", "/missing", "/dir", "/small.txt")]
    args = [a for u in urls for a in ("-o", str(tmp_path / f"o{len(u)}-{hash(u) & 0xFFFF}"), u)]
    r = curl(engine_process, "-v", *args)
    assert r.returncode == 0, r.stderr
    reused = r.stderr.count(b"Re-using existing connection") + r.stderr.count(b"Reusing existing connection")
    assert reused == len(urls) - 1, r.stderr.decode(errors="replace")[-3000:]


# -- http.client --------------------------------------------------------------------------------------


def test_http_client_keeps_one_connection(engine_process: ServeProcess) -> None:
    conn: http.client.HTTPConnection
    if engine_process.tls:
        conn = http.client.HTTPSConnection(
            engine_process.host, engine_process.port, timeout=30, context=engine_process.client_ctx()
        )
    else:
        conn = http.client.HTTPConnection(engine_process.host, engine_process.port, timeout=30)
    try:
        conn.request("GET", "/big.bin")
        resp = conn.getresponse()
        etag = resp.headers["ETag"]
        assert (resp.status, Blob(resp.read())) == (200, Blob(pattern(BIG)))
        sock = conn.sock
        cases: list[tuple[str, str, dict[str, str], int, bytes]] = [
            ("GET", "/small.txt", {}, 200, pattern(SMALL, seed=3)),
            ("HEAD", "/big.bin", {}, 200, b""),
            ("GET", "/big.bin", {"Range": "bytes=5-14"}, 206, pattern(BIG)[5:15]),
            ("GET", "/big.bin", {"If-None-Match": etag}, 304, b""),
            ("GET", "/missing", {}, 404, b"404: Not Found"),
            ("POST", "/small.txt", {}, 405, b"405: Method Not Allowed"),
            ("GET", "/doc.txt", {"Accept-Encoding": "gzip"}, 200, gzip.compress(DOC)),
            ("GET", "/dir/", {}, 200, b"index!"),
        ]
        for method, path, headers, status, body in cases * 3:
            conn.request(method, path, headers=headers)
            resp = conn.getresponse()
            got = resp.read()
            assert resp.status == status, (method, path, headers)
            if path != "/doc.txt":  # gzip.compress adds a timestamp: compare by decompressing
                assert got == body, (method, path, headers)
            else:
                assert gzip.decompress(got) == DOC
            if method == "HEAD":
                assert resp.headers["Content-Length"] == str(BIG)
        assert conn.sock is sock, "the server closed a keep-alive connection"
    finally:
        conn.close()


# -- aiohttp's client -----------------------------------------------------------------------------------


async def test_aiohttp_client_concurrent_downloads_and_multipart(engine_process: ServeProcess) -> None:
    ctx = engine_process.client_ctx()
    connector = aiohttp.TCPConnector(ssl=ctx if ctx else False, limit=8)
    want = hashlib.sha256(pattern(BIG)).hexdigest()
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:

        async def one(i: int) -> str:
            path, expected = ("/big.bin", want) if i % 2 else ("/small.txt", None)
            async with session.get(engine_process.url(path)) as resp:
                body = await resp.read()
                assert resp.status == 200
                assert int(resp.headers["Content-Length"]) == len(body)
            if expected is None:
                assert body == pattern(SMALL, seed=3)
                return "small"
            assert hashlib.sha256(body).hexdigest() == expected
            return "big"

        results = await asyncio.gather(*(one(i) for i in range(24)))
        assert sorted(set(results)) == ["big", "small"]
        async with session.get(engine_process.url("/big.bin"), headers={"Range": "bytes=0-9,-5"}) as resp:
            assert resp.status == 206
            reader = aiohttp.MultipartReader.from_response(resp)
            parts = []
            while (part := await reader.next()) is not None:
                assert isinstance(part, aiohttp.BodyPartReader)
                parts.append((part.headers["Content-Range"], bytes(await part.read(decode=False))))
        assert parts == [
            (f"bytes 0-9/{BIG}", pattern(BIG)[:10]),
            (f"bytes {BIG - 5}-{BIG - 1}/{BIG}", pattern(BIG)[-5:]),
        ]


# -- a raw socket ----------------------------------------------------------------------------------------


def _connect(server: ServeProcess) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=30)
    if server.tls:
        ctx = server.client_ctx()
        assert ctx is not None
        return ctx.wrap_socket(sock, server_hostname="localhost")
    return sock


def _read_all(sock: socket.socket | TLSDuplex) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(2**20)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _req(target: bytes, *headers: bytes, method: bytes = b"GET") -> bytes:
    return (
        method
        + b" "
        + target
        + b" HTTP/1.1\r\nHost: localhost\r\n"
        + b"".join(h + b"\r\n" for h in headers)
        + b"\r\n"
    )


PIPELINE: list[tuple[bytes, bytes]] = [
    (b"GET", _req(b"/small.txt")),
    (b"GET", _req(b"/big.bin")),
    (b"HEAD", _req(b"/big.bin", method=b"HEAD")),
    (b"GET", _req(b"/small.txt", b"Range: bytes=1-3")),
    (b"GET", _req(b"/missing")),
    (b"GET", _req(b"/big.bin", b"Range: bytes=1000000-1999999")),
    (b"GET", _req(b"/dir")),
    (b"DELETE", _req(b"/small.txt", method=b"DELETE")),
    (b"GET", _req(b"/doc.txt")),
    (b"GET", _req(b"/big.bin")),
    (b"GET", _req(b"/small.txt", b"Connection: close")),
]


def test_raw_pipelined_requests_are_answered_in_order_byte_exact(engine_process: ServeProcess) -> None:
    methods = [m for m, _ in PIPELINE]
    # One at a time on one connection: the reference.
    sock = _connect(engine_process)
    reference = []
    with sock:
        one_by_one = SocketResponses(sock)
        for method, data in PIPELINE:
            sock.sendall(data)
            reference.append(one_by_one.next(method))
        assert _read_all(sock) == b""
        assert one_by_one.buffer == b""
    # All of them in one send.
    with _connect(engine_process) as sock:
        sock.sendall(b"".join(d for _, d in PIPELINE))
        got = _read_all(sock)
    answers, rest = split_responses(got, methods)
    assert rest == b""
    assert [Blob(without_date(a.raw)) for a in answers] == [Blob(without_date(a.raw)) for a in reference]
    bodies = answers
    assert [r.status for r in bodies] == [200, 200, 200, 206, 404, 206, 301, 405, 200, 200, 200]
    assert Blob(bodies[1].body) == Blob(pattern(BIG)) == Blob(bodies[9].body)
    assert Blob(bodies[5].body) == Blob(pattern(BIG)[1000000:2000000])


@pytest.mark.parametrize(
    ("bad", "status"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\nNo colon here\r\n\r\n", 400),
        (b"GET /" + b"x" * 20_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414),
        (b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\nX-Huge: " + b"y" * 40_000 + b"\r\n\r\n", 431),
        # RFC 9112 6.1: chunked framing on HTTP/1.0 is refused and the connection closed (nginx: 400)
        (b"GET /small.txt HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        # a transfer coding we do not implement before chunked (nginx: 501)
        (
            b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\n"
            b"Transfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n",
            501,
        ),
        (b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /small.txt HTTP/2.0\r\nHost: localhost\r\n\r\n", 505),  # an HTTP/1.x server (nginx: 505)
    ],
    ids=[
        "garbage",
        "bad-header",
        "long-target",
        "huge-header",
        "http10-chunked",
        "te-identity",
        "te-gzip",
        "http2",
    ],
)
def test_raw_malformed_request_is_answered_then_closed(
    engine_process: ServeProcess, bad: bytes, status: int
) -> None:
    with _connect(engine_process) as sock:
        sock.sendall(_req(b"/small.txt") + bad + _req(b"/small.txt"))
        got = _read_all(sock)
    answers, rest = split_responses(got, [b"GET", b"GET", b"GET"])
    assert rest == b"", rest[:300]
    assert [a.status for a in answers] == [200, status], got[:600]
    assert answers[1].header("connection") == "close"


def test_raw_pipelined_big_answers_to_a_slow_small_window_reader(engine_process: ServeProcess) -> None:
    """Several file bodies queued behind each other while the client's window is tiny: the
    EAGAIN path runs again and again, and the stream is still exact and in order."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(30)
    raw.connect((engine_process.host, engine_process.port))
    sock: socket.socket = raw
    if engine_process.tls:
        ctx = engine_process.client_ctx()
        assert ctx is not None
        sock = ctx.wrap_socket(raw, server_hostname="localhost")
    pipeline = [
        _req(b"/big.bin"),
        _req(b"/small.txt"),
        _req(b"/big.bin", b"Range: bytes=1-1000000,2000000-"),
        _req(b"/big.bin", b"Connection: close"),
    ]
    with sock:
        sock.sendall(b"".join(pipeline))
        got = _read_all(sock)
    answers, rest = split_responses(got, [b"GET"] * 4)
    assert rest == b""
    statuses = [a.status for a in answers]
    assert statuses == [200, 200, 206, 200]
    assert Blob(answers[0].body) == Blob(pattern(BIG)) == Blob(answers[3].body)
    assert answers[1].body == pattern(SMALL, seed=3)


def test_raw_many_small_pipelined_requests_with_a_reader_alongside(engine_process: ServeProcess) -> None:
    """2,000 requests written while the answers are read in another thread: all, in order. (Over
    TLS the client runs over memory BIOs: an ``SSLSocket`` read and written by two threads at
    once is not safe.)"""
    n = 2000
    raw = socket.create_connection((engine_process.host, engine_process.port), timeout=30)
    client_ctx = engine_process.client_ctx() if engine_process.tls else None
    with TLSDuplex(raw, client_ctx) if client_ctx is not None else raw as sock:
        received: list[bytes] = []

        def read() -> None:
            received.append(_read_all(sock))

        reader = threading.Thread(target=read)
        reader.start()
        batch = b"".join(_req(b"/small.txt" if i % 2 else b"/missing") for i in range(n - 1))
        sock.sendall(batch + _req(b"/small.txt", b"Connection: close"))
        reader.join(60)
        assert not reader.is_alive()
    answers, rest = split_responses(received[0], [b"GET"] * n)
    assert rest == b""
    assert [a.status for a in answers] == [404 if i % 2 == 0 else 200 for i in range(n - 1)] + [200]


def test_clients_that_vanish_mid_body_leave_nothing_behind(
    engine_process: ServeProcess, request: pytest.FixtureRequest
) -> None:
    """Reset mid-download, half-closed after the request, gone before the answer: the server's
    descriptors come back to where they were, it still serves, and it says nothing on stderr.
    The count to come back to is taken after a first answer: uvloop's loop opens the descriptor
    it keeps in reserve for EMFILE (libuv's ``/dev/null``) at its first connection."""
    with _connect(engine_process) as sock:
        sock.sendall(_req(b"/small.txt", b"Connection: close"))
        assert parse_response(_read_all(sock)).body == pattern(SMALL, seed=3)
    time.sleep(0.1)
    engine_process.new_stderr()
    base = engine_process.fd_count()
    for _ in range(5):
        with _connect(engine_process) as sock:
            sock.sendall(_req(b"/big.bin"))
            sock.recv(10_000)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        with _connect(engine_process) as sock:
            sock.sendall(_req(b"/big.bin") * 3)  # and gone without reading
    if (
        not engine_process.tls
    ):  # a half-close after the request: the answer still comes (TLS has no half-close)
        with _connect(engine_process) as sock:
            sock.sendall(_req(b"/small.txt"))
            sock.shutdown(socket.SHUT_WR)
            r = parse_response(_read_all(sock))
            assert (r.status, r.body) == (200, pattern(SMALL, seed=3))
    wait_for(lambda: engine_process.fd_count() <= base, 30, f"server fds back to {base}")
    with _connect(engine_process) as sock:
        sock.sendall(_req(b"/small.txt", b"Connection: close"))
        assert parse_response(_read_all(sock)).body == pattern(SMALL, seed=3)
    time.sleep(0.2)
    assert engine_process.new_stderr() == ""
