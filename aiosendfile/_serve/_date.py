"""The per-second response tails: ``Date``, ``Server`` and ``Connection`` as ready bytes.

Formatting a ``Date`` costs ~1.7 µs, more than the whole hot answer's headroom over nginx, so
it is formatted once per second (when the engine's timer ticks into a new wall-clock second)
and every response appends one of three prebuilt tails (each with ``X-Content-Type-Options:
nosniff``: no browser guesses a type that runs script from a file's bytes): closing, HTTP/1.1
keep-alive (no ``Connection`` field, as aiohttp answers) and HTTP/1.0 keep-alive
(``Connection: keep-alive``).
The access log's ``[day/Mon/year:H:M:S +0000]`` stamp is refreshed with it.
"""

from __future__ import annotations

import time
from email.utils import formatdate

__all__ = ("CLOSE", "KEEP10", "KEEP11", "SERVER", "Clock")

#: Indexes into :attr:`Clock.tails`: how the connection goes on after a response.
CLOSE, KEEP11, KEEP10 = 0, 1, 2

SERVER = b"aiosendfile"

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

_CONNECTION = (b"Connection: close\r\n", b"", b"Connection: keep-alive\r\n")


class Clock:
    """The tails and the log stamp of the current second; :meth:`update` refreshes them."""

    __slots__ = ("extra", "log_stamp", "second", "tails")

    def __init__(self, private: bool = False) -> None:
        #: *private*: every answer needs a password, and says ``Cache-Control: private``: a shared
        #: cache in front (a proxy's) gives none of them to another client (RFC 9111 3.5 asks a
        #: cache not to, nginx's ``proxy_cache`` stores them when told to keep 200s).
        self.extra = b"Cache-Control: private\r\n" if private else b""
        self.second = -1
        self.tails: tuple[bytes, bytes, bytes] = (b"", b"", b"")
        self.log_stamp = ""
        self.update()

    def update(self, now: float | None = None) -> None:
        """Re-render if the wall-clock second has changed since the last call."""
        if now is None:
            now = time.time()
        second = int(now)
        if second == self.second:
            return
        self.second = second
        head = (
            b"Date: "
            + formatdate(second, usegmt=True).encode("ascii")
            + b"\r\nServer: "
            + SERVER
            + b"\r\nX-Content-Type-Options: nosniff\r\n"
            + self.extra
        )
        self.tails = (head + _CONNECTION[0] + b"\r\n", head + b"\r\n", head + _CONNECTION[2] + b"\r\n")
        t = time.gmtime(second)
        day = f"{t.tm_mday:02d}/{_MONTHS[t.tm_mon - 1]}/{t.tm_year}"
        self.log_stamp = f"[{day}:{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000]"
