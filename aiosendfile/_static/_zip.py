"""A folder as one stored (uncompressed) zip archive, laid out from ``stat`` like the tar
(``_archive``): for the people whose systems open nothing else.

Pure: the bytes are made here from each member's name, size, date and mode, and its CRC-32 (which
the door computes off the loop, ``_tree.member_crc``, and keeps in ``Layout.crcs``). Every
member's local header carries its sizes and CRC (no data descriptor: any unzip can read it
front to back), then its bytes as they are; the central directory and the end records follow.
Sizes or offsets past 4 GiB, or more than 65,534 entries, take ZIP64 fields. A name in UTF-8
sets the language encoding flag; one that is not (a file system's own bytes) is written as it
is, without the flag. Dates are MS-DOS dates (UTC, two-second steps, 1980 to 2107) and, exact in
any time zone, Info-ZIP's extended timestamp; permissions are Unix modes ("made by" Unix).

Parts (``Layout.spans``): member *i*'s local header and bytes, then member *i*'s central record
(part ``n + i``), then the end records (part ``2n``). Only the local headers and the central
records need CRCs; the length, offsets and ``ETag`` need none.
"""

from __future__ import annotations

import stat
import struct
import time
from array import array

from ._archive import PERMISSIONS, Layout, Member

__all__ = ("ZipLayout",)

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_ZIP64_END = struct.Struct("<IQHHIIQQQQ")
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_END = struct.Struct("<IHHHHIIH")
_UT = struct.Struct("<HHBI")
_LIMIT = 0xFFFFFFFF
_ENTRIES_LIMIT = 0xFFFF
_UTF8 = 0x800
_UNIX_45 = (3 << 8) | 45  # made by: Unix, version 4.5 (ZIP64)
_END_LENGTH = _END.size
_ZIP64_END_LENGTH = _ZIP64_END.size + _ZIP64_LOCATOR.size


def _name(member: Member) -> tuple[bytes, int]:
    """The name's bytes and the flag they need (UTF-8, or the file system's own bytes)."""
    raw = member.name.encode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw, 0
    return raw, _UTF8 if not member.name.isascii() else 0


