"""The command line: ``python -m aiosendfile serve|send|recv``.

``serve [DIRECTORY]`` is a zero-copy static file server; ``send``/``recv`` are
a file transfer pair (see ``aiosendfile._pair``). The text users read is in the
parsers' descriptions and epilogs below, not here.

``serve`` (:mod:`._serve`) runs the native HTTP engine (:mod:`aiosendfile._serve`) on
uvloop when installed; ``--workers N`` runs N processes that share the port.

Stopping: SIGINT (Ctrl-C) or SIGTERM ends ``serve`` with status 0 and no
traceback (send/recv: 128 + the signal, one line), however early it lands once
our code runs. ``python -m aiosendfile`` and the ``aiosendfile`` script install a
quiet-exit handler (``_cli._common.quiet_exit_on_signals``) before this module,
asyncio, httptools or uvloop are imported, and ``main`` does again when called
directly. A running server swaps it for the loop's graceful stop and puts it back
(signals blocked meanwhile) before the loop is closed, since closing an asyncio
loop restores the default handlers. Workers are forked with the signals blocked,
so one that arrives before a worker has its own handler waits for it instead of
hitting the parent's. Only the interpreter's own start (about 10 ms) is beyond
reach: a signal then has its default effect. ``serve`` also handles SIGHUP (a
logged stop, unless ignored from the start) and SIGUSR1/SIGUSR2 (ignored, logged)
from that same early moment: see :mod:`._serve`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from .. import __version__
from ._common import Parser, quiet_exit_on_signals

__all__ = ("main",)

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


def _parser() -> argparse.ArgumentParser:
    from .._pair._cli import add_commands
    from ._serve_options import add_serve_command

    parser = Parser(
        prog="aiosendfile",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aiosendfile {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    add_serve_command(commands)
    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    _standard_descriptors()
    # Before anything else (asyncio, uvloop, even argparse): a signal from now on
    # ends the command quietly. Called in-process (tests), the caller's handlers come back.
    replaced = quiet_exit_on_signals(words[0] if words else "")
    try:
        return _main(words)
    finally:
        for signum, handler in replaced.items():
            # Done: a stop signal is moot now. The interpreter's exit would put SIG_DFL
            # back for a Python handler (killed by the signal); it leaves SIG_IGN alone.
            signal.signal(signum, handler if argv is not None else signal.SIG_IGN)


def _standard_descriptors() -> None:
    """Descriptors 0, 1 and 2 that were closed (``serve >&- 2>&-``) become ``/dev/null``'s, as a
    daemon has them: otherwise a socket or the loop's own descriptor takes the number, a stray
    write to stderr lands in it, and libuv's close asserts a descriptor above 2 (every stop on
    uvloop ended in SIGABRT). ``sys.stdout`` and ``sys.stderr`` stay None: nothing is said there."""
    for fd in (0, 1, 2):  # (in order: each open takes the lowest free number, the one closed)
        try:
            os.fstat(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.open(os.devnull, os.O_RDWR)


def _main(words: list[str]) -> int:
    args = _parser().parse_args(words)
    return int(args.run(args))
