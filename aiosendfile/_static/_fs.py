"""The static core's one door to the file system: the ``FileSystem`` port and ``REAL_FS``.

Everything else in ``_static`` is pure; tests hand the core a fake file system. Every method is
synchronous: a door decides where the decision runs (inline on the loop, or in a pool thread).

``open_regular`` opens with ``O_NONBLOCK`` (a FIFO cannot hang the caller) and ``O_CLOEXEC``,
``fstat``s it, then checks the *opened descriptor* against the root (its ``/proc/self/fd`` link;
the path where there is no ``/proc``), so a symlink or a swap between check and open cannot
escape, and refuses anything but a regular file. A file found inside is remembered by path and
identity (root, path, device, inode, ctime: a rename or a link count change moves the ctime), as
the hot cache trusts its entries, so the next open of the same file by the same path skips the
``readlink`` (3 µs, the open's largest cost).

``scan`` lists a directory the same way: it opens the directory, checks the *opened descriptor*
against the root and lists by that descriptor, so a symlink swapped in after the core's
containment check lists nothing outside. It lists only what a request could fetch (a readable
regular file, a directory that can be listed and entered). A listing can be ten thousand ``stat``
calls: the loop's file system (``REAL_FS``) refuses with :class:`DecideInPool`, and the door
takes the decision again in its pool, with ``POOL_FS``.

``reopen`` and ``read_back`` serve a door answering from its answer cache (``_answers``): the file
opened again and checked by ``fstat`` against the identity the answer was decided for, and a small
one's bytes read back (into the hot-file cache if it admits them; a door may read files up to a
size of its own either way). ``reopen_answer`` does the same for ``serve``'s engine in one call
(``_lookup.reopen_read``), the bytes read behind the answer's head. ``folder_identity`` and
``no_sibling_names`` let a door keep a browser's answer (``Accept-Encoding``): while no name a
pre-compressed sibling could have exists and the file's directory is unchanged, it is a plain one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import weakref
from typing import Any, Literal, Protocol

from .. import _lookup, _platform
from . import _hot
from ._archive import Layout
from ._paths import inside
from ._policy import ENCODINGS, DirectoryPolicy

__all__ = (
    "POOL_FS",
    "REAL_FS",
    "ArchivesBusy",
    "DecideInPool",
    "FileSystem",
    "KnownInside",
    "NotRegular",
    "directory_policy",
    "folder_identity",
    "no_sibling_names",
    "open_cached",
    "opened_inside",
    "OutsideRoot",
    "PoolFS",
    "RealFS",
    "look_up_path",
    "lookup_cached",
    "read_back",
    "read_first",
    "reopen",
    "reopen_answer",
    "same_file",
)

_O_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
#: For a sibling with no root to contain it: a symlink is refused (ELOOP), as aiohttp's class does.
_O_NOFOLLOW_FLAGS = _O_FLAGS | getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_DIRECTORY", 0)


class OutsideRoot(Exception):
    """The opened file lies outside the root (a symlink pointing out, or one swapped in)."""


class NotRegular(Exception):
    """The opened file is a directory, FIFO, device or socket."""


class ArchivesBusy(Exception):
    """As many folders as :data:`MAX_WALKS` are being walked for archives already (503): each walk
    holds a pool thread for as long as a tree of up to ``max_archive_entries`` takes to list."""


#: Archive walks at once, per process (``PoolFS.archive``); the pool's other threads stay free.
MAX_WALKS = 2
_walks = threading.BoundedSemaphore(MAX_WALKS)
#: The entries of the layouts of archives being sent, at most this many times an archive's bound
#: (about 350 bytes each): a folder downloaded by many clients at once is laid out once (the same
#: snapshot, the same ``Layout``), and many folders at once wait (503) past the budget.
LIVE_LAYOUTS = 4
_live: weakref.WeakValueDictionary[tuple[str, str], Layout] = weakref.WeakValueDictionary()
_live_lock = threading.Lock()


def _shared(path: str, layout: Layout, budget: int) -> Layout:
    """The live layout of the same snapshot of *path* if one is being sent, else *layout*, counted
    against *budget* entries of live layouts (:class:`ArchivesBusy` past it)."""
    with _live_lock:
        key = (path, layout.etag)
        same = _live.get(key)
        if same is not None:
            return same
        if sum(len(live.members) for live in _live.values()) + len(layout.members) > budget:
            raise ArchivesBusy(path)
        _live[key] = layout
        return layout


class DecideInPool(Exception):
    """This file system does not do that on the event loop (a directory listing): the door decides
    the request again in its pool, with :data:`POOL_FS`."""


class FileSystem(Protocol):
    """What the static core asks of the file system (all synchronous; errors are ``OSError``)."""

    def stat(self, path: str) -> os.stat_result: ...

    def is_file(self, path: str) -> bool: ...

    def realpath(self, path: str) -> str: ...

    def open_regular(self, path: str, root: str | None, nofollow: bool) -> tuple[int, os.stat_result]:
        """Open *path* for reading: (fd, its fstat). Raises OSError from the open, OutsideRoot when
        *root* is given and the descriptor lies outside it, NotRegular; no fd is left open then."""
        ...

    def read_cached(self, fd: int, size: int) -> bytes | None:
        """The first *size* bytes if all are in the page cache, else None (never waits for the disk)."""
        ...

    def scan(self, path: str, root: str | None) -> tuple[list[tuple[str, os.stat_result]], str]:
        """A directory's entries (name, stat following symlinks) a request could fetch (readable
        regular files and directories; no broken symlink; with *root* given, no symlink out of it),
        and the directory's real path. Lists the directory it opened: raises OutsideRoot if that
        one lies outside *root*, OSError if it cannot be read, DecideInPool where that is not done."""
        ...

    def archive(self, path: str, top: str, policy: DirectoryPolicy, kind: type[Layout] = Layout) -> Layout:
        """The layout (*kind*: tar, or ``_zip.ZipLayout``) of the archive of the directory *path*,
        its members under *top* (``_tree.walk``, by *policy*'s rules and bounds). Raises
        ``TooLarge``, ``ArchivesBusy``, OSError if *path* cannot be listed, DecideInPool where that
        is not done."""
        ...

    def close(self, fd: int) -> None: ...


#: Regular files found inside a root, by (root, path, device, inode, ctime ns): emptied when it
#: holds this many, or this many characters of paths (bounded memory, about 24 MiB at most).
_INSIDE_MAX = 65536
_INSIDE_MAX_CHARS = 16 * 1024 * 1024


class KnownInside:
    """Regular files already found inside a root: (root, path, device, inode, ctime ns), bounded."""

    def __init__(self) -> None:
        self._known: set[tuple[str, str, int, int, int]] = set()
        self._chars = 0

    def __contains__(self, key: tuple[str, str, int, int, int]) -> bool:
        return key in self._known

    def add(self, key: tuple[str, str, int, int, int]) -> None:
        if len(self._known) >= _INSIDE_MAX or self._chars > _INSIDE_MAX_CHARS:
            self._known.clear()
            self._chars = 0
        self._known.add(key)
        self._chars += len(key[1])


class RealFS:
    """The file system through ``os``.

    *known* is the memory of files found inside a root; file systems given the same one (the
    loop's and the pool's) each skip the check the other made.
    """

    def __init__(self, known: KnownInside | None = None) -> None:
        self._inside = KnownInside() if known is None else known

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def is_file(self, path: str) -> bool:
        return _is_file(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def open_regular(self, path: str, root: str | None, nofollow: bool) -> tuple[int, os.stat_result]:
        fd = os.open(path, _O_NOFOLLOW_FLAGS if nofollow else _O_FLAGS)
        try:
            st = os.fstat(fd)
            if root is not None:
                known = (root, path, st.st_dev, st.st_ino, st.st_ctime_ns)
                if known not in self._inside:
                    if not opened_inside(fd, path, root):
                        raise OutsideRoot(path)
                    if stat.S_ISREG(st.st_mode):
                        self._inside.add(known)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegular(path)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def read_cached(self, fd: int, size: int) -> bytes | None:
        read = _platform.pread_cached(fd, size, 0)
        return None if read is None else bytes(read)

    def scan(self, path: str, root: str | None) -> tuple[list[tuple[str, os.stat_result]], str]:
        raise DecideInPool(path)  # (thousands of stat calls: never on the loop)

    def archive(self, path: str, top: str, policy: DirectoryPolicy, kind: type[Layout] = Layout) -> Layout:
        raise DecideInPool(path)  # (a whole tree: never on the loop)

    def close(self, fd: int) -> None:
        os.close(fd)


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _scan(path: str, root: str | None) -> tuple[list[tuple[str, os.stat_result]], str]:
    fd = os.open(path, _O_DIRECTORY_FLAGS)
    try:
        real = _real_path_of(fd, path)
        if root is not None and not inside(real, root):
            raise OutsideRoot(path)  # swapped for a symlink out since the core's check
        found: list[tuple[str, os.stat_result]] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                name = entry.name
                try:
                    st = entry.stat()  # follows symlinks, as the request for it would
                    if (
                        root is not None
                        and entry.is_symlink()
                        and not inside(os.path.realpath(os.path.join(real, name)), root)
                    ):
                        continue  # out of the root: refused when fetched; its size and date are not ours
                    if stat.S_ISREG(st.st_mode):
                        wanted = os.R_OK
                    elif stat.S_ISDIR(st.st_mode):
                        wanted = os.R_OK | os.X_OK
                    else:
                        continue  # a FIFO, socket or device: answered 403
                    if not _may(name, wanted, fd, real):
                        continue  # we may not read it: answered 403
                except OSError:  # a broken symlink, or gone meanwhile: nothing to fetch
                    continue
                found.append((name, st))
        return found, real
    finally:
        os.close(fd)


_ACCESS_BY_FD = os.access in os.supports_dir_fd
_EFFECTIVE = os.access in os.supports_effective_ids


def _may(name: str, mode: int, dir_fd: int, directory: str) -> bool:
    """Whether this process (its effective ids, as an open would be judged) may *mode* the entry
    *name* of the directory open as *dir_fd* (at *directory*, where access() takes no dir_fd)."""
    if _ACCESS_BY_FD:
        return os.access(name, mode, dir_fd=dir_fd, effective_ids=_EFFECTIVE)
    return os.access(os.path.join(directory, name), mode, effective_ids=_EFFECTIVE)


def _real_path_of(fd: int, path: str) -> str:
    """Where the descriptor *fd* (opened as *path*) really is: its ``/proc`` link; without
    ``/proc`` (macOS/BSD) the realpath of *path*, only if it names what *fd* is (else "": a
    path swapped since the open is nowhere we know)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    real = os.path.realpath(path)
    try:
        st, there = os.fstat(fd), os.stat(real)
    except OSError:
        return ""
    return real if (st.st_dev, st.st_ino) == (there.st_dev, there.st_ino) else ""


def opened_inside(fd: int, path: str, root: str) -> bool:
    """Whether the file actually opened lies inside *root* (checked on the open fd: no race)."""
    return inside(_real_path_of(fd, path), root)


class PoolFS(RealFS):
    """The file system for a decision taken in a pool thread, where waiting for the disk is the
    point: ``read_cached`` reads a small body whether or not its pages are cached, so a first sight
    comes back whole in one hop (not a second hop to read its body off the loop); ``scan`` lists."""

    def scan(self, path: str, root: str | None) -> tuple[list[tuple[str, os.stat_result]], str]:
        return _scan(path, root)

    def archive(self, path: str, top: str, policy: DirectoryPolicy, kind: type[Layout] = Layout) -> Layout:
        if not _walks.acquire(blocking=False):
            raise ArchivesBusy(path)
        try:
            root = None if policy.follow_symlinks else policy.root
            from ._tree import walk  # (here: _tree builds on this module's open and checks)

            layout = walk(
                path, top, root, policy.dotfiles, policy.max_archive_entries, policy.max_archive_size, kind
            )
        finally:
            _walks.release()
        return _shared(path, layout, LIVE_LAYOUTS * policy.max_archive_entries)

    def read_cached(self, fd: int, size: int) -> bytes | None:
        read = super().read_cached(fd, size)
        if read is not None or size <= 0:
            return read  # (an empty file is not cached, as with REAL_FS)
        chunks = []
        got = 0
        while got < size:
            chunk = os.pread(fd, size - got, got)
            if not chunk:
                break  # shrank meanwhile: the caller sees a short read
            chunks.append(chunk)
            got += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def open_cached(path: str) -> tuple[int, os.stat_result] | bool | None:
    """A door's first sight of *path* (``route``'s: the root, which has no symlink, and a checked
    name below it), looked up and opened at once where that waits for no disk and crosses no
    symlink (``_lookup.open_cached``): a regular file reached so lies inside the root, and its
    descriptor (blocking again) and ``fstat`` come back for ``decide(..., opened=)``, which skips
    its own ``stat``, open and containment check. False: the lookup would read the disk. True: it
    was answered from the kernel's caches but nothing is opened (missing, forbidden, a
    directory...): decide it as usual. None: it cannot tell (no ``openat2``; a symlink on the way)."""
    fd = _lookup.open_cached(path)
    if fd is None or fd == -errno.ELOOP:
        return None
    if fd < 0:
        return fd != -errno.EAGAIN
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.set_blocking(fd, True)
            return fd, st
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)  # a directory, a FIFO opened without waiting for a writer, a device
    return True


