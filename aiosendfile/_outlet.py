"""A connection owner's own way to its socket: ``sendfile`` below ``_api``, for doors that own theirs.

The public :func:`aiosendfile.sendfile` is built for callers who do not own their transport: it
checks its arguments, ``fstat``s the file, resolves the target, leases the transport (swapping
its protocol, polling a ``dup()`` of its fd) and reports progress through a callback, on every
call. A door that owns its connections (``serve``'s protocol: it gets ``pause_writing`` and
``connection_lost``) needs none of that per response:

* **Resolved once per connection.** :class:`Outlet` is made at a connection's first file body:
  the transport is checked once (``_target.resolve_target``: a plain TCP or Unix transport of a
  known class; TLS and unknown transports keep the public path), and one ``dup()`` of its socket
  is made and kept until ``connection_lost``. Every send and every wait for writability goes to
  that duplicate: it is ours, so a closed transport can never have its fd number reused under a
  send, and the loop lets us poll it (both loops refuse ``add_writer`` on a transport's own fd).
* **Order.** A body starts only when the transport's buffer is empty (everything answered before
  it has reached the socket) and nothing else writes until it ends (the protocol is ``busy``), so
  the head and the file follow what went before and precede what comes after.

The bodies sent on an outlet (the first send of a small file, a transfer, a cold whole file sent by
the page reader's thread) are in :mod:`._bodies`; this module holds the outlet, the send path's
sizes, and whether a door may probe a file as it opens it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from . import _platform, _reading_in
from ._options import DEFAULT_OPTIONS
from ._target import resolve_target

__all__ = (
    "COLD_WAITS",
    "FIRST_WAIT",
    "MAX_CHUNK",
    "PROBED_COLD",
    "PROBE_MAX",
    "READ_AHEAD_MAX",
    "READ_MAX",
    "Outlet",
    "probe_max",
)

#: Bytes one ``sendfile`` call may move before the transfer gives way to other connections
#: (nginx's ``sendfile_max_chunk`` default).
MAX_CHUNK = 2 * 1024 * 1024

#: A cold chunk up to this size is read in off the loop (the page reader, else the kernel's read
#: ahead and a timer) and then sent on it, not from a pool thread (the 2 MiB chunk of a large file
#: goes to the pool: its read is long).
READ_AHEAD_MAX = 256 * 1024
#: A chunk up to this size is read with one ``RWF_NOWAIT`` read, which is also its probe, and sent
#: from memory: below it, the copy costs less than a probe and a ``sendfile`` (docs/performance.md,
#: "Reading small files").
READ_MAX = 16 * 1024
#: A file up to this size that a door opens again is probed as it is opened (``_platform.
#: reopen_read``: ``cachestat`` and its last page, as ``_writer.is_cold`` checks a chunk), so that
#: ``_bodies.send_first`` sends it with no probe of its own.
PROBE_MAX = MAX_CHUNK
PROBED_COLD = _platform.PROBED_COLD
#: Waits for a cold chunk's pages before it goes to the pool (the page reader's reads; or timers,
#: 1 ms, then 2 ms, each under load also at least a turn of the loop).
COLD_WAITS = 2
FIRST_WAIT = 0.001

_MSG_MORE = getattr(socket, "MSG_MORE", 0) if _platform.HAS_MSG_MORE else 0
_TCP = (socket.AF_INET, socket.AF_INET6)


class Outlet:
    """One connection's own way to its socket: a duplicate of the transport's fd (see above)."""

    __slots__ = ("closed", "fd", "flags", "in_pool", "loop", "sock")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, flags: int) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.flags = flags  # MSG_MORE for a TCP head, else 0
        self.in_pool = False  # a pool thread is sending on fd: close only once it is done
        self.closed = False

    @classmethod
    def of(cls, transport: Any, loop: asyncio.AbstractEventLoop) -> Outlet | None:
        """The transport's outlet, or None where the engine must use the public path (TLS, an
        unknown transport class, no ``sendfile`` on this platform)."""
        try:
            target = resolve_target(transport)
        except (TypeError, RuntimeError):
            return None
        if not target.zero_copy or target.sock_fd < 0:
            return None
        family = transport.get_extra_info("socket").family
        if family in _TCP and not _platform.HAS_MSG_MORE:
            return None  # BSD/macOS: TCP_NOPUSH around head and file is the public path's job
        fd = os.dup(target.sock_fd)
        try:
            # Family, type and protocol given: CPython asks the kernel nothing. The fd is
            # non-blocking already (the transport's); a send that cannot go raises BlockingIOError.
            sock = socket.socket(family, socket.SOCK_STREAM, 0, fileno=fd)
        except BaseException:
            os.close(fd)
            raise
        if sock.gettimeout() is not None:  # socket.setdefaulttimeout() was called: clear it
            sock.setblocking(False)
        return cls(loop, sock, _MSG_MORE if family in _TCP else 0)

    def close(self) -> None:
        """Close the duplicate (now, or when the pool thread sending on it is done)."""
        self.closed = True
        if not self.in_pool:
            self.sock.close()


def probe_max(ident: tuple[int, ...]) -> int:
    """How large a file a door may probe as it opens the file *ident* (``_hot.identity``) names
    again (``_lookup.reopen_read``): 0 while a read this process started may still bring its
    pages in (then ``_writer.is_cold`` checks every page itself), or where probing is off."""
    return (
        PROBE_MAX if DEFAULT_OPTIONS.probe and not _reading_in.reading_in(None, (ident[0], ident[1])) else 0
    )
