"""``aiosendfile serve``: the command line of the native HTTP engine (:mod:`aiosendfile._serve`).

Parses the options, checks the directory and the TLS files, binds the address
(errors show before anything starts), prints the banner and runs the engine in
one process or in ``--workers N`` forked processes that share the port with
``SO_REUSEPORT``. How stop signals are handled is in :mod:`aiosendfile._cli._main`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import ssl
import stat
import sys
from typing import Any

from .. import __version__
from ._common import STOP_SIGNALS, add_loop_option, fail, in_words, loop_factory, port, quiet_exit_on_signals

__all__ = ("add_serve_command", "serve_command")

SHUTDOWN_TIMEOUT = 0.5  # seconds open connections get to finish on stop
MAX_WORKERS = 1024
PROG = "aiosendfile serve"

_SERVE_DESCRIPTION = """\
Serve the files in DIRECTORY over HTTP (GET and HEAD), zero-copy with
sendfile(2). Ranges, conditional requests (ETag, Last-Modified) and
pre-compressed siblings (a.js.br, a.js.gz, chosen by Accept-Encoding) are
supported. A directory answers with its index.html, or with a listing under
--show-index, else 403.

Hidden by default: any path with a component starting with "." (/.env,
/.git/config) gets 404 and is not listed; only /.well-known/ is served.
Symlinks that lead outside DIRECTORY get 404 unless --follow-symlinks.

--tls-cert FILE (and --tls-key FILE, unless the key is in FILE) serves HTTPS
instead.

Ctrl-C or SIGTERM stops the server (exit status 0): open connections get
half a second to finish."""

_SERVE_EPILOG = """\
examples:
  aiosendfile serve                          the current directory on 127.0.0.1:8000
  aiosendfile serve ./public --show-index    list folders that have no index.html
  aiosendfile serve site --host 0.0.0.0 --port 8080 --workers 4
                                             every interface, 4 processes

exit status: 0 when stopped by Ctrl-C/SIGTERM; 2 for a bad argument (a port
outside 0-65535, --workers outside 1-1024, a DIRECTORY that is missing or
unreadable); 1 when the address cannot be listened on (in use, not this
machine's, or a port below 1024 without privileges)."""


def _workers(text: str) -> int:
    """``--workers``: a number of processes, 1 to :data:`MAX_WORKERS`."""
    value = text.strip()
    if not value.isdigit() or not 1 <= int(value) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"a number of processes from 1 to {MAX_WORKERS}, not {text!r}")
    return int(value)


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
        help="processes sharing the port with SO_REUSEPORT (default: %(default)s)",
    )
    serve.add_argument("--access-log", action="store_true", help="log every request to stderr (default: off)")
    serve.add_argument(
        "--show-index",
        action="store_true",
        help="list a directory that has no index.html (default: 403)",
    )
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
    serve.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    serve.add_argument(
        "--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM; default: in FILE)"
    )
    serve.set_defaults(run=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return fail(PROG, "needs httptools (pip install 'aiosendfile[serve]')", 2)
    directory = args.directory  # absolute, and checked readable by _directory
    _, loop_name = loop_factory(args.loop)
    if args.tls_key and not args.tls_cert:
        return fail(PROG, "--tls-key needs --tls-cert", 2)
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
        sock = _bind(args.host, args.port, reuse_port=multi, listen=not multi)
    except OSError as exc:
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {in_words(exc)}")
    host, port = sock.getsockname()[:2]
    scheme = "https" if args.tls_cert else "http"
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/"
    banner = (
        f"aiosendfile {__version__} serving {directory} at {url} "
        f"({loop_name}, {args.workers} worker{'s' if multi else ''}; Ctrl-C to stop)"
    )
    if not multi:
        print(banner, flush=True)
        _run_server(args, directory, sock)
        return 0
    with sock:
        return _run_workers(args, directory, host, port, banner)


def tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    """The server's TLS context from ``--tls-cert``/``--tls-key`` (OSError or SSLError if unusable)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


def _bind(host: str, port: int, *, reuse_port: bool, listen: bool) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


def _run_workers(args: argparse.Namespace, directory: str, host: str, port: int, banner: str) -> int:
    import multiprocessing
    import queue

    ctx: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    ready = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(args, directory, host, port, ready), daemon=True)
        for _ in range(args.workers)
    ]
    stopping = False
    start_failed = ""

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                os.kill(p.pid, signal.SIGTERM)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    for p in procs:
        if stopping:
            break
        # Forked with SIGINT/SIGTERM blocked: a stop that comes before the worker has
        # its own handler waits for it (the child would otherwise run our `stop`).
        # Here, a stop during the fork runs once `p.pid` is known, so it reaches p.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    started = [p for p in procs if p.pid is not None]
    waiting = len(started)
    while waiting and not stopping and not start_failed:  # the banner promises a working server
        try:
            error = ready.get(timeout=0.2)
        except queue.Empty:  # (a stop during the wait ends the loop: its workers exit, not fail)
            if not stopping and any(p.exitcode is not None for p in started):
                start_failed = "it exited"
            continue
        waiting -= 1
        start_failed = error
    if start_failed:
        fail(PROG, f"a worker failed to start: {start_failed}")
        stop(signal.SIGTERM, None)
    elif not stopping:
        print(banner, flush=True)
    for p in started:
        p.join()
    if start_failed:
        return 1
    failed = [p.exitcode for p in started if p.exitcode not in (0, -signal.SIGTERM, -signal.SIGINT)]
    return 0 if stopping or not failed else 1


def _worker(args: argparse.Namespace, directory: str, host: str, port: int, ready: Any) -> None:
    # Started with SIGINT/SIGTERM blocked and the parent's handlers: take our own, then
    # let any signal that came meanwhile in.
    quiet_exit_on_signals("serve")
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    args.parent_pid = os.getppid()
    try:
        sock = _bind(host, port, reuse_port=True, listen=True)
    except OSError as exc:
        ready.put(in_words(exc))
        return
    ready.put("")
    _run_server(args, directory, sock)


def _run_server(args: argparse.Namespace, directory: str, sock: socket.socket) -> None:
    factory, _ = loop_factory(args.loop)
    loop = factory()
    try:
        loop.run_until_complete(_serve(args, directory, sock))
    finally:
        loop.close()


async def _serve(args: argparse.Namespace, directory: str, sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in STOP_SIGNALS:  # from here on a signal stops the server gracefully
        loop.add_signal_handler(signum, stop.set)
    try:
        await _serve_until(args, directory, sock, stop)
    finally:
        # Closing the loop would put back the default handlers (SIGTERM kills, SIGINT
        # raises KeyboardInterrupt): hand the signals back to the quiet exit instead,
        # with them blocked for the swap so that none falls in between.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)
            quiet_exit_on_signals("serve")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


async def _serve_until(
    args: argparse.Namespace, directory: str, sock: socket.socket, stop: asyncio.Event
) -> None:
    from .._serve._server import ServeConfig, shutdown, start_server

    config = ServeConfig(
        directory,
        show_index=args.show_index,
        follow_symlinks=args.follow_symlinks,
        show_dotfiles=args.show_dotfiles,
        access_log=sys.stderr if args.access_log else None,
    )
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
    try:
        await stop.wait()
    finally:
        await shutdown(server, SHUTDOWN_TIMEOUT)