def _dos_time(mtime_ns: int) -> tuple[int, int]:
    t = time.gmtime(max(0, mtime_ns // 1_000_000_000))
    if t.tm_year < 1980:
        return 0, (0 << 9) | (1 << 5) | 1
    if t.tm_year > 2107:
        return (23 << 11) | (59 << 5) | 29, (127 << 9) | (12 << 5) | 31
    return (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2), ((t.tm_year - 1980) << 9) | (
        t.tm_mon << 5
    ) | t.tm_mday


def _local_extra(member: Member) -> bytes:
    if member.size < _LIMIT:
        return b""
    return struct.pack("<HHQQ", 1, 16, member.size, member.size)


def _timestamp(member: Member) -> bytes:
    """Info-ZIP's extended timestamp (0x5455): the modification time in seconds since the epoch,
    which unzip, bsdtar and 7-Zip set an extracted file's time from in any time zone (the MS-DOS
    date has none). Left out for a time a 32-bit field cannot hold."""
    seconds = member.mtime_ns // 1_000_000_000
    if not 0 <= seconds <= 0xFFFFFFFF:
        return b""
    return _UT.pack(0x5455, 5, 1, seconds)


def local_header(member: Member, crc: int) -> bytes:
    """*member*'s local file header (its bytes follow it, stored)."""
    name, flags = _name(member)
    zip64 = _local_extra(member)
    extra = zip64 + _timestamp(member)
    dos_time, dos_date = _dos_time(member.mtime_ns)
    size = _LIMIT if zip64 else member.size
    needed = 45 if zip64 else 20
    fixed = _LOCAL.pack(
        0x04034B50, needed, flags, 0, dos_time, dos_date, crc, size, size, len(name), len(extra)
    )
    return fixed + name + extra


def _local_size(member: Member) -> int:
    return _LOCAL.size + len(_name(member)[0]) + len(_local_extra(member)) + len(_timestamp(member))


def _central_extra(member: Member, offset: int) -> bytes:
    values = []
    if member.size >= _LIMIT:
        values += [member.size, member.size]
    if offset >= _LIMIT:
        values.append(offset)
    if not values:
        return b""
    return struct.pack(f"<HH{len(values)}Q", 1, 8 * len(values), *values)


def central_record(member: Member, crc: int, offset: int) -> bytes:
    """*member*'s record in the central directory (its local header at *offset*)."""
    name, flags = _name(member)
    zip64 = _central_extra(member, offset)
    extra = zip64 + _timestamp(member)
    dos_time, dos_date = _dos_time(member.mtime_ns)
    size = _LIMIT if member.size >= _LIMIT else member.size
    needed = 45 if zip64 else 20
    mode = stat.S_IFMT(member.mode) | (member.mode & PERMISSIONS)  # (no setuid: as in the tar)
    attributes = (mode << 16) | (0x10 if member.is_dir else 0)
    fixed = _CENTRAL.pack(
        0x02014B50,
        _UNIX_45,
        needed,
        flags,
        0,
        dos_time,
        dos_date,
        crc,
        size,
        size,
        len(name),
        len(extra),
        0,
        0,
        0,
        attributes,
        min(offset, _LIMIT),
    )
    return fixed + name + extra


def _central_size(member: Member, offset: int) -> int:
    return (
        _CENTRAL.size + len(_name(member)[0]) + len(_central_extra(member, offset)) + len(_timestamp(member))
    )


def end_records(entries: int, directory_start: int, directory_size: int) -> bytes:
    """The end of central directory record, after a ZIP64 one and its locator where needed."""
    zip64 = entries >= _ENTRIES_LIMIT or directory_start >= _LIMIT or directory_size >= _LIMIT
    out = b""
    if zip64:
        end64_at = directory_start + directory_size
        out = _ZIP64_END.pack(
            0x06064B50,
            _ZIP64_END.size - 12,
            _UNIX_45,
            45,
            0,
            0,
            entries,
            entries,
            directory_size,
            directory_start,
        ) + _ZIP64_LOCATOR.pack(0x07064B50, 0, end64_at, 1)
    count = min(entries, _ENTRIES_LIMIT)
    return out + _END.pack(
        0x06054B50, 0, 0, count, count, min(directory_size, _LIMIT), min(directory_start, _LIMIT), 0
    )


def _end_size(entries: int, directory_start: int, directory_size: int) -> int:
    zip64 = entries >= _ENTRIES_LIMIT or directory_start >= _LIMIT or directory_size >= _LIMIT
    return _END_LENGTH + (_ZIP64_END_LENGTH if zip64 else 0)


class ZipLayout(Layout):
    """A stored zip's parts (see the module)."""

    KIND = "zip"
    CONTENT_TYPE = "application/zip"
    NEEDS_CRC = True

    __slots__ = ()

    def _lay_out(self) -> array[int]:
        starts = array("q")
        at = 0
        members = self.members
        for m in members:
            starts.append(at)
            at += _local_size(m) + m.size
        directory_start = at
        for i, m in enumerate(members):
            starts.append(at)
            at += _central_size(m, starts[i])
        starts.append(at)  # (the end records)
        starts.append(at + _end_size(len(members), directory_start, at - directory_start))
        return starts

    def crc_index(self, part: int) -> int | None:
        n = len(self.members)
        return part % n if part < 2 * n else None

    def around(self, part: int, lo: int, hi: int, crc: int = 0) -> tuple[bytes, int, int, bytes]:
        members = self.members
        n = len(members)
        if part < n:
            member = members[part]
            header = local_header(member, crc)
            h = len(header)
            first, last = max(lo, h) - h, min(hi, h + member.size) - h
            return header[lo:hi], first, max(first, last), b""
        if part < 2 * n:
            return central_record(members[part - n], crc, self.starts[part - n])[lo:hi], 0, 0, b""
        directory_start = self.starts[n]
        records = end_records(n, directory_start, self.starts[2 * n] - directory_start)
        return records[lo:hi], 0, 0, b""
