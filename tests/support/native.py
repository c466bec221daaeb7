"""The native ``serve`` engine for tests: in the test's own loop, or as a separate process.

``native_site`` starts ``aiosendfile._serve._server.start_server`` on the running loop (TCP,
TLS or a Unix socket) and yields a ``NativeSite`` with the same face as the plugin's test
sites (``url``, ``fetch`` of raw bytes, ``host``/``port``, ``prefix`` b"" as ``serve`` mounts
at "/"). ``NativeProcess`` runs the engine in another interpreter (``python -m
tests.support.native DIR ...``, this module's ``main``, or ``python -m aiosendfile serve``):
a client in the server's own loop hides real bugs (ordering, flow control, a loop that blocks),
and load tests measure the server's memory alone. ``read_response``/``split_responses`` frame
HTTP/1.1 answers on a keep-alive connection by their Content-Length, for pipelining and
differential tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import BANNER, cli_env
from .raw_http import Response, connect, parse_response, raw_async

# -- in the test's loop -----------------------------------------------------------------------------


@dataclass
class NativeSite:
    """A native engine serving *public* at "/", on this loop; *ctx* is the client's TLS context."""

    public: Path
    host: str
    port: int
    ctx: ssl.SSLContext | None
    server: Any
    unix_path: str | None = None
    prefix: bytes = b""

    @property
    def tls(self) -> bool:
        return self.ctx is not None

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    async def fetch(self, data: bytes) -> Response:
        """Send *data* as is; read until the server closes (requests should say ``Connection: close``)."""
        if self.unix_path is not None:
            return parse_response(await raw_unix(self.unix_path, data))
        return parse_response(await raw_async(self.host, self.port, data, self.ctx))

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw connection to the site (TLS when the site is), for keep-alive and pipelining."""
        return await connect(self.host, self.port, self.ctx, self.unix_path)


def engine() -> Any:
    """The engine's module (imported late: the tests of other doors must not need it)."""
    from aiosendfile._serve import _server

    return _server


@contextlib.asynccontextmanager
async def native_site(
    public: Path,
    *,
    server_ctx: ssl.SSLContext | None = None,
    client_ctx: ssl.SSLContext | None = None,
    unix_path: str | None = None,
    **config: Any,
) -> AsyncIterator[NativeSite]:
    """The engine serving *public* on the running loop; *config* goes to ``ServeConfig``."""
    mod = engine()
    cfg = mod.ServeConfig(str(public), **config)
    if unix_path is not None:
        server = await mod.start_server(cfg, path=unix_path)
        host, port = "localhost", 0
    else:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        host, port = sock.getsockname()
        try:
            server = await mod.start_server(cfg, sock=sock, ssl=server_ctx)
        except BaseException:
            sock.close()
            raise
    try:
        yield NativeSite(public, host, port, client_ctx if server_ctx else None, server, unix_path)
    finally:
        await mod.shutdown(server, 5.0)


async def raw_unix(path: str, data: bytes, timeout: float = 20) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path, limit=2**20)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


# -- framing answers on a keep-alive connection --------------------------------------------------------


def _body_length(head: bytes, method: bytes) -> int:
    status = int(head.split(b" ", 2)[1])
    if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
        return 0
    m = re.search(rb"\r\ncontent-length:[ \t]*(\d+)", head, re.IGNORECASE)
    if m is None:
        raise AssertionError(f"an answer without Content-Length: {head[:300]!r}")
    return int(m[1])


async def read_response(reader: asyncio.StreamReader, method: bytes = b"GET", timeout: float = 20) -> bytes:
    """One whole answer (head and Content-Length body) from a keep-alive connection, raw."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    body = await asyncio.wait_for(reader.readexactly(_body_length(head, method)), timeout)
    return head + body


def split_responses(data: bytes, methods: list[bytes]) -> tuple[list[bytes], bytes]:
    """Cut a stream of answers (to requests of *methods*, in order) into raw answers; and the rest."""
    out = []
    pos = 0
    for method in methods:
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        end += 4
        stop = end + _body_length(data[pos:end], method)
        if stop > len(data):
            break
        out.append(data[pos:stop])
        pos = stop
    return out, data[pos:]


class Blob:
    """Bytes compared by value but shown by length and digest: an assertion on a multi-MiB body
    fails at once instead of making pytest diff it (which takes minutes)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        head = self.data[:60]
        return f"<{len(self.data)} bytes sha256:{hashlib.sha256(self.data).hexdigest()[:16]} {head!r}...>"


DATE = re.compile(rb"\r\nDate: [^\r]*", re.IGNORECASE)


def without_date(raw: bytes) -> bytes:
    """*raw* with its Date field's value blanked (formatted once a second: two answers may differ)."""
    return DATE.sub(b"\r\nDate: -", raw)


