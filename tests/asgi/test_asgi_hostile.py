"""Hostile conditions for uvicorn with our protocol, in its own process: clients that vanish
mid-file, a file truncated or growing mid-file, a slow reader that pipelines, SIGTERM/SIGINT while
slow downloads are in flight, concurrent downloads (200; 1,000 under ``nox -s stress``).

Each server is ``uvicorn --http aiosendfile.uvicorn:HttpToolsProtocol`` (or ``H11Protocol``) on
one loop (asyncio, uvloop), over TCP or TLS, serving the unchanged Starlette app (Starlette's own
StaticFiles and FileResponse, which send ``pathsend`` for full files) or the same app with
``aiosendfile.asgi``'s (ranges and multipart through our private pathsend keys too). After every
case: a new connection gets a right answer, the server's open descriptors (``/proc/<pid>/fd``)
come back to what they were before the case, and its logs hold no traceback and no "Exception in
ASGI application". A truncated file must never look like a complete answer: the client sees
fewer bytes than Content-Length, then the end of the connection.

In the test's own loop (deterministic where a process race is not): a file message sent when the
transport is already closing but uvicorn has not yet heard ``connection_lost``.

Last, a client that pipelines and leaves without reading (#23 item 7), against stock uvicorn's two
protocols and ours, each on both loops, serving ``aiosendfile.asgi``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..support.asgi_apps import FILE_NAME
from ..support.asgi_apps import ours_available as apps_available
from ..support.asgi_servers import (
    OUR_H11,
    OUR_HTTPTOOLS,
    PROBLEMS,
    AsgiServer,
    TlsFiles,
    clean_exit,
    ours_available,
    tls_files,
)
from ..support.files import DOWNLOAD_MIX, download_sizes, pattern, write_download_mix
from ..support.raw_http import parse_head

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

MiB = 2**20
APPS = "tests.support.asgi_apps"
BIG = 8 * MiB
SMALL = b"small and whole\n" * 8
CLIENTS = Path(__file__).parent.parent / "support" / "stress_clients.py"
GRACE = ["--timeout-graceful-shutdown", "2"]


@dataclass(frozen=True)
class Setup:
    app: str
    loop: str
    tls: bool
    http: str = OUR_HTTPTOOLS

    @property
    def id(self) -> str:
        h11 = "-h11" if self.http == OUR_H11 else ""
        return f"{self.app}-{self.loop}-{'tls' if self.tls else 'tcp'}{h11}"


SETUPS = [
    *(
        Setup(app, loop, tls)
        for app in ("starlette_app", "ours_starlette_app")
        for loop, tls in (("asyncio", False), ("uvloop", False), ("uvloop", True))
    ),
    Setup("starlette_app", "uvloop", False, OUR_H11),
    Setup("ours_starlette_app", "asyncio", True, OUR_H11),
]


def skip_unless_there(app: str) -> None:
    if not ours_available():
        pytest.skip("aiosendfile.uvicorn (engineer U's protocol) is not in the tree yet")
    if app.startswith("ours_") and not apps_available():
        pytest.skip("aiosendfile.asgi (engineer A's apps) is not in the tree yet")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    public = tmp_path_factory.mktemp("asgi-hostile") / "public"
    public.mkdir()
    (public / FILE_NAME).write_bytes(pattern(BIG))
    (public / "small.txt").write_bytes(SMALL)
    (public / "f64k.bin").write_bytes(pattern(65_536, seed=3))
    return public


@pytest.fixture(scope="module")
def server_tls_files(tmp_path_factory: pytest.TempPathFactory, tls_ca: Any) -> TlsFiles:
    """A certificate for the server processes (and its CA for the clients), for the module."""
    return tls_files(tls_ca, tmp_path_factory.mktemp("asgi-hostile-tls"))


def start(setup: Setup, tree: Path, server_tls_files: TlsFiles, *options: str) -> AsgiServer:
    return AsgiServer(
        f"{APPS}:{setup.app}",
        tree,
        http=setup.http,
        loop=setup.loop,
        tls=server_tls_files if setup.tls else None,
        options=["--no-access-log", *GRACE, *options],
    )


class Watched:
    """A server, its descriptor count at rest (after a warm-up, no client connected), and where
    the current case's logs begin."""

    def __init__(self, server: AsgiServer) -> None:
        self.server = server
        assert get(server, "/static/small.txt") == SMALL
        assert get(server, "/file") == pattern(BIG)
        self.baseline = settled_fds(server)
        self.mark = 0

    def begin(self) -> None:
        self.mark = len(self.server.err())

    def logs(self) -> str:
        """What the server logged since the case began."""
        return self.server.err()[self.mark :]

    def check(self) -> None:
        """A new connection is answered, the fds are back to the baseline, the logs are clean."""
        assert get(self.server, "/static/small.txt") == SMALL
        deadline = time.monotonic() + 15
        while self.server.fd_count() > self.baseline:
            if time.monotonic() > deadline:
                raise AssertionError(f"fds above {self.baseline}: {self.server.fds()}")
            time.sleep(0.05)
        logs = self.logs()
        assert not any(p in logs for p in PROBLEMS), logs[-5000:]


