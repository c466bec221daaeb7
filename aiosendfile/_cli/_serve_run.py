"""One ``aiosendfile serve`` process (alone, or one of ``--workers``): the engine on its own loop
until a stop signal, and its lines on stderr.

Signals, decided for a server whose log is stderr and whose configuration is its command line
(nginx reloads on SIGHUP, reopens its logs on SIGUSR1, upgrades on SIGUSR2):

- SIGINT, SIGTERM: a graceful stop (connections get :data:`SHUTDOWN_TIMEOUT`), exit 0, silent.
- SIGHUP: the same stop, with one line saying so; there is nothing to reload, and a hangup
  means whoever ran serve is gone. If SIGHUP was ignored when serve started (``nohup``),
  it stays ignored.
- SIGUSR1, SIGUSR2: ignored, one line each: nothing to reopen, nothing to upgrade.
- With ``--workers``, these are the parent's (:mod:`._supervisor`): workers stop on
  SIGINT/SIGTERM (the parent's, or a Ctrl-C to the process group) and ignore the rest, so a
  hangup or a stray SIGUSR1 to the group is acted on, and said, once.

Lines on stderr (the access log, these) go through the log's writer
(:mod:`aiosendfile._serve._accesslog`): they never block serving nor a stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._serve._listener import listening_socket
from ._common import (
    NO_OP_SIGNALS,
    SERVE_SIGNALS,
    STOP_SIGNALS,
    hangup_text,
    ignored_text,
    in_words,
    loop_factory,
    quiet_exit_on_signals,
)

if TYPE_CHECKING:
    from .._serve._accesslog import LineWriter

__all__ = (
    "LOG_DRAIN",
    "PROG",
    "SHUTDOWN_TIMEOUT",
    "drain_log",
    "quiet_exit",
    "run_server",
    "say",
    "signal_name",
    "stderr_lines",
    "tls_context",
    "tls_refusal",
    "worker",
)

PROG = "aiosendfile serve"
SHUTDOWN_TIMEOUT = 0.5  # seconds open connections get to finish on stop
LOG_DRAIN = 1.0  # seconds the log lines still queued at the end get to reach stderr


def tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    """The server's TLS context from ``--tls-cert``/``--tls-key`` (OSError or SSLError if unusable).
    A client's end of stream with no ``close_notify`` after a whole request (a half-close) is an
    end of stream, as nginx has it, not a fatal error that drops the answers still owed: HTTP
    frames what it reads. ALPN names ``http/1.1``, the one protocol served (as nginx).

    Loaded once a process (the command checks it before anything starts): ``--workers`` forked
    after share it, as nginx's workers share their master's. A worker restarted later reads no
    file, which may be gone or replaced by then, and every worker has the same session ticket
    keys, so a client resumes its session on whichever worker it reaches."""
    key = (args.tls_cert, args.tls_key)
    context = _LOADED.get(key)
    if context is None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)  # (OpenSSL 3)
        context.load_cert_chain(args.tls_cert, args.tls_key, password=_no_passphrase)
        context.set_alpn_protocols(["http/1.1"])
        _LOADED[key] = context
    return context


_LOADED: dict[tuple[str, str | None], ssl.SSLContext] = {}


def tls_refusal(exc: OSError, cert: str, key: str | None) -> str:
    """Why ``--tls-cert``/``--tls-key`` cannot be used (*exc*: OpenSSL's refusal, or a file that
    could not be read), in words naming the file: the command's check's and a worker's line."""
    if isinstance(exc, ssl.SSLError):
        trouble = _tls_trouble(cert, key, exc)
    else:
        trouble = _tls_file_trouble(exc, cert, key)
    return f"cannot use --tls-cert/--tls-key: {trouble}"


def _tls_trouble(cert: str, key: str | None, exc: ssl.SSLError) -> str:
    """What is wrong with a ``--tls-cert``/``--tls-key`` pair OpenSSL refused, in words naming the
    file (OpenSSL says ``[SSL] PEM lib`` for a file with no certificate, a missing key and a file
    that is no key alike): told from the PEM markers in each file's first MiB."""
    if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
        return f"the key in {key or cert} does not belong to the certificate in {cert}"
    if b"CERTIFICATE-----" not in _pem_start(cert):
        return f"{cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    if b"PRIVATE KEY-----" not in _pem_start(key or cert):
        if key is None:
            return f"{cert} holds no private key: give it with --tls-key"
        return f"{key} holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
    return in_words(exc)


def _tls_file_trouble(exc: OSError, cert: str, key: str | None) -> str:
    """A ``--tls-cert``/``--tls-key`` file that could not be read, in words naming it (OpenSSL's
    error names none): the first of them that does not open as a file."""
    for path in (cert, key):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as failed:
            return f"{path}: {in_words(failed)}"
    return in_words(exc)


