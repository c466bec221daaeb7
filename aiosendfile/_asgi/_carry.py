"""Carry out an ASGI file body (``pathsend``, ``zerocopysend``) on a transport with ``sendfile``.

Server-neutral, so a server's glue keeps only its own HTTP bookkeeping: :func:`file_body` reads a
message into a :class:`FileBody` (the file, its ranges and the body's length, all checked before a
byte is written, so a bad message is an application error with nothing sent), and
:func:`transmit` sends it between the framing bytes the server gives (chunk size, closing chunk)
with :func:`aiosendfile.sendfile`: zero-copy on the loop's own transports, the bounded copy under
TLS.

The messages (ASGI spec, "Extensions"):

* ``http.response.pathsend``: ``path``, the whole file, the final message. Our private extension
  (``aiosendfile.pathsend``) adds keys the door's apps send: ``aiosendfile.fd`` (an open fd of
  that file, kept open by the app until ``send`` returns: ``path`` is then not opened),
  ``aiosendfile.offset``/``aiosendfile.count`` (one range), ``aiosendfile.parts`` (a list of
  ``(part header bytes, offset, count)``) and ``aiosendfile.closing`` (bytes after the last part).
* ``http.response.zerocopysend``: ``file`` (has ``fileno()``), ``offset`` (default: the file's
  current position), ``count`` (default: to the end), ``more_body``. As with ``sendfile(2)``,
  an explicit ``offset`` leaves the file position where it was; without one the send starts at
  the position and leaves it after the bytes sent, so consecutive messages continue the file.
"""

from __future__ import annotations

import errno
import io
import os
from dataclasses import dataclass
from typing import IO, Any

from .._api import sendfile
from .._errors import ConnectionLostError
from .._state import check_int
from .._static._fs import REAL_FS, NotRegular

__all__ = (
    "PATHSEND",
    "PRIVATE",
    "ZEROCOPYSEND",
    "FileBody",
    "file_body",
    "offered",
    "transmit",
)

PATHSEND = "http.response.pathsend"
ZEROCOPYSEND = "http.response.zerocopysend"
PRIVATE = "aiosendfile.pathsend"

_FD = "aiosendfile.fd"
_OFFSET = "aiosendfile.offset"
_COUNT = "aiosendfile.count"
_PARTS = "aiosendfile.parts"
_CLOSING = "aiosendfile.closing"


def offered() -> dict[str, dict[str, Any]]:
    """The extensions a server carrying out these messages lists in ``scope["extensions"]``."""
    return {PATHSEND: {}, ZEROCOPYSEND: {}, PRIVATE: {}}


@dataclass
class FileBody:
    """What one message sends: *ranges* of *file* (each after its part header), then *closing*."""

    file: IO[bytes]
    ranges: list[tuple[bytes, int, int]]
    closing: bytes
    length: int  # every body byte: part headers, file bytes, closing
    more_body: bool
    owned: bool  # we opened (or wrapped) the file: close it after
    position: int | None  # the file position to put back after (zerocopysend with an offset)

    def close(self) -> None:
        """Give the file back: close what we opened, or restore the position the app had."""
        if self.owned:
            self.file.close()
        elif self.position is not None:
            self.file.seek(self.position)


def file_body(message: Any) -> FileBody:
    """Read a ``pathsend`` or ``zerocopysend`` *message*; raise (nothing sent) if it is bad.

    A missing file raises ``OSError`` like any ``open``; a bad key a ``TypeError``/``ValueError``.
    """
    if message["type"] == PATHSEND:
        return _pathsend(message)
    return _zerocopysend(message)


def _pathsend(message: Any) -> FileBody:
    fd = message.get(_FD)
    if fd is not None:
        file: IO[bytes] = io.FileIO(_int(fd, _FD), "rb", closefd=False)
    else:
        path = message["path"]
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"pathsend 'path' must be a path, not {type(path).__name__}")
        file = io.FileIO(_open_regular(path), "rb")
    try:
        parts = message.get(_PARTS)
        if parts is not None:
            ranges = [(bytes(head), _int(at, "offset"), _int(n, "count")) for head, at, n in parts]
            closing = bytes(message.get(_CLOSING, b""))
        else:
            offset = _int(message.get(_OFFSET, 0), _OFFSET)
            count = message.get(_COUNT)
            if count is None:
                count = max(os.fstat(file.fileno()).st_size - offset, 0)
            ranges = [(b"", offset, _int(count, _COUNT))]
            closing = b""
    except BaseException:
        file.close()
        raise
    return FileBody(file, ranges, closing, _length(ranges, closing), False, True, None)


def _open_regular(path: str | bytes | os.PathLike[Any]) -> int:
    """*path* opened to be read, without waiting (a FIFO's open would wait for a writer, on the
    loop, holding every connection): a descriptor of a regular file (the static core's own open,
    ``_fs.RealFS.open_regular``), else ``OSError`` (what Starlette's ``FileResponse`` refuses too;
    a folder, ``IsADirectoryError`` as ``open`` says it), nothing left open."""
    name = os.fsdecode(path)
    try:
        return REAL_FS.open_regular(name, None, False)[0]
    except NotRegular:
        if os.path.isdir(name):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name) from None
        raise OSError(errno.EINVAL, "pathsend: not a regular file", name) from None


def _zerocopysend(message: Any) -> FileBody:
    given = message["file"]
    owned = not _is_os_file(given)
    file: IO[bytes] = io.FileIO(given.fileno(), "rb", closefd=False) if owned else given
    try:
        offset = message.get("offset")
        position = file.tell()
        start = position if offset is None else _int(offset, "offset")
        count = message.get("count")
        if count is None:
            count = max(os.fstat(file.fileno()).st_size - start, 0)
        ranges = [(b"", start, _int(count, "count"))]
    except BaseException:
        if owned:
            file.close()
        raise
    more_body = bool(message.get("more_body", False))
    kept = None if owned or offset is None else position
    return FileBody(file, ranges, b"", _length(ranges, b""), more_body, owned, kept)


def _is_os_file(file: Any) -> bool:
    if isinstance(file, io.FileIO):
        return True
    return isinstance(file, (io.BufferedReader, io.BufferedRandom)) and isinstance(file.raw, io.FileIO)


def _int(value: Any, name: str) -> int:
    """*value*, checked by the one offset/count rule (``TypeError``/``ValueError``)."""
    check_int(name, value)
    return int(value)


def _length(ranges: list[tuple[bytes, int, int]], closing: bytes) -> int:
    return sum(len(head) + count for head, _, count in ranges) + len(closing)


async def transmit(transport: Any, body: FileBody, head: bytes, tail: bytes) -> None:
    """Send *head*, the body, then *tail* on *transport*; raise as ``sendfile`` does.

    ``FileTruncatedError`` if the file ends early, a ``ConnectionError`` if the peer goes; bytes
    may have gone out then, so the caller must not reuse the connection.
    """
    ranges = body.ranges
    last = len(ranges) - 1
    before = head
    for i, (part, offset, count) in enumerate(ranges):
        if i and transport.is_closing():  # cannot happen without an error from the last range: guard
            raise ConnectionLostError("the connection closed between two ranges")
        before += part
        after = body.closing + tail if i == last else b""
        if count:
            await sendfile(transport, body.file, offset, count, headers=before, trailers=after)
        elif before or after:
            transport.write(before + after)
        before = b""
    if last < 0 and (head or body.closing or tail):
        transport.write(head + body.closing + tail)