def settled_fds(server: AsgiServer) -> int:
    """The server's fd count once it has stopped changing (closed connections take a moment)."""
    last, stable = -1, 0
    while stable < 4:
        now = server.fd_count()
        stable = stable + 1 if now == last else 0
        last = now
        time.sleep(0.05)
    return last


@pytest.fixture(scope="module", params=SETUPS, ids=[s.id for s in SETUPS])
def watched(request: pytest.FixtureRequest, tree: Path, server_tls_files: TlsFiles) -> Iterator[Watched]:
    setup: Setup = request.param
    skip_unless_there(setup.app)
    server = start(setup, tree, server_tls_files)
    try:
        yield Watched(server)
    finally:
        code, logs = server.stop()
    assert clean_exit(code), (code, logs[-3000:])  # each case checked its own logs


@pytest.fixture
def case_server(watched: Watched) -> Watched:
    """The module's server for one case: its logs from here on are the case's."""
    watched.begin()
    return watched


# -- a raw client ---------------------------------------------------------------------------------


def request(target: str, close: bool = False, extra: str = "") -> bytes:
    fields = extra + ("Connection: close\r\n" if close else "")
    return f"GET {target} HTTP/1.1\r\nHost: localhost\r\n{fields}\r\n".encode()


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The answer's head and the body bytes that came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before the head: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def content_length(head: bytes) -> int:
    length = parse_head(head)[1].get("content-length")
    assert length is not None, f"no Content-Length: {head!r}"
    return int(length)


def read_until_end(sock: socket.socket, limit: int) -> tuple[bytes, str]:
    """Up to *limit* bytes, until the peer ends the connection: (bytes, "eof" | "reset" | "limit")."""
    chunks, got = [], 0
    while got < limit:
        try:
            chunk = sock.recv(min(2**20, limit - got))
        except (ConnectionResetError, ssl.SSLError):
            return b"".join(chunks), "reset"
        if not chunk:
            return b"".join(chunks), "eof"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks), "limit"


def get(server: AsgiServer, target: str) -> bytes:
    """A whole 200 answer's body, on a new connection."""
    with server.socket(timeout=30) as sock:
        sock.sendall(request(target, close=True))
        head, rest = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200 "), head
        body, _ = read_until_end(sock, content_length(head) + 1)
        return rest + body


def reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


# -- the cases ----------------------------------------------------------------------------------------


MULTIPART = "Range: bytes=0-3999999,4000100-8388607\r\n"  # not adjacent: not merged


@pytest.mark.parametrize(
    ("target", "extra"),
    [("/static/" + FILE_NAME, ""), ("/file", ""), ("/static/" + FILE_NAME, MULTIPART)],
    ids=["static", "file-response", "multipart"],
)
@pytest.mark.parametrize("how", ["close", "rst"])
def test_client_disconnects_mid_file(case_server: Watched, how: str, target: str, extra: str) -> None:
    """Clients with a small receive buffer read a little of an 8 MiB file (or of a multipart answer
    of all of it) and go away."""
    server = case_server.server
    for _ in range(3):
        sock = server.socket(timeout=30, rcvbuf=4096)
        try:
            sock.sendall(request(target, extra=extra))
            head, rest = read_head(sock)
            assert content_length(head) >= BIG
            more, _ = read_until_end(sock, 100_000)
            if not extra:
                assert rest + more == pattern(BIG)[: len(rest) + len(more)]
        finally:
            reset(sock) if how == "rst" else sock.close()
    case_server.check()


