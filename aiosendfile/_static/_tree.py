"""A folder's tree for an archive (``_archive``), read from the file system in a pool thread.

:func:`walk` lists a folder recursively under the listing's rules: no dotfile unless they are
served, only what a request could fetch (a readable regular file, a folder that can be listed and
entered), no symlink out of the root. A symlink to a file inside the root is taken as that file (as
a request for it is answered); a symlink to a folder is left out (no loops, no folder twice). Each
folder is opened by its parent's descriptor with ``O_NOFOLLOW`` and listed by its own descriptor,
so a folder swapped for a symlink while the walk runs lists nothing outside. A name with a
backslash is left out, as from a listing: no request could fetch it, and some unzippers take
the backslash for a separator (``..\\..\\x`` would land outside the folder they unpack into).
Names are sorted: the same tree gives the same archive, byte for byte.

:func:`open_member` opens a member's file to send it, and checks by ``fstat`` that it is still the
file the layout was made from (device and inode), not shorter, and regular: a file replaced, or a
folder on its path swapped for a symlink out, is refused before a byte of it is sent.
"""

from __future__ import annotations

import os
import stat
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from ._archive import DEFAULT_MAX_ENTRIES, Layout, Member, TooLarge
from ._fs import _O_DIRECTORY_FLAGS, _O_FLAGS, _may, _real_path_of, opened_inside
from ._paths import RESERVED, inside

__all__ = (
    "SMALL",
    "MemberChanged",
    "Piece",
    "crc_known",
    "crc_read",
    "member_crc",
    "open_member",
    "piece",
    "rewritten",
    "sent_as_read",
    "walk",
)

_SUBDIR_FLAGS = _O_DIRECTORY_FLAGS | getattr(os, "O_NOFOLLOW", 0)


class MemberChanged(OSError):
    """A member's file is no longer the one the archive's layout was made from (the connection is
    aborted, as for a file that shrinks: not a server error)."""


def walk(
    path: str,
    top: str,
    root: str | None,
    dotfiles: bool,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_bytes: int | None = None,
    kind: type[Layout] = Layout,
) -> Layout:
    """The layout of the archive of the folder *path*, its members named under *top* (``top/``,
    ``top/a.txt``...). *root*: where every member must lie (None: symlinks followed anywhere).
    Raises :class:`TooLarge` past *max_entries* entries or *max_bytes* bytes of files, OSError if
    *path* itself cannot be listed. *kind*: the format's layout (``Layout``: tar; ``ZipLayout``)."""
    fd = os.open(path, _O_DIRECTORY_FLAGS)
    try:
        real = _real_path_of(fd, path)
        if root is not None and not inside(real, root):
            raise PermissionError(path)  # (swapped for a symlink out since the core's check)
        st = os.fstat(fd)
        tree = _Tree(root, dotfiles, max_entries, max_bytes)
        tree.path_room = PATH_MAX - (len(os.fsencode(path)) - len(os.fsencode(top)))
        tree.add(_member(top + "/", st))
        tree.folder(fd, real, top, 0)
    finally:
        os.close(fd)
    return kind(tree.members, tree.skipped, root)


def _member(name: str, st: os.stat_result) -> Member:
    """A member named *name* (a folder's ends with ``/``: its size is 0) as *st* describes it."""
    size = 0 if name.endswith("/") else st.st_size
    return Member(name, size, st.st_mtime_ns, st.st_mode, st.st_dev, st.st_ino, st.st_ctime_ns)


#: Folders deeper than this are left out (noted as skipped): the walk recurses once a level.
MAX_DEPTH = 64
#: A file whose path (``open_member``'s: the folder's path and its name under it) is this long or
#: longer is left out (noted as skipped): it could not be opened by its path to be sent
#: (ENAMETOOLONG), and the archive would be cut at it, every time.
PATH_MAX = 4096


