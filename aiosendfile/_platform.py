"""Platform shim: the only module that calls ``os.sendfile``, ``os.splice``, ``os.preadv`` and ``send``.

One non-blocking attempt per call (``sendfile_once``, ``pread_cached``).
It returns the number of bytes the kernel
took, or raises ``BlockingIOError`` when the socket is full. Linux and the BSDs
(macOS included) differ in the C API. CPython's ``os.sendfile`` already hides
most of that; what is left is handled here:

* On macOS/BSD a ``count`` of 0 means "until EOF", so we never pass 0.
* On macOS/BSD an EAGAIN after a partial send reports the partial count;
  CPython returns it as a normal result, so callers see the same thing as on
  Linux.
* Some errnos mean "this pair of fds cannot do sendfile" (a file system
  without splice support, a non-socket on macOS). :func:`sendfile_once`
  raises :class:`NotSupportedBySendfile` for those, and the caller can fall
  back while nothing has been sent yet.

This module does not import asyncio.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from . import _reading_in

if TYPE_CHECKING:
    from . import _syscalls as _syscalls_types

try:
    import fcntl
except ImportError:  # Windows: no pipes to size, and no splice anyway
    fcntl = None  # type: ignore[assignment]

__all__ = (
    "CORK_OPTION",
    "HAS_MSG_MORE",
    "HAS_RWF_NOWAIT",
    "HAS_SENDFILE",
    "HAS_SPLICE",
    "PLATFORM",
    "NotSupportedBySendfile",
    "PROBED_COLD",
    "ShimCounters",
    "acceptor",
    "borrow_socket",
    "counters",
    "make_pipe",
    "page_cached",
    "peer_ended",
    "range_cached",
    "range_cached_available",
    "range_readable",
    "went_to_pool",
    "pread_cached",
    "read_nowait",
    "push",
    "read_ahead",
    "send_once",
    "set_cork",
    "splice_once",
    "sendfile_once",
)

#: ``os.sendfile`` exists and takes a socket as the output fd.
HAS_SENDFILE: bool = hasattr(os, "sendfile") and sys.platform != "win32"

#: Short name of the platform family, for capability reports.
PLATFORM: str = (
    "linux"
    if sys.platform.startswith("linux")
    else "bsd"
    if sys.platform == "darwin" or "bsd" in sys.platform
    else "other"
)

# errnos that mean "sendfile cannot do this pair of fds", not "the transfer failed".
_UNSUPPORTED_ERRNOS = frozenset(
    e
    for e in (
        getattr(errno, "EINVAL", None),  # Linux: the input fd cannot be mmap'd/spliced
        getattr(errno, "ENOSYS", None),
        getattr(errno, "ENOTSUP", None),
        getattr(errno, "EOPNOTSUPP", None),
        getattr(errno, "ENOTSOCK", None),  # BSD: output must be a socket
    )
    if e is not None
)


class NotSupportedBySendfile(OSError):
    """Raised by :func:`sendfile_once` when the fd pair cannot use sendfile."""


@dataclass
class ShimCounters:
    """Bytes and calls that went through the kernel's zero-copy path.

    Tests read these to prove zero-copy was used; they cost one add per call.
    ``waits`` counts the driver's waits for a full socket to become writable,
    ``cold`` the chunks sent from the thread pool because their pages were not cached.
    """

    calls: int = 0
    bytes: int = 0
    eagain: int = 0
    waits: int = 0
    cold: int = 0  # chunks whose sendfile ran in the cold-read pool
    splice_bytes: int = 0  # bytes recvfile moved from a pipe into a file with splice

    def reset(self) -> None:
        self.calls = self.bytes = self.eagain = self.waits = self.cold = self.splice_bytes = 0


counters = ShimCounters()


def went_to_pool(fd: int | None = None, key: tuple[int, int] | None = None) -> None:
    """A chunk of *fd* (the file *key* names, if given) goes to the cold-read pool to be sent or
    read: counted (``counters.cold``), and a read that may bring pages in
    (:func:`._reading_in.started_reading`)."""
    counters.cold += 1
    _reading_in.started_reading(fd, key)


def sendfile_once(out_fd: int, in_fd: int, offset: int, count: int) -> int:
    """Make one ``sendfile`` attempt of at most *count* (> 0) bytes from *offset*.

    Returns the number of bytes sent (0 means end of file).
    Raises ``BlockingIOError`` if the socket cannot take anything now,
    :class:`NotSupportedBySendfile` if the fds cannot use sendfile, or another
    ``OSError`` if the transfer failed.
    """
    if count <= 0:
        raise ValueError("count must be positive")  # 0 means "to EOF" on BSD
    try:
        sent = os.sendfile(out_fd, in_fd, offset, count)
    except BlockingIOError:
        counters.eagain += 1
        raise
    except OSError as exc:
        if exc.errno in _UNSUPPORTED_ERRNOS:
            raise NotSupportedBySendfile(exc.errno, exc.strerror) from exc
        raise
    counters.calls += 1
    counters.bytes += sent
    return sent


#: ``preadv(..., RWF_NOWAIT)`` exists: a read can be tried "only if it needs no disk I/O".
HAS_RWF_NOWAIT: bool = hasattr(os, "preadv") and hasattr(os, "RWF_NOWAIT")

_nowait_unsupported_errnos = frozenset(
    e for e in (getattr(errno, "EOPNOTSUPP", None), getattr(errno, "ENOTSUP", None), errno.EINVAL) if e
)


def pread_cached(fd: int, size: int, offset: int) -> bytearray | None:
    """Read *size* bytes at *offset* only if they are all in the page cache.

    Returns a new buffer of the bytes (fewer at end of file), or None if reading would wait for
    the disk, or if the platform or file system cannot tell. The caller then
    reads off the event-loop thread.
    """
    got = read_nowait(fd, size, offset)
    return got if isinstance(got, bytearray) else None


def read_nowait(
    fd: int, size: int, offset: int, device: int | None = None, file_size: int | None = None
) -> bytearray | Literal[False] | None:
    """:func:`pread_cached` that says why it read nothing: the bytes (fewer at end of file);
    False if some would wait for the disk; None if this platform or file system cannot tell.

    A caller that knows the file's file system (*device*, its ``st_dev``) has a refusal
    remembered for it, as :func:`page_cached` does, and is not asked again; one that knows its
    size a moment ago (*file_size*) spares the ``fstat`` that tells a range past the end.
    """
    if not HAS_RWF_NOWAIT or size <= 0:
        return None
    buf = bytearray(size)
    got = read_into_nowait(fd, buf, offset, device, file_size)
    if got is None or got is False:
        return got
    if got < size:
        del buf[got:]
    # The buffer itself, not a copy: it is fresh and nobody else holds it. (A bytes() copy
    # made a 256 KiB read take 240 µs instead of 50.)
    return buf


def read_into_nowait(
    fd: int, buf: bytearray | memoryview, offset: int, device: int | None = None, file_size: int | None = None
) -> int | Literal[False] | None:
    """Read into *buf* at *offset* without waiting for the disk: how many bytes (fewer only at the
    end of the file); False if some would wait for it; None if this platform or file system
    cannot tell (see :func:`read_nowait`).

    Where ``cachestat(2)`` counts the pages, a range not all cached is refused without a read: a
    refused ``RWF_NOWAIT`` read still starts the read-ahead of the missing pages from the
    calling thread (the loop's), and submitting it may wait in the block layer for
    milliseconds (measured: the uvloop ticks over 5 ms of the loop-stall benchmark).
    """
    size = len(buf)
    if not HAS_RWF_NOWAIT or size <= 0:
        return None
    if device is not None and _no_probe_devices and device in _no_probe_devices:
        return None
    call = _cachestat.call
    if call is not None:
        pages = call(fd, offset, size)
        if pages is not None and pages < _pages_of(offset, size):
            if file_size is None:
                file_size = os.fstat(fd).st_size
            end = min(offset + size, file_size)  # (a range past the end: its pages are none)
            if end <= offset or pages < _pages_of(offset, end - offset):
                return False if end > offset else 0
    try:
        got = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _nowait_unsupported_errnos:
            if device is not None:
                _no_probe_devices.add(device)
            return None
        raise
    if got < size and offset + got < os.fstat(fd).st_size:
        return False  # short, but not at EOF: only part of the range is cached
    return got


_no_probe_devices: set[int] = set()  # file systems (st_dev) where RWF_NOWAIT is refused
#: Where a probe's byte is read to: shared by every thread (the byte is never looked at), so a
#: probe allocates nothing.
_PROBE_BYTE = [bytearray(1)]


#: Where :func:`range_readable` reads to: one buffer named over and over in the read's vector, so a
#: range of any length costs no allocation and stays in the CPU's cache (never looked at).
_SCRATCH = memoryview(bytearray(64 * 1024))
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def range_readable(fd: int, offset: int, size: int) -> bool | None:
    """Whether every byte of [offset, offset+size) can be read now, without waiting for the disk:
    one ``RWF_NOWAIT`` read of the whole range into a scratch buffer (its bytes are dropped).

    The one check that sees every page: ``cachestat`` counts a page still being read in as
    cached, and a probe of the last page says nothing of the ones before it, while any of them
    makes ``sendfile`` wait for the disk. Call it only where :func:`range_cached` said every page
    is there: a refused read of a missing page starts reading it from the calling thread. False
    also when the file ends inside the range; None where the platform cannot tell.
    """
    if not HAS_RWF_NOWAIT or size <= 0:
        return None
    whole, rest = divmod(size, len(_SCRATCH))
    parts = [_SCRATCH] * whole
    if rest:
        parts.append(_SCRATCH[:rest])
    if len(parts) > _IOV_MAX:
        return None
    try:
        got = os.preadv(fd, parts, offset, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _nowait_unsupported_errnos:
            return None
        raise
    return got >= size


def page_cached(fd: int, offset: int, device: int | None = None) -> bool | None:
    """Whether the page holding *offset* is in the page cache (a 1-byte ``RWF_NOWAIT`` read).

    None means this platform or file system cannot tell. A refusal is remembered
    for the file's file system (its ``st_dev``: *device*, or an ``fstat`` made only
    when it is needed, so the usual call costs the one read).
    """
    if not HAS_RWF_NOWAIT:
        return None
    if _no_probe_devices and (os.fstat(fd).st_dev if device is None else device) in _no_probe_devices:
        return None
    try:
        os.preadv(fd, _PROBE_BYTE, offset, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _nowait_unsupported_errnos:
            _no_probe_devices.add(os.fstat(fd).st_dev if device is None else device)
            return None
        raise
    return True


# cachestat(2) (Linux >= 6.5): how many pages of a range are in the page cache, without
# reading anything. A 1-byte RWF_NOWAIT read of a missing page starts readahead for it
# from the calling (loop) thread; cachestat has no side effects and sees the whole range.
# It and openat2 come from aiosendfile._syscalls, a C module built at install where a compiler
# is: the standard library has no binding, and a ctypes call costs 2-3 times as much.
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SYSCALLS_ABI = 6  # aiosendfile/_syscalls.c's SYSCALLS_ABI: a stale build in a checkout is not used


def _load_syscalls() -> Any:
    """The compiled ``_syscalls`` module, or None: not built here, built from another version, or
    turned off (``AIOSENDFILE_NO_EXTENSIONS`` set to anything but empty: the pure-Python path)."""
    if PLATFORM != "linux" or os.environ.get("AIOSENDFILE_NO_EXTENSIONS"):
        return None
    try:
        from . import _syscalls
    except ImportError:
        return None
    return _syscalls if getattr(_syscalls, "ABI", None) == _SYSCALLS_ABI else None


_syscalls = _load_syscalls()
#: Whether the compiled system calls are here (``capabilities()`` says it).
HAS_SYSCALLS_MODULE: bool = _syscalls is not None


def acceptor(sock: socket.socket) -> Callable[[], int]:
    """The non-blocking listening *sock*'s accept as ``() -> int``: the new connection's descriptor
    (close-on-exec), or minus the errno (``-EAGAIN``: none is waiting). The compiled module's where
    it is here (no address formatted, no exception for the EAGAIN that ends every batch); else the
    standard library's (``_compat.acceptor``), its exception turned into minus its errno."""
    if _syscalls is not None:
        return functools.partial(_syscalls.accept, sock.fileno())
    from . import _compat

    inner = _compat.acceptor(sock)

    def accept() -> int:
        try:
            return int(inner()[0])
        except OSError as exc:
            return -(exc.errno or errno.EIO)

    return accept