def test_slow_reader_keeps_its_connection(case_server: Watched) -> None:
    """A reader with a 4 KiB receive buffer takes files in 8 KiB reads (the server waits on a full
    socket again and again), sending each next request halfway through the answer before it
    (it arrives while the file is going out): every answer exact, in order, on one connection."""
    data = pattern(BIG)
    cases = [
        ("/file", "", data),
        ("/static/small.txt", "", SMALL),
        ("/static/" + FILE_NAME, "Range: bytes=1000-2000000\r\n", data[1000:2000001]),
        ("/static/" + FILE_NAME, "", data),
        ("/static/" + FILE_NAME, MULTIPART, None),
        ("/file", "", data),
    ]
    requests = [request(target, extra=extra) for target, extra, _ in cases]
    with case_server.server.socket(timeout=60, rcvbuf=4096) as sock:
        sock.sendall(requests[0])
        for i, (target, _, expected) in enumerate(cases):
            head, rest = read_head(sock)
            n = content_length(head)
            body = bytearray(rest)
            sent_next = i + 1 == len(cases)
            while len(body) < n:
                if not sent_next and len(body) >= n // 2:
                    sock.sendall(requests[i + 1])
                    sent_next = True
                chunk = sock.recv(min(8192, n - len(body)))
                assert chunk, (target, len(body), n)
                body += chunk
            if not sent_next:
                sock.sendall(requests[i + 1])
            assert len(body) == n, (target, head)
            if expected is not None:
                assert body == expected, target
            else:  # (Starlette's multipart format is its own: each part's bytes after its header)
                for first, last in ((0, 3_999_999), (4_000_100, BIG - 1)):
                    mark = f"bytes {first}-{last}/{BIG}\r\n\r\n".encode()
                    at = bytes(body).index(mark) + len(mark)
                    assert body[at : at + last + 1 - first] == data[first : last + 1], (target, first)
    case_server.check()


def test_file_truncated_mid_file(case_server: Watched, tree: Path) -> None:
    """The file shrinks while it is sent: the connection is aborted, never a short complete answer;
    a warning in the log, no traceback; the next connection is served."""
    truncated_mid_file(case_server, tree, "")


#: The setups serving ``aiosendfile.asgi``'s app: Starlette's own FileResponse streams ranges itself
#: (body messages, its own error), so only these send ranges down the protocol's file path.
OURS = [pytest.param(s, id=s.id) for s in SETUPS if s.app == "ours_starlette_app"]


@pytest.mark.parametrize("watched", OURS, indirect=True)
@pytest.mark.parametrize("ranges", ["bytes=1000-", "bytes=0-8388607,8388608-"])
def test_file_truncated_mid_range(case_server: Watched, tree: Path, ranges: str) -> None:
    """As :func:`test_file_truncated_mid_file`, for one range and for multipart ranges."""
    truncated_mid_file(case_server, tree, ranges)