class _Tree:
    """The members found so far, and the bounds they must stay within."""

    __slots__ = ("dotfiles", "max_bytes", "max_entries", "members", "path_room", "root", "skipped", "total")

    def __init__(self, root: str | None, dotfiles: bool, max_entries: int, max_bytes: int | None) -> None:
        self.root, self.dotfiles = root, dotfiles
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.members: list[Member] = []
        self.skipped = 0
        self.total = 0
        self.path_room = PATH_MAX  # bytes a member's name may have: its path to open stays shorter

    def add(self, member: Member) -> None:
        if len(self.members) >= self.max_entries:
            raise TooLarge(f"more than {self.max_entries} entries")
        self.total += member.size
        if self.max_bytes is not None and self.total > self.max_bytes:
            raise TooLarge(f"more than {self.max_bytes} bytes")
        self.members.append(member)

    def folder(self, dir_fd: int, real: str, prefix: str, depth: int) -> None:
        """Add the members under the folder open as *dir_fd* (at *real*, named *prefix*)."""
        for name, st in self._entries(dir_fd, real):
            full = f"{prefix}/{name}"
            if not stat.S_ISDIR(st.st_mode):
                if len(os.fsencode(full)) >= self.path_room:
                    self.skipped += 1  # (its path is too long to open: see PATH_MAX)
                    continue
                self.add(
                    Member(full, st.st_size, st.st_mtime_ns, st.st_mode, st.st_dev, st.st_ino, st.st_ctime_ns)
                )
                continue
            if depth >= MAX_DEPTH:
                self.skipped += 1
                continue
            try:
                sub = os.open(name, _SUBDIR_FLAGS, dir_fd=dir_fd)
            except OSError:  # gone meanwhile, or swapped for a symlink (ELOOP, ENOTDIR)
                self.skipped += 1
                continue
            try:
                self.add(
                    Member(full + "/", 0, st.st_mtime_ns, st.st_mode, st.st_dev, st.st_ino, st.st_ctime_ns)
                )
                self.folder(sub, f"{real}/{name}", full, depth + 1)
            finally:
                os.close(sub)

    def _entries(self, dir_fd: int, real: str) -> list[tuple[str, os.stat_result]]:
        """The entries of a folder an archive takes, sorted by name (see the module)."""
        found: list[tuple[str, os.stat_result]] = []
        root = self.root
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") and (not self.dotfiles or name[:8].lower() == RESERVED):
                    continue
                if "\\" in name:  # (no request could fetch it; a separator to some unzippers)
                    self.skipped += 1
                    continue
                try:
                    if entry.is_symlink():
                        st = _link_target(name, dir_fd, real, root)  # (followed: as a request for it)
                        if st is None:
                            self.skipped += 1  # a symlink to a folder, out of the root, or to a device
                            continue
                    else:
                        st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        wanted = os.R_OK
                    elif stat.S_ISDIR(st.st_mode):
                        wanted = os.R_OK | os.X_OK
                    else:
                        self.skipped += 1  # a FIFO, socket or device
                        continue
                    if not _may(name, wanted, dir_fd, real):
                        self.skipped += 1
                        continue
                except OSError:  # a broken symlink, or gone meanwhile
                    self.skipped += 1
                    continue
                found.append((name, st))
        found.sort(key=lambda e: e[0].encode("utf-8", "surrogateescape"))
        return found


