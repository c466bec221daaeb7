"""The serve door's harness: its engine (``aiosendfile._serve``) in the test's own loop, or as a
separate process. Its answers are read with ``raw_http``'s reader.

* ``serve_site(public, ...)`` starts ``start_server`` on the running loop (TCP, TLS or a Unix
  socket) and yields a :class:`ServeSite`: ``url``, ``open`` (a raw connection, for keep-alive and
  pipelining), ``exchange`` (raw bytes until the server closes), ``fetch`` (the same as a
  ``Response``), ``host``/``port`` and ``prefix`` b"" (serve mounts at "/"), the face of the other
  doors' test sites.
* ``serving(tmp_path, ...)`` is ``serve_site`` over ``build()``'s tree (``www``: a small file, a big
  one, odd names, a directory with an index), for the engine's socket tests; ``get`` writes their
  requests, ``at_eof``, ``close_writer``, ``holding`` and ``reported`` watch the connection, the
  engine and the loop.
* :class:`ServeProcess` runs the engine in another interpreter (``python -m tests.support.serve DIR
  ...``, this module's ``main``, or ``python -m aiosendfile serve``): a client in the server's own
  loop hides real bugs (ordering, flow control, a loop that blocks), and load tests measure the
  server's memory alone; ``serve_process`` also holds it to a clean stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .files import pattern
from .processes import BANNER, cli_env
from .raw_http import Response, connect, parse_response, read_to_eof

# -- in the test's loop -----------------------------------------------------------------------------

SMALL = 4096  # build()'s small.txt
BIG = 3 * 1024 * 1024 + 17  # build()'s big.bin: above the inline limit, sent by aiosendfile.sendfile


@dataclass
class ServeSite:
    """The engine serving *public* at "/", on this loop; *ctx* is the client's TLS context, *limit*
    the buffer limit of the connections ``open`` makes."""

    public: Path
    host: str
    port: int
    ctx: ssl.SSLContext | None
    server: Any
    unix_path: str | None = None
    prefix: bytes = b""
    limit: int = 2**20

    @property
    def tls(self) -> bool:
        return self.ctx is not None

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    async def open(self, **kw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw connection to the site (TLS when the site is), for keep-alive and pipelining."""
        return await connect(self.host, self.port, self.ctx, self.unix_path, limit=self.limit, **kw)

    async def exchange(self, data: bytes, timeout: float = 20) -> bytes:
        """Send *data* as is; read until the server closes (requests should say ``Connection: close``)."""
        reader, writer = await self.open()
        try:
            writer.write(data)
            return await asyncio.wait_for(read_to_eof(reader), timeout)
        finally:
            await close_writer(writer)

    async def fetch(self, data: bytes) -> Response:
        """``exchange`` as one answer (``parse_response``)."""
        return parse_response(await self.exchange(data))


def engine() -> Any:
    """The engine's module (imported late: the tests of other doors must not need it)."""
    from aiosendfile._serve import _server

    return _server


#: How a cold chunk's pages are waited for: the compiled page reader, or a timer after a read ahead.
PAGE_WAITS = ("reader", "timer")


def watch_feeds(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the engine's connections hand their parser from now on (a read the heads memo
    recognised is not)."""
    from aiosendfile._serve import _protocol

    fed: list[bytes] = []
    real = _protocol.HttpProtocol._feed

    def feed(self: Any, data: Any) -> None:
        fed.append(bytes(data))
        real(self, data)

    monkeypatch.setattr(_protocol.HttpProtocol, "_feed", feed)
    return fed


def wait_pages_by(site: Any, how: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Make *site*'s engine wait for cold pages *how* (``PAGE_WAITS``; the reader is skipped where
    it is not built): the (offset, size) of every range it has read in, the reader's as it is asked,
    the read ahead's from its thread (it may come after the body)."""
    from aiosendfile import _platform

    eng = engine()._engines[site.server]
    asked: list[tuple[int, int]] = []
    if how == "timer":
        eng.pages = None
        monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: asked.append((offset, size)))
        return asked
    if eng.pages is None:
        pytest.skip("no compiled page reader here")
    kind = type(eng.pages)
    real, real_send = kind.ask, kind.ask_send

    def ask(self: Any, fd: int, offset: int, size: int, then: Any, late: Any, key: Any = None) -> int:
        asked.append((offset, size))
        return real(self, fd, offset, size, then, late, key)

    def ask_send(self: Any, fd: int, offset: int, size: int, *args: Any) -> int:
        asked.append((offset, size))
        return real_send(self, fd, offset, size, *args)

    monkeypatch.setattr(kind, "ask", ask)
    monkeypatch.setattr(kind, "ask_send", ask_send)
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: asked.append((-1, -1)))
    return asked


