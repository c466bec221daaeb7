"""What every command line shares: one parser behaviour, one port rule, OS errors said in words.

- :class:`Parser` reports a bad argument in one line (``aiosendfile serve: --port: ...``)
  and exits 2, instead of argparse's usage block.
- :func:`port` and :func:`address` are the only places a port is checked (0-65535;
  a destination port is 1-65535). ``getaddrinfo`` would otherwise take 99999 as
  34463 (mod 65536) and say "Servname not supported" for -1.
- :func:`quiet_exit_on_signals` makes Ctrl-C/SIGTERM end a command without a
  traceback until the command's own handling takes over (this module imports no
  asyncio, so ``python -m aiosendfile`` installs it within milliseconds of starting);
  for ``serve`` also SIGHUP (a logged stop, unless it was ignored from the start, as
  under ``nohup``) and SIGUSR1/SIGUSR2 (ignored, logged): :data:`SERVE_SIGNALS`.
- :func:`in_words` turns an ``OSError`` into something a user acts on, instead of
  ``[Errno 104] Connection reset by peer``.
- :func:`add_loop_option` and :func:`loop_factory` are the one ``--loop`` of ``serve``,
  ``send`` and ``recv`` (asyncio is imported only when a loop is made).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import asyncio

__all__ = (
    "NO_OP_SIGNALS",
    "SERVE_SIGNALS",
    "STOP_SIGNALS",
    "Parser",
    "add_loop_option",
    "address",
    "destination",
    "fail",
    "hangup_text",
    "ignored_text",
    "in_words",
    "loop_factory",
    "port",
    "quiet_exit_on_signals",
)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: What ``serve`` does not stop for: nothing to reopen (its log is stderr), nothing to upgrade.
NO_OP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
#: Every signal ``serve`` handles (SIGHUP only if it was not ignored when serve started).
SERVE_SIGNALS = (*STOP_SIGNALS, signal.SIGHUP, *NO_OP_SIGNALS)


def hangup_text() -> str:
    """What ``serve`` says when SIGHUP stops it (after ``aiosendfile serve: ``)."""
    return "SIGHUP: stopping (a hangup; serve has no configuration to reload)"


def ignored_text(signum: int) -> str:
    """What ``serve`` says when it ignores SIGUSR1/SIGUSR2 (after ``aiosendfile serve: ``)."""
    why = "no log file to reopen: its log is stderr" if signum == signal.SIGUSR1 else "no binary upgrade"
    return f"{signal.Signals(signum).name} ignored ({why})"


class Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported in one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def port(text: str) -> int:
    """A port to listen on: 0 (the system picks a free one) to 65535."""
    return _port(text, lowest=0)


def is_number(text: str) -> bool:
    """Whether *text* is a whole number in ASCII digits (``str.isdigit`` also takes ``²``, which
    ``int`` then refuses)."""
    return text.isascii() and text.isdigit()


def _port(text: str, *, lowest: int) -> int:
    value = text.strip()
    if not is_number(value) or not lowest <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from {lowest} to 65535, not {text!r}")
    return int(value)


def _split(text: str, *, lowest: int, default_host: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (for example 127.0.0.1:9000), not {text!r}")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):  # [::1]:9000
        host = host[1:-1]
    return host or default_host, _port(port_text, lowest=lowest)


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` to listen on (port 0 picks a free one; an empty host is 127.0.0.1)."""
    return _split(text, lowest=0, default_host="127.0.0.1")


def destination(text: str) -> tuple[str, int]:
    """``HOST:PORT`` to connect to (port 1-65535)."""
    return _split(text, lowest=1, default_host="127.0.0.1")


_WORDS = {
    errno.ECONNREFUSED: "nothing is listening there (connection refused)",
    errno.ECONNRESET: "the other side dropped the connection",
    errno.EPIPE: "the other side closed the connection",
    errno.ECONNABORTED: "the connection was aborted",
    errno.ETIMEDOUT: "the other side did not answer in time",
    errno.EHOSTUNREACH: "that host cannot be reached",
    errno.ENETUNREACH: "that network cannot be reached",
    errno.EADDRINUSE: "the address is already in use by another program",
    errno.EADDRNOTAVAIL: "that address is not one of this machine's",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOENT: "no such file or directory",
    errno.EISDIR: "it is a directory",
    errno.ENXIO: "no program reads that pipe (or no such device)",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
}


