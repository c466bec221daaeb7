"""A folder as one tar archive whose every byte is known before the first is sent.

Pure: the members come from the file system port (``_tree.walk``, in a pool thread). From their
``stat`` alone the archive's layout is fixed: each member is a POSIX pax header (``tarfile``'s
own encoder: any size, any name, UTF-8 or not), its body (the file's bytes, sent by ``sendfile``)
and zero padding to a 512-byte block; two zero blocks end it. So the answer has an exact
``Content-Length``, an ``ETag`` made from the snapshot (names, sizes, dates, identities), and takes
``Range``/``If-Range``: a cut download resumes, byte-identical, while the folder is unchanged.

Nothing here is kept per byte: a layout holds the members (bounded by ``max_entries``) and one
offset each; a header is made again when it is sent (``tar_header``: the same bytes each time).
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from typing import NamedTuple
from urllib.parse import quote

__all__ = (
    "BLOCK",
    "DEFAULT_MAX_ENTRIES",
    "END",
    "Layout",
    "Member",
    "PERMISSIONS",
    "TooLarge",
    "content_disposition",
    "header_size",
    "tar_header",
)

BLOCK = 512
#: Two zero blocks: the end of a tar archive.
END = bytes(2 * BLOCK)
#: Entries (files and folders) an archive may hold unless the server says otherwise: its layout
#: costs about 350 bytes of memory an entry while it is sent.
DEFAULT_MAX_ENTRIES = 100_000

#: ustar's numeric fields: sizes and dates past these need a pax record.
_MAX_OCTAL_SIZE = 0o77777777777
_NAME_FIELD = 100


class TooLarge(Exception):
    """The folder holds more entries or bytes than an archive may (413)."""


class Member(NamedTuple):
    """One entry: its name in the archive (``/``-separated, the file system's bytes as
    ``os.fsdecode`` gives them; a folder's ends with ``/``), size, modification time (ns),
    permission bits, and the identity (device, inode) its file is checked against when sent."""

    name: str
    size: int
    mtime_ns: int
    mode: int
    dev: int
    ino: int
    ctime_ns: int = 0  # (any change to the file, its bytes or its metadata, moves it)

    @property
    def is_dir(self) -> bool:
        return self.name.endswith("/")


def tar_header(member: Member) -> bytes:
    """*member*'s header: a ustar block, after a pax extended header where a field does not fit
    (then made by ``tarfile``; the common block is made here, the same bytes, several times faster)."""
    if _fits_ustar(member):
        return _ustar(member.name.encode("ascii"), member)
    return _pax_header(member)


def _fits_ustar(member: Member) -> bool:
    """Whether *member* needs no pax record: a short ASCII name, a size and date ustar holds."""
    name = member.name
    return (
        len(name) <= _NAME_FIELD
        and name.isascii()
        and member.size <= _MAX_OCTAL_SIZE
        and member.mtime_ns // 1_000_000_000 <= _MAX_OCTAL_SIZE
    )


def _ustar(name: bytes, member: Member) -> bytes:
    """The ustar block ``tarfile`` makes for a member that needs no pax record (fields by
    offset: name, mode, uid, gid, size, mtime, checksum, type, ..., magic; the rest zeros)."""
    mode = b"%07o\0" % (member.mode & PERMISSIONS)
    numbers = b"%011o\0%011o\0" % (member.size, max(0, member.mtime_ns // 1_000_000_000))
    kind = b"5" if name.endswith(b"/") else b"0"
    checksum = sum(name) + sum(mode) + _IDS_SUM + sum(numbers) + _SPACES_SUM + kind[0] + _MAGIC_SUM
    return b"".join(
        (
            name,
            bytes(_NAME_FIELD - len(name)),
            mode,
            _IDS,
            numbers,
            b"%06o\0 " % checksum,
            kind,
            _LINK_FIELD,
            _MAGIC,
            _TAIL,
        )
    )


#: The mode bits a member keeps: its permissions, never setuid, setgid or sticky. Members are
#: written as root's (uid, gid 0): a setuid file of any user's would come out of ``sudo tar -x``
#: setuid root.
PERMISSIONS = 0o777

_IDS = b"0000000\0" * 2  # uid, gid: 0
_IDS_SUM = sum(_IDS)
_SPACES_SUM = 8 * 0x20  # (the checksum's own field counts as spaces)
_LINK_FIELD = bytes(100)
_MAGIC = b"ustar\x0000"
_MAGIC_SUM = sum(_MAGIC)
_TAIL = bytes(BLOCK - 265)  # uname, gname, devices, prefix: empty


def _pax_header(member: Member) -> bytes:
    import tarfile  # (here: most servers never make an archive)

    info = tarfile.TarInfo(member.name)
    info.type = tarfile.DIRTYPE if member.is_dir else tarfile.REGTYPE
    info.size = member.size
    info.mtime = max(0, member.mtime_ns // 1_000_000_000)
    info.mode = member.mode & PERMISSIONS
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def header_size(member: Member) -> int:
    """``len(tar_header(member))``, without making it where no pax record is needed (the common
    case: a short ASCII name, a size under 8 GiB)."""
    return BLOCK if _fits_ustar(member) else len(_pax_header(member))


def _padding(size: int) -> int:
    return -size % BLOCK


class Layout:
    """Where each part of the archive lies (a member's header, body and padding; the end blocks),
    and the archive's length and ``ETag``. Other formats (``_zip.ZipLayout``) lay out their own
    parts the same way: :meth:`spans` cuts any range into parts, :meth:`around` gives a part's
    bytes made in memory and the part of a member's file between them."""

    KIND = "tar"
    CONTENT_TYPE = "application/x-tar"
    NEEDS_CRC = False

    __slots__ = (
        "__weakref__",
        "crc_mtimes",
        "crcs",
        "etag",
        "length",
        "members",
        "root",
        "skipped",
        "starts",
    )

    def __init__(self, members: list[Member], skipped: int = 0, root: str | None = None) -> None:
        self.members = members
        #: where every member's file must lie when it is opened to be sent (None: anywhere)
        self.root = root
        #: each member's CRC-32 once known (-1: not yet), for a format that needs them (zip)
        self.crcs = array("q", [-1]) * len(members) if self.NEEDS_CRC else array("q")
        #: the modification time of each member's file when its CRC-32 was read (its bytes are
        #: those while the time stays: ``_tree.sent_as_read``)
        self.crc_mtimes = array("q", [0]) * len(members) if self.NEEDS_CRC else array("q")
        #: entries left out (unreadable, a special file, a symlink to a folder or out of the root)
        self.skipped = skipped
        digest = hashlib.blake2b(digest_size=12)
        digest.update(b"0o777 UT\n")  # (the modes, zip's timestamps as written: older archives differ)
        for m in members:
            digest.update(
                f"{m.name}\0{m.size}\0{m.mtime_ns}\0{m.mode}\0{m.dev}\0{m.ino}\0{m.ctime_ns}\n".encode(
                    "utf-8", "surrogateescape"
                )
            )
        #: where each part starts, and (last) the archive's length
        self.starts = self._lay_out()
        self.length = self.starts[-1]
        self.etag = f'"{self.KIND}-{digest.hexdigest()}"'

    def _lay_out(self) -> array[int]:
        starts = array("q")
        at = 0
        for m in self.members:
            starts.append(at)
            at += header_size(m) + m.size + _padding(m.size)
        starts.append(at)  # (the end blocks)
        starts.append(at + len(END))
        return starts

    def spans(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """The parts of [*start*, *stop*) of the archive, in order: ``(part, from, to)``, offsets
        within that part's bytes."""
        starts = self.starts
        parts = len(starts) - 1
        i = max(0, bisect_right(starts, start) - 1)
        while i < parts:
            begin = starts[i]
            if begin >= stop:
                return
            lo, hi = max(start, begin) - begin, min(stop, starts[i + 1]) - begin
            if hi > lo:
                yield i, lo, hi
            i += 1

    def body_of(self, part: int) -> Member | None:
        """The member whose file's bytes *part* carries (between its headers), if any."""
        return self.members[part] if part < len(self.members) else None

    def crc_index(self, part: int) -> int | None:
        """The index of the member whose CRC-32 *part*'s headers carry, if any (a tar has none)."""
        return None

    def around(self, part: int, lo: int, hi: int, crc: int = 0) -> tuple[bytes, int, int, bytes]:
        """[*lo*, *hi*) of *part*: the bytes before its file's, the file's [first, last), the bytes
        after (*crc*: the CRC-32 of the member ``crc_index(part)`` names)."""
        members = self.members
        if part == len(members):
            return END[lo:hi], 0, 0, b""
        member = members[part]
        header = tar_header(member)
        h, size = len(header), member.size
        first, last = max(lo, h) - h, min(hi, h + size) - h
        return header[lo:hi], first, max(first, last), bytes(max(0, hi - max(lo, h + size)))


def content_disposition(name: str) -> str:
    """``attachment`` with *name* as the file to save: an ASCII ``filename`` for every client and
    the exact one as ``filename*`` (RFC 6266) where it is not plain ASCII."""
    ascii_name = "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else "_" for c in name)
    field = f'attachment; filename="{ascii_name}"'
    try:
        exact = name.encode("utf-8")
    except UnicodeEncodeError:  # (the file system's bytes, not UTF-8: no exact name to give)
        return field
    if ascii_name != name:
        field += "; filename*=UTF-8''" + quote(exact, safe="")
    return field
