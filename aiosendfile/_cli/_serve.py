"""``aiosendfile serve``: the command line of the native HTTP engine (:mod:`aiosendfile._serve`).

Parses the options, checks the directory and the TLS files, binds the address
(errors show before anything starts), prints the banner and runs the engine in
one process or in ``--workers N`` forked processes that share the port with
``SO_REUSEPORT``, supervised by the first (:class:`_Supervisor`: a worker that dies is
said and restarted after a :class:`Backoff`). How stop signals are handled before the
loop runs is in :mod:`aiosendfile._cli._main`.

Signals, decided for a server whose log is stderr and whose configuration is its command
line (nginx reloads on SIGHUP, reopens its logs on SIGUSR1, upgrades on SIGUSR2):

- SIGINT, SIGTERM: a graceful stop (connections get :data:`SHUTDOWN_TIMEOUT`), exit 0, silent.
- SIGHUP: the same stop, with one line saying so; there is nothing to reload, and a hangup
  means whoever ran serve is gone. If SIGHUP was ignored when serve started (``nohup``),
  it stays ignored.
- SIGUSR1, SIGUSR2: ignored, one line each: nothing to reopen, nothing to upgrade.
- With ``--workers``, these are the parent's: workers stop on SIGINT/SIGTERM (the parent's,
  or a Ctrl-C to the process group) and ignore the rest, so a hangup or a stray SIGUSR1 to
  the group is acted on, and said, once.

Lines on stderr (the access log, these) go through the log's writer
(:mod:`aiosendfile._serve._accesslog`): they never block serving nor a stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import os
import signal
import socket
import ssl
import stat
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from .._serve._listener import listening_socket
from ._common import (
    NO_OP_SIGNALS,
    SERVE_SIGNALS,
    STOP_SIGNALS,
    add_loop_option,
    fail,
    hangup_text,
    ignored_text,
    in_words,
    loop_factory,
    port,
    quiet_exit_on_signals,
)

if TYPE_CHECKING:
    from .._serve._accesslog import LineWriter

__all__ = ("Backoff", "add_serve_command", "serve_command")

SHUTDOWN_TIMEOUT = 0.5  # seconds open connections get to finish on stop
LOG_DRAIN = 1.0  # seconds the log lines still queued at the end get to reach stderr
STOP_WORKERS_WITHIN = 5.0  # seconds workers get to stop once told; then they are killed
MAX_WORKERS = 1024
PROG = "aiosendfile serve"

_SERVE_DESCRIPTION = """\
Serve the files in DIRECTORY over HTTP (GET and HEAD), zero-copy with
sendfile(2). Ranges, conditional requests (ETag, Last-Modified) and
pre-compressed siblings (a.js.br, a.js.gz, chosen by Accept-Encoding) are
supported. A directory answers with its index.html, else with a listing
(sortable by name, date or size; as JSON with ?json or Accept:
application/json), or 403 under --no-listing.

Hidden by default: any path with a component starting with "." (/.env,
/.git/config) gets 404 and is not listed; only /.well-known/ is served.
Symlinks that lead outside DIRECTORY get 404 unless --follow-symlinks.

--tls-cert FILE (and --tls-key FILE, unless the key is in FILE) serves HTTPS
instead. OpenSSL encrypts on the connection's socket itself, as nginx does
without kernel TLS (a file is read once into memory, encrypted and written);
the banner says so, and whether this machine offers kernel TLS (not used
yet).

--access-log writes a line per response to stderr (Combined Log Format).
It never holds serving up: when stderr is not read, up to 1 MiB of lines
waits, later ones are dropped, then a line says how many.

Ctrl-C, SIGTERM or SIGHUP stops the server (exit status 0; SIGHUP says so
on stderr, and stays ignored if it was when serve started, as under nohup):
open connections get half a second to finish. SIGUSR1 and SIGUSR2 are
ignored, with a line on stderr: there is no log file to reopen (the log is
stderr) and nothing to reload. With --workers N, signals are for the first
process; a worker that dies is restarted, with a line on stderr, 0.1 s
later, then twice as late each time a new one dies within 30 s (up to 10 s)."""

_SERVE_EPILOG = """\
examples:
  aiosendfile serve                          the current directory on 127.0.0.1:8000
  aiosendfile serve ./public --no-listing    403 for folders that have no index.html
  aiosendfile serve site --host 0.0.0.0 --port 8080 --workers 4
                                             every interface, 4 processes

