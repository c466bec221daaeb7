"""ASGI servers as subprocesses for the ASGI door's tests: uvicorn (stock, or with a protocol class
such as ``aiosendfile.uvicorn:HttpToolsProtocol``), hypercorn and granian.

``AsgiServer`` starts ``python -m uvicorn|hypercorn`` or ``granian`` on an app given as
"module:factory" (the served directory goes in the environment, ``PUBLIC_ENV``), over TCP on a
free port, a Unix socket or TLS (``tls_files`` writes trustme's key and chain), on either loop;
waits until the server accepts; keeps its stdout and stderr in files (``logs()``, ``new_logs()``,
``problems()`` for tracebacks); gives its pid (``fd_count()``, ``rss()`` from ``/proc``); and stops it with
SIGTERM or SIGINT under a timeout. A server in its own process is what users run: its loop, its
signal handling and its logs are the real ones, and the test's loop cannot hide a bug in them.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import cli_env
from .raw_http import connect

#: The environment variable the app factories (``tests.support.asgi_apps``) read the served directory from.
PUBLIC_ENV = "AIOSENDFILE_TEST_PUBLIC"

#: Our protocol classes, as ``--http`` takes them.
OUR_HTTPTOOLS = "aiosendfile.uvicorn:HttpToolsProtocol"
OUR_H11 = "aiosendfile.uvicorn:H11Protocol"

#: What a server must never log.
PROBLEMS = ("Traceback", "Exception in ASGI application")

_UVICORN_STARTED = re.compile(r"Uvicorn running on https?://[^:\s]+:(\d+)")


def available(server: str) -> bool:
    """Whether *server* ("uvicorn", "hypercorn", "granian") is installed here."""
    return importlib.util.find_spec(server) is not None


def ours_available() -> bool:
    """Whether ``aiosendfile.uvicorn`` (our protocol classes) is in the tree yet."""
    return importlib.util.find_spec("aiosendfile.uvicorn") is not None


@dataclass(frozen=True)
class TlsFiles:
    """A server's PEM files (PKCS#8 key, certificate chain) and the CA file its clients trust."""

    key: Path
    cert: Path
    ca: Path

    def client_ctx(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def tls_files(ca: Any, directory: Path) -> TlsFiles:
    """Write a certificate for "localhost" and 127.0.0.1 issued by *ca* (a ``trustme.CA``) into
    *directory*. The key is PKCS#8, the one format all three servers read (granian's only one)."""
    from cryptography.hazmat.primitives import serialization

    leaf = ca.issue_cert("localhost", "127.0.0.1")
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    paths = TlsFiles(directory / "server.key", directory / "server.pem", directory / "ca.pem")
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths.cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    ca.cert_pem.write_to_path(str(paths.ca))
    return paths


def free_port() -> int:
    """A TCP port nothing listens on now (for servers that cannot bind port 0 and say which)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class AsgiServer:
    """One ASGI server process serving *app* ("module:factory", called with no arguments).

    *http* is uvicorn's ``--http`` (None: uvicorn's default, "httptools", "h11", or a class path
    such as :data:`OUR_HTTPTOOLS`); *loop* "asyncio" or "uvloop"; *uds* a Unix socket path
    instead of TCP; *tls* the server's files; *options* more command-line options; *env* more
    environment (the app factories read :data:`PUBLIC_ENV`, set from *public*). For granian,
    ``pid`` is the main process (its worker is a child of it).
    """

    app: str
    public: Path | None = None
    server: str = "uvicorn"
    http: str | None = None
    loop: str = "asyncio"
    uds: Path | None = None
    tls: TlsFiles | None = None
    options: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 30.0
    wait: bool = True  # False: start and return; call wait_ready() (start several servers at once)

    def __post_init__(self) -> None:
        self._logdir = Path(tempfile.mkdtemp(prefix="asgi-server-"))
        self._seen = 0
        self.host = "127.0.0.1"
        self.port = 0 if self.server == "uvicorn" else free_port()
        env = {**cli_env(), **self.env}
        if self.public is not None:
            env[PUBLIC_ENV] = str(self.public)
        env.setdefault("PYTHONUNBUFFERED", "1")
        root = Path(__file__).resolve().parent.parent.parent
        with open(self._logdir / "out", "wb") as out, open(self._logdir / "err", "wb") as err:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=root,
                start_new_session=True,  # a hard kill takes granian's workers too
            )
        self.pid = self.proc.pid
        if self.wait:
            self.wait_ready()

    # -- the command line ---------------------------------------------------------------------------

    def argv(self) -> list[str]:
        if self.server == "uvicorn":
            return self._uvicorn()
        if self.server == "hypercorn":
            return self._hypercorn()
        if self.server == "granian":
            return self._granian()
        raise ValueError(f"unknown ASGI server {self.server!r}")

    def _uvicorn(self) -> list[str]:
        argv = [sys.executable, "-m", "uvicorn", self.app, "--factory", "--loop", self.loop]
        argv += ["--lifespan", "off", "--no-use-colors"]
        if self.http is not None:
            argv += ["--http", self.http]
        if self.uds is not None:
            argv += ["--uds", str(self.uds)]
        else:
            argv += ["--host", self.host, "--port", str(self.port)]
        if self.tls is not None:
            argv += ["--ssl-keyfile", str(self.tls.key), "--ssl-certfile", str(self.tls.cert)]
        return [*argv, *self.options]

    def _hypercorn(self) -> list[str]:
        bind = f"unix:{self.uds}" if self.uds is not None else f"{self.host}:{self.port}"
        argv = [sys.executable, "-m", "hypercorn", f"{self.app}()", "--bind", bind]
        argv += ["--worker-class", self.loop, "--error-logfile", "-"]
        if self.tls is not None:
            argv += ["--keyfile", str(self.tls.key), "--certfile", str(self.tls.cert)]
        return [*argv, *self.options]

    def _granian(self) -> list[str]:
        exe = Path(sys.executable).with_name("granian")
        argv = [str(exe), self.app, "--factory", "--interface", "asgi", "--loop", self.loop]
        argv += ["--workers", "1", "--no-ws"]
        if self.uds is not None:
            argv += ["--uds", str(self.uds)]
        else:
            argv += ["--host", self.host, "--port", str(self.port)]
        if self.tls is not None:
            argv += ["--ssl-keyfile", str(self.tls.key), "--ssl-certificate", str(self.tls.cert)]
        return [*argv, *self.options]

    # -- start ----------------------------------------------------------------------------------------

    def wait_ready(self) -> None:
        """Wait until the server accepts connections; kill it and fail if it exits or takes too long."""
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise AssertionError(f"{self.server} exited ({code}) at start:\n{self.logs()}")
            if self.server == "uvicorn" and self.uds is None and self.port == 0:
                m = _UVICORN_STARTED.search(self.logs())
                if m:
                    self.port = int(m[1])
            if (self.port or self.uds is not None) and self._accepts():
                return
            if time.monotonic() > deadline:
                what = f"{self.server} did not accept in {self.start_timeout} s"
                raise AssertionError(f"{what}:\n{self.logs()}")
            time.sleep(0.05)

    def _accepts(self) -> bool:
        try:
            sock = self.raw_socket(timeout=1)
        except OSError:
            return False
        sock.close()
        return True

    # -- clients ----------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def client_ctx(self) -> ssl.SSLContext | None:
        return self.tls.client_ctx() if self.tls is not None else None

    def raw_socket(self, timeout: float | None = 20, rcvbuf: int | None = None) -> socket.socket:
        """A plain connected socket (TCP or Unix; no TLS), *rcvbuf* set before connecting."""
        family = socket.AF_UNIX if self.uds is not None else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if rcvbuf is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.settimeout(timeout)
            sock.connect(str(self.uds) if self.uds is not None else (self.host, self.port))
        except BaseException:
            sock.close()
            raise
        return sock

    def socket(self, timeout: float | None = 20, rcvbuf: int | None = None) -> socket.socket:
        """A connected client socket, wrapped in TLS (checked as "localhost") when the server is TLS."""
        sock = self.raw_socket(timeout, rcvbuf)
        ctx = self.client_ctx()
        if ctx is None:
            return sock
        try:
            return ctx.wrap_socket(sock, server_hostname="localhost")
        except BaseException:
            sock.close()
            raise

    def connection(self, timeout: float = 20) -> http.client.HTTPConnection:
        """An ``http.client`` connection to the server (keep-alive: reuse it for many requests)."""
        server = self

        class Connection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = server.socket(timeout)

        return Connection(self.host, self.port, timeout=timeout)

    async def open(self, **kw: Any) -> Any:
        """An asyncio (reader, writer) pair to the server (``raw_http.connect``)."""
        uds = str(self.uds) if self.uds is not None else None
        return await connect(self.host, self.port, self.client_ctx(), uds, **kw)

    # -- the process --------------------------------------------------------------------------------

    def logs(self) -> str:
        """Everything the server wrote so far, stdout then stderr."""
        parts = []
        for name in ("out", "err"):
            with contextlib.suppress(FileNotFoundError):
                parts.append((self._logdir / name).read_bytes().decode("utf-8", "replace"))
        return "".join(parts)

    def err(self) -> str:
        with contextlib.suppress(FileNotFoundError):
            return (self._logdir / "err").read_bytes().decode("utf-8", "replace")
        return ""

    def new_logs(self) -> str:
        """What the server wrote to stderr since the last call."""
        text = self.err()
        out, self._seen = text[self._seen :], len(text)
        return out

    def problems(self) -> list[str]:
        """The lines of the logs that show a traceback or an ASGI application's exception."""
        return [line for line in self.logs().splitlines() if any(p in line for p in PROBLEMS)]

    def fds(self) -> dict[int, str]:
        """The server process's open descriptors and what each refers to."""
        out = {}
        for name in os.listdir(f"/proc/{self.pid}/fd"):
            with contextlib.suppress(OSError):
                out[int(name)] = os.readlink(f"/proc/{self.pid}/fd/{name}")
        return out

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        """The server process's resident set size in bytes (``VmRSS`` in ``/proc/<pid>/status``)."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for {self.pid}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20) -> tuple[int, str]:
        """Send *signum*, wait up to *timeout* s for the exit; returns (exit status, logs).

        uvicorn raises the signal again once it has shut down, so a clean stop exits with
        ``-signum`` (or 0). Fails (after a hard kill) if the process does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logs = self.logs()  # before kill() removes the files
            self.kill()
            what = f"{self.server} did not stop in {timeout} s"
            raise AssertionError(f"{what}:\n{logs[-5000:]}") from None
        logs = self.logs()
        self._cleanup()
        return code, logs

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.server == "granian":  # its worker is in our session: make sure it is gone
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for name in ("out", "err"):
            with contextlib.suppress(FileNotFoundError):
                (self._logdir / name).unlink()
        with contextlib.suppress(OSError):
            self._logdir.rmdir()


def clean_exit(code: int, signum: int = signal.SIGTERM) -> bool:
    """Whether *code* is a clean exit after *signum*: 0, or the signal uvicorn raises again."""
    return code in (0, -signum)


@contextlib.contextmanager
def asgi_server(app: str, public: Path | None = None, **kwargs: Any) -> Iterator[AsgiServer]:
    """An :class:`AsgiServer` that must stop cleanly: a clean exit on SIGTERM within 20 s and
    nothing in its logs that :data:`PROBLEMS` names."""
    server = AsgiServer(app, public, **kwargs)
    try:
        yield server
    except BaseException:
        server.kill()
        raise
    code, logs = server.stop()
    bad = [line for line in logs.splitlines() if any(p in line for p in PROBLEMS)]
    assert not bad, logs[-5000:]
    assert clean_exit(code), (code, logs[-5000:])
