"""Differential: uvicorn with our protocol answers exactly as stock uvicorn, serving the same app.

Each pair is two uvicorn processes serving one unchanged app (Starlette's or FastAPI's own
``StaticFiles``/``FileResponse``, and the same apps with ``aiosendfile.asgi``'s) from one
tree: stock uvicorn (``--http httptools`` or ``h11``) and ours (``--http
aiosendfile.uvicorn:HttpToolsProtocol`` or ``H11Protocol``), on one loop, over TCP or TLS. The
same requests go to both on one keep-alive connection per server: full GET and HEAD, single and
multiple ranges, conditionals (304, If-Match, If-Range), missing files, traversal attempts,
under the plain mount, ``GZipMiddleware`` and ``BaseHTTPMiddleware``. Every answer must be the
same status line, the same header fields in the same order but ``Date`` and ``Server``, and the
same body bytes (multipart boundaries, random in Starlette, normalised); and each connection
must be reused after the same answers. Then raw bytes: ten pipelined requests in one write, and
one-shot requests (HTTP/1.0, ``Connection: close``, an absolute-form target) that must end the
connection alike. The one difference by design: Starlette's GZip leaves a ``pathsend`` answer
alone, so under our protocol a full file behind it comes uncompressed and without ``Vary``.

Zero-copy is proved in the server process: ``/_counters`` reports its shim counters, which grow
by the body's size for each full file over TCP under our protocol, and not at all over TLS (the
bounded copy) or under stock uvicorn.
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..support.asgi_apps import FILE_NAME
from ..support.asgi_apps import ours_available as apps_available
from ..support.asgi_servers import (
    OUR_H11,
    OUR_HTTPTOOLS,
    AsgiServer,
    TlsFiles,
    clean_exit,
    ours_available,
    tls_files,
)
from ..support.files import pattern
from ..support.raw_http import split_responses
from ..support.static_requests import normalise as normalise_raw

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

APPS = "tests.support.asgi_apps"
BIG = 300_001  # file.bin: over several 64 KiB chunks, not a multiple of one
VARY = ("vary", "Accept-Encoding")


@dataclass(frozen=True)
class Combo:
    app: str  # a factory of tests.support.asgi_apps
    loop: str
    tls: bool
    http: str  # "httptools" or "h11": stock uvicorn's; ours is the same parser's subclass

    @property
    def id(self) -> str:
        return f"{self.app}-{self.loop}-{'tls' if self.tls else 'tcp'}-{self.http}"

    @property
    def ours_http(self) -> str:
        return OUR_HTTPTOOLS if self.http == "httptools" else OUR_H11

    @property
    def prefixes(self) -> list[str]:
        return ["", "/gz", "/mw"] if "starlette" in self.app else [""]


COMBOS = [
    *(
        Combo(app, loop, tls, "httptools")
        for app in ("starlette_app", "fastapi_app")
        for loop in ("asyncio", "uvloop")
        for tls in (False, True)
    ),
    Combo("starlette_app", "asyncio", False, "h11"),
    Combo("fastapi_app", "uvloop", True, "h11"),
    *(
        Combo("ours_starlette_app", loop, tls, "httptools")
        for loop in ("asyncio", "uvloop")
        for tls in (False, True)
    ),
    Combo("ours_fastapi_app", "uvloop", False, "httptools"),
    Combo("ours_starlette_app", "asyncio", True, "h11"),
]


# -- the tree ---------------------------------------------------------------------------------------


def build_tree(root: Path) -> Path:
    """public/ with the files the requests name, and secret.txt beside it (what traversal would reach)."""
    public = root / "public"
    (public / "sub").mkdir(parents=True)
    (public / FILE_NAME).write_bytes(pattern(BIG))
    (public / "small.txt").write_bytes(b"small text file\n" * 64)
    (public / "empty.bin").write_bytes(b"")
    (public / "with space.txt").write_bytes(b"a name with a space\n")
    (public / "sub" / "nested.html").write_bytes(b"<!doctype html><p>nested</p>\n")
    (public / "style.css").write_bytes(b"body { color: red }\n" * 100)
    (root / "secret.txt").write_bytes(b"SECRET\n")
    return public


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tree(tmp_path_factory.mktemp("asgi-diff"))


@pytest.fixture(scope="module")
def server_tls_files(tmp_path_factory: pytest.TempPathFactory, tls_ca: Any) -> TlsFiles:
    """A certificate for the server processes (and its CA for the clients), for the module."""
    return tls_files(tls_ca, tmp_path_factory.mktemp("asgi-diff-tls"))


# -- a pair of servers -----------------------------------------------------------------------------


@dataclass
class Side:
    server: AsgiServer
    conn: http.client.HTTPConnection = field(init=False)

    def __post_init__(self) -> None:
        self.conn = self.server.connection()

    def request(self, method: str, target: str, headers: dict[str, str]) -> tuple[dict[str, Any], bool]:
        """One request on the keep-alive connection: (its comparable answer, whether the connection was
        the one the previous request used)."""
        before = self.conn.sock
        self.conn.request(method, target, headers=headers)
        reused = before is not None and self.conn.sock is before
        resp = self.conn.getresponse()
        body = resp.read()
        answer = {
            "status": (resp.version, resp.status, resp.reason),
            "headers": [(k.lower(), v) for k, v in resp.getheaders() if k.lower() not in ("date", "server")],
            "body": body,
        }
        return normalise(answer), reused

    def counters(self) -> dict[str, int]:
        self.conn.request("GET", "/_counters")
        resp = self.conn.getresponse()
        assert resp.status == 200
        return dict(json.loads(resp.read()))

    def close(self) -> None:
        self.conn.close()


def normalise(answer: dict[str, Any]) -> dict[str, Any]:
    """A multipart answer's random boundary replaced by a fixed one of the same length."""
    for name, value in answer["headers"]:
        m = re.match(r"multipart/byteranges; boundary=(\S+)", value) if name == "content-type" else None
        if m:
            boundary = m[1]
            fixed = "B" * len(boundary)
            answer["headers"] = [(k, v.replace(boundary, fixed)) for k, v in answer["headers"]]
            answer["body"] = answer["body"].replace(boundary.encode(), fixed.encode())
    return answer


