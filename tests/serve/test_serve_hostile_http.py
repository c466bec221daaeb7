"""Hostile HTTP against the aiohttp plugin, the native engine and ``python -m aiosendfile serve``.

The ``door`` fixture is the door under test: the plugin under ``/static`` in an Application, or the
native engine (``aiosendfile._serve``) at "/" in the test's loop; each over TCP and TLS.

Every request here is written raw to a socket: no client library normalises
the path or the headers first.

* Path tricks (a table of traversal and encoding tricks, symlink escapes, long
  paths): never a 200, never a byte from outside the served directory, never a
  5xx.
* Malformed, huge and amplifying Range headers: every answer is a correct one
  (200 whole file, 206 slice or multipart, 416, or 400 from the parser), and the
  response never exceeds the file plus the multipart framing of at most 16 parts.
* A property test: random file sizes and Range headers against a reference
  model of RFC 9110 with nginx's ``max_ranges``/amplification rules, on both
  loops, over TCP and TLS.
* A file truncated while its response is being sent: the client sees an error
  (``ClientPayloadError`` or a disconnect), never a complete short body.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

import aiosendfile.aiohttp as sf
from aiosendfile import _platform

from ..support.connections import trusting
from ..support.files import pattern
from ..support.processes import Server
from ..support.ranges import model
from ..support.raw_http import (
    Response,
    parse_head,
    parse_multipart,
    parse_response,
    raw_async,
    raw_sync,
    request_bytes,
)
from ..support.serve import ServeSite, serve_site

SECRET = b"TOP SECRET 7f3a"  # outside the served directory
SIBLING_SECRET = b"SIBLING SECRET 91c2"  # in a directory whose name extends the root's
PASSWD = b"root:x:0:0"
BIG = 100_007  # above the plugin's inline limit: its body goes through sendfile
SMALL = 1000
#: Largest multipart framing for 16 parts (the most ever served) plus a response head.
MAX_PARTS = 16
PART_OVERHEAD = 200
HEAD_ALLOWANCE = 2048


# -- the tree -------------------------------------------------------------------------------------


def build_tree(base: Path) -> Path:
    """``base/public`` is served; secrets sit beside it and symlinks try to reach them."""
    public = base / "public"
    public.mkdir()
    (base / "secret.txt").write_bytes(SECRET)
    (base / "public-secret").mkdir()  # "public-secret" starts with "public": a prefix check must not pass it
    (base / "public-secret" / "file.txt").write_bytes(SIBLING_SECRET)
    (public / "big.bin").write_bytes(pattern(BIG))
    (public / "small.bin").write_bytes(pattern(SMALL, seed=3))
    (public / "dir").mkdir()
    (public / "dir" / "inner.txt").write_text("inner")
    (public / "sub").mkdir()
    (public / "escape").symlink_to(base / "secret.txt")  # absolute link out
    (public / "rel-escape").symlink_to("../secret.txt")  # relative link out
    (public / "passwd-link").symlink_to("/etc/passwd")
    (public / "outdir").symlink_to(base)  # a directory link out
    (public / "sub" / "up").symlink_to("../..")  # climbs out from a subdirectory
    (public / "chain2").symlink_to(base / "secret.txt")
    (public / "chain").symlink_to(public / "chain2")  # inside -> inside -> outside
    (public / "sibling-link").symlink_to(base / "public-secret" / "file.txt")
    (public / "sibling-dir").symlink_to(base / "public-secret")
    return public


# -- the servers ---------------------------------------------------------------------------------


@dataclass
class PluginSite:
    public: Path
    server: TestServer
    ctx: ssl.SSLContext | None
    prefix: bytes = b"/static"

    @property
    def tls(self) -> bool:
        return self.ctx is not None

    @property
    def path(self) -> str:
        return self.prefix.decode()

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def fetch(self, data: bytes) -> Response:
        assert self.server.host is not None
        assert self.server.port is not None
        return parse_response(await raw_async(self.server.host, self.server.port, data, self.ctx))


class _NativeServer:
    """What a PluginSite reads of its TestServer, for the native engine's site."""

    def __init__(self, site: ServeSite) -> None:
        self.host, self.port, self.base = site.host, site.port, site.base

    def make_url(self, path: str) -> URL:
        return URL(self.base + path)


