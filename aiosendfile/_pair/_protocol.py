"""The rules of the ``send``/``recv`` protocol, IO-free: its limits, its messages and their checks.

``python -m aiosendfile send`` / ``recv`` is a zero-copy file transfer pair with end-to-end checks.

The protocol is line-delimited JSON (each line at most 64 KiB) around one raw body:

1. sender → ``{"name", "size", "sha256"}``. ``name`` is informational (the
   receiver writes to its OUT, never to ``name``); ``size`` an int 0..2**63-1;
   ``sha256`` 64 hex digits.
2. receiver → ``{"offset", "prefix_sha256"}``. ``offset`` is the size of OUT
   with ``--resume`` when that is no more than ``size``, else 0; ``prefix_sha256``
   hashes all of OUT (it is ``""`` when ``offset`` is 0). An optional
   ``"notice"`` says why the receiver starts over (the sender prints it).
3. sender → ``{"start"}``: ``offset`` if the sender's first ``offset`` bytes hash
   the same, else 0 (the partial file is not ours: start over). Any other
   value is refused.
4. sender → ``size - start`` raw bytes (``sendfile``); the receiver writes them
   at ``start`` (``recvfile``).
5. receiver → ``{"ok", "sha256"}`` after hashing the whole file.

Errors: in place of any of its lines, the receiver may send ``{"error": "..."}``
(busy with another transfer, a start it did not offer, a malformed message, a
write that failed, ...) and close; the sender prints the text. A sender that
predates this line sees a closed connection instead, as before.

Trust: the receiver takes one file from the first peer that completes a valid
handshake. Anything else that connects (a port scanner, an HTTP client, a
garbage or silent peer) is logged in one line and dropped, and the receiver
keeps waiting; a handshake must complete within ``--handshake-timeout``. While a
transfer runs, other connections are refused. OUT is opened only once a sender
has announced a valid file and chosen an offered start; with ``--resume`` the
only hash a peer can obtain is that of the whole of OUT. There is no
authentication: anyone who can connect can send the file, so listen on
127.0.0.1 (the default) or a network you trust.

A mismatch, an early close, a failed write or a signal (Ctrl-C, SIGTERM: exit
130/143) leaves OUT holding exactly the bytes received, flushed, and says so;
``recv --resume`` continues it. Nothing is silently corrupt.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeGuard

__all__ = (
    "BUSY",
    "FAREWELL_TIMEOUT",
    "HANDSHAKE_TIMEOUT",
    "IDLE_TIMEOUT",
    "HASH_RATE",
    "LINE_LIMIT",
    "MAX_SIZE",
    "BadPeer",
    "Refused",
    "TransferFailed",
    "check_announcement",
    "clip",
    "encode",
    "is_int",
    "json_object",
    "printable",
    "short",
)

LINE_LIMIT = 64 * 1024
HASH_RATE = 50e6  # bytes/s: the time a side gets to hash a file (the prefix offered, OUT read back)
MAX_SIZE = 2**63 - 1
FAREWELL_TIMEOUT = 1.0  # seconds a refused peer gets to read our error before we close
HANDSHAKE_TIMEOUT = 10.0  # seconds a peer has for each handshake line (and send, to connect)
#: seconds a body may make no progress before its transfer ends (nginx: client_body_timeout)
IDLE_TIMEOUT = 60.0
BUSY = "busy: another transfer is in progress; try again when it is done"
_SHA256 = re.compile(r"[0-9a-fA-F]{64}\Z")


class TransferFailed(Exception):
    """A transfer that did not complete; the message says why and what is left behind."""


class BadPeer(Exception):
    """A peer that does not speak the protocol (or breaks it): logged in one line and dropped."""


class Refused(BadPeer):
    """A well-formed request we cannot take (no room for the file): said, logged, dropped."""


def encode(message: dict[str, Any]) -> bytes:
    """One protocol line."""
    return json.dumps(message).encode() + b"\n"


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def json_object(line: bytes) -> dict[str, Any] | None:
    """A protocol line as a JSON object; None for anything else. (``json`` raises
    RecursionError, not ValueError, on deep nesting such as 5000 "[" in one line.)"""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: Any, limit: int = 300) -> str:
    """What the receiver said, safe for a terminal: control characters (escape sequences that
    could rewrite the screen) shown escaped, and no longer than *limit*."""
    return clip("".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text)), limit)


def check_announcement(message: Any) -> tuple[int, str]:
    """The announced (size, sha256), or BadPeer saying what is wrong."""
    if not isinstance(message, dict):
        raise BadPeer("its handshake is not a JSON object")
    size, digest, name = message.get("size"), message.get("sha256"), message.get("name", "")
    if not is_int(size) or not 0 <= size <= MAX_SIZE:
        raise BadPeer(f"announced an invalid size {short(size)}")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise BadPeer(f"announced an invalid sha256 {short(digest)}")
    if not isinstance(name, str) or len(name) > 255 or any(c in name for c in "/\\\0") or name in (".", ".."):
        raise BadPeer(f"announced an invalid name {short(name)}")
    return size, digest.lower()


def short(value: Any, limit: int = 60) -> str:
    return clip(repr(value), limit)