exit status: 0 when stopped by Ctrl-C/SIGTERM/SIGHUP; 2 for a bad argument (a
port outside 0-65535, --workers outside 1-1024, a DIRECTORY that is missing or
unreadable); 1 when the address cannot be listened on (in use, not this
machine's, or a port below 1024 without privileges), or a worker cannot start."""


def _workers(text: str) -> int:
    """``--workers``: a number of processes, 1 to :data:`MAX_WORKERS`."""
    value = text.strip()
    if not value.isdigit() or not 1 <= int(value) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"a number of processes from 1 to {MAX_WORKERS}, not {text!r}")
    return int(value)


def _size(text: str) -> int:
    """``--max-upload-size``: bytes, or a number with K, M or G (powers of 1024)."""
    value = text.strip().upper().removesuffix("B")
    scale = 1
    if value[-1:] in ("K", "M", "G", "T"):
        scale = 1024 ** ("KMGT".index(value[-1]) + 1)
        value = value[:-1]
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"a size in bytes (or with K, M, G), not {text!r}")
    return int(value) * scale


def _directory(text: str) -> str:
    """DIRECTORY: an existing directory this process can list and open files in; its absolute path.

    Checked at start, not per request: a folder the server cannot read would
    otherwise start fine and answer 403 to everything.
    """
    path = os.path.abspath(text)
    try:
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
        os.stat(os.path.join(path, "."))  # x: files in it can be opened
        with os.scandir(path):  # r: it can be listed (index.html lookups, --show-index)
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot serve {text!r}: {in_words(exc)}") from None
    return path


def add_serve_command(commands: Any) -> None:
    """The ``serve`` subcommand of the ``aiosendfile`` parser."""
    serve = commands.add_parser(
        "serve",
        help="serve a directory over HTTP",
        description=_SERVE_DESCRIPTION,
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "directory",
        nargs="?",
        default=".",
        type=_directory,
        metavar="DIRECTORY",
        help="the directory to serve (default: the current one)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; 0.0.0.0 or :: for all)",
    )
    serve.add_argument(
        "--port", type=port, default=8000, help="port to listen on (default: %(default)s; 0 picks a free one)"
    )
    add_loop_option(serve)
    serve.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N",
        help="processes sharing the port with SO_REUSEPORT, restarted if one dies (default: %(default)s)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log every request to stderr; never blocks serving (default: off)",
    )
    serve.add_argument(
        "--no-listing",
        dest="listing",
        action="store_false",
        help="answer 403 for a directory that has no index.html (default: a listing)",
    )
    # (Listings were off by default before: the old switch is still taken, and changes nothing.)
    serve.add_argument("--show-index", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument(
        "--show-dotfiles",
        action="store_true",
        help="serve and list names starting with '.' (default: 404, except /.well-known/)",
    )
    serve.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="serve symlinks that point outside DIRECTORY (default: 404)",
    )
    serve.add_argument(
        "--upload",
        action="store_true",
        help="let PUT and form posts (the listing's upload form, curl -F) write files (each appears whole, "
        "or not at all; needs --auth off loopback)",
    )
    serve.add_argument(
        "--overwrite", action="store_true", help="with --upload: an upload may replace a file (default: 409)"
    )
    serve.add_argument(
        "--max-upload-size",
        type=_size,
        metavar="SIZE",
        help="with --upload: refuse larger bodies with 413 (bytes, or with K, M, G; default: no limit)",
    )
    serve.add_argument(
        "--auth",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="ask for this user and password (HTTP Basic); repeatable; the password may be a hash "
        "from 'aiosendfile hash-password USER'",
    )
    serve.add_argument(
        "--auth-file",
        metavar="FILE",
        help="users from FILE, one USER:HASH a line (from 'aiosendfile hash-password USER')",
    )
    serve.add_argument(
        "--public-read",
        action="store_true",
        help="with --auth/--auth-file: GET and HEAD need no password (only uploads will)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this host name (repeatable; .example.org: it and its subdomains; "
        "'*': any); by default only IP addresses, localhost, this machine's name and --host are "
        "answered, others get 421 (DNS rebinding)",
    )
    serve.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDR",
        help="with --auth: a reverse proxy (an address or a network, repeatable) whose "
        "X-Forwarded-For names the client that failed passwords are counted against",
    )
    serve.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    serve.add_argument(
        "--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM; default: in FILE)"
    )
    serve.set_defaults(run=serve_command)
    hasher = commands.add_parser(
        "hash-password",
        help="print a USER:HASH line for serve --auth-file",
        description="Read a password (asked twice on a terminal, else one line from stdin) and "
        "print USER:HASH, a salted scrypt hash, for serve --auth-file or --auth.",
    )
    hasher.add_argument("user", metavar="USER", help="the user name (no ':')")
    hasher.set_defaults(run=hash_password_command)