def in_words(exc: BaseException) -> str:
    """One short phrase for an error, in words a user acts on (no errno numbers)."""
    if isinstance(exc, OSError):
        if exc.errno in _WORDS:
            return _WORDS[exc.errno]
        if exc.strerror:
            return exc.strerror[0].lower() + exc.strerror[1:]
        if isinstance(exc, (ConnectionError, EOFError)):
            return "the connection was lost"
    text = str(exc)
    return text or type(exc).__name__


def announce(text: str) -> OSError | ValueError | None:
    """Print *text* on stdout, where nobody may read it: a closed or full stdout (``serve | true``,
    ``> /dev/full``) is no reason to stop, and no traceback (stdout goes to /dev/null from then on,
    so that the exit's flush does not fail either). Returns what the write raised, for a command
    whose output is the point (``hash-password``)."""
    try:
        print(text, flush=True)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
        return exc
    return None


def pair_stop_signals() -> tuple[int, ...]:
    """What stops ``send`` and ``recv`` mid-transfer: SIGINT, SIGTERM, and SIGHUP (a dropped ssh
    session, the pair's usual way across) unless it is ignored (``nohup``: it stays so)."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return STOP_SIGNALS
    return (*STOP_SIGNALS, signal.SIGHUP)


def fail(prog: str, message: str, status: int = 1) -> int:
    """Print ``prog: message`` on stderr and return *status* (for ``return fail(...)``)."""
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    return status


def quiet_exit_on_signals(command: str, *, stopping: bool = False) -> dict[int, Any]:
    """SIGINT/SIGTERM before a command's own handling starts (and once it ended): no traceback.

    serve exits 0 ("stopped"); send and recv exit 128 + the signal's number, as their own
    handlers do mid-transfer, saying nothing was moved yet. SIGHUP too, unless it is ignored (as
    ``nohup`` leaves it: then it stays so); serve says so (not when *stopping* already). serve
    also says it ignores SIGUSR1/SIGUSR2. Returns the handlers replaced.
    """

    def exit_quietly(signum: int, frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a reentrant flush, a closed pipe: we are leaving anyway
                stream.flush()
        if command in ("send", "recv"):
            _say(f"aiosendfile {command}: interrupted before any transfer began")
            os._exit(128 + signum)
        if signum == signal.SIGHUP and not stopping:
            _say(f"aiosendfile serve: {hangup_text()}")
        os._exit(0)

    def say_ignored(signum: int, frame: FrameType | None) -> None:
        _say(f"aiosendfile serve: {ignored_text(signum)}")

    replaced: dict[int, Any] = {signum: signal.signal(signum, exit_quietly) for signum in STOP_SIGNALS}
    if command in ("serve", "send", "recv") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        replaced[signal.SIGHUP] = signal.signal(signal.SIGHUP, exit_quietly)
    if command == "serve":
        for signum in NO_OP_SIGNALS:
            replaced[signum] = signal.signal(signum, say_ignored)
    return replaced


def _say(line: str) -> None:
    # One write, in a signal handler: no stream (its lock may be held where the signal landed).
    if sys.stderr is None:  # started with fd 2 closed: another file may have it now
        return
    with contextlib.suppress(Exception):
        os.write(2, f"{line}\n".encode())


def add_loop_option(parser: argparse.ArgumentParser) -> None:
    """``--loop auto|asyncio|uvloop``, the same for every command; :func:`loop_factory` reads it."""
    parser.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="event loop (default: auto, which is uvloop when it is installed)",
    )


def loop_factory(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """The factory and name of the ``--loop`` *choice* (``auto``: uvloop when it is installed).
    asyncio is imported here, not at the top: see :func:`quiet_exit_on_signals`."""
    import asyncio

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