def truncated_mid_file(case_server: Watched, tree: Path, ranges: str) -> None:
    size = 16 * MiB
    path = tree / "trunc.bin"
    data = pattern(size, seed=7)
    path.write_bytes(data)
    try:
        with case_server.server.socket(timeout=30, rcvbuf=16384) as sock:
            extra = f"Range: {ranges}\r\n" if ranges else ""
            # keep-alive: a short body would look complete
            sock.sendall(request("/static/trunc.bin", extra=extra))
            head, rest = read_head(sock)
            assert head.startswith(b"HTTP/1.1 206 " if ranges else b"HTTP/1.1 200 "), head
            promised = content_length(head)
            first, _ = read_until_end(sock, 256 * 1024)
            os.truncate(path, size // 2)  # beyond what the kernel can have taken yet (window, buffer)
            body, end = read_until_end(sock, promised)
        got = rest + first + body
        assert end in ("eof", "reset"), end
        assert len(got) < promised
        if ranges == "bytes=1000-":
            assert got == data[1000 : 1000 + len(got)]
        elif not ranges:
            assert got == data[: len(got)]
        else:
            assert got.count(b"Content-Range") <= 2
            assert not got.endswith(b"--\r\n")  # no closing delimiter: the answer never ends
    finally:
        path.unlink()
    case_server.check()
    assert "WARNING" in case_server.logs()


def test_file_growing_mid_file(case_server: Watched, tree: Path) -> None:
    """The file grows while it is sent: exactly the promised bytes go out, and the connection
    carries the next answer (the body's end is where Content-Length said)."""
    size = 16 * MiB
    path = tree / "grow.bin"
    data = pattern(size, seed=11)
    path.write_bytes(data)
    try:
        with case_server.server.socket(timeout=30, rcvbuf=16384) as sock:
            sock.sendall(request("/static/grow.bin"))
            head, rest = read_head(sock)
            assert content_length(head) == size
            first, _ = read_until_end(sock, 256 * 1024)
            with open(path, "ab") as f:
                f.write(b"X" * MiB)
            body, end = read_until_end(sock, size - len(rest) - len(first))
            assert end == "limit", end
            assert rest + first + body == data
            sock.sendall(request("/static/small.txt"))
            head, rest = read_head(sock)
            assert head.startswith(b"HTTP/1.1 200 "), head
            more, _ = read_until_end(sock, len(SMALL) - len(rest))
            assert rest + more == SMALL
    finally:
        path.unlink()
    case_server.check()


@pytest.mark.parametrize(
    "clients", [pytest.param(200, id="200"), pytest.param(1000, id="1000", marks=pytest.mark.stress)]
)
def test_concurrent_downloads(case_server: Watched, tmp_path: Path, clients: int) -> None:
    """Clients at once (200; 1,000 under stress) each download a 64 KiB file, byte-exact (a client
    process, aiohttp)."""
    digest = hashlib.sha256(pattern(65_536, seed=3)).hexdigest()
    result = downloads(case_server.server, [("/static/f64k.bin", 65_536, digest)] * clients, tmp_path)
    assert result["ok"] == clients, result
    case_server.check()


def downloads(server: AsgiServer, jobs: list[tuple[str, int, str]], tmp_path: Path) -> dict[str, Any]:
    config = tmp_path / "clients.json"
    ca = str(server.tls.ca) if server.tls is not None else None
    config.write_text(json.dumps({"base": server.base, "jobs": jobs, "ca": ca}))
    out = subprocess.run(
        [sys.executable, str(CLIENTS), "download", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_concurrent_downloads_mixed(case_server: Watched, tree: Path, tmp_path: Path) -> None:
    """1,000 concurrent downloads of the load tests' mix (1 kB to 8 MB, about 640 MB), byte-exact."""
    digests = write_download_mix(tree)
    jobs = [(f"/static/f{size}.bin", size, digests[size]) for size in download_sizes(1000)]
    assert len({size for size, _ in DOWNLOAD_MIX}) == len(digests)
    result = downloads(case_server.server, jobs, tmp_path)
    assert result["ok"] == 1000, result
    case_server.check()


@pytest.mark.parametrize(
    ("setup", "signum"),
    [
        (Setup(app, loop, False), signum)
        for app in ("starlette_app", "ours_starlette_app")
        for loop, signum in (("asyncio", signal.SIGTERM), ("uvloop", signal.SIGINT))
    ],
    ids=lambda v: v.id if isinstance(v, Setup) else signal.Signals(v).name,
)
def test_shutdown_while_downloads_are_slow(
    tree: Path, server_tls_files: TlsFiles, setup: Setup, signum: int
) -> None:
    """A signal while four downloads stall on clients that stopped reading: uvicorn's graceful
    shutdown (2 s) cancels them and the process exits cleanly.

    After SIGTERM the logs hold no traceback. After SIGINT uvicorn itself logs each cancelled
    request as "Exception in ASGI application" with its CancelledError (stock uvicorn too, with
    Starlette's own streaming: uvicorn re-raises SIGTERM once shut down, which ends the process
    before the cancelled tasks get to log; SIGINT lets asyncio.run finish them): there, nothing
    but those CancelledErrors may show."""
    skip_unless_there(setup.app)
    server = start(setup, tree, server_tls_files)
    socks = []
    try:
        for _ in range(4):
            sock = server.socket(timeout=30, rcvbuf=4096)
            socks.append(sock)
            sock.sendall(request("/static/" + FILE_NAME))
            head, _ = read_head(sock)
            assert content_length(head) == BIG
        idle = server.socket(timeout=30)  # and a keep-alive connection between requests
        socks.append(idle)
        idle.sendall(request("/static/small.txt"))
        read_head(idle)
        code, logs = server.stop(signum, timeout=20)
    finally:
        for sock in socks:
            sock.close()
        server.kill()
    assert clean_exit(code, signum), (code, logs[-3000:])
    assert "Cancel 4 running task(s)" in logs, logs[-3000:]
    if signum == signal.SIGTERM:
        assert not any(p in logs for p in PROBLEMS), logs[-5000:]
    else:  # uvicorn's own logs of its cancellation, as stock uvicorn writes them: nothing else
        assert not foreign_errors(logs), logs[-5000:]


def foreign_errors(logs: str) -> list[str]:
    """The lines of *logs* naming an exception or warning other than a CancelledError, or an
    error asyncio reports on its own (a task's exception never retrieved, an exception ignored)."""
    out = []
    for line in logs.splitlines():
        m = re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b", line)
        if (m and not m[0].endswith("CancelledError")) or "never retrieved" in line or "ignored" in line:
            out.append(line)
    return out


# -- a peer that resets between the head and the file ----------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_client_gone_before_the_body(tree: Path, server_tls_files: TlsFiles, loop: str) -> None:
    """Clients that send a request and close at once (unread data: an RST), thirty times. Now and
    then the reset lands between the app's head and its pathsend (d16-findings #1, fixed in
    9635359: it raised RuntimeError('Transport is closing') into the app); the deterministic
    version is test_file_after_the_transport_began_closing."""
    skip_unless_there("starlette_app")
    server = start(Setup("starlette_app", loop, False), tree, server_tls_files)
    try:
        for _ in range(30):
            with server.socket(timeout=30, rcvbuf=4096) as sock:
                sock.sendall(request("/static/" + FILE_NAME))
                time.sleep(0.01)
        assert get(server, "/static/small.txt") == SMALL
    finally:
        code, logs = server.stop()
    assert clean_exit(code), (code, logs[-3000:])
    assert not any(p in logs for p in PROBLEMS), logs[-5000:]


@pytest.mark.parametrize("protocol", ["stock", "stock-h11", "ours", "ours-h11"])
async def test_file_after_the_transport_began_closing(tmp_path: Path, protocol: str) -> None:
    """In the test's loop, deterministic: the app sends its head, the transport is closed the way
    the loop closes it on a reset (``abort()``: closing at once, ``connection_lost`` on the next
    turn), then the app sends the body. Stock uvicorn drops that write silently and the response
    counts as complete; so must the protocol: nothing raised into the app, nothing logged."""
    skip_unless_there("starlette_app")
    import asyncio

    from uvicorn import Config, Server
    from uvicorn.protocols.http import h11_impl, httptools_impl

    from aiosendfile import uvicorn as ours

    classes = {
        "stock": httptools_impl.HttpToolsProtocol,
        "stock-h11": h11_impl.H11Protocol,
        "ours": ours.HttpToolsProtocol,
        "ours-h11": ours.H11Protocol,
    }

    path = tmp_path / "f.bin"
    path.write_bytes(pattern(100_000))
    raised: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100000")]}
        await send(start)
        for conn in server.server_state.connections:
            conn.transport.abort()
        try:
            if protocol.startswith("ours"):
                await send({"type": "http.response.pathsend", "path": str(path)})
            else:
                await send({"type": "http.response.body", "body": path.read_bytes()})
        except BaseException as exc:
            raised.append(exc)

    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    logging.getLogger("uvicorn.error").addHandler(handler)
    config = Config(app, http=classes[protocol], lifespan="off", log_config=None)
    config.load()
    server = Server(config)
    server.lifespan = config.lifespan_class(config)  # what Server.serve sets before startup
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        await server.startup(sockets=[sock])
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(request("/", close=True))
        while await reader.read(65536):
            pass
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        while server.server_state.tasks:
            await asyncio.sleep(0.01)
    finally:
        if server.started:
            await server.shutdown(sockets=[sock])
        sock.close()
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert not raised, raised
    assert not errors, [r.getMessage() for r in errors]  # the cycle completed, as uvicorn's own


# -- aiosendfile.asgi's own error when the file ends early -------------------------------------------


# d16-findings #2 (fixed): under ASGI < 2.4 (uvicorn, hypercorn) the disconnect watch's anyio task
# group wrapped the error in an ExceptionGroup.
@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_truncated_body_raises_file_truncated_error(tmp_path: Path, spec_version: str) -> None:
    """``aiosendfile.asgi.StaticFiles`` sending body messages (a server with no file extension)
    raises ``FileTruncatedError`` itself when the file ends early, whatever the server's ASGI
    version: an exception handler for it (or for OSError) must see that class, not a group."""
    skip_unless_there("ours_starlette_app")
    import asyncio

    from aiosendfile import FileTruncatedError
    from aiosendfile.asgi import StaticFiles

    path = tmp_path / "big.bin"
    path.write_bytes(pattern(4 * MiB))
    app = StaticFiles(directory=tmp_path)
    sent = 0

    async def send(message: Any) -> None:
        nonlocal sent
        sent += len(message.get("body", b""))
        if sent > MiB:
            os.truncate(path, 2 * MiB)

    async def receive() -> Any:
        await asyncio.sleep(3600)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/big.bin",
        "raw_path": b"/big.bin",
        "root_path": "",
        "headers": [],
        "query_string": b"",
        "asgi": {"version": "3.0", "spec_version": spec_version},
    }
    with pytest.raises(FileTruncatedError):
        await app(scope, receive, send)


# -- a pipelining client that leaves (#23 item 7) ----------------------------------------------------

#: uvicorn stock (httptools, h11) and with our protocols, each on both loops, serving aiosendfile.asgi.
LEAVERS = [
    (http, loop) for http in ("httptools", "h11", OUR_HTTPTOOLS, OUR_H11) for loop in ("asyncio", "uvloop")
]


@pytest.mark.parametrize(("http", "loop"), LEAVERS, ids=[f"{h.rpartition(':')[2]}-{lp}" for h, lp in LEAVERS])
def test_a_pipelining_client_that_leaves_is_no_error(tree: Path, http: str, loop: str) -> None:
    """200 GETs of a hot 64 KiB file in one write from a client with a 4 KiB receive buffer that
    reads nothing, then resets (SO_LINGER 0) or closes; five of each. The server's socket fills, the
    request being answered waits for it to drain, and the client's going wakes it. uvicorn's
    httptools protocol had marked only the last request it parsed as disconnected, so under uvloop
    that request's next write raised into ``aiosendfile.asgi.StaticFiles`` ("unable to perform
    operation on <TCPTransport closed=True ...>", logged as "Exception in ASGI application").
    After each client: no traceback in the log, and a new connection is served. Our protocols log
    nothing at all; stock uvicorn may log its "ASGI callable returned without completing response."
    (the app cannot tell it the client is gone)."""
    skip_unless_there("ours_starlette_app")
    server = AsgiServer(f"{APPS}:ours_starlette_app", tree, http=http, loop=loop, options=["--no-access-log"])
    try:
        assert get(server, "/static/f64k.bin") == pattern(65_536, seed=3)
        baseline = settled_fds(server)
        pipelined = request("/static/f64k.bin") * 200
        for how in ("rst", "close"):
            for _ in range(5):
                sock = server.socket(timeout=30, rcvbuf=4096)
                sock.sendall(pipelined)
                time.sleep(0.05)  # the server answers until its socket is full
                reset(sock) if how == "rst" else sock.close()
            deadline = time.monotonic() + 15
            while server.fd_count() > baseline:  # every connection_lost has run
                assert time.monotonic() < deadline, server.fds()
                time.sleep(0.02)
            assert get(server, "/static/small.txt") == SMALL
            logs = server.err()
            assert not any(p in logs for p in PROBLEMS), logs[-5000:]
            if http in (OUR_HTTPTOOLS, OUR_H11):
                assert "ERROR" not in logs, logs[-5000:]
    finally:
        code, logs = server.stop()
    assert clean_exit(code), (code, logs[-3000:])
