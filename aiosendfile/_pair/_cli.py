"""``python -m aiosendfile send`` / ``recv``: their command lines. The protocol is in
:mod:`._protocol`, each end in :mod:`._send` / :mod:`._recv`."""

from __future__ import annotations

import argparse
from typing import Any

from .._cli._common import add_loop_option, address, destination
from ._protocol import HANDSHAKE_TIMEOUT, IDLE_TIMEOUT
from ._recv import recv_main
from ._send import send_main

__all__ = ("add_commands",)


_SEND_HELP = """\
Send FILE to a waiting 'aiosendfile recv' at HOST:PORT, zero-copy (sendfile).

The receiver checks the SHA-256 of what it wrote and reports back; send exits
0 only when it matches. If the receiver already holds the start of FILE (it
runs with --resume after an interrupted transfer), only the rest is sent.
"""
_SEND_EPILOG = """\
examples:
  aiosendfile send big.iso 192.0.2.7:9000     to 'aiosendfile recv big.iso --listen 0.0.0.0:9000'
  aiosendfile send big.iso :9000              to a receiver on this machine (127.0.0.1)

exit status: 0 sent and verified; 1 failed (the message says why); 2 bad
arguments; 130/143 interrupted by Ctrl-C/SIGTERM (the receiver keeps what
arrived: run 'recv --resume' and send again to finish).
"""
_RECV_HELP = """\
Wait for one file from 'aiosendfile send', write it to OUT zero-copy (splice),
check its SHA-256, then exit.

Only a sender that completes the handshake is served. Anything else that
connects (a port scanner, an HTTP request, a peer that says nothing) is logged
in one line and dropped, and recv keeps waiting. While a transfer runs, other
connections are refused. There is no authentication: anyone who can connect
can send the file, so listen on 127.0.0.1 (the default) or a trusted network.
"""
_RECV_EPILOG = """\
examples:
  aiosendfile recv big.iso --listen 0.0.0.0:9000      accept from other machines
  aiosendfile recv big.iso --resume                   continue an interrupted transfer
  aiosendfile recv big.iso --force                    overwrite an existing big.iso

exit status: 0 received and verified; 1 failed (OUT keeps the bytes received,
and the message says how many); 2 bad arguments or unusable OUT; 130/143
interrupted by Ctrl-C/SIGTERM (OUT keeps the bytes received: --resume continues).
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"a number of seconds greater than 0, not {text!r}")
    return value


def add_commands(commands: Any) -> None:
    """Add ``send`` and ``recv`` to the ``aiosendfile`` command line (*commands*: its subparsers)."""
    raw = argparse.RawDescriptionHelpFormatter
    send = commands.add_parser(
        "send",
        help="send a file to 'aiosendfile recv' (zero-copy, checksummed)",
        description=_SEND_HELP,
        epilog=_SEND_EPILOG,
        formatter_class=raw,
    )
    send.add_argument("file", metavar="FILE", help="the file to send (a regular file)")
    send.add_argument(
        "address",
        metavar="HOST:PORT",
        type=destination,
        help="where 'aiosendfile recv' listens, e.g. 192.0.2.7:9000 (no host: 127.0.0.1)",
    )
    send.add_argument(
        "--handshake-timeout",
        type=_seconds,
        default=HANDSHAKE_TIMEOUT,
        metavar="SECONDS",
        help=f"give up on a receiver that takes longer than this to connect or to answer "
        f"(default: {HANDSHAKE_TIMEOUT:g})",
    )
    send.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=IDLE_TIMEOUT,
        metavar="SECONDS",
        help="give up on a receiver that takes nothing for this long mid-transfer; it keeps what "
        f"arrived (default: {IDLE_TIMEOUT:g}; its verdict may take this long and a read back of "
        "the file at 50 MB/s)",
    )
    add_loop_option(send)
    send.set_defaults(run=send_main)

    recv = commands.add_parser(
        "recv",
        help="receive one file from 'aiosendfile send' (zero-copy)",
        description=_RECV_HELP,
        epilog=_RECV_EPILOG,
        formatter_class=raw,
    )
    recv.add_argument(
        "out",
        metavar="OUT",
        help="the file to write; its directory must exist. An existing OUT is refused "
        "unless --force or --resume is given",
    )
    recv.add_argument(
        "--listen",
        default=("127.0.0.1", 9000),
        type=address,
        metavar="HOST:PORT",
        help="where to listen (default: 127.0.0.1:9000, this machine only; 0.0.0.0:9000 "
        "accepts from any machine; port 0 picks a free one)",
    )
    existing = recv.add_mutually_exclusive_group()
    existing.add_argument(
        "--resume",
        action="store_true",
        help="keep an existing OUT and fetch only the rest, if it is the start of the file being "
        "sent (else start over, and say so)",
    )
    existing.add_argument("--force", action="store_true", help="overwrite an existing OUT")
    recv.add_argument(
        "--handshake-timeout",
        type=_seconds,
        default=HANDSHAKE_TIMEOUT,
        metavar="SECONDS",
        help=f"drop a peer that takes longer than this to send a handshake line "
        f"(default: {HANDSHAKE_TIMEOUT:g})",
    )
    recv.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=IDLE_TIMEOUT,
        metavar="SECONDS",
        help="end a transfer whose data stops coming for this long; OUT keeps what arrived "
        f"(default: {IDLE_TIMEOUT:g})",
    )
    add_loop_option(recv)
    recv.set_defaults(run=recv_main)