class _Cachestat:
    """``cachestat(2)`` as ``call(fd, offset, size)``: pages cached, or None where the kernel cannot
    tell. ``call`` is None where it is missing (no compiled module, an old kernel, a filter)."""

    def __init__(self) -> None:
        self.call: Callable[[int, int, int], int | None] | None = None
        if _syscalls is None:
            return
        cachestat = _syscalls.cachestat

        def call(fd: int, offset: int, size: int) -> int | None:
            """Pages of [offset, offset+size) in the cache, or None if the kernel cannot tell."""
            pages: int = cachestat(fd, offset, size)
            if pages >= 0:
                return pages
            if pages in (-errno.ENOSYS, -errno.EPERM):  # old kernel, or a seccomp filter
                self.call = None
            elif pages == -errno.EBADF:
                raise OSError(errno.EBADF, os.strerror(errno.EBADF))
            return None

        self.call = call  # until the kernel says ENOSYS


_cachestat = _Cachestat()

#: A transfer's ``warm_to`` when its caller has just probed its first chunk and found it cold:
#: it waits for the pages at once instead of probing them again (``_outlet``; the compiled
#: ``reopen_read`` answers the same -1).
PROBED_COLD = -1


def range_cached_available() -> bool:
    """Whether :func:`range_cached` can answer here (so far: the kernel has not said ENOSYS)."""
    return _cachestat.call is not None


