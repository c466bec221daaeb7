"""The command line: ``python -m aiosendfile serve|send|recv``.

``serve [DIRECTORY]`` is a zero-copy static file server; ``send``/``recv`` are
a file transfer pair (see ``_transfer_cli``).

It serves DIRECTORY (default: the current one) with the aiohttp plugin, on
uvloop when it is installed. ``--workers N`` runs N processes that share the
port with ``SO_REUSEPORT``, so the kernel spreads connections over them.
SIGINT (Ctrl-C) or SIGTERM stops it cleanly within a second, with exit
status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from ._cli_common import Parser, port

__all__ = ("main",)

SHUTDOWN_TIMEOUT = 0.5  # seconds open connections get to finish on stop


def _parser() -> argparse.ArgumentParser:
    from ._transfer_cli import add_commands

    parser = Parser(prog="aiosendfile", description="Zero-copy file serving for asyncio.")
    parser.add_argument("--version", action="version", version=f"aiosendfile {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    serve = commands.add_parser("serve", help="serve a directory over HTTP", description=__doc__)
    serve.add_argument("directory", nargs="?", default=".", help="directory to serve (default: .)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=port, default=8000, help="port (default: 8000; 0 picks a free one)")
    serve.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto", help="event loop")
    serve.add_argument("--workers", type=int, default=1, help="processes sharing the port (default: 1)")
    serve.add_argument("--access-log", action="store_true", help="log every request to stderr")
    serve.add_argument("--show-index", action="store_true", help="list directories without index.html")
    serve.add_argument("--follow-symlinks", action="store_true", help="serve symlinks that point outside")
    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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


def _loop_factory(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit(
                    "aiosendfile: --loop uvloop needs uvloop (pip install 'aiosendfile[uvloop]')"
                ) from None
        else:
            return uvloop.new_event_loop, "uvloop"
    return asyncio.new_event_loop, "asyncio"


def _serve_command(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("aiosendfile: serve needs aiohttp (pip install 'aiosendfile[aiohttp]')", file=sys.stderr)
        return 2
    directory = os.path.abspath(args.directory)
    if not os.path.isdir(directory):
        print(f"aiosendfile: {args.directory}: not a directory", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("aiosendfile: --workers must be at least 1", file=sys.stderr)
        return 2
    _, loop_name = _loop_factory(args.loop)
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
        print(f"aiosendfile: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
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
    ctx: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    ready = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(args, directory, host, port, ready), daemon=True)
        for _ in range(args.workers)
    ]
    stopping = start_failed = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for p in procs:
        p.start()
    for _ in procs:  # the banner promises a working server: wait until every worker listens
        error = ready.get(timeout=60)
        if error:
            print(f"aiosendfile: a worker failed to start: {error}", file=sys.stderr)
            start_failed = True
            stop(signal.SIGTERM, None)
            break
    else:
        print(banner, flush=True)
    for p in procs:
        p.join()
    failed = [p.exitcode for p in procs if p.exitcode not in (0, -signal.SIGTERM, -signal.SIGINT)]
    if start_failed:
        return 1
    return 0 if stopping or not failed else 1


def _worker(args: argparse.Namespace, directory: str, host: str, port: int, ready: Any) -> None:
    # Forked with the parent's Python handlers: until our loop installs its own,
    # SIGINT/SIGTERM must simply end this process.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    args.parent_pid = os.getppid()
    try:
        sock = _bind(host, port, reuse_port=True, listen=True)
    except OSError as exc:
        ready.put(str(exc))
        return
    ready.put("")
    _run_server(args, directory, sock)


def _run_server(args: argparse.Namespace, directory: str, sock: socket.socket) -> None:
    factory, _ = _loop_factory(args.loop)
    loop = factory()
    try:
        loop.run_until_complete(_serve(args, directory, sock))
    finally:
        loop.close()


async def _serve(args: argparse.Namespace, directory: str, sock: socket.socket) -> None:
    from aiohttp import web
    from aiohttp.log import access_logger

    from ._static import StaticResource

    # aiohttp's low-level server: no router, middlewares or signals to run per
    # request, just the static resource (see StaticResource.handle).
    resource = StaticResource("", directory, show_index=args.show_index, follow_symlinks=args.follow_symlinks)
    server = web.Server(resource.handle, access_log=access_logger if args.access_log else None)
    runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
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
