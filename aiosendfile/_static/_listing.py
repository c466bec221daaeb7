"""A directory listing page, nginx-autoindex style, and the cache of the pages built recently.

The page is pure (the entries come from the file system port). Building one can take ten
thousand ``stat`` calls, so the core keeps the pages it built in :data:`listings` for
``LISTING_SECONDS``, checked against the directory's own ``stat`` (an entry added, removed or
renamed changes its mtime), bounded by entries and bytes (page and key); a door builds a page in
its pool, never on the loop (``_fs.DecideInPool``).

A parent link except at the root; directories first and with a trailing ``/``, then files, each
sorted by name (bytes), with a size (``-`` for directories, ``ls -h`` style otherwise) and a UTC
modification date. Only what a request could fetch is listed: no dotfile unless they are served,
no name with a backslash (the scan already left out broken symlinks and symlinks out of the root).
Names are escaped, links percent-encoded from the name's bytes.
"""

from __future__ import annotations

import html
import os
import stat
import threading
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import quote

__all__ = (
    "LISTINGS_MAX_BYTES",
    "LISTINGS_MAX_ENTRIES",
    "LISTING_SECONDS",
    "Listings",
    "listing_html",
    "listings",
)

#: A page built this recently is served again while its directory's stat is unchanged (a file in
#: it that changes size or date shows within this delay; a name added or removed at once).
LISTING_SECONDS = 1.0
#: Pages kept at most, and their bytes (pages and keys) at most.
LISTINGS_MAX_ENTRIES = 64
LISTINGS_MAX_BYTES = 16 * 1024 * 1024

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def listing_html(
    shown_path: bytes, at_root: bool, entries: list[tuple[str, os.stat_result]], dotfiles: bool
) -> bytes:
    """The page for a directory requested as *shown_path* (the decoded request path's bytes)."""
    title = html.escape(f"Index of {_display(shown_path)}")
    rows = []
    if not at_root:
        rows.append('<tr><td><a href="../">../</a></td><td></td><td class="size"></td></tr>')
    shown = []
    for name, st in entries:
        if name.startswith(".") and not dotfiles:
            continue
        if "\\" in name:  # refused by the path rules: nothing to fetch
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        shown.append((not is_dir, os.fsencode(name), is_dir, st))
    shown.sort(key=lambda e: e[:2])
    for _, raw, is_dir, st in shown:
        slash = "/" if is_dir else ""
        href = html.escape(quote(raw) + slash)
        size = "-" if is_dir else _human_size(st.st_size)
        rows.append(
            f'<tr><td><a href="{href}">{html.escape(_display(raw) + slash)}</a></td>'
            f'<td>{_listing_date(st.st_mtime)}</td><td class="size">{size}</td></tr>'
        )
    page = (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{title}</title>\n<style>td{{padding:0 1em 0 0}}.size{{text-align:right}}</style>"
        f"</head>\n<body><h1>{title}</h1>\n<table>\n"
        "<tr><th>Name</th><th>Last modified (UTC)</th><th class='size'>Size</th></tr>\n"
        + "\n".join(rows)
        + "\n</table></body></html>\n"
    )
    return page.encode()


def _display(raw: bytes) -> str:
    """A file name's bytes as text to show: UTF-8, anything else as U+FFFD."""
    return raw.decode("utf-8", "replace")


def _listing_date(mtime: float) -> str:
    """As nginx's autoindex: ``24-Nov-2026 03:21`` (UTC, English month whatever the locale)."""
    t = time.gmtime(mtime)
    return f"{t.tm_mday:02d}-{_MONTHS[t.tm_mon - 1]}-{t.tm_year} {t.tm_hour:02d}:{t.tm_min:02d}"


def _human_size(size: int) -> str:
    """``ls -h`` style: 512, 1.5K, 12K, 3.4M, 2.0G (powers of 1024)."""
    if size < 1024:
        return str(size)
    value = float(size)
    for unit in "KMGTPE":
        value /= 1024
        if value < 1023.95 or unit == "E":
            return f"{value:.1f}{unit}" if value < 9.95 else f"{value:.0f}{unit}"
    raise AssertionError("unreachable")


class Listings:
    """Listing pages built recently: key → (the directory's stat identity, when, page); bounded by
    entries and by bytes (page and key), least recently built out first. Pool threads put, the loop
    gets: a lock."""

    def __init__(
        self,
        seconds: float = LISTING_SECONDS,
        max_entries: int = LISTINGS_MAX_ENTRIES,
        max_bytes: int = LISTINGS_MAX_BYTES,
    ) -> None:
        self.seconds, self.max_entries, self.max_bytes = seconds, max_entries, max_bytes
        self._pages: OrderedDict[Any, tuple[tuple[int, ...], float, bytes, int]] = OrderedDict()
        self.size = 0
        self._lock = threading.Lock()

    @staticmethod
    def identity(st: os.stat_result) -> tuple[int, ...]:
        """What changes when the directory's entries do (or the directory is replaced)."""
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def get(self, key: Any, st: os.stat_result) -> bytes | None:
        """The page built for *key* less than ``seconds`` ago for the directory *st* describes."""
        with self._lock:
            held = self._pages.get(key)
            if held is None:
                return None
            ident, when, page, _ = held
            if ident == self.identity(st) and time.monotonic() - when < self.seconds:
                return page
            self._drop(key)
            return None

    def put(self, key: Any, st: os.stat_result, page: bytes, key_bytes: int) -> None:
        """Keep *page* for *key* (charged its length and *key_bytes*), built from the directory *st*."""
        cost = len(page) + key_bytes + 256
        if cost > self.max_bytes // 4:
            return
        with self._lock:
            self._drop(key)
            self._pages[key] = (self.identity(st), time.monotonic(), page, cost)
            self.size += cost
            while len(self._pages) > self.max_entries or self.size > self.max_bytes:
                self.size -= self._pages.popitem(last=False)[1][3]

    def _drop(self, key: Any) -> None:
        held = self._pages.pop(key, None)
        if held is not None:
            self.size -= held[3]

    def clear(self) -> None:
        with self._lock:
            self._pages.clear()
            self.size = 0

    def __len__(self) -> int:
        return len(self._pages)


#: The process's listing pages (one per process, as the hot file cache).
listings = Listings()