def range_cached(fd: int, offset: int, size: int) -> bool | None:
    """Whether every page of [offset, offset+size) is in the page cache (``cachestat(2)``).

    None where the kernel cannot tell (not Linux >= 6.5, or the file system
    declines). Pages still being read in count as cached here, so callers pair a
    True with :func:`page_cached` on the last page, which says "not yet" for those,
    or, where a read of the range was just started, with :func:`range_readable`.
    """
    call = _cachestat.call
    if call is None or size <= 0:
        return None
    pages = call(fd, offset, size)
    if pages is None:
        return None
    return pages >= _pages_of(offset, size)


def _pages_of(offset: int, size: int) -> int:
    """How many pages [offset, offset+size) touches (*size* > 0)."""
    return (offset + size - 1) // _PAGE - offset // _PAGE + 1


#: Whether the compiled page reader is here (:func:`page_reader`).
HAS_PAGE_READER: bool = hasattr(_syscalls, "PageReader")


def page_reader() -> _syscalls_types.PageReader:
    """A new compiled page reader (``_syscalls.PageReader``: a thread of its own that reads ranges
    into the page cache without the GIL and says so on an eventfd; ``_coldread.PageWaits`` uses
    it). Only where :data:`HAS_PAGE_READER`; elsewhere a cold range is read ahead with
    :func:`read_ahead` and waited for on a timer."""
    reader: _syscalls_types.PageReader = _syscalls.PageReader()
    return reader