@dataclass
class Pair:
    combo: Combo
    stock: Side
    ours: Side
    etag: str
    last_modified: str

    def both(self, method: str, target: str, headers: dict[str, str] | None = None) -> list[Any]:
        """The request to both sides; the differences found (empty when they answer alike)."""
        fields = {k: v.format(etag=self.etag, lm=self.last_modified) for k, v in (headers or {}).items()}
        a, reused_a = self.stock.request(method, target, fields)
        b, reused_b = self.ours.request(method, target, fields)
        if target.startswith("/gz/"):  # GZip's Vary: see test_gzip_passes_pathsend_through
            a["headers"] = [h for h in a["headers"] if h[0] != "vary"]
            b["headers"] = [h for h in b["headers"] if h[0] != "vary"]
        found = []
        if a["status"] != b["status"]:
            found.append((method, target, headers, "status", a["status"], b["status"]))
        if a["headers"] != b["headers"]:
            only_a = [h for h in a["headers"] if h not in b["headers"]]
            only_b = [h for h in b["headers"] if h not in a["headers"]]
            what = "header order" if not only_a and not only_b else "headers"
            found.append((method, target, headers, what, only_a or a["headers"], only_b or b["headers"]))
        if a["body"] != b["body"]:
            found.append((method, target, headers, "body", summary(a["body"]), summary(b["body"])))
        if reused_a != reused_b:
            found.append((method, target, headers, "connection reused", reused_a, reused_b))
        return found


def summary(body: bytes) -> str:
    return f"{len(body)} bytes {body[:40]!r}"


@pytest.fixture(scope="module", params=COMBOS, ids=[c.id for c in COMBOS])
def server_pair(request: pytest.FixtureRequest, tree: Path, server_tls_files: TlsFiles) -> Iterator[Pair]:
    combo: Combo = request.param
    if not ours_available():
        pytest.skip("aiosendfile.uvicorn (engineer U's protocol) is not in the tree yet")
    if combo.app.startswith("ours_") and not apps_available():
        pytest.skip("aiosendfile.asgi (engineer A's apps) is not in the tree yet")
    servers = [
        AsgiServer(
            f"{APPS}:{combo.app}",
            tree,
            http=http,
            loop=combo.loop,
            tls=server_tls_files if combo.tls else None,
            options=["--no-access-log"],
            wait=False,
        )
        for http in (combo.http, combo.ours_http)
    ]
    try:
        for server in servers:
            server.wait_ready()
        stock, ours = Side(servers[0]), Side(servers[1])
        head, _ = stock.request("HEAD", "/static/" + FILE_NAME, {})
        ours.request("HEAD", "/static/" + FILE_NAME, {})  # both connections open: reuse is compared
        fields = dict(head["headers"])
        yield Pair(combo, stock, ours, fields["etag"], fields["last-modified"])
        stock.close()
        ours.close()
    finally:
        results = [server.stop() for server in servers]
    for code, logs in results:
        assert clean_exit(code), (code, logs[-3000:])
        assert "Traceback" not in logs, logs[-5000:]
        assert "Exception in ASGI application" not in logs, logs[-5000:]