def _link_target(name: str, dir_fd: int, directory: str, root: str | None) -> os.stat_result | None:
    """The ``fstat`` of the regular file the symlink *name* (in the folder open as *dir_fd*, at
    *directory*) leads to, checked to lie inside *root* on the descriptor opened (a link swapped
    between two looks cannot pass); None if it is not such a file."""
    fd = os.open(name, _O_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if root is not None and not opened_inside(fd, os.path.join(directory, name), root):
            return None
        return st
    finally:
        os.close(fd)


def open_member(base: str, member: Member, root: str | None = None) -> int:
    """*member*'s file under the folder *base* opened to be sent, checked to be the file the layout
    was made from (see the module) and, with *root*, to lie inside it on the descriptor opened (a
    symlink turned outside since the walk cannot pass). Raises :class:`MemberChanged` (or
    OSError: it is gone)."""
    path = os.path.join(base, member.name.split("/", 1)[1])
    fd = os.open(path, _O_FLAGS)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (member.dev, member.ino) or not stat.S_ISREG(st.st_mode):
            raise MemberChanged(member.name)
        if root is not None and not opened_inside(fd, path, root):
            raise MemberChanged(f"{member.name} is no longer inside the root")
        if st.st_size < member.size:
            raise MemberChanged(f"{member.name} shrank from {member.size} to {st.st_size} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd


def rewritten(st: os.stat_result, member: Member, mtime_ns: int) -> bool:
    """Whether the file *st* describes was written in place since it had the modification time
    *mtime_ns* (when its CRC-32 was read): a new time at the same size. Its change time is not
    asked here (a ``chmod`` or a link moves it, not its bytes): :func:`piece` reads a CRC-32
    again when it moved since the walk, which catches a rewrite whose date was put back. A file
    that grew is taken to have been appended to (a log), its first ``member.size`` bytes, all the
    archive holds of it, unchanged; one rewritten and grown at once cannot be told from it
    without reading it."""
    return st.st_size == member.size and st.st_mtime_ns != mtime_ns


def sent_as_read(fd: int, check: tuple[Member, int]) -> None:
    """Raise :class:`MemberChanged` if the member's file (open as *fd*) was rewritten since its
    CRC-32 was read, at the time *check* gives (a zip's: its CRC, sent before its bytes, would not
    match them)."""
    member, mtime_ns = check
    if rewritten(os.fstat(fd), member, mtime_ns):
        raise MemberChanged(f"{member.name} was rewritten since its CRC-32 was read")


#: A member file this small is read with its part (:func:`piece`): its bytes go with the headers
#: around them (one ``sendfile`` call costs more than copying this much).
SMALL = 64 * 1024


class Piece(NamedTuple):
    """A part of an archive made ready to send (in a pool thread): the bytes before the member's
    file, then the file's bytes (read: ``data``; or ``length`` bytes from ``first`` of the open
    ``fd``, the caller's to close), then the bytes after. ``check``: the member whose file must
    still be as its CRC-32 was read, and its time then, once its bytes are sent from ``fd``
    (:func:`sent_as_read`)."""

    before: bytes
    fd: int | None
    data: bytes | None
    first: int
    length: int
    after: bytes
    check: tuple[Member, int] | None = None


def piece(
    path: str, layout: Layout, part: int, lo: int, hi: int, tick: Callable[[], None] | None = None
) -> Piece:
    """[*lo*, *hi*) of *layout*'s *part* (``Layout.spans``), its member's file checked (and its
    CRC-32 computed, for a zip: *tick* is called on the way) first. Raises
    :class:`MemberChanged` or OSError."""
    crc = member_crc(path, layout, layout.crc_index(part), tick)
    before, first, last, after = layout.around(part, lo, hi, crc)
    if last <= first:
        return Piece(before, None, None, 0, 0, after)
    member = layout.body_of(part)
    assert member is not None
    exact = layout.NEEDS_CRC
    fd = open_member(path, member, layout.root)
    if member.size > SMALL:
        if not exact:
            return Piece(before, fd, None, first, last - first, after)
        check = (member, layout.crc_mtimes[part])  # (a zip's member part is its index)
        try:
            sent_as_read(fd, check)  # (and again once its bytes are sent)
            # Changed since the walk, its date aside (a chmod; or a rewrite with its date put
            # back: cp -p, touch -r): its CRC-32 read again, before its bytes go.
            if os.fstat(fd).st_ctime_ns != member.ctime_ns and _crc_of(fd, member, tick) != crc:
                raise MemberChanged(f"{member.name} was rewritten (its date put back) since its CRC-32 read")
        except BaseException:
            os.close(fd)
            raise
        return Piece(before, fd, None, first, last - first, after, check)
    try:
        if exact:  # the whole file, to check it against the CRC-32 its headers carry
            data = os.pread(fd, member.size, 0)
            if zlib.crc32(data) != crc and len(data) == member.size:
                raise MemberChanged(f"{member.name} was rewritten since its CRC-32 was read")
            data = data[first:last]
        else:
            data = os.pread(fd, last - first, first)
    finally:
        os.close(fd)
    if len(data) < last - first:  # (shrunk since it was checked)
        raise MemberChanged(f"{member.name} shrank while it was read")
    return Piece(before, None, data, 0, 0, after)


#: CRC-32s of member files by identity (device, inode, size, mtime, ctime): a folder zipped
#: again is sent without reading its files first (within one archive, ``Layout.crcs`` keeps them
#: whatever this drops). At most this many (about 330 bytes each), the oldest dropped first.
CRC_CACHE_ENTRIES = 65_536
_crcs: OrderedDict[tuple[int, int, int, int, int], int] = OrderedDict()
_crcs_lock = threading.Lock()
_CRC_READ = 1024 * 1024
TICK_BYTES = 64 * _CRC_READ


def member_crc(path: str, layout: Layout, index: int | None, tick: Callable[[], None] | None = None) -> int:
    """The CRC-32 of *layout*'s member *index* (0 for None): the layout's own once known (so an
    archive needs each file's read once however many members it has), else :func:`crc_read`."""
    if index is None:
        return 0
    known = layout.crcs[index]
    if known >= 0:
        return known
    crc, mtime_ns = crc_read(path, layout.members[index], tick, layout.root)
    layout.crcs[index] = crc
    layout.crc_mtimes[index] = mtime_ns
    return crc


def crc_known(layout: Layout, index: int | None) -> bool:
    """Whether the CRC-32 of *layout*'s member *index* is known without reading its file."""
    if index is None or layout.crcs[index] >= 0:
        return True
    member = layout.members[index]
    if member.is_dir or not member.size:
        return True
    return _crc_key(member) in _crcs


def _crc_key(member: Member) -> tuple[int, int, int, int, int]:
    return (member.dev, member.ino, member.size, member.mtime_ns, member.ctime_ns)


def _crc_of(fd: int, member: Member, tick: Callable[[], None] | None) -> int:
    """The CRC-32 of the first ``member.size`` bytes of *fd*, read (*tick* called after each
    :data:`TICK_BYTES`); :class:`MemberChanged` if it has fewer."""
    crc = 0
    left = member.size
    at = 0
    while left:
        block = os.pread(fd, min(left, _CRC_READ), at)
        if not block:
            raise MemberChanged(f"{member.name} shrank while it was read")
        crc = zlib.crc32(block, crc)
        at += len(block)
        left -= len(block)
        if tick is not None and at % TICK_BYTES == 0:
            tick()
    return crc


def crc_read(
    path: str, member: Member, tick: Callable[[], None] | None = None, root: str | None = None
) -> tuple[int, int]:
    """*member*'s CRC-32 (its file's first ``size`` bytes) and its file's modification time when
    they were read, from the cache or read (in a pool thread: it reads the whole file, which
    leaves its pages cached for the ``sendfile`` after; *tick* is called after each
    :data:`TICK_BYTES` read: a large file's read is progress too). Kept by the walk's identity
    only if the file still had the walk's time: a CRC read since a change is this archive's."""
    if member.is_dir or not member.size:
        return 0, member.mtime_ns
    key = _crc_key(member)
    with _crcs_lock:
        known = _crcs.get(key)
        if known is not None:
            _crcs.move_to_end(key)
            return known, member.mtime_ns
    fd = open_member(path, member, root)
    try:
        before = os.fstat(fd).st_mtime_ns
        crc = _crc_of(fd, member, tick)
        if rewritten(os.fstat(fd), member, before):  # (meanwhile: the CRC of neither)
            raise MemberChanged(f"{member.name} was rewritten while its CRC-32 was read")
    finally:
        os.close(fd)
    if before == member.mtime_ns:
        with _crcs_lock:
            _crcs[key] = crc
            if len(_crcs) > CRC_CACHE_ENTRIES:
                _crcs.popitem(last=False)
    return crc, before