# -- as a separate process ------------------------------------------------------------------------------


@dataclass
class NativeProcess:
    """``python -m tests.support.native DIR ...``: the engine in its own process (uvloop by default).

    ``stop()`` sends SIGTERM, waits, and returns (exit status, stderr but what ``new_stderr()`` took).
    """

    public: Path
    loop: str = "uvloop"
    cert: Path | None = None  # key and certificate chain in one PEM file
    ca: Path | None = None  # for clients
    options: list[str] = field(default_factory=list)
    cli: bool = False  # run ``python -m aiosendfile serve`` itself (options are then serve's)

    def __post_init__(self) -> None:
        argv = [sys.executable, "-m", "tests.support.native", str(self.public), "--loop", self.loop]
        if self.cli:
            argv = [sys.executable, "-m", "aiosendfile", "serve", str(self.public), "--host", "127.0.0.1"]
            argv += ["--port", "0", "--loop", self.loop]
        if self.cert is not None:
            argv += ["--tls-cert" if self.cli else "--cert", str(self.cert)]
        root = Path(__file__).resolve().parent.parent.parent
        self.proc = subprocess.Popen(
            [*argv, *self.options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=cli_env(),
            cwd=root,
        )
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        line = self.proc.stdout.readline()
        os.set_blocking(self.proc.stderr.fileno(), False)  # new_stderr() reads what is there
        self._err_seen = ""
        try:
            if self.cli:
                banner = BANNER.search(line)
                if banner is None:
                    raise ValueError(line)
                host, port = banner["url"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
                info = {"host": host, "port": int(port)}
            else:
                info = json.loads(line)
        except ValueError:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"the native server did not start: {line!r} {err[-3000:]}") from None
        self.host: str = info["host"]
        self.port: int = info["port"]
        self.pid = self.proc.pid

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def client_ctx(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca else None

    def new_stderr(self) -> str:
        """What the server wrote to stderr since the last call (a warning, a traceback), without waiting."""
        assert self.proc.stderr is not None
        chunks = []
        with contextlib.suppress(BlockingIOError, TypeError):  # TypeError: read() gave None (nothing yet)
            while chunk := self.proc.stderr.read():
                chunks.append(chunk)
        out = "".join(chunks)
        self._err_seen += out
        return out

    def stop(self, timeout: float = 20) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.stderr is not None
        os.set_blocking(self.proc.stderr.fileno(), True)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"the native server did not stop on SIGTERM: {err[-3000:]}") from None
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


@contextlib.contextmanager
def native_process(public: Path, **kwargs: Any) -> Iterator[NativeProcess]:
    """A :class:`NativeProcess` that must stop cleanly: exit 0 on SIGTERM, nothing on stderr (no
    traceback, no warning) but what a test took with ``new_stderr()``."""
    server = NativeProcess(public, **kwargs)
    try:
        yield server
    except BaseException:
        server.kill()
        raise
    code, err = server.stop()
    assert code == 0, err[-3000:]
    assert err == "", err[-3000:]


def raise_nofile(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards *wanted* (at most the hard limit); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


async def _serve(args: argparse.Namespace) -> None:
    mod = engine()
    ctx = None
    if args.cert:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(args.cert)
    config: dict[str, Any] = {}
    if args.header_timeout is not None:
        config["header_timeout"] = args.header_timeout
    if args.keepalive_timeout is not None:
        config["keepalive_timeout"] = args.keepalive_timeout
    if args.send_timeout is not None:
        config["send_timeout"] = args.send_timeout
    if args.show_index:
        config["show_index"] = True
    if args.iteration_budget is not None:
        mod.ITERATION_BUDGET = args.iteration_budget  # (-1: each iteration answers one request)
    cfg = mod.ServeConfig(args.directory, **config)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    server = await mod.start_server(cfg, sock=sock, ssl=ctx)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host, port = sock.getsockname()[:2]
    print(json.dumps({"host": host, "port": port, "nofile": args.nofile_now}), flush=True)
    await stop.wait()
    await mod.shutdown(server, 5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description="run the native engine for tests")
    parser.add_argument("directory")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--cert", help="one PEM file: private key and certificate chain")
    parser.add_argument("--nofile", type=int, default=0, help="raise RLIMIT_NOFILE's soft limit to this")
    parser.add_argument("--header-timeout", type=float)
    parser.add_argument("--keepalive-timeout", type=float)
    parser.add_argument("--send-timeout", type=float)
    parser.add_argument("--show-index", action="store_true")
    parser.add_argument("--iteration-budget", type=float, help="the engine's ITERATION_BUDGET, in seconds")
    args = parser.parse_args()
    args.nofile_now = raise_nofile(args.nofile) if args.nofile else None
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(_serve(args))
    else:
        asyncio.run(_serve(args))


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    """Poll *predicate* (sync) until it holds, or fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
