"""Files looked up by path: the shim's calls that take a path, beside ``_platform``'s that take a
descriptor or a socket.

* ``lookup_cached`` and ``open_cached``: ``openat2(2)`` with ``RESOLVE_CACHED`` (Linux >= 5.12), a
  lookup or an open only where it reads no disk (a first sight decided on the loop).
* ``identity_of`` and ``stat_identity``: what must not change for a kept answer or a cached body
  to stay valid (device, inode, size, mtime, ctime), from a ``stat_result`` or from a path.
* ``reopen_read``: a kept answer's file opened again, checked against that identity and read (or
  probed) in one call.

Each comes from the compiled ``_syscalls`` module where it was built (``_platform._syscalls``),
else from the standard library, with the same answers (the tests hold the two to it).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from . import _platform
from ._platform import PROBED_COLD

__all__ = (
    "REOPEN_FLAGS",
    "identity_of",
    "lookup_cached",
    "open_cached",
    "reopen_read",
    "stat_identity",
)

_syscalls = _platform._syscalls
#: File systems (st_dev) where RWF_NOWAIT is refused: ``_platform``'s own set, shared.
_no_probe_devices = _platform._no_probe_devices


def identity_of(st: os.stat_result) -> tuple[int, ...]:
    """What must not change for a kept answer or a cached body to stay valid: device, inode, size,
    mtime, ctime (``_static._hot.identity``; the compiled ``stat_identity`` gives the same five)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat_identity(path: str) -> tuple[int, ...] | int:
    """:func:`identity_of` ``stat(path)``, or minus the errno."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return -(exc.errno or errno.EIO)
    except UnicodeEncodeError:  # (raised, as the compiled call raises it)
        raise
    except ValueError:  # (a NUL in the path: no such path)
        return -errno.ENOENT
    return identity_of(st)


#: :func:`identity_of` ``stat(path)``, or minus the errno: the check that a kept answer's file is
#: still the one it was. The compiled module's where it is here: it builds the five numbers and
#: no ``os.stat_result`` (whose three float times and three nanosecond times cost more than the
#: call), and lets the GIL go for the lookup as ``os.stat`` does.
stat_identity: Callable[[str], tuple[int, ...] | int] = (
    _syscalls.stat_identity if _syscalls is not None else _stat_identity
)


#: How a kept answer's file is opened again: never blocking on a FIFO swapped in (its ``fstat``
#: differs from the identity, and it is closed unread).
REOPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
#: :func:`reopen_read`'s state for a file system that refuses ``RWF_NOWAIT`` (the compiled call's).
_REFUSED_NOWAIT = -2


def _pure_reopen_read(
    path: str, ident: tuple[int, ...], head: bytes, read_max: int, probe_max: int
) -> bytes | tuple[int, int, int] | None:
    """:func:`reopen_read` from the standard library's calls (no compiled module here)."""
    try:
        fd = os.open(path, REOPEN_FLAGS)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or identity_of(st) != ident:
        os.close(fd)
        return None
    size = st.st_size
    state = 0
    if size <= read_max:
        if size == 0:
            os.close(fd)
            return head
        buf = bytearray(size)
        try:
            got = _platform.read_into_nowait(fd, buf, 0, st.st_dev, size)
        except OSError:
            got = None  # (not read: the sender meets the error again)
        if got == size:
            os.close(fd)
            return head + buf
        state = PROBED_COLD if got is False else 0
    elif size <= probe_max:
        whole = _platform.range_cached(fd, 0, size)
        if whole is False:
            state = PROBED_COLD
        elif whole:
            try:
                last = _platform.page_cached(fd, size - 1, st.st_dev)
            except OSError:
                last = None
            state = size if last else PROBED_COLD if last is False else 0
    return fd, size, state


def _compiled_reopen_read(
    path: str, ident: tuple[int, ...], head: bytes, read_max: int, probe_max: int
) -> bytes | tuple[int, int, int] | None:
    """:func:`reopen_read` in one compiled call (open, ``fstat``, its identity, ``cachestat``, the
    ``RWF_NOWAIT`` read into the answer's own bytes after its head, close)."""
    if _no_probe_devices and ident[0] in _no_probe_devices:
        read_max = probe_max = 0
    assert _syscalls is not None
    got: bytes | tuple[int, int, int] | None = _syscalls.reopen_read(path, ident, head, read_max, probe_max)
    if type(got) is tuple and got[2] == _REFUSED_NOWAIT:
        _no_probe_devices.add(ident[0])
        return got[0], got[1], 0
    return got


