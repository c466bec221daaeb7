"""The hot small-file cache: recently served small files' bytes, valid while their ``stat`` is unchanged.

A hit saves the ``open``, the descriptor containment check, the ``fstat``, the read and the
``close``: a request for a hot small file costs one ``stat`` of its path. Doors memoise their
rendering of a plain 200 on the entry (:meth:`HotEntry.rendering`: a typed slot per door), so it
lives exactly as long as the identity-checked entry. A lock makes it safe for a door that decides in
a pool thread.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping

from .. import _lookup

__all__ = (
    "HOT_FILES_MAX_BYTES",
    "HOT_FILES_MAX_ENTRIES",
    "HotEntry",
    "HotFiles",
    "Rendering",
    "hot_files",
    "identity",
)

#: Small files kept in memory by :class:`HotFiles` (bodies up to ``inline_limit`` only), and the
#: bytes they are charged: body, path (a key: one file may be reached by several spellings of its
#: path, ``a/./b``), and ENTRY_OVERHEAD for the objects around them.
HOT_FILES_MAX_ENTRIES = 1024
HOT_FILES_MAX_BYTES = 16 * 1024 * 1024
ENTRY_OVERHEAD = 512
#: Once the cache is full, one file in this many that a door would read in (at its first answer
#: or back) is admitted: a working set larger than the cache is then sent from its files (as nginx
#: does) instead of copied in and evicted again each time, and a file that stays hot still gets in.
READMIT_EVERY = 32


#: What must not change for a cached body to stay valid: device, inode, size, mtime, ctime
#: (defined beside its compiled twin, ``_lookup.stat_identity``, which must give the same).
identity = _lookup.identity_of


class Rendering:
    """What is built for a plain 200 of one hot file, under one ``precompressed`` setting (the only
    input of those fields besides the file, which the entry's identity pins), shared by every
    spelling of its path. A slot is None until it is filled. (The engine's and the ASGI apps'
    renderings live in their answer caches: ``_answers.Decided``.)"""

    __slots__ = ("fields", "headers")

    def __init__(self) -> None:
        self.fields: list[tuple[str, str]] | None = None  # the static core's header fields
        self.headers: Mapping[str, str] | None = None  # the aiohttp door's (a CIMultiDict it copies)


class HotEntry:
    """One hot file: its identity, its bytes, its path, and each door's rendering of a plain 200
    (:meth:`rendering`), valid exactly as long as the entry: every value comes from the
    identity-checked stat. The renderings are made at the first door's asking: ``serve``'s
    engine answers hot files from its own answer cache and never asks, and a thousand entries
    then hold three thousand objects fewer for the garbage collector to walk."""

    __slots__ = ("_renderings", "body", "identity", "path")

    def __init__(self, identity: tuple[int, ...], body: bytes, path: str = "") -> None:
        self.identity, self.body, self.path = identity, body, path
        self._renderings: tuple[Rendering, Rendering] | None = None

    def rendering(self, precompressed: bool) -> Rendering:
        """The doors' renderings for a policy with (True) or without precompressed siblings.
        (Two threads asking at once may each make a pair; one is kept, and a rendering filled
        in the other is only made again.)"""
        renderings = self._renderings
        if renderings is None:
            renderings = self._renderings = (Rendering(), Rendering())
        return renderings[precompressed]


class HotFiles:
    """Small, recently served files: their validated identity and their bytes.

    An entry is used only while a ``stat`` of its path still shows the same file (any write or
    ``chmod`` changes ctime; a replacement by rename or a symlink swapped in is another inode).
    Containment was checked on the descriptor the bytes were read from, and it holds for that
    inode, under the same root (the key is ``(path, root)``). Bounded by entries and bytes (bodies,
    paths and an overhead each), least recently used out first (nginx's ``open_file_cache`` caches
    descriptors; this caches the small bodies too).
    """

    def __init__(
        self, max_entries: int = HOT_FILES_MAX_ENTRIES, max_bytes: int = HOT_FILES_MAX_BYTES
    ) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[tuple[str, str | None], HotEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._refused = 0  # read-backs declined since the last one admitted

    identity = staticmethod(identity)

    def admits(self, size: int) -> bool:
        """Whether a door should read a *size*-byte file into the cache (at its first answer, or
        back after its entry was dropped): yes while there is room, then one time in
        :data:`READMIT_EVERY` (no lock: a lost count only shifts which read is admitted)."""
        if len(self._entries) < self.max_entries and self._bytes + size + ENTRY_OVERHEAD <= self.max_bytes:
            return True
        self._refused += 1
        if self._refused < READMIT_EVERY:
            return False
        self._refused = 0
        return True

    def get(self, path: str, root: str | None, st: os.stat_result) -> bytes | None:
        """The cached bytes of *path* (checked under *root*) if *st* still shows the same file."""
        entry = self.entry(path, root, st)
        return None if entry is None else entry.body

    def entry(self, path: str, root: str | None, st: os.stat_result) -> HotEntry | None:
        """:meth:`get`, with the whole entry."""
        key = (path, root)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.identity != identity(st):
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return entry

    def body(self, path: str, root: str | None, ident: tuple[int, ...]) -> bytes | None:
        """The cached bytes of *path* (checked under *root*) if its entry has the identity *ident*
        (the caller checks that the path still names that file, with a ``stat``).

        For the event loop's hot path: no lock. Each ``OrderedDict`` operation is atomic under the
        GIL, and a :meth:`put` in a pool thread between the two only makes the reorder miss."""
        key = (path, root)
        entry = self._entries.get(key)
        if entry is None or entry.identity != ident:
            return None
        try:  # noqa: SIM105 (contextlib.suppress costs more than the lookup, on every hot request)
            self._entries.move_to_end(key)
        except KeyError:  # dropped by a put meanwhile: the bytes are still this identity's
            pass
        return entry.body

    def put(self, path: str, root: str | None, ident: tuple[int, ...], body: bytes) -> HotEntry | None:
        """Keep *body* as *path*'s bytes while its file has the identity *ident* (:func:`identity`);
        the new entry, or None if not kept."""
        if len(body) != ident[2] or len(body) > self.max_bytes // 16:
            return None
        entry = HotEntry(ident, body, path)
        with self._lock:
            self._drop((path, root))
            self._entries[(path, root)] = entry
            self._bytes += _cost(entry)
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._bytes -= _cost(old)
        return entry

    def _drop(self, key: tuple[str, str | None]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= _cost(entry)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _cost(entry: HotEntry) -> int:
    return len(entry.body) + len(entry.path) + ENTRY_OVERHEAD


#: The process's cache of hot small files (one per process: workers do not share memory).
hot_files = HotFiles()