def hash_password_command(args: argparse.Namespace) -> int:
    from .._serve._auth import AuthError, hash_password, parse_entry

    prog = "aiosendfile hash-password"
    if ":" in args.user:
        return fail(prog, f"cannot use user {args.user!r}: a user name holds no ':'", 2)
    try:
        parse_entry(f"{args.user}:x")
    except AuthError as exc:
        return fail(prog, f"cannot use user {args.user!r}: {exc}", 2)
    if sys.stdin is not None and sys.stdin.isatty():
        import getpass

        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            return fail(prog, "the passwords differ", 2)
    else:
        line = sys.stdin.readline() if sys.stdin is not None else ""
        password = line[:-1] if line.endswith("\n") else line
    if not password:
        return fail(prog, "the password is empty", 2)
    print(f"{args.user}:{hash_password(password)}")
    return 0


def _users(args: argparse.Namespace) -> tuple[tuple[bytes, Any], ...]:
    """The users of ``--auth`` and ``--auth-file`` (AuthError saying which cannot be used, and why)."""
    from .._serve._auth import AuthError, parse_entry, read_auth_file

    users = {}
    if args.auth_file:
        try:
            users.update(read_auth_file(args.auth_file))
        except (AuthError, OSError, UnicodeDecodeError) as exc:
            words = in_words(exc) if isinstance(exc, OSError) else str(exc)
            raise AuthError(f"--auth-file {args.auth_file}: {words}") from None
    for entry in args.auth:
        try:
            user, secret = parse_entry(entry)
        except AuthError as exc:  # (the password is not repeated)
            raise AuthError(f"--auth {entry.partition(':')[0]}:...: {exc}") from None
        users[user] = secret
    return tuple(users.items())


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def serve_command(args: argparse.Namespace) -> int:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return fail(PROG, "needs httptools (pip install 'aiosendfile[serve]')", 2)
    directory = args.directory  # absolute, and checked readable by _directory
    _, loop_name = loop_factory(args.loop)
    if args.tls_key and not args.tls_cert:
        return fail(PROG, "--tls-key needs --tls-cert", 2)
    try:
        args.users = _users(args)
    except ValueError as exc:  # (an AuthError, or an OSError's words: what, and where)
        return fail(PROG, f"cannot use {exc}", 2)
    if args.public_read and not args.users:
        return fail(PROG, "--public-read needs --auth or --auth-file (who may upload)", 2)
    if args.trusted_proxy and not args.users:
        return fail(PROG, "--trusted-proxy goes with --auth or --auth-file (whose lockout it keys)", 2)
    try:
        from .._serve._auth import TrustedProxies

        TrustedProxies(tuple(args.trusted_proxy))
    except ValueError as exc:
        return fail(PROG, f"cannot use --trusted-proxy: {exc}", 2)
    if (args.overwrite or args.max_upload_size is not None) and not args.upload:
        return fail(PROG, "--overwrite and --max-upload-size go with --upload", 2)
    if args.upload and importlib.util.find_spec("python_multipart") is None:
        return fail(PROG, "--upload needs python-multipart (pip install 'aiosendfile[serve]')", 2)
    if args.tls_cert:
        try:
            tls_context(args)  # checked here, so that a bad file shows before anything starts
        except (OSError, ssl.SSLError) as exc:
            return fail(PROG, f"cannot use --tls-cert/--tls-key: {in_words(exc)}", 2)

    multi = args.workers > 1
    # Bind here first: errors (port in use) show before any worker starts, and with
    # port 0 this picks the port every worker then shares. With workers, this socket
    # only holds the port: it never listens, so the kernel gives it no connections.
    try:
        sock = listening_socket(args.host, args.port, reuse_port=multi, listen=not multi)
    except OSError as exc:
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {in_words(exc)}")
    host, port = sock.getsockname()[:2]
    if args.upload and not args.users and not _is_loopback(host):
        sock.close()
        return fail(PROG, f"--upload on {host} lets anyone write files: add --auth USER:PASSWORD", 2)
    scheme = "https" if args.tls_cert else "http"
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/"
    banner = (
        f"aiosendfile {__version__} serving {directory} at {url} "
        f"({loop_name}, {args.workers} worker{'s' if multi else ''}; Ctrl-C to stop)"
    )
    if args.tls_cert:
        from .._serve._tls import tls_path

        banner += f"\n{tls_path()}"
    if args.upload:
        limit = "" if args.max_upload_size is None else f", up to {args.max_upload_size} bytes"
        verb = "write and replace" if args.overwrite else "write"
        banner += f"\nuploads: PUT and the listing's form (POST) {verb} files{limit}"
    if args.users:
        n = len(args.users)
        who = f"{n} user{'s' if n > 1 else ''}"
        reads = "GET and HEAD are open (--public-read)" if args.public_read else "every request needs one"
        banner += f"\npasswords (HTTP Basic): {who}; {reads}"
        if not args.tls_cert and not _is_loopback(host):
            banner += (
                "\nwarning: over plain HTTP on a non-loopback address, passwords cross the network in"
                " clear text: add --tls-cert FILE"
            )
    if not multi:
        print(banner, flush=True)
        _run_server(args, directory, sock, worker=False)
        return 0
    with sock:
        status = _Supervisor(args, directory, host, port, sock).run(banner)
    _drain_log()
    return status


def tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    """The server's TLS context from ``--tls-cert``/``--tls-key`` (OSError or SSLError if unusable).
    A client's end of stream with no ``close_notify`` after a whole request (a half-close) is an
    end of stream, as nginx has it, not a fatal error that drops the answers still owed: HTTP
    frames what it reads."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)  # (OpenSSL 3)
    context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


class Backoff:
    """How long a worker slot waits before it starts a new worker after one died: 0.1 s, doubling
    with each death up to 10 s, so that a worker that dies at once does not make the parent spin;
    back to 0.1 s after a worker that had run :attr:`STABLE` seconds."""

    FIRST = 0.1
    CAP = 10.0
    STABLE = 30.0

    def __init__(self) -> None:
        self.delay = self.FIRST

    def after(self, ran: float) -> float:
        """The wait before the next start, now that a worker that ran *ran* seconds died."""
        if ran >= self.STABLE:
            self.delay = self.FIRST
        delay = self.delay
        self.delay = min(delay * 2, self.CAP)
        return delay


class _Slot:
    """One of the N workers: its process (None between a death and the restart), and when."""

    __slots__ = ("backoff", "error", "listening", "proc", "restart_at", "since")

    def __init__(self) -> None:
        self.proc: Any = None  # a multiprocessing Process
        self.since = 0.0  # when it started (monotonic)
        self.listening = False  # it said it listens
        self.error = ""  # what it said instead (it could not listen)
        self.restart_at: float | None = None
        self.backoff = Backoff()


class _Supervisor:
    """The parent of ``--workers N``: starts the workers, prints the banner once every one listens,
    restarts one that dies (saying so; with a :class:`Backoff`), stops them all on a stop signal.

    Signals are handled by its own loop: their Python handlers only note them, and
    ``signal.set_wakeup_fd`` wakes the wait on the workers' sentinels, so a stop is acted on at
    once, during a backoff too. Lines go through the log's writer (they never block the parent,
    even when the workers' access log has filled stderr). Workers are forked with the signals
    blocked, take their own handlers (SIGINT/SIGTERM stop gracefully, SIGHUP/SIGUSR1/SIGUSR2 are
    the parent's business: ignored), close the parent's descriptors, then unblock them.
    """

    def __init__(
        self, args: argparse.Namespace, directory: str, host: str, port: int, holder: socket.socket
    ) -> None:
        import multiprocessing

        self.ctx: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        self.args = args
        self.directory = directory
        self.host = host
        self.port = port
        self.holder = holder  # the socket that holds the port: the parent's, not the workers'
        self.slots = [_Slot() for _ in range(args.workers)]
        self.signals: list[int] = []
        self.stopping = False
        self.kill_at = 0.0  # stopping: workers still running then are killed
        self.started = False  # every worker listened once: the banner is out
        self.start_failed = False

    def run(self, banner: str) -> int:
        hangup = signal.getsignal(signal.SIGHUP) != signal.SIG_IGN  # (nohup: it stays ignored)
        handled = [signum for signum in SERVE_SIGNALS if hangup or signum != signal.SIGHUP]
        self.ready, self.ready_w = self.ctx.Pipe(duplex=False)
        self.wake_r, self.wake_w = os.pipe()
        if sys.stderr is not None:
            _stderr().linger = 0.0  # its thread ends once its lines are out: workers are forked
        try:
            os.set_blocking(self.wake_r, False)
            os.set_blocking(self.wake_w, False)
            wakeup = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
            for signum in handled:
                signal.signal(signum, self._on_signal)
            try:
                for slot in self.slots:
                    self._handle_signals()
                    if self.stopping:
                        break
                    if error := self._start(slot):
                        self._failed_to_start(error)
                        break
                self._supervise(banner)
            finally:
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SERVE_SIGNALS)
                try:
                    _quiet_exit(worker=False, stopping=True)
                    signal.set_wakeup_fd(wakeup)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        finally:
            for slot in self.slots:
                if slot.proc is not None:  # (only after an error of ours: they are gone otherwise)
                    slot.proc.kill()
                    slot.proc.join()
                    slot.proc.close()
            self.ready.close()
            self.ready_w.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
        return 1 if self.start_failed else 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)  # acted on by the loop below, which the wakeup fd wakes

    def _supervise(self, banner: str) -> None:
        import multiprocessing.connection

        while True:
            self._handle_signals()
            self._read_ready()
            self._reap()
            live = [slot.proc for slot in self.slots if slot.proc is not None]
            if self.stopping and not live:
                return
            if not (self.started or self.stopping) and all(slot.listening for slot in self.slots):
                print(banner, flush=True)  # the banner promises a working server
                self.started = True
            now = time.monotonic()
            if self.stopping:
                deadline: float | None = self.kill_at
                if now >= self.kill_at:
                    for proc in live:
                        _say(f"worker {proc.pid} did not stop within {STOP_WORKERS_WITHIN:g} s: killed")
                        proc.kill()
                    self.kill_at = now + 3600.0
            else:
                for slot in self.slots:
                    due_now = slot.restart_at is not None and now >= slot.restart_at
                    if due_now and (error := self._start(slot)):
                        delay = slot.backoff.after(0.0)
                        _say(f"cannot start a worker: {error}; trying again in {delay:g} s")
                        slot.restart_at = now + delay
                due = [slot.restart_at for slot in self.slots if slot.restart_at is not None]
                deadline = min(due, default=None)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            waiting = [self.wake_r, self.ready, *(slot.proc.sentinel for slot in self.slots if slot.proc)]
            multiprocessing.connection.wait(waiting, timeout)
            with contextlib.suppress(OSError):
                while os.read(self.wake_r, 512):
                    pass

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if signum in NO_OP_SIGNALS:
                _say(ignored_text(signum))
                continue
            if signum == signal.SIGHUP and not self.stopping:
                _say(hangup_text())
            self._stop()  # (again while stopping: each worker gets one more SIGTERM)

    def _read_ready(self) -> None:
        while self.ready.poll():
            pid, error = self.ready.recv()
            for slot in self.slots:
                if slot.proc is not None and slot.proc.pid == pid:
                    slot.listening = not error
                    slot.error = error
                    if error and not (self.started or self.stopping):
                        self._failed_to_start(error)

    def _reap(self) -> None:
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.exitcode is None:
                continue
            slot.proc = None
            pid, code = proc.pid, proc.exitcode
            proc.close()
            if self.stopping:
                continue
            if not self.started:
                self._failed_to_start(slot.error or "it exited")
                continue
            now = time.monotonic()
            delay = slot.backoff.after(now - slot.since)
            if slot.error:
                why = f"could not listen: {slot.error}"
            elif code < 0:
                why = f"was killed by {_signal_name(-code)}"
            else:
                why = f"exited with status {code}"
            _say(f"worker {pid} {why}; restarting in {delay:g} s")
            slot.restart_at = now + delay

    def _failed_to_start(self, error: str) -> None:
        if not self.start_failed:
            self.start_failed = True
            fail(PROG, f"a worker failed to start: {error}")
        self._stop()

    def _stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self.kill_at = time.monotonic() + STOP_WORKERS_WITHIN
        for slot in self.slots:
            slot.restart_at = None
            if slot.proc is not None and slot.proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.proc.pid, signal.SIGTERM)

    def _start(self, slot: _Slot) -> str:
        """Start *slot*'s worker; what went wrong, in words ("" if nothing)."""
        inherited: list[int] = []
        if self.ctx.get_start_method() == "fork":  # what the child gets and must not keep
            inherited = [self.wake_r, self.wake_w, self.ready.fileno(), self.holder.fileno()]
            inherited += [other.proc.sentinel for other in self.slots if other.proc is not None]
        proc = self.ctx.Process(
            target=_worker,
            args=(self.args, self.directory, self.host, self.port, self.ready_w, inherited),
            daemon=True,
        )
        # Forked with the signals blocked: one that comes before the worker has its own handlers
        # waits for them (the child would otherwise run the parent's). The parent's own, if one
        # came meanwhile, runs once `proc` is in its slot, so a stop reaches it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SERVE_SIGNALS)
        try:
            proc.start()
        except OSError as exc:  # no memory, no more processes
            return in_words(exc)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        slot.proc = proc
        slot.since = time.monotonic()
        slot.listening = False
        slot.error = ""
        slot.restart_at = None
        return ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _stderr() -> LineWriter:
    """This process's writer of stderr lines (the access log's too): its lines never block."""
    from .._serve._accesslog import line_writer

    return line_writer(2, PROG)


def _say(text: str) -> None:
    """``aiosendfile serve: text`` on stderr, in order with the access log, never blocking."""
    if sys.stderr is not None:  # (None: started with fd 2 closed; another file may have it now)
        _stderr().say(text)


def _drain_log() -> None:
    """What is queued for stderr gets :data:`LOG_DRAIN` seconds to be written, no more."""
    if sys.stderr is not None:
        _stderr().drain(LOG_DRAIN)


def _quiet_exit(*, worker: bool, stopping: bool = False) -> None:
    """The handlers outside a running loop (see :func:`quiet_exit_on_signals`). A worker
    ignores SIGHUP/SIGUSR1/SIGUSR2: they are for the parent, which stops or ignores them once
    for all (a hangup of the terminal reaches every process)."""
    quiet_exit_on_signals("serve", stopping=stopping)
    if worker:
        for signum in (signal.SIGHUP, *NO_OP_SIGNALS):
            signal.signal(signum, signal.SIG_IGN)


def _worker(
    args: argparse.Namespace, directory: str, host: str, port: int, ready: Any, inherited: list[int]
) -> None:
    # Started with the signals blocked and the parent's handlers (forked: its wakeup fd and
    # descriptors too): take our own, close the parent's, then let any signal that came in.
    signal.set_wakeup_fd(-1)
    _quiet_exit(worker=True)
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SERVE_SIGNALS)
    args.parent_pid = os.getppid()
    try:
        sock = listening_socket(host, port, reuse_port=True)
    except OSError as exc:
        error = in_words(exc)
    else:
        error = ""
    with contextlib.suppress(OSError):
        ready.send((os.getpid(), error))
        ready.close()
    if not error:
        _run_server(args, directory, sock, worker=True)


