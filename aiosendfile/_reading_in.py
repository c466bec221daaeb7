"""Which files this process is reading in from disk, and for how long pages may still be on the
way: a read started (a cold chunk sent or read in the pool, a read ahead asked) opens a window of
:data:`READING_IN_S` for its file, during which ``cachestat`` counts pages as cached that are not
yet, so every page of a chunk of that file is checked before it is sent on the loop. Pure state,
kept by (device, inode), bounded in entries; no asyncio.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

__all__ = ("READING_IN_FILES", "READING_IN_S", "reading_in", "started_reading")

#: How long after this process last started reading a file in (a chunk sent or read in the
#: cold-read pool, a read ahead asked) pages may still be on the way, which ``cachestat`` counts
#: as cached: on a slow device a read waits behind the others for a good part of a second
#: (docs/performance.md, "A slow disk"). Until then every page of a chunk of that file is checked
#: before it is sent on the loop.
READING_IN_S = 2.0
#: The files being read in are known by (device, inode), this many at most (about 200 bytes each:
#: 3 MiB): past it (a cold burst wider than that), every file is taken as being read in until the
#: window closes, and every page of every chunk is checked by a copy. At 4,096, one worker on the
#: 20,000-file cold set (about 2,500 files read in a second, 5,000 a window) passed it all the time:
#: three of four page-cache checks became such a copy (docs/performance.md, 2026-12-01).
READING_IN_FILES = 16384
_reading_in_until = 0.0  # when the last window closes (0.0: none was ever opened)
_every_file_until = 0.0  # a read of a file not known by its inode, or too many: every file's window
#: (device, inode): its window's end, oldest first (ordered: a plain dict emptied from its front
#: makes each look at its first entry skip every slot freed before it).
_files_reading_in: OrderedDict[tuple[int, int], float] = OrderedDict()
_reading_in_lock = threading.Lock()


def started_reading(fd: int | None = None, key: tuple[int, int] | None = None) -> None:
    """This process started reading a file in (*fd*'s, or the file *key* names, its device and
    inode: no ``fstat`` then; None: not known): pages may be on the way for a while, and only
    that file's (another connection's transfer of the same file checks every page:
    :func:`reading_in`)."""
    global _reading_in_until, _every_file_until
    until = time.monotonic() + READING_IN_S
    if key is None and fd is not None:
        try:
            st = os.fstat(fd)
        except OSError:
            pass
        else:
            key = (st.st_dev, st.st_ino)
    with _reading_in_lock:
        _reading_in_until = until
        files = _files_reading_in
        if key is None:
            _every_file_until = until
            return
        files[key] = until
        files.move_to_end(key)  # (so order is expiry order: every window lasts as long)
        now = until - READING_IN_S
        while files:  # the closed windows out, oldest first; and past the bound, open ones too
            oldest = next(iter(files))
            end = files[oldest]
            if end > now and len(files) <= READING_IN_FILES:
                break
            del files[oldest]
            if end > now:  # (a file forgotten while it may be read in: every file, to be safe)
                _every_file_until = until


def reading_in(fd: int | None = None, file_key: tuple[int, int] | None = None) -> bool:
    """Whether a read this process started may still be bringing pages in (:data:`READING_IN_S`):
    of the file *fd* (or *file_key*, its device and inode) if one is named, else of any file."""
    until = _reading_in_until
    if until == 0.0:
        return False
    now = time.monotonic()
    if now >= until:
        return False
    if now < _every_file_until or (fd is None and file_key is None):
        return True
    if file_key is None:
        try:
            st = os.fstat(fd)  # type: ignore[arg-type]
        except OSError:
            return True
        file_key = (st.st_dev, st.st_ino)
    end = _files_reading_in.get(file_key)
    return end is not None and now < end