def run(pair: Pair, cases: list[tuple[str, str, dict[str, str]]]) -> None:
    differ = []
    for method, target, headers in cases:
        for prefix in pair.combo.prefixes:
            if prefix == "/gz" and "gzip" in headers.get("Accept-Encoding", ""):
                continue  # compressed by stock, not by ours: test_gzip_passes_pathsend_through
            differ += pair.both(method, prefix + target, headers)
    for side in (pair.stock, pair.ours):
        assert not side.server.problems(), side.server.logs()[-5000:]
    assert not differ, differ


# -- the requests -----------------------------------------------------------------------------------

FILES = ["/static/" + FILE_NAME, "/file"]

FULL = [
    *((method, target, {}) for method in ("GET", "HEAD") for target in FILES),
    ("GET", "/static/small.txt", {}),
    ("HEAD", "/static/small.txt", {}),
    ("GET", "/static/style.css", {}),
    ("GET", "/static/empty.bin", {}),
    ("GET", "/static/sub/nested.html", {}),
    ("GET", "/static/with%20space.txt", {}),
    ("GET", "/static/" + FILE_NAME + "?query=1", {}),
    ("GET", "/static/" + FILE_NAME, {"Accept-Encoding": "gzip, br"}),
    ("POST", "/static/" + FILE_NAME, {"Content-Length": "0"}),
]
RANGES = [
    (method, target, headers)
    for target in FILES
    for method, headers in [
        ("GET", {"Range": "bytes=0-99"}),
        ("GET", {"Range": "bytes=-500"}),
        ("GET", {"Range": "bytes=299000-"}),
        ("GET", {"Range": f"bytes=0-{BIG + 100}"}),
        ("GET", {"Range": "bytes=100-199,1000-1099"}),
        ("GET", {"Range": "bytes=0-0,-1,70000-140000"}),
        ("GET", {"Range": "bytes=0-10,5-20"}),
        ("GET", {"Range": f"bytes={BIG}-"}),
        ("GET", {"Range": "bytes=abc"}),
        ("GET", {"Range": "items=0-1"}),
        ("HEAD", {"Range": "bytes=0-99"}),
        ("HEAD", {"Range": "bytes=0-9,20-29"}),
        ("GET", {"Range": "bytes=0-99", "If-Range": "{etag}"}),
        ("GET", {"Range": "bytes=0-99", "If-Range": '"other"'}),
        ("GET", {"Range": "bytes=0-99", "If-Range": "{lm}"}),
    ]
]
CONDITIONALS = [
    (method, target, headers)
    for target in FILES
    for method, headers in [
        ("GET", {"If-None-Match": "{etag}"}),
        ("HEAD", {"If-None-Match": "{etag}"}),
        ("GET", {"If-None-Match": '"other", {etag}'}),
        ("GET", {"If-None-Match": '"other"'}),
        ("GET", {"If-None-Match": "*"}),
        ("GET", {"If-Modified-Since": "{lm}"}),
        ("GET", {"If-Modified-Since": "Mon, 01 Jan 1990 00:00:00 GMT"}),
        ("GET", {"If-Match": '"nope"'}),
        ("GET", {"If-Match": "{etag}"}),
        ("GET", {"If-Unmodified-Since": "Mon, 01 Jan 1990 00:00:00 GMT"}),
        ("GET", {"If-None-Match": "{etag}", "Range": "bytes=0-9"}),
    ]
]
MISSING = [
    ("GET", "/static/missing.txt", {}),
    ("HEAD", "/static/missing.txt", {}),
    ("GET", "/nowhere", {}),
    ("GET", "/static/sub", {}),
    ("GET", "/static/sub/", {}),
    ("GET", "/static/", {}),
    ("GET", "/static/../secret.txt", {}),
    ("GET", "/static/sub/../../secret.txt", {}),
    ("GET", "/static/%2e%2e/secret.txt", {}),
    ("GET", "/static/%2E%2E/secret.txt", {}),
    ("GET", "/static/.%2e/secret.txt", {}),
    ("GET", "/static/..%2fsecret.txt", {}),
    ("GET", "/static/%2e%2e%2fsecret.txt", {}),
    ("GET", "/static/sub/..%2f..%2fsecret.txt", {}),
    ("GET", "/static/sub%2f..%2f..%2fsecret.txt", {}),
    ("GET", "/static/..%5csecret.txt", {}),
    ("GET", "/static//etc/passwd", {}),
    ("GET", "/static/%2fetc%2fpasswd", {}),
    ("GET", "/static/small.txt%00.png", {}),
    ("GET", "/static/small.txt/", {}),
]