#: A kept answer's file opened again, if its ``fstat`` still has the identity *ident*
#: (:func:`identity_of`); else None, nothing left open. A file of at most *read_max* bytes whose
#: pages are all cached is read with one ``RWF_NOWAIT`` read (its probe) and closed: the answer,
#: *head* followed by its bytes. Otherwise ``(fd, size, warm_to)``, the descriptor the caller's:
#: ``warm_to`` is ``PROBED_COLD`` (-1) when not all its pages are cached, its size when it is at
#: most *probe_max* bytes and every page is (``cachestat`` and its last page read, as
#: ``_writer.is_cold`` checks), 0 when not probed. The compiled module's where it is here: one
#: call, no ``os.stat_result``, no buffer zero-filled and copied again behind the head.
reopen_read: Callable[[str, tuple[int, ...], bytes, int, int], bytes | tuple[int, int, int] | None] = (
    _compiled_reopen_read if _syscalls is not None else _pure_reopen_read
)


# openat2(2) with RESOLVE_CACHED (Linux >= 5.12): a path lookup that fails with EAGAIN instead of
# reading a directory or an inode from the disk. The same number on every architecture.
_RESOLVE_NO_SYMLINKS = 0x04
#: What ``openat2`` answers where it is not there to use: no such call, a seccomp filter, an
#: unknown flag (no ``RESOLVE_CACHED`` before Linux 5.12), a larger ``struct open_how``.
_REFUSED = frozenset((errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG))


class _CachedLookup:
    """``openat2(O_PATH, RESOLVE_CACHED)`` (``call``) and the open that reads (``open``:
    ``O_RDONLY | O_NONBLOCK``, ``RESOLVE_CACHED | RESOLVE_NO_SYMLINKS``); each is None where it is
    missing (no compiled module, not Linux, an old kernel, a seccomp filter)."""

    def __init__(self) -> None:
        self.call: Callable[[str], bool | None] | None = None
        self.open: Callable[[str], int | None] | None = None
        syscalls = _platform._syscalls  # (read now: a test may hand it a refusing module)
        if syscalls is None or not hasattr(os, "O_PATH"):
            return
        openat2 = syscalls.openat2_cached  # RESOLVE_CACHED always; minus the errno on a refusal
        looking = os.O_PATH | os.O_CLOEXEC
        opening = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        close = os.close

        def call(path: str) -> bool | None:
            """False: the lookup would read the disk. True: it ends without (found or not)."""
            fd: int = openat2(path, looking, 0)
            if fd >= 0:
                close(fd)
                return True
            if -fd in _REFUSED:
                self.call = None  # no openat2, a filter, or no RESOLVE_CACHED (Linux < 5.12)
                return None
            return fd != -errno.EAGAIN  # ENOENT, ENOTDIR, EACCES, ELOOP...: answered from the caches

        def open_(path: str) -> int | None:
            """The descriptor, or minus the errno (EAGAIN: it would read the disk; ELOOP: a
            symlink on the way); None where the kernel cannot tell."""
            fd: int = openat2(path, opening, _RESOLVE_NO_SYMLINKS)
            if fd < 0 and -fd in _REFUSED:
                self.open = None
                return None
            return fd

        self.call = call
        self.open = open_


_cached_lookup = _CachedLookup()


def lookup_cached(path: str) -> bool | None:
    """Whether looking *path* up (``stat``, ``open``) would wait for no disk: its directories and
    inode are in the kernel's caches (``openat2`` with ``RESOLVE_CACHED``). None where the kernel
    cannot tell."""
    call = _cached_lookup.call
    return None if call is None else call(path)


def open_cached(path: str) -> int | None:
    """*path* opened for reading (``O_NONBLOCK``: a FIFO cannot hang the caller; close-on-exec)
    if its lookup waits for no disk and crosses no symlink (``openat2`` with ``RESOLVE_CACHED``
    and ``RESOLVE_NO_SYMLINKS``): the descriptor, else minus the errno (``-EAGAIN``: the lookup
    would read the disk; ``-ELOOP``: a symlink on the way; ``-ENOENT``, ``-EACCES``...: answered
    from the caches). None where the kernel cannot tell."""
    call = _cached_lookup.open
    return None if call is None else call(path)