@pytest.fixture(
    params=[("plugin", False), ("plugin", True), ("native", False), ("native", True)],
    ids=["plugin-tcp", "plugin-tls", "native-tcp", "native-tls"],
)
async def door(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
) -> AsyncIterator[PluginSite]:
    """The door under test: the plugin under /static in an Application, or the native engine at "/"."""
    door, tls = request.param
    public = build_tree(tmp_path)
    if door == "native":
        pytest.importorskip("aiosendfile._serve._server")
        async with serve_site(
            public, server_ctx=tls_server_ctx if tls else None, client_ctx=tls_client_ctx
        ) as site:
            yield PluginSite(public, _NativeServer(site), site.ctx, prefix=b"")  # type: ignore[arg-type]
        return
    app = web.Application()
    app.add_routes([sf.static("/static", public)])
    server = TestServer(app, scheme="https" if tls else "http")
    await server.start_server(ssl=tls_server_ctx if tls else None)
    try:
        yield PluginSite(public, server, tls_client_ctx if tls else None)
    finally:
        await server.close()


@pytest.fixture(
    scope="module",
    params=[("asyncio", False), ("uvloop", False), ("asyncio", True), ("uvloop", True)],
    ids=["asyncio-tcp", "uvloop-tcp", "asyncio-tls", "uvloop-tls"],
)
def serve_cli(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tls_ca: trustme.CA
) -> Iterator[Server]:
    loop, tls = request.param
    base = tmp_path_factory.mktemp(f"serve-{loop}-{'tls' if tls else 'tcp'}")
    public = build_tree(base)
    options = []
    if tls:
        chain = base / "chain.pem"
        tls_ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(chain))
        options = ["--tls-cert", str(chain)]
    server = Server(str(public), "--port", "0", "--loop", loop, *options)
    try:
        yield server
    finally:
        code = server.interrupt()
        server.close()
        assert code == 0