def _pem_start(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(1 << 20)
    except OSError:
        return b""


def _no_passphrase() -> bytes:
    """Called by OpenSSL for an encrypted key only: refused in words, never asked (OpenSSL would
    ask the terminal in every process, a worker restarted unattended included)."""
    raise ssl.SSLError(0, "the key is encrypted with a passphrase: give serve a key file without one")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stderr_lines() -> LineWriter:
    """This process's writer of stderr lines (the access log's too): its lines never block."""
    from .._serve._accesslog import line_writer

    return line_writer(2, PROG)


def say(text: str) -> None:
    """``aiosendfile serve: text`` on stderr, in order with the access log, never blocking."""
    if sys.stderr is not None:  # (None: started with fd 2 closed; another file may have it now)
        stderr_lines().say(text)


def drain_log() -> None:
    """What is queued for stderr gets :data:`LOG_DRAIN` seconds to be written, no more."""
    if sys.stderr is not None:
        stderr_lines().drain(LOG_DRAIN)


def quiet_exit(*, worker: bool, stopping: bool = False) -> None:
    """The handlers outside a running loop (see :func:`quiet_exit_on_signals`). A worker
    ignores SIGHUP/SIGUSR1/SIGUSR2: they are for the parent, which stops or ignores them once
    for all (a hangup of the terminal reaches every process)."""
    quiet_exit_on_signals("serve", stopping=stopping)
    if worker:
        for signum in (signal.SIGHUP, *NO_OP_SIGNALS):
            signal.signal(signum, signal.SIG_IGN)


def worker(
    args: argparse.Namespace, directory: str, host: str, port: int, ready: Any, inherited: list[int]
) -> None:
    # Started with the signals blocked and the parent's handlers (forked: its wakeup fd and
    # descriptors too): take our own, close the parent's, then let any signal that came in.
    signal.set_wakeup_fd(-1)
    quiet_exit(worker=True)
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SERVE_SIGNALS)
    args.parent_pid = os.getppid()
    error = ""
    try:
        if args.tls_cert:  # (forked: the parent's, loaded; spawned: read here, said in words)
            tls_context(args)
    except OSError as exc:  # (ssl.SSLError is one)
        error = tls_refusal(exc, args.tls_cert, args.tls_key)
    if not error:
        try:
            sock = listening_socket(host, port, reuse_port=True)
        except OSError as exc:
            error = in_words(exc)

    def tell(error: str) -> None:  # (once: serving, or why not)
        with contextlib.suppress(OSError):
            ready.send((os.getpid(), error))
            ready.close()

    if error:
        tell(error)
        return
    if run_server(args, directory, sock, worker=True, ready=tell):
        sys.exit(1)


def run_server(
    args: argparse.Namespace,
    directory: str,
    sock: socket.socket,
    *,
    worker: bool,
    ready: Callable[[str], None],
) -> int:
    """Serve until stopped; 1 if the server could not start (*ready* is told why), else 0.
    *ready* is called once: with "" as the server serves (its banner promises a working one),
    or with what kept it from starting (out of descriptors, say), said in words."""
    # SIGUSR1/SIGUSR2 wait (blocked) until the loop's own handlers take them: uvloop listens to
    # signals from the moment it runs, so one that the early handler said it ignored would also
    # reach the loop's handler once installed, and be said twice. (A worker ignores them.)
    factory, _ = loop_factory(args.loop)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, NO_OP_SIGNALS) if not worker else None
    started = False

    def serving() -> None:
        nonlocal started
        started = True
        ready("")

    loop = None
    main = _serve(args, directory, sock, worker=worker, serving=serving)
    try:
        loop = factory()
        loop.run_until_complete(main)
    except OSError as exc:
        if started:
            raise
        main.close()  # (a loop that failed to set itself up never began it)
        ready(in_words(exc))
        return 1
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if loop is not None:
            # (a loop that failed to set itself up, uvloop's signals' socket out of descriptors,
            # says it is still running: it is dropped, not closed)
            with contextlib.suppress(RuntimeError):
                loop.close()
        drain_log()
    return 0


async def _serve(
    args: argparse.Namespace,
    directory: str,
    sock: socket.socket,
    *,
    worker: bool,
    serving: Callable[[], None],
) -> None:
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
                say(hangup_text())
            stop.set()

        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
            loop.add_signal_handler(signal.SIGHUP, hang_up)
            handled.append(signal.SIGHUP)
        for signum in NO_OP_SIGNALS:
            loop.add_signal_handler(signum, say, ignored_text(signum))
            handled.append(signum)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, NO_OP_SIGNALS)  # (blocked by run_server)
    try:
        await _serve_until(args, directory, sock, stop, serving)
    finally:
        # Closing the loop would put back the default handlers (SIGTERM kills, SIGINT
        # raises KeyboardInterrupt): hand the signals back to the quiet exit instead,
        # with them blocked for the swap so that none falls in between.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SERVE_SIGNALS)
        try:
            for signum in handled:
                loop.remove_signal_handler(signum)
            quiet_exit(worker=worker, stopping=True)
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
    args: argparse.Namespace,
    directory: str,
    sock: socket.socket,
    stop: asyncio.Event,
    serving: Callable[[], None],
) -> None:
    from .._serve._rules import HostRule
    from .._serve._server import ServeConfig, shutdown, start_server

    config = ServeConfig(
        directory,
        show_index=args.listing,
        follow_symlinks=args.follow_symlinks,
        show_dotfiles=args.show_dotfiles,
        access_log=sys.stderr if args.access_log else None,
        access_log_format=args.access_log_format,
        auth=args.users,
        public_read=args.public_read,
        upload=args.upload,
        overwrite=args.overwrite,
        max_upload_size=args.max_upload_size,
        resumable=args.resumable,
        upload_expiry=args.upload_expiry or 86400.0,
        max_partial_uploads=args.max_partial_uploads or 16,
        max_partial_size=64 << 30 if args.max_partial_size is None else args.max_partial_size,
        hosts=HostRule((args.host, *args.allow_host)),
        trusted_proxies=tuple(args.trusted_proxy),
        archives=args.archives,
        path_prefix=args.path_prefix,
        max_archive_entries=args.max_archive_entries,
        max_archive_size=args.max_archive_size,
    )
    if args.access_log:
        stderr_lines()  # made here, so that its dropped-lines note starts with PROG
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
    serving()
    _settle_heap()
    try:
        await stop.wait()
    finally:
        await shutdown(server, SHUTDOWN_TIMEOUT)