def read_ahead(fd: int, offset: int, size: int) -> None:
    """Ask the kernel to start reading [offset, offset+size) into the page cache (no wait for it).

    Not from a loop's thread: submitting the read may wait (``_coldread.read_ahead`` asks it from
    its own thread)."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)


CORK_OPTION: int | None = getattr(socket, "TCP_CORK", None) or getattr(socket, "TCP_NOPUSH", None)

#: ``send(..., MSG_MORE)`` holds a partial TCP segment for what the next send adds (Linux).
#: Headers go that way instead of inside ``TCP_CORK``: no ``setsockopt`` pair per transfer, which
#: halves the server's CPU per 1 MiB response (docs/performance.md, "Headers with MSG_MORE").
HAS_MSG_MORE: bool = PLATFORM == "linux" and hasattr(socket, "MSG_MORE")
_MSG_MORE: int = getattr(socket, "MSG_MORE", 0)
_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def send_once(sock: socket.socket, data: bytes | memoryview, *, more: bool = False) -> int:
    """One non-blocking ``send`` of *data*; with *more* (Linux, TCP) flagged ``MSG_MORE``.

    ``MSG_MORE`` leaves a partial segment waiting for the next send (the
    file's first bytes) to fill it. If no send follows, :func:`push` flushes it.
    Raises ``BlockingIOError`` when the socket is full.
    """
    flags = _MSG_MORE if more and HAS_MSG_MORE and sock.family in _TCP_FAMILIES else 0
    return sock.send(data, flags)


def borrow_socket(fd: int) -> socket.socket:
    """A socket object over *fd*, which stays its owner's: ``detach()`` it, never ``close()``.

    For a few sends on a transport's own fd while nothing else can run. Costs
    one ``getsockname`` (CPython checks the fd); the family comes with it. A
    process-wide ``socket.setdefaulttimeout()`` would make ``send`` wait: undone.
    """
    sock = socket.socket(-1, socket.SOCK_STREAM, 0, fileno=fd)
    if sock.gettimeout() is not None:
        sock.setblocking(False)  # the fd is non-blocking already: this only clears the timeout
    return sock


def peer_ended(fd: int, *, reset_only: bool = False) -> bool:
    """Whether the stream socket *fd*'s peer has ended its side (its end of stream, or a reset),
    looked at without reading (``MSG_PEEK``): False while nothing came, or bytes wait. For a
    request waiting with reading paused, whose client may have gone meanwhile. With
    *reset_only*, a reset (or another failure) only: a client may half-close after its request
    and still read the answer (nginx answers it); one gone for good resets the connection once
    anything reaches it (a head sent meanwhile)."""
    sock = borrow_socket(fd)
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"" and not reset_only
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        sock.detach()


def push(sock: socket.socket) -> None:
    """Send now what a ``MSG_MORE`` (or a cork) holds back: clearing ``TCP_CORK`` pushes it.

    For a transfer that ends, however it ends, after a send flagged *more*
    with nothing after it. Unix sockets hold nothing; errors mean nothing is held.
    """
    if CORK_OPTION is not None and sock.family in _TCP_FAMILIES:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, CORK_OPTION, 0)


def set_cork(sock: socket.socket, on: bool) -> bool:
    """Hold (or release) partial TCP segments: ``TCP_CORK`` on Linux, ``TCP_NOPUSH`` on BSD.

    Lets headers, the file and trailers share packets. Returns False where it
    does not apply (Unix sockets, platforms without either option).
    """
    if CORK_OPTION is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, CORK_OPTION, 1 if on else 0)
    except OSError:
        return False
    return True


#: ``os.splice`` exists (Linux): socket → pipe → file without a userspace copy.
HAS_SPLICE: bool = hasattr(os, "splice")

_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


def splice_once(src: int, dst: int, count: int, offset_dst: int | None = None) -> int:
    """One non-blocking ``splice`` of at most *count* bytes; ``offset_dst`` for a file destination.

    Returns the bytes moved (0 = end of input), raises ``BlockingIOError`` when
    nothing can move now, :class:`NotSupportedBySendfile` where the fds
    cannot splice (the caller falls back), or the ``OSError``.
    """
    try:
        if offset_dst is None:
            moved = os.splice(src, dst, count, flags=_SPLICE_FLAGS)
        else:
            moved = os.splice(src, dst, count, offset_dst=offset_dst, flags=_SPLICE_FLAGS)
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno in _UNSUPPORTED_ERRNOS:
            raise NotSupportedBySendfile(exc.errno, exc.strerror) from exc
        raise
    if offset_dst is not None:  # count each received byte once: on its pipe → file leg
        counters.splice_bytes += moved
    return moved


def make_pipe(size: int) -> tuple[int, int]:
    """A non-blocking, close-on-exec pipe, grown to *size* bytes where the OS allows."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC) if hasattr(os, "pipe2") else os.pipe()
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if set_size is not None:
        with contextlib.suppress(OSError):  # over /proc/sys/fs/pipe-max-size: keep the default
            fcntl.fcntl(w, set_size, size)
    return r, w