def test_full_and_head(server_pair: Pair) -> None:
    run(server_pair, FULL)


def test_ranges(server_pair: Pair) -> None:
    run(server_pair, RANGES)


def test_conditionals(server_pair: Pair) -> None:
    run(server_pair, CONDITIONALS)


def test_missing_and_traversal(server_pair: Pair) -> None:
    run(server_pair, MISSING)
    for side in (server_pair.stock, server_pair.ours):
        for target in ("/static/../secret.txt", "/static/%2e%2e%2fsecret.txt"):
            answer, _ = side.request("GET", target, {})
            assert b"SECRET" not in answer["body"]


def test_keep_alive_reuse(server_pair: Pair) -> None:
    """Twenty full files in a row on one connection: the same connection all along, on both."""
    for side in (server_pair.stock, server_pair.ours):
        side.request("GET", "/static/small.txt", {})  # (re)opened here if a case closed it
        for i in range(20):
            answer, reused = side.request("GET", FILES[i % 2], {})
            assert reused, (side.server.http, i)
            assert answer["body"] == pattern(BIG)


PIPELINE = [
    ("GET", "/static/" + FILE_NAME, ""),
    ("HEAD", "/file", ""),
    ("GET", "/static/small.txt", ""),
    ("GET", "/file", "Range: bytes=100-199,1000-1099\r\n"),
    ("GET", "/mw/file", ""),
    ("GET", "/static/missing.txt", ""),
    ("GET", "/file", ""),
    ("GET", "/static/empty.bin", ""),
    ("GET", "/static/" + FILE_NAME, "If-None-Match: {etag}\r\n"),
    ("GET", "/static/style.css", "Connection: close\r\n"),
]


def test_pipelined(server_pair: Pair) -> None:
    """Ten requests in one write on a raw connection (the last says ``Connection: close``): the
    same answers, in order, byte for byte but Date/Server, and then the end of the connection."""
    data = b"".join(
        f"{method} {target} HTTP/1.1\r\nHost: localhost\r\n{extra.format(etag=server_pair.etag)}\r\n".encode()
        for method, target, extra in PIPELINE
    )
    methods = [method.encode() for method, _, _ in PIPELINE]
    answers = []
    for side in (server_pair.stock, server_pair.ours):
        with side.server.socket(timeout=30) as sock:
            sock.sendall(data)
            chunks = []
            while chunk := sock.recv(2**20):
                chunks.append(chunk)
        raw, rest = split_responses(b"".join(chunks), methods)
        assert rest == b"", rest[:300]
        answers.append([normalise_raw(r.raw) for r in raw])
    assert len(answers[0]) == len(PIPELINE)
    assert answers[0] == answers[1]


RAW_ONE_SHOT = [
    b"GET /static/file.bin HTTP/1.0\r\n\r\n",
    b"GET /file HTTP/1.0\r\nHost: localhost\r\n\r\n",
    b"HEAD /file HTTP/1.0\r\n\r\n",
    b"GET /static/file.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    b"GET http://localhost/static/file.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    b"GET /mw/static/file.bin HTTP/1.0\r\n\r\n",
    b"GET /static/file.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nRange: bytes=5-9\r\n\r\n",
    b"GET /static/file.bin HTTP/1.1\r\nConnection: close\r\n\r\n",  # no Host: uvicorn lets it by
]


def test_one_shot_answers_and_the_close(server_pair: Pair) -> None:
    """HTTP/1.0, ``Connection: close``, an absolute-form target: the same bytes (but Date/Server),
    then the server closes the connection, on both."""
    differ = []
    for data in RAW_ONE_SHOT:
        answers = []
        for side in (server_pair.stock, server_pair.ours):
            with side.server.socket(timeout=30) as sock:
                sock.sendall(data)
                chunks = []
                while chunk := sock.recv(2**20):
                    chunks.append(chunk)
            answers.append(normalise_raw(b"".join(chunks)))
        if answers[0] != answers[1]:
            differ.append((data, answers))
    assert not differ, differ


