"""Shared fixtures: every async test runs on stock asyncio and on uvloop.

* ``pytest_asyncio_loop_factories`` parametrizes each async test over both loops.
* ``_no_loop_errors`` fails a test if the loop's exception handler was called.
* ``_no_fd_leak`` fails a test that leaves file descriptors open.
* ``connect`` makes a connected server-side ``StreamWriter`` and a client over
  TCP, a Unix socket or TLS (certificates from trustme).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvloop

from aiosendfile import _platform
from aiosendfile._splice import close_idle_pipes

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def pytest_asyncio_loop_factories(
    config: Any, item: Any
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    return LOOPS


def loop_name() -> str:
    return "uvloop" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "asyncio"


# When the suite runs in the background of a shell without job control (CI runners, `cmd &`
# in a script), SIGINT arrives ignored, and every subprocess would inherit that: a Ctrl-C sent
# to a CLI under test before its own handler is in place would then be dropped instead of
# having Python's default effect. Tests see what a user at a terminal sees.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- guards ------------------------------------------------------------------------


@pytest.fixture(autouse=True)
async def _no_loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    yield errors
    await asyncio.sleep(0)
    assert not errors, f"the loop's exception handler was called: {errors}"


class SlowDisk(ThreadPoolExecutor):
    """A pool whose jobs (those *slow* picks) first sleep *delay*: a disk that takes its time.

    ``started`` is set when a slow job begins, and ``threads`` holds the threads they ran on.
    """

    def __init__(self, workers: int, delay: float, slow: Callable[[Any], bool] = lambda fn: True) -> None:
        super().__init__(workers)
        self.delay, self.slow = delay, slow
        self.started = threading.Event()
        self.threads: set[int] = set()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            if self.slow(fn):
                self.threads.add(threading.get_ident())
                self.started.set()
                time.sleep(self.delay)
            return fn(*args, **kwargs)

        return super().submit(run)


async def until_set(event: threading.Event, timeout: float = 30.0) -> None:
    """Wait (without blocking the loop) until another thread sets *event*."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        assert time.monotonic() < deadline, "the event was never set"
        await asyncio.sleep(0.01)


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


@pytest.fixture(autouse=True)
async def _no_fd_leak() -> AsyncIterator[None]:
    """Measured inside the test's loop, so the loop's own fds are there before and after."""
    close_idle_pipes()
    gc.collect()
    before = open_fds()
    yield
    await asyncio.sleep(0)  # let transports finish their scheduled connection_lost
    close_idle_pipes()  # recvfile's pipe pool is a cache, not a leak
    gc.collect()
    leaked = {fd: _describe(fd) for fd in open_fds() - before}
    # libuv opens /dev/null once per loop as its reserve fd for EMFILE; it is the loop's.
    leaked = {fd: d for fd, d in leaked.items() if d != "/dev/null"}
    assert not leaked, f"file descriptors leaked: {leaked}"