@contextlib.asynccontextmanager
async def serve_site(
    public: Path,
    *,
    server_ctx: ssl.SSLContext | None = None,
    client_ctx: ssl.SSLContext | None = None,
    unix_path: str | None = None,
    limit: int = 2**20,
    **config: Any,
) -> AsyncIterator[ServeSite]:
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
        ctx = client_ctx if server_ctx else None
        yield ServeSite(public, host, port, ctx, server, unix_path, limit=limit)
    finally:
        await mod.shutdown(server, 5.0)


def build(root: Path) -> Path:
    """The engine's socket tests' tree: ``small.txt`` (SMALL), ``big.bin`` (BIG), odd names, ``sub/``."""
    root.mkdir()
    (root / "small.txt").write_bytes(pattern(SMALL, seed=1))
    (root / "big.bin").write_bytes(pattern(BIG, seed=2))
    (root / "sp ace.txt").write_bytes(b"space")
    (root / "a%20b.txt").write_bytes(b"literal percent")
    (root / "sub").mkdir()
    (root / "sub" / "index.html").write_bytes(b"<p>index</p>")
    return root


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    kind: str = "tcp",
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
    **config: Any,
) -> AsyncIterator[ServeSite]:
    """``build()``'s tree (``tmp_path/www``) served over *kind* ("tcp" or "unix"); over TLS with
    *tls* (the server's context, the client's)."""
    root = build(tmp_path / "www")
    where: dict[str, Any] = {"unix_path": str(tmp_path / "s.sock")} if kind == "unix" else {}
    if tls:
        where.update(server_ctx=tls[0], client_ctx=tls[1])
    async with serve_site(root, limit=2**22, **where, **config) as site:
        yield site


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 5)


def get(target: str, extra: str = "", method: str = "GET", version: str = "1.1") -> bytes:
    return f"{method} {target} HTTP/{version}\r\nHost: localhost\r\n{extra}\r\n".encode("latin-1")


async def at_eof(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed: EOF (or a reset) with nothing more to read."""
    try:
        return await asyncio.wait_for(reader.read(1), 20) == b""
    except (ConnectionError, ssl.SSLError):
        return True


async def holding(eng: Any, n: int) -> None:
    """Wait (up to 2 s) until the engine *eng* holds exactly *n* connections."""
    for _ in range(200):
        if len(eng.connections) == n:
            break
        await asyncio.sleep(0.01)


@contextlib.contextmanager
def reported() -> Iterator[list[dict[str, Any]]]:
    """What reaches the loop's exception handler meanwhile (instead of failing the test)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    try:
        yield errors
    finally:
        loop.set_exception_handler(previous)


# -- as a separate process ------------------------------------------------------------------------------


@dataclass
class ServeProcess:
    """``python -m tests.support.serve DIR ...``: the engine in its own process (uvloop by default).

    ``stop()`` sends SIGTERM, waits, and returns (exit status, stderr but what ``new_stderr()`` took).
    """

    public: Path
    loop: str = "uvloop"
    cert: Path | None = None  # key and certificate chain in one PEM file
    ca: Path | None = None  # for clients
    options: list[str] = field(default_factory=list)
    cli: bool = False  # run ``python -m aiosendfile serve`` itself (options are then serve's)

    def __post_init__(self) -> None:
        argv = [sys.executable, "-m", "tests.support.serve", str(self.public), "--loop", self.loop]
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
                where = urllib.parse.urlsplit(banner["url"])  # (a --path-prefix follows the port)
                info = {"host": where.netloc.rsplit(":", 1)[0], "port": where.port}
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
def serve_process(public: Path, **kwargs: Any) -> Iterator[ServeProcess]:
    """A :class:`ServeProcess` that must stop cleanly: exit 0 on SIGTERM, nothing on stderr (no
    traceback, no warning) but what a test took with ``new_stderr()``."""
    server = ServeProcess(public, **kwargs)
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


if __name__ == "__main__":
    main()
