"""The command line: ``python -m aiosendfile serve|send|recv``.

``serve [DIRECTORY]`` is a zero-copy static file server; ``send``/``recv`` are
a file transfer pair (see ``aiosendfile._pair``). The text users read is in the
parsers' descriptions and epilogs below, not here.

serve runs the aiohttp plugin's ``StaticResource`` on uvloop when installed.
``--workers N`` runs N processes that share the port with ``SO_REUSEPORT``.

Stopping: SIGINT (Ctrl-C) or SIGTERM ends ``serve`` with status 0 and no
traceback (send/recv: 128 + the signal, one line), however early it lands once
our code runs. ``python -m aiosendfile`` and the ``aiosendfile`` script install a
quiet-exit handler (``_cli._common.quiet_exit_on_signals``) before this module,
asyncio, aiohttp or uvloop are imported, and ``main`` does again when called
directly. A running server swaps it for the loop's graceful stop and puts it back
(signals blocked meanwhile) before the loop is closed, since closing an asyncio
loop restores the default handlers. Workers are forked with the signals blocked,
so one that arrives before a worker has its own handler waits for it instead of
hitting the parent's. Only the interpreter's own start (about 10 ms) is beyond
reach: a signal then has its default effect.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ._common import (
    STOP_SIGNALS,
    Parser,
    add_loop_option,
    fail,
    in_words,
    loop_factory,
    port,
    quiet_exit_on_signals,
)

__all__ = ("main",)

SHUTDOWN_TIMEOUT = 0.5  # seconds open connections get to finish on stop
MAX_WORKERS = 1024
PROG = "aiosendfile serve"

_DESCRIPTION = """\
Zero-copy file transfer for asyncio: an HTTP static file server (serve) and a
checksummed one-file transfer pair (send, recv). Files go from the page cache
to the socket with sendfile(2), on stock asyncio or uvloop."""

_EPILOG = """\
examples:
  aiosendfile serve ./public --port 8080              serve a folder over HTTP
  aiosendfile recv big.iso --listen 0.0.0.0:9000      wait for one file from any machine...
  aiosendfile send big.iso receiver.example:9000      ...and send it from another one

'aiosendfile COMMAND --help' describes each command."""

_SERVE_DESCRIPTION = """\
Serve the files in DIRECTORY over HTTP (GET and HEAD), zero-copy with
sendfile(2). Ranges, conditional requests (ETag, Last-Modified) and
pre-compressed siblings (a.js.br, a.js.gz, chosen by Accept-Encoding) are
supported. A directory answers with its index.html, or with a listing under
--show-index, else 403.

Hidden by default: any path with a component starting with "." (/.env,
/.git/config) gets 404 and is not listed; only /.well-known/ is served.
Symlinks that lead outside DIRECTORY get 404 unless --follow-symlinks.

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


def _parser() -> argparse.ArgumentParser:
    from .._pair._cli import add_commands

    parser = Parser(
        prog="aiosendfile",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aiosendfile {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
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
    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # Before anything else (aiohttp, uvloop, even argparse): a signal from now on
    # ends the command quietly. Called in-process (tests), the caller's handlers come back.
    replaced = quiet_exit_on_signals(words[0] if words else "")
    try:
        return _main(words)
    finally:
        for signum, handler in replaced.items():
            # Done: a stop signal is moot now. The interpreter's exit would put SIG_DFL
            # back for a Python handler (killed by the signal); it leaves SIG_IGN alone.
            signal.signal(signum, handler if argv is not None else signal.SIG_IGN)


def _main(words: list[str]) -> int:
    args = _parser().parse_args(words)
    if args.command == "serve":
        return _serve_command(args)
    return int(args.run(args))


# -- serve ---------------------------------------------------------------------------------


def _one_line_errors(record: logging.LogRecord) -> bool:
    """Clients control what reaches the error log: one line per bad request, never a traceback."""
    if record.exc_info and record.exc_info[1] is not None:
        record.msg = f"{record.getMessage()}: {record.exc_info[1]!r}"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
    return True


def _serve_command(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return fail(PROG, "needs aiohttp (pip install 'aiosendfile[aiohttp]')", 2)
    directory = args.directory  # absolute, and checked readable by _directory
    _, loop_name = loop_factory(args.loop)
    logging.basicConfig(
        level=logging.INFO if args.access_log else logging.WARNING, format="%(message)s", stream=sys.stderr
    )
    logging.getLogger("aiohttp.server").addFilter(_one_line_errors)

    multi = args.workers > 1
    # Bind here first: errors (port in use) show before any worker starts, and with
    # port 0 this picks the port every worker then shares. With workers, this socket
    # only holds the port: it never listens, so the kernel gives it no connections.
    try:
        sock = _bind(args.host, args.port, reuse_port=multi, listen=not multi)
    except OSError as exc:
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {in_words(exc)}")
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
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
    from aiohttp import web
    from aiohttp.log import access_logger

    from .._aiohttp._static import StaticResource

    # aiohttp's low-level server: no router, middlewares or signals to run per
    # request, just the static resource (see StaticResource.handle).
    resource = StaticResource(
        "",
        directory,
        show_index=args.show_index,
        follow_symlinks=args.follow_symlinks,
        show_dotfiles=args.show_dotfiles,
    )
    server = web.Server(resource.handle, access_log=access_logger if args.access_log else None)
    runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    loop = asyncio.get_running_loop()
    parent = getattr(args, "parent_pid", None)
    if parent is not None:  # a worker: stop if the parent is gone (even SIGKILLed)

        def watch_parent() -> None:
            if os.getppid() != parent:
                stop.set()
            else:
                loop.call_later(1.0, watch_parent)

        loop.call_later(1.0, watch_parent)
    try:
        site = web.SockSite(runner, sock)
        await site.start()
        await stop.wait()
    finally:
        await runner.cleanup()