def _run_server(args: argparse.Namespace, directory: str, sock: socket.socket, *, worker: bool) -> None:
    # SIGUSR1/SIGUSR2 wait (blocked) until the loop's own handlers take them: uvloop listens to
    # signals from the moment it runs, so one that the early handler said it ignored would also
    # reach the loop's handler once installed, and be said twice. (A worker ignores them.)
    factory, _ = loop_factory(args.loop)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, NO_OP_SIGNALS) if not worker else None
    loop = factory()
    try:
        loop.run_until_complete(_serve(args, directory, sock, worker=worker))
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        loop.close()
        _drain_log()


async def _serve(args: argparse.Namespace, directory: str, sock: socket.socket, *, worker: bool) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # From here on a stop signal stops the server gracefully. One process alone also stops on
    # SIGHUP (saying so; unless it was ignored from the start) and says it ignores SIGUSR1/2.
    handled = list(STOP_SIGNALS)
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    if not worker:

        def hang_up() -> None:
            if not stop.is_set():
                _say(hangup_text())
            stop.set()

        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
            loop.add_signal_handler(signal.SIGHUP, hang_up)
            handled.append(signal.SIGHUP)
        for signum in NO_OP_SIGNALS:
            loop.add_signal_handler(signum, _say, ignored_text(signum))
            handled.append(signum)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, NO_OP_SIGNALS)  # (blocked by _run_server)
    try:
        await _serve_until(args, directory, sock, stop)
    finally:
        # Closing the loop would put back the default handlers (SIGTERM kills, SIGINT
        # raises KeyboardInterrupt): hand the signals back to the quiet exit instead,
        # with them blocked for the swap so that none falls in between.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SERVE_SIGNALS)
        try:
            for signum in handled:
                loop.remove_signal_handler(signum)
            _quiet_exit(worker=worker, stopping=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _settle_heap() -> None:
    """Keep the cyclic garbage collector off what starting the server built: ``gc.freeze()``.

    A full collection walks every object it tracks with the loop stopped. Started, the process
    holds about 20,000 (modules, classes, the loop, the engine): a full pass took 4 ms idle and
    9 ms under load on the cold mixed set (``benchmarks.mixed_stall``), above the 5 ms a loop may
    be held. What requests leave is freed by reference counting; objects made from now on are
    collected as before. Garbage from starting is collected first, so none is kept for good.
    """
    gc.collect()
    gc.freeze()


async def _serve_until(
    args: argparse.Namespace, directory: str, sock: socket.socket, stop: asyncio.Event
) -> None:
    from .._serve._rules import HostRule
    from .._serve._server import ServeConfig, shutdown, start_server

    config = ServeConfig(
        directory,
        show_index=args.listing,
        follow_symlinks=args.follow_symlinks,
        show_dotfiles=args.show_dotfiles,
        access_log=sys.stderr if args.access_log else None,
        auth=args.users,
        public_read=args.public_read,
        upload=args.upload,
        overwrite=args.overwrite,
        max_upload_size=args.max_upload_size,
        hosts=HostRule((args.host, *args.allow_host)),
        trusted_proxies=tuple(args.trusted_proxy),
    )
    if args.access_log:
        _stderr()  # made here, so that its dropped-lines note starts with PROG
    loop = asyncio.get_running_loop()
    parent = getattr(args, "parent_pid", None)
    if parent is not None:  # a worker: stop if the parent is gone (even SIGKILLed)

        def watch_parent() -> None:
            if os.getppid() != parent:
                stop.set()
            else:
                loop.call_later(1.0, watch_parent)

        loop.call_later(1.0, watch_parent)
    server = await start_server(config, sock=sock, ssl=tls_context(args) if args.tls_cert else None)
    _settle_heap()
    try:
        await stop.wait()
    finally:
        await shutdown(server, SHUTDOWN_TIMEOUT)