def directory_policy(directory: str | os.PathLike[str], **options: Any) -> DirectoryPolicy:
    """The policy for serving *directory* (every door's one way to make it): its real path is the
    root every file opened must lie under; *options* are the policy's other fields."""
    return DirectoryPolicy(os.path.realpath(directory), **options)


def same_file(path: str, ident: tuple[int, ...]) -> bool:
    """Whether *path* still names the file *ident* (``_hot.identity``) describes: one ``stat``."""
    return _lookup.stat_identity(path) == ident


def folder_identity(path: str) -> tuple[str, tuple[int, ...]] | None:
    """The directory of *path* and its identity (``_lookup.stat_identity``: device, inode, size,
    mtime, ctime), which changes when an entry is added to it, removed or renamed in it (a
    door checks it again with :func:`same_file`); None if it cannot be looked at."""
    folder = os.path.dirname(path)
    try:
        ident = _lookup.stat_identity(folder)
    except (UnicodeEncodeError, ValueError):
        return None
    return None if isinstance(ident, int) else (folder, ident)


def no_sibling_names(path: str) -> bool:
    """Whether no name a pre-compressed sibling of *path* could have (``.br``, ``.gz``) exists in
    any form: a dangling symlink could come to life without its directory changing."""
    for _, suffix in ENCODINGS:
        try:
            os.lstat(path + suffix)
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return False
        return False
    return True