def serve_fetch(server: Server, data: bytes, ca: trustme.CA | None = None) -> Response:
    """*data* sent raw to ``serve`` (over TLS, trusting *ca*, when it serves https)."""
    host, port = server.url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    if not server.url.startswith("https:"):
        return parse_response(raw_sync(host, int(port), data))
    assert ca is not None
    with (
        socket.create_connection((host, int(port)), timeout=20) as raw,
        trusting(ca).wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(ConnectionResetError, ssl.SSLError):
            while chunk := sock.recv(2**20):
                chunks.append(chunk)
    return parse_response(b"".join(chunks))


# -- path tricks ------------------------------------------------------------------------------------

# "{p}" is the mount point: "/static" for the plugin, "" for serve (mounted at "/").
TRAVERSAL: list[bytes] = [
    # plain and percent-encoded dot segments
    b"{p}/../secret.txt",
    b"{p}/../../../../../../../../etc/passwd",
    b"{p}/..%2fsecret.txt",
    b"{p}/..%2Fsecret.txt",
    b"{p}/%2e%2e/secret.txt",
    b"{p}/%2E%2E/secret.txt",
    b"{p}/%2e%2E%2fsecret.txt",
    b"{p}/.%2e/secret.txt",
    b"{p}/%2e./secret.txt",
    b"{p}/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    b"{p}/dir/../../secret.txt",
    b"{p}/dir/./../../secret.txt",
    b"{p}/dir//../../secret.txt",
    b"{p}/dir/%2e%2e/%2e%2e/secret.txt",
    b"{p}/dir%2f..%2f..%2fsecret.txt",
    b"{p}/./../secret.txt",
    b"{p}/....//secret.txt",
    b"{p}/...//secret.txt",
    b"{p}/.../secret.txt",
    # double and triple encoding
    b"{p}/%252e%252e/secret.txt",
    b"{p}/%252e%252e%252fsecret.txt",
    b"{p}/%25252e%25252e/secret.txt",
    b"{p}/..%252fsecret.txt",
    b"{p}/.%252e/secret.txt",
    # backslashes and mixed separators
    b"{p}/..\\secret.txt",
    b"{p}/..%5csecret.txt",
    b"{p}/..%5Csecret.txt",
    b"{p}/%5c..%5c..%5csecret.txt",
    b"{p}/..%255csecret.txt",
    b"{p}/..\\/secret.txt",
    b"{p}/../\\secret.txt",
    b"{p}/..%2f..%5csecret.txt",
    b"{p}/%2e%2e%5csecret.txt",
    # NUL bytes
    b"{p}/..%00/secret.txt",
    b"{p}/%00/../secret.txt",
    b"{p}/../secret.txt%00.png",
    b"{p}/..%00%2fsecret.txt",
    b"{p}/escape%00",
    b"{p}/..\x00/secret.txt",  # a raw NUL in the request line
    # overlong UTF-8 and %u encodings of '.', '/' and '\'
    b"{p}/%c0%ae%c0%ae/secret.txt",
    b"{p}/%c0%ae%c0%ae%c0%afsecret.txt",
    b"{p}/%c0%2e%c0%2e/secret.txt",
    b"{p}/%e0%80%ae%e0%80%ae/secret.txt",
    b"{p}/%f0%80%80%ae%f0%80%80%ae/secret.txt",
    b"{p}/..%c0%afsecret.txt",
    b"{p}/..%c1%9csecret.txt",
    b"{p}/..%e0%80%afsecret.txt",
    b"{p}/%uff0e%uff0e/secret.txt",
    b"{p}/%u002e%u002e/secret.txt",
    # Unicode look-alike dots and slashes (NFKC would make some of them "..")
    b"{p}/%ef%bc%8e%ef%bc%8e/secret.txt",
    b"{p}/%ef%bc%8e%ef%bc%8e%ef%bc%8fsecret.txt",
    b"{p}/%e2%80%a4%e2%80%a4/secret.txt",
    b"{p}/%e2%80%a5/secret.txt",
    b"{p}/%ef%b9%92%ef%b9%92/secret.txt",
    b"{p}/..%e2%88%95secret.txt",
    "{p}/\uff0e\uff0e/secret.txt".encode(),  # raw UTF-8 in the request line
    # ';' parameters (Tomcat-style path params)
    b"{p}/..;/secret.txt",
    b"{p}/..;x=1/secret.txt",
    b"{p}/;/../secret.txt",
    b"{p}/dir/..;/..;/secret.txt",
    b"{p}/%2e%2e;/secret.txt",
    b"{p}/..%3b/secret.txt",
    # whitespace, query and fragment around dot segments
    b"{p}/..%20/secret.txt",
    b"{p}/..%09/secret.txt",
    b"{p}/%20../secret.txt",
    b"{p}/../secret.txt?x=../",
    b"{p}/../secret.txt#frag",
    # absolute paths and absolute-form targets
    b"{p}//etc/passwd",
    b"{p}/%2fetc%2fpasswd",
    b"{p}/%2F%2E%2E%2Fsecret.txt",
    b"{p}///..//..//secret.txt",
    b"http://localhost{p}/../secret.txt",
    b"http://localhost{p}/%2e%2e/secret.txt",
    b"../secret.txt",
    b"*",
    # symlink escapes
    b"{p}/escape",
    b"{p}/rel-escape",
    b"{p}/passwd-link",
    b"{p}/outdir/secret.txt",
    b"{p}/outdir%2fsecret.txt",
    b"{p}/outdir/",
    b"{p}/chain",
    b"{p}/sub/up/secret.txt",
    b"{p}/sub/up/",
    b"{p}/sibling-link",
    b"{p}/sibling-dir/file.txt",
    b"{p}/../public-secret/file.txt",
    b"{p}/..%2fpublic-secret%2ffile.txt",
    # case tricks (Linux file names are case-sensitive; routes are too)
    b"{p}/ESCAPE",
    b"{p}/%2E%2e/SECRET.TXT",
    b"/STATIC/../secret.txt",
    # long paths
    b"{p}/" + b"a/../" * 400 + b"../secret.txt",
    b"{p}/" + b"./" * 3000 + b"../secret.txt",
    b"{p}/" + b"%2e%2e%2f" * 800 + b"etc/passwd",
    b"{p}/" + b"x" * 300 + b"/../../secret.txt",
    b"{p}/" + b"A" * 5000,  # one name longer than NAME_MAX
    b"{p}/" + b"d/" * 2000 + b"secret.txt",  # a path longer than PATH_MAX
    b"{p}/" + b"a/" * 6000,  # longer than the parser's line limit
]

ALLOWED_REFUSALS = {301, 400, 403, 404, 414, 431}


def check_refused(target: bytes, response: Response) -> str | None:
    """Why *response* to *target* is unacceptable, or None."""
    for secret in (SECRET, SIBLING_SECRET, PASSWD):
        if secret in response.raw:
            return f"leaked {secret!r}"
    if response.status not in ALLOWED_REFUSALS:
        return f"status {response.status}"
    return None


def test_the_traversal_table_is_big_enough() -> None:
    assert len(TRAVERSAL) >= 40
    assert len(set(TRAVERSAL)) == len(TRAVERSAL)


async def test_the_check_sees_a_leak(tmp_path: Path) -> None:
    """With ``follow_symlinks=True`` a symlink out is served: the check must flag exactly that."""
    app = web.Application()
    app.add_routes([sf.static("/static", build_tree(tmp_path), follow_symlinks=True)])
    server = TestServer(app)
    await server.start_server()
    try:
        site = PluginSite(tmp_path / "public", server, None)
        response = await site.fetch(request_bytes(b"/static/escape"))
        assert check_refused(b"/static/escape", response) == f"leaked {SECRET!r}"
        response = await site.fetch(request_bytes(b"/static/dir/inner.txt"))
        assert check_refused(b"/static/dir/inner.txt", response) == "status 200"
    finally:
        await server.close()


async def test_traversal_table_against_the_plugin(door: PluginSite) -> None:
    failures = []
    for template in TRAVERSAL:
        target = template.replace(b"{p}", door.prefix)
        response = await door.fetch(request_bytes(target))
        problem = check_refused(target, response)
        if problem:
            failures.append((target[:120], problem))
    # The same server still serves what is inside (the table did not just break it).
    ok = await door.fetch(request_bytes(door.prefix + b"/dir/inner.txt"))
    assert (ok.status, ok.body) == (200, b"inner")
    assert not failures, failures


def test_traversal_table_against_serve(serve_cli: Server, tls_ca: trustme.CA) -> None:
    failures = []
    for template in TRAVERSAL:
        target = template.replace(b"{p}", b"")
        response = serve_fetch(serve_cli, request_bytes(target), tls_ca)
        problem = check_refused(target, response)
        if problem:
            failures.append((target[:120], problem))
    ok = serve_fetch(serve_cli, request_bytes(b"/dir/inner.txt"), tls_ca)
    assert (ok.status, ok.body) == (200, b"inner")
    assert not failures, failures


def test_serve_does_not_print_tracebacks_for_malformed_requests(tmp_path: Path) -> None:
    server = Server(str(build_tree(tmp_path)), "--port", "0")
    try:
        for target, status in ((b"../secret.txt", 400), (b"*", 400), (b"/..\x00/secret.txt", 400)):
            assert serve_fetch(server, request_bytes(target)).status == status
        assert serve_fetch(server, request_bytes(b"/" + b"a/" * 6000)).status == 414  # URI Too Long, as nginx
        assert server.interrupt() == 0
        assert server.proc.stderr is not None
        err = server.proc.stderr.read()
    finally:
        server.close()
    assert "Traceback" not in err, err[:2000]


# -- malformed and huge Range headers ---------------------------------------------------------------


def _spread(n: int, step: int) -> str:
    return ",".join(f"{i * step}-{i * step}" for i in range(n))


# (Range header value(s), expected status or None for "any correct answer")
RANGE_TABLE: list[tuple[list[str], int | None]] = [
    ([",".join(["0-0"] * 1800)], 206),  # 1800 identical ranges -> coalesced to one byte
    ([",".join(["0-"] * 1000)], 200),  # 1000 whole-file ranges: amplification -> ignored
    ([_spread(700, 3)], 200),  # 700 disjoint ranges > 16 -> ignored (the header stays under 8 KiB)
    ([_spread(17, 1000)], 200),  # 17 disjoint ranges -> ignored
    ([_spread(16, 1000)], 206),  # 16 disjoint ranges -> multipart
    ([",".join(f"{i}-{i}" for i in reversed(range(800)))], 206),  # adjacent -> one range
    ([",".join(["0-50000", "25000-75000", "50000-"])], 200),  # overlapping, more than the file
    (["0-10,5-15"], 206),  # overlapping, coalesced
    (["0-99999999999999999999999999999999"], 206),
    (["0-" + "9" * 5000], 206),
    (["9" * 5000 + "-"], 416),
    (["-" + "9" * 5000], 206),
    (["1" + "0" * 3000 + "-" + "9" * 3000], 416),  # a > b, both huge: invalid
    (["-0"], 416),
    (["0-0,-0"], 206),
    (["1-0"], 416),  # invalid specs: rejected, as nginx and aiohttp do
    (["-"], 416),
    (["--5"], 416),
    (["5--6"], 416),
    (["0x10-0x20"], 416),
    (["\u0661-\u0662"], 416),  # Arabic-Indic digits are not DIGIT
    (["0-10;q=1"], 416),
    (["0-10,,,,20-30"], 206),
    (["0-10, 200000000-"], 206),  # one satisfiable range is enough
    (["200000000-"], 416),
    ([""], 416),  # bytes= and nothing
    (["0-10", "20-30"], None),  # two Range field lines
    ([",".join(["-1"] * 500)], 206),  # the last byte, 500 times
    ([",".join(f"{i}-{i + 99}" for i in range(0, 1600, 100))], 206),  # 16 touching -> one
]


def _range_request(target: bytes, values: list[str], unit: str = "bytes") -> bytes:
    extra = b"".join(
        f"Range: {unit}={v}\r\n".encode() if unit else f"Range: {v}\r\n".encode() for v in values
    )
    return request_bytes(target, extra)


def check_range_response(response: Response, data: bytes) -> str | None:
    """Whether *response* is a correct, bounded answer to some reading of a Range request on *data*."""
    size = len(data)
    bound = size + MAX_PARTS * PART_OVERHEAD + 64
    if len(response.raw) > bound + HEAD_ALLOWANCE or len(response.body) > bound:
        return f"{len(response.raw)} response bytes for a {size}-byte file"
    length = response.header("content-length")
    if response.status in (200, 206, 416) and (length is None or int(length) != len(response.body)):
        return f"Content-Length {length} for a {len(response.body)}-byte body"
    if response.status == 200:
        return None if response.body == data else "a 200 that is not the file"
    if response.status == 416:
        ok = response.header("content-range") == f"bytes */{size}" and response.body == b""
        return None if ok else "a malformed 416"
    if response.status == 206:
        content_type = response.header("content-type") or ""
        if content_type.startswith("multipart/byteranges"):
            boundary = content_type.split("boundary=", 1)[1].encode()
            try:
                parts = [
                    (cr.decode(), payload) for _, cr, payload in parse_multipart(response.body, boundary)
                ]
            except AssertionError as exc:
                return f"bad multipart body: {exc}"
            if not 2 <= len(parts) <= MAX_PARTS:
                return f"{len(parts)} parts"
            for content_range, payload in parts:
                start, stop = _parse_content_range(content_range, size)
                if payload != data[start:stop]:
                    return f"part {content_range} has the wrong bytes"
            return None
        start, stop = _parse_content_range(response.header("content-range") or "", size)
        return None if response.body == data[start:stop] else "a 206 with the wrong bytes"
    if response.status in (400, 431):
        return None  # the request was refused by the HTTP parser (header too large, NUL, ...)
    return f"status {response.status}"


def _parse_content_range(value: str, size: int) -> tuple[int, int]:
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", value)
    assert m, value
    start, last, total = int(m[1]), int(m[2]), int(m[3])
    assert total == size, value
    assert start <= last < size, value
    return start, last + 1


def _range_cases() -> list[tuple[bytes, list[str], int | None]]:
    cases: list[tuple[bytes, list[str], int | None]] = []
    for name in (b"big.bin", b"small.bin"):
        for values, expected in RANGE_TABLE:
            cases.append((name, values, expected))
    return cases


def _expected_for(name: bytes, values: list[str], expected: int | None) -> int | None:
    """The table's statuses are for big.bin; for the 1000-byte file some ranges fall past its end."""
    return expected if name == b"big.bin" else None


async def test_hostile_ranges_against_the_plugin(door: PluginSite) -> None:
    failures = []
    for name, values, expected in _range_cases():
        data = (door.public / name.decode()).read_bytes()
        response = await door.fetch(_range_request(door.prefix + b"/" + name, values))
        problem = check_range_response(response, data)
        want = _expected_for(name, values, expected)
        if problem is None and want is not None and response.status != want:
            problem = f"status {response.status}, expected {want}"
        if problem:
            failures.append((name, [v[:60] for v in values], problem))
    assert not failures, failures


def test_hostile_ranges_against_serve(serve_cli: Server, tls_ca: trustme.CA) -> None:
    public = Path(serve_cli.banner["dir"])
    failures = []
    for name, values, expected in _range_cases():
        data = (public / name.decode()).read_bytes()
        response = serve_fetch(serve_cli, _range_request(b"/" + name, values), tls_ca)
        problem = check_range_response(response, data)
        want = _expected_for(name, values, expected)
        if problem is None and want is not None and response.status != want:
            problem = f"status {response.status}, expected {want}"
        if problem:
            failures.append((name, [v[:60] for v in values], problem))
    assert not failures, failures


async def test_oversized_range_header_is_refused_with_a_small_answer(door: PluginSite) -> None:
    """A Range header past the parser's field limit: refused by the parser, never amplified."""
    values = [",".join(["0-"] * 5000)]  # 15 KB
    response = await door.fetch(_range_request(door.prefix + b"/big.bin", values))
    assert response.status in (400, 431), response.status
    assert len(response.raw) < 4096


# -- Range responses against a reference model (property-based) ------------------------------------

JUNK_SPECS = ["", " ", "-", "a-b", "1-2-3", "7", "+1-2", "1 -2", "--1", "0x1-", "\u0661-2"]


@st.composite
def range_headers(draw: st.DrawFn, size: int) -> str | None:
    """Mostly valid headers of a few short ranges (so 206 single, multipart and 416 all come up);
    some with a junk spec, huge numbers, another unit, or no header at all."""
    flavour = draw(st.sampled_from(["valid"] * 6 + ["overlapping", "huge", "junk", "unit", "none"]))
    if flavour == "none":
        return None
    near = st.integers(0, size + 20)
    short = st.integers(0, max(size // 20, 1))
    specs_st = [
        st.builds(lambda a, n: f"{a}-{a + n}", near, short),
        st.builds(lambda a: f"{a}-", st.integers(max(size - size // 10, 0), size + 5)),
        st.builds(lambda n: f"-{n}", short),
        st.builds(lambda z, a, n: f"{'0' * z}{a}-{a + n}", st.integers(1, 3), near, short),
    ]
    if flavour == "overlapping":
        specs_st.append(st.builds(lambda a, n: f"{a}-{a + n}", near, st.integers(0, size)))
    if flavour == "huge":
        big = st.integers(size, 2**80)
        specs_st += [st.builds(lambda a, b: f"{a}-{b}", near, big), st.builds(lambda a: f"{a}-", big)]
    specs = draw(st.lists(st.one_of(*specs_st), min_size=1, max_size=20))
    if flavour == "junk":
        specs.insert(draw(st.integers(0, len(specs))), draw(st.sampled_from(JUNK_SPECS)))
    seps = draw(
        st.lists(st.sampled_from([",", ", ", " ,", ",\t", ",,"]), min_size=len(specs), max_size=len(specs))
    )
    units = ["bytes"] * 6 + ["Bytes", "BYTES"] if flavour != "unit" else ["items", "byte", "bytes2", "none"]
    unit = draw(st.sampled_from(units))
    return unit + "=" + "".join(s + p for s, p in zip(specs, seps, strict=True))[: -len(seps[-1]) or None]


@st.composite
def sized_requests(draw: st.DrawFn) -> tuple[int, str | None]:
    size = draw(st.one_of(st.integers(0, 300), st.integers(0, 150_000)))
    return size, draw(range_headers(size))


@settings(
    max_examples=int(os.environ.get("AIOSENDFILE_RANGE_EXAMPLES", "25")),  # raise it to hunt further
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request_=sized_requests(), seed=st.integers(0, 255))
async def test_range_responses_match_the_model(
    door: PluginSite, tls_client_ctx: ssl.SSLContext, request_: tuple[int, str | None], seed: int
) -> None:
    size, header = request_
    path = door.public / "prop.bin"
    data = pattern(size, seed)
    path.write_bytes(data)
    os.utime(path, ns=(seed, 10**18 + seed * 10**9 + size))  # a fresh validator for each example
    kind, ranges = model(header, size)
    headers = {} if header is None else {"Range": header}
    connector = aiohttp.TCPConnector(ssl=tls_client_ctx if door.tls else False)
    async with (
        aiohttp.ClientSession(connector=connector, auto_decompress=False) as session,
        session.get(door.url(door.path + "/prop.bin"), headers=headers) as resp,
    ):
        body = await resp.read()
        status, content_type = resp.status, resp.headers.get("Content-Type", "")
        content_range = resp.headers.get("Content-Range")
        assert int(resp.headers["Content-Length"]) == len(body)
    if kind == "full":
        assert (status, content_range) == (200, None), header
        assert body == data
    elif kind == "416":
        assert (status, content_range, body) == (416, f"bytes */{size}", b""), header
    elif len(ranges) == 1:
        start, stop = ranges[0]
        assert status == 206, header
        assert content_range == f"bytes {start}-{stop - 1}/{size}"
        assert body == data[start:stop]
    else:
        assert status == 206, header
        assert content_type.startswith("multipart/byteranges; boundary="), content_type
        parts = parse_multipart(body, content_type.split("boundary=", 1)[1].encode())
        assert [(cr.decode(), payload) for _, cr, payload in parts] == [
            (f"bytes {a}-{b - 1}/{size}", data[a:b]) for a, b in ranges
        ], header
        assert len(body) <= sum(b - a for a, b in ranges) + MAX_PARTS * PART_OVERHEAD


def test_the_model_on_known_cases() -> None:
    assert model(None, 10) == ("full", [])
    assert model("bytes=0-0", 0) == ("416", [])
    assert model("bytes=-0", 10) == ("416", [])
    assert model("bytes=5-", 10) == ("ranges", [(5, 10)])
    assert model("bytes=0-1,5-6", 10) == ("ranges", [(0, 2), (5, 7)])
    assert model("bytes=5-6,0-1", 10) == ("ranges", [(5, 7), (0, 2)])  # request order kept
    assert model("bytes=5-6,0-5", 10) == ("ranges", [(0, 7)])  # overlap: merged, sorted
    assert model("bytes=0-5,6-7", 10) == ("ranges", [(0, 8)])  # touching: merged
    assert model("bytes=0-9,0-9", 10) == ("full", [])  # more than the file
    assert model("bytes=1-0", 10) == ("416", [])  # invalid: rejected
    assert model("items=1-0", 10) == ("full", [])  # another unit: ignored
    assert model("bytes=0-1,x", 10) == ("416", [])
    assert model("bytes=" + ",".join(f"{2 * i}-{2 * i}" for i in range(17)), 100)[0] == "full"


# -- a file truncated while its response is sent -------------------------------------------------------

TRUNCATED_SIZE = 24 * 2**20  # more than loopback's socket buffers can hold


def _small_rcvbuf() -> dict[str, Any]:
    """A client socket with a small receive buffer (aiohttp 3.12+), so the file cannot all be in flight."""
    if "socket_factory" not in inspect.signature(aiohttp.TCPConnector).parameters:
        return {}

    def factory(addr_info: Any) -> socket.socket:
        family, type_, proto = addr_info[:3]
        sock = socket.socket(family, type_, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        return sock

    return {"socket_factory": factory}


def _apply(marks: list[Any]) -> Any:
    def decorate(f: Any) -> Any:
        for mark in marks:
            f = mark(f)
        return f

    return decorate


def _sparse_file(path: Path, size: int) -> None:
    """A file of *size* zero bytes that costs no writing (a hole); its content is not checked."""
    with open(path, "wb") as f:
        f.truncate(size)


# Python 3.10's TLS transport: aiohttp's client leaves its side of the broken connection unclosed.
_PY310_CLIENT_LEAK = (
    [pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
    if sys.version_info < (3, 11)
    else []
)


@pytest.mark.parametrize("shape", ["single", "multipart"])
@_apply(_PY310_CLIENT_LEAK)
async def test_file_truncated_mid_response_is_an_error_for_the_client(
    door: PluginSite, tls_client_ctx: ssl.SSLContext, shape: str
) -> None:
    path = door.public / "huge.bin"
    _sparse_file(path, TRUNCATED_SIZE)
    headers = {"Range": "bytes=0-9,1000-"} if shape == "multipart" else {}
    connector = aiohttp.TCPConnector(ssl=tls_client_ctx if door.tls else False, limit=1, **_small_rcvbuf())
    async with aiohttp.ClientSession(connector=connector, read_bufsize=2**14) as session:
        async with session.get(door.url(door.path + "/huge.bin"), headers=headers) as resp:
            assert resp.status == (206 if shape == "multipart" else 200)
            length = int(resp.headers["Content-Length"])
            assert length >= TRUNCATED_SIZE - 1000
            first = await resp.content.readexactly(4096)
            await asyncio.sleep(0.15)  # the client stops reading: the server fills the socket and waits
            os.truncate(path, 2**20)
            got = len(first)

            async def read_to_the_end() -> None:
                nonlocal got
                while chunk := await resp.content.read(2**16):
                    got += len(chunk)

            with pytest.raises(aiohttp.ClientPayloadError):
                await read_to_the_end()
            assert got < length
        # The broken connection is not reused: the next request on the session is whole.
        async with session.get(door.url(door.path + "/small.bin")) as resp:
            assert (resp.status, await resp.read()) == (200, pattern(SMALL, seed=3))


async def test_truncated_response_closes_the_connection_raw(door: PluginSite) -> None:
    """Pipelined: request 1 is cut short, so request 2's answer must never follow on that connection."""
    path = door.public / "huge.bin"
    _sparse_file(path, TRUNCATED_SIZE)
    assert door.server.host is not None
    assert door.server.port is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (door.server.host, door.server.port))
    reader, writer = await asyncio.open_connection(
        sock=sock, ssl=door.ctx, server_hostname="localhost" if door.ctx else None, limit=2**14
    )
    try:
        keep_alive = b"GET " + door.prefix + b"/huge.bin HTTP/1.1\r\nHost: localhost\r\n\r\n"
        writer.write(keep_alive + b"GET " + door.prefix + b"/small.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(parse_head(head)[1]["content-length"])
        await asyncio.sleep(0.15)
        os.truncate(path, 2**20)
        rest = b""
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while chunk := await asyncio.wait_for(reader.read(2**20), 20):
                rest += chunk
        assert len(rest) < length  # short, and then the connection ended: nothing else followed
        assert b"HTTP/1.1" not in rest[-4096:]
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


async def test_inline_body_truncated_before_it_is_read(
    door: PluginSite, tls_client_ctx: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small body that shrinks between ``fstat`` and its read: no short 200 is ever sent."""
    path = door.public / "shrinks.bin"
    path.write_bytes(pattern(4096))
    real = _platform.read_nowait

    def shrink_then_read(fd: int, size: int, offset: int, *rest: Any) -> Any:
        os.truncate(path, 100)
        return real(fd, size, offset, *rest)  # (its caller's size, if given, is the one before)

    # (the read every door's small body takes: the core's admission read, the engine's first sight)
    monkeypatch.setattr(_platform, "read_nowait", shrink_then_read)
    # Raw, because aiohttp's client retries an idempotent request once after a disconnect.
    response = await door.fetch(request_bytes(door.prefix + b"/shrinks.bin"))
    if response.status:
        assert len(response.body) < int(response.header("content-length") or 0), response.raw[:300]
    monkeypatch.setattr(_platform, "read_nowait", real)
    connector = aiohttp.TCPConnector(ssl=tls_client_ctx if door.tls else False)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(door.url(door.path + "/shrinks.bin")) as resp,
    ):
        assert (resp.status, await resp.read()) == (200, pattern(100))
