"""The access log: one line per response in the Combined Log Format, as nginx and Apache write it.

    127.0.0.1 - - [24/Nov/2026:08:09:07 +0000] "GET /a.txt HTTP/1.1" 200 4096 "-" "curl/8.5.0"

``%b`` is the body bytes sent (``-`` for none). Request line, ``Referer`` and ``User-Agent`` are
the client's bytes with ``"``, ``\\`` and non-printable bytes escaped as ``\\xHH`` (nginx's rule),
so a line can be neither split nor forged. Lines are batched here and reach the stream as whole
lines, up to ``PIPE_BUF`` (4 KiB) per ``write`` (atomic on a pipe shared by the workers, and one
syscall per batch even on a line-buffered ``sys.stderr``); the engine flushes each second and at
shutdown. Nothing here runs when no log is configured.
"""

from __future__ import annotations

import contextlib
import re
from typing import TextIO

__all__ = ("AccessLog",)

#: A batch of lines written at once: a write to a pipe up to PIPE_BUF is never interleaved.
_BATCH = 4096

_UNSAFE = re.compile(rb'[^\x20-\x7e]|["\\]')


def _escape(value: bytes | None) -> str:
    if not value:
        return "-"
    if _UNSAFE.search(value) is not None:
        value = _UNSAFE.sub(lambda m: b"\\x%02X" % m[0][0], value)
    return value.decode("ascii")


class AccessLog:
    """Writes Combined Log Format lines to *stream*."""

    __slots__ = ("lines", "size", "stream")

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lines: list[str] = []  # not yet written: at most _BATCH characters, or one line
        self.size = 0

    def line(
        self,
        peer: str,
        stamp: str,
        request: bytes,
        status: int,
        sent: int,
        referer: bytes | None,
        agent: bytes | None,
    ) -> None:
        text = (
            f'{peer} - - {stamp} "{_escape(request)}" {status} {sent or "-"} '
            f'"{_escape(referer)}" "{_escape(agent)}"\n'
        )
        if self.size + len(text) > _BATCH and self.lines:
            self._write()
        self.lines.append(text)
        self.size += len(text)

    def _write(self) -> None:
        text = "".join(self.lines)
        self.lines.clear()
        self.size = 0
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: serving goes on
            self.stream.write(text)
            self.stream.flush()

    def flush(self) -> None:
        if self.lines:
            self._write()