def lookup_cached(path: str) -> bool | None:
    """Whether looking *path* up would wait for no disk (``_lookup.lookup_cached``)."""
    return _lookup.lookup_cached(path)


def look_up_path(path: str) -> None:
    """(In a pool thread.) ``stat`` *path*, whatever it finds: its directory entries and inode
    come into the kernel's caches."""
    with contextlib.suppress(OSError, ValueError):
        os.stat(path)


def read_first(fd: int, size: int, device: int) -> bytearray | Literal[False] | None:
    """A first sight's small file read whole with one ``RWF_NOWAIT`` read (its page-cache probe):
    its bytes, False if some would wait for the disk, None if not read (the platform or file
    system cannot tell, an error: the sender meets it again)."""
    try:
        return _platform.read_nowait(fd, size, 0, device, size)  # (size: its fstat's, a moment ago)
    except OSError:
        return None


def reopen(path: str, ident: tuple[int, ...]) -> tuple[int, os.stat_result] | None:
    """*path* opened again (never blocking on a FIFO swapped in: its ``fstat`` differs) and its
    ``fstat``, if it still names the file *ident* (``_hot.identity``) describes; None if it does not
    (replaced, renamed over, grown, truncated, chmod'ed, gone), with nothing left open."""
    try:
        fd = os.open(path, _O_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or _hot.identity(st) != ident:
        os.close(fd)
        return None
    return fd, st


def read_back(
    fd: int, st: os.stat_result, path: str, cache_root: str | None, read_max: int = 0
) -> bytes | bytearray | Literal[False] | None:
    """A small file's bytes read from *fd* with one ``RWF_NOWAIT`` read (its page-cache probe),
    if the hot-file cache admits them (then kept there, as *path* under *cache_root*, and given
    back as ``bytes``) or they are at most *read_max* bytes (given back as the fresh buffer):
    then *fd* is closed. False: not all of its pages are cached; None: not read (not admitted,
    the file system cannot tell, the file changed size); *fd* is still open then (a working set
    larger than the cache is sent from its files, not copied in and evicted again)."""
    size = st.st_size
    hot = _hot.hot_files
    admitted = hot.admits(size)
    if not admitted and size > read_max:
        return None
    read = read_first(fd, size, st.st_dev)
    if not isinstance(read, bytearray):
        return read  # False: cold; None: cannot tell, or an error
    if len(read) != size:
        return None
    os.close(fd)
    if not admitted:
        return read
    body = bytes(read)
    hot.put(path, cache_root, _hot.identity(st), body)
    return body


def reopen_answer(
    path: str,
    ident: tuple[int, ...],
    small: bool,
    cache_root: str | None,
    head: bytes,
    read_max: int,
    probe_max: int,
) -> bytes | tuple[int, int, int] | None:
    """A kept answer's file opened again, if it is still the file *ident* describes, and read where
    it can be (``_lookup.reopen_read``): the whole answer, *head* then the bytes of a *small*
    file of at most *read_max* bytes (or one the hot-file cache admits: then kept there, as
    *path* under *cache_root*) whose pages are all cached; else ``(fd, size, warm_to)`` for a
    sender (the pages probed if it is at most *probe_max* bytes); None: not that file (replaced,
    renamed over, grown, truncated, chmod'ed, gone), nothing open."""
    hot = _hot.hot_files
    if small and hot.admits(ident[2]):
        got = _lookup.reopen_read(path, ident, b"", ident[2], probe_max)
        if type(got) is bytes:
            hot.put(path, cache_root, ident, got)
            return head + got
        return got
    return _lookup.reopen_read(path, ident, head, read_max if small else 0, probe_max)


_KNOWN_INSIDE = KnownInside()
#: The real file system.
REAL_FS: FileSystem = RealFS(_KNOWN_INSIDE)
#: The real file system, for decisions taken in a pool thread (see :class:`PoolFS`); it shares
#: REAL_FS's memory of files found inside, so a first sight decided in the pool spares the loop's
#: later opens the ``readlink``.
POOL_FS: FileSystem = PoolFS(_KNOWN_INSIDE)