def _describe(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    _platform.counters.reset()


# -- TLS -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tls_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def tls_server_ctx(tls_ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca.issue_cert("localhost", "127.0.0.1").configure_cert(ctx)
    return ctx


@pytest.fixture(scope="session")
def tls_client_ctx(tls_ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    tls_ca.configure_trust(ctx)
    return ctx


# -- files -----------------------------------------------------------------------


def pattern(size: int, seed: int = 0) -> bytes:
    """Deterministic, position-dependent bytes: misordered or repeated chunks show up."""
    block = bytes((i * 7 + seed) & 0xFF for i in range(251))  # prime length
    reps = size // len(block) + 1
    return (block * reps)[:size]


@pytest.fixture
def make_file(tmp_path: Path) -> Callable[..., Path]:
    def make(size: int, name: str = "data.bin", seed: int = 0) -> Path:
        path = tmp_path / name
        path.write_bytes(pattern(size, seed))
        return path

    return make


# -- connections -----------------------------------------------------------------


@dataclass
class Conn:
    """A server-side StreamWriter connected to a client socket the test reads."""

    writer: asyncio.StreamWriter
    client: socket.socket | ssl.SSLObject | Any
    client_reader: asyncio.StreamReader | None
    client_writer: asyncio.StreamWriter | None
    closers: list[Any] = field(default_factory=list)

    @property
    def transport(self) -> Any:
        return self.writer.transport

    async def read_all(self) -> bytes:
        """Read until the server closes the connection."""
        assert self.client_reader is not None
        return await self.client_reader.read()

    async def read_exactly(self, n: int) -> bytes:
        assert self.client_reader is not None
        return await self.client_reader.readexactly(n)


class Connector:
    """Opens server/client pairs of one kind; closes everything at teardown."""

    def __init__(self, kind: str, tmp_path: Path, server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext):
        self.kind = kind
        self.tmp_path = tmp_path
        self.server_ctx = server_ctx
        self.client_ctx = client_ctx
        self.servers: list[asyncio.Server] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def __call__(self, *, rcvbuf: int | None = None, limit: int = 2**16) -> Conn:
        accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

        async def on_client(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            accepted.set_result(w)

        sock = self._client_socket(rcvbuf)
        if self.kind == "unix":
            path = str(self.tmp_path / f"s{len(self.servers)}.sock")
            server = await asyncio.start_unix_server(on_client, path)
            await asyncio.get_running_loop().sock_connect(sock, path)
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=limit)
        else:
            ssl_ctx = self.server_ctx if self.kind == "tls" else None
            server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=ssl_ctx)
            port = server.sockets[0].getsockname()[1]
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            client_ssl = self.client_ctx if self.kind == "tls" else None
            reader, writer = await asyncio.open_connection(
                sock=sock, ssl=client_ssl, server_hostname="localhost" if client_ssl else None, limit=limit
            )
        self.servers.append(server)
        server_writer = await accepted
        self.writers += [server_writer, writer]
        return Conn(server_writer, sock, reader, writer)

    def _client_socket(self, rcvbuf: int | None) -> socket.socket:
        family = socket.AF_UNIX if self.kind == "unix" else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        return sock

    async def close(self) -> None:
        """Close every connection; abort those that cannot finish closing in a second.

        (Python 3.10's TLS transport never finishes close() when reading is paused
        and the peer is gone, and its wait_for() can turn that timeout into a
        CancelledError. asyncio.wait() cancels nothing, so it is used here.)
        """
        for w in self.writers:
            w.close()
        waits = {asyncio.ensure_future(w.wait_closed()): w for w in self.writers}
        if waits:
            _, pending = await asyncio.wait(waits, timeout=1)
            for fut in pending:
                waits[fut].transport.abort()
            if pending:
                _, still = await asyncio.wait(pending, timeout=1)
                for fut in still:
                    fut.cancel()
            for fut in waits:
                if fut.done() and not fut.cancelled():
                    fut.exception()  # retrieved: a peer that reset is expected here
        for s in self.servers:
            s.close()
            await s.wait_closed()


@pytest.fixture(params=["tcp", "unix", "tls"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def connect(
    kind: str, tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> AsyncIterator[Connector]:
    connector = Connector(kind, tmp_path, tls_server_ctx, tls_client_ctx)
    yield connector
    await connector.close()


def evict(path: Path) -> None:
    """Drop *path*'s pages from the page cache (fsync + ``POSIX_FADV_DONTNEED``), or skip the test.

    The check uses ``cachestat(2)`` where it exists: a 1-byte ``RWF_NOWAIT``
    probe of a missing page would start readahead and warm the file again.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if _platform.range_cached_available():
            cached = _platform.range_cached(fd, 0, 4096)
        else:
            cached = _platform.page_cached(fd, 0)
        if cached is not False:
            pytest.skip("this file system cannot evict pages or cannot probe them")
    finally:
        os.close(fd)


def zero_copy_expected(kind: str) -> bool:
    return kind != "tls"


# -- command-line processes ------------------------------------------------------------


def catches(pid: int, signum: int) -> bool:
    """Whether *pid* has a handler for *signum* (SigCgt in /proc): aiosendfile's own code is running."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def cli_env() -> dict[str, str]:
    """The environment for ``python -m aiosendfile`` subprocesses: this checkout first on the path."""
    root = Path(__file__).resolve().parent.parent
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def aiosendfile_process(*argv: str) -> subprocess.Popen[str]:
    """``python -m aiosendfile *argv`` from this checkout, stdout/stderr piped (text), no stdin."""
    return subprocess.Popen(
        [sys.executable, "-m", "aiosendfile", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=cli_env(),
    )


@contextlib.contextmanager
def cli_process(*argv: str) -> Iterator[subprocess.Popen[str]]:
    """:func:`aiosendfile_process`, killed (and reaped) on the way out if it is still running."""
    proc = aiosendfile_process(*argv)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def signal_while_starting(argv: list[str], signum: int, delay: float) -> tuple[bool, int, str]:
    """Start ``python -m aiosendfile *argv``, send *signum* after *delay* s, wait for the end.

    Returns (ours, exit status, stderr). *ours* says whether the process had a SIGTERM
    handler when the signal was sent: without one, the signal landed before any
    aiosendfile code ran (the interpreter's start) and has Python's default effect.
    """
    with cli_process(*argv) as proc:
        time.sleep(delay)
        ours = catches(proc.pid, signal.SIGTERM)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    return ours, proc.returncode, err