def only(keep: Callable[[Combo], bool]) -> list[Any]:
    """The combos *keep* admits, to parametrize ``server_pair`` for a test that applies to those alone."""
    return [pytest.param(c, id=c.id) for c in COMBOS if keep(c)]


@pytest.mark.parametrize(
    "server_pair", only(lambda c: "/gz" in c.prefixes), indirect=True
)  # FastAPI's: no /gz
def test_gzip_passes_pathsend_through(server_pair: Pair) -> None:
    """Behind GZipMiddleware, stock uvicorn's answer is compressed (Starlette streams the body) and
    says ``Vary: Accept-Encoding``; ours is the file as is, without Vary (GZip passes a
    ``pathsend`` answer on untouched): the same bytes once decoded. Starlette's choice, not the
    protocol's: the one difference the other tests leave out (Vary under /gz: GZip adds its own to a body it
    saw, even to an app's own Vary)."""
    data = pattern(BIG)
    for target in FILES:
        for encoding in ("gzip", "identity"):
            stock, _ = server_pair.stock.request("GET", "/gz" + target, {"Accept-Encoding": encoding})
            ours, _ = server_pair.ours.request("GET", "/gz" + target, {"Accept-Encoding": encoding})
            assert stock["status"] == ours["status"] == ((11, 200, "OK"))
            if server_pair.combo.app.startswith("ours_"):  # A's apps: equal bodies once decoded
                assert decoded(stock) == decoded(ours) == data
                continue
            gzipped = encoding == "gzip"
            assert ("content-encoding", "gzip") in stock["headers"] if gzipped else True
            assert decoded(stock) == data
            # Starlette's GZip sends a pathsend answer on untouched: no compression, no Vary
            assert ours["body"] == data
            assert ("content-encoding", "gzip") not in ours["headers"]
            assert VARY in stock["headers"]
            assert VARY not in ours["headers"]


def decoded(answer: dict[str, Any]) -> bytes:
    if ("content-encoding", "gzip") in answer["headers"]:
        return gzip.decompress(answer["body"])
    return bytes(answer["body"])


# -- zero-copy, proved in the server process --------------------------------------------------------


def test_zero_copy(server_pair: Pair) -> None:
    """A full file under our protocol goes through the shim's sendfile over TCP (the counters grow
    by its size), not over TLS; under stock uvicorn never. HEAD and ranges of Starlette's own
    FileResponse send body messages: nothing through the shim either."""
    targets = [p + t for p in server_pair.combo.prefixes for t in FILES]
    for side, ours in ((server_pair.stock, False), (server_pair.ours, True)):
        for target in targets:
            before = side.counters()
            answer, _ = side.request("GET", target, {})
            after = side.counters()
            assert answer["body"] == pattern(BIG)
            moved = after["bytes"] - before["bytes"]
            expected = BIG if ours and not server_pair.combo.tls else 0
            assert moved == expected, (side.server.http, target, moved)
        before = side.counters()
        side.request("HEAD", FILES[0], {})
        if not server_pair.combo.app.startswith("ours_"):
            side.request("GET", FILES[0], {"Range": "bytes=0-99"})
        assert side.counters()["bytes"] == before["bytes"]


@pytest.mark.parametrize("server_pair", only(lambda c: c.app.startswith("ours_")), indirect=True)
def test_zero_copy_ranges(server_pair: Pair) -> None:
    """``aiosendfile.asgi``'s apps send ranges and multipart through our protocol's private
    pathsend keys: zero-copy over TCP, the part headers by plain writes. (Starlette's own
    FileResponse sends ranges as body messages: the combos of the other apps are not generated.)"""
    data = pattern(BIG)
    for side, ours in ((server_pair.stock, False), (server_pair.ours, True)):
        for target in FILES:
            for spec, size in (("bytes=1000-80999", 80_000), ("bytes=0-99,200000-299999", 100_100)):
                before = side.counters()
                answer, _ = side.request("GET", target, {"Range": spec})
                moved = side.counters()["bytes"] - before["bytes"]
                assert answer["status"][1] == 206
                if "," not in spec:
                    assert answer["body"] == data[1000:81000]
                expected = size if ours and not server_pair.combo.tls else 0
                assert moved == expected, (side.server.http, target, spec, moved)
