"""A directory listing page, nginx-autoindex style (pure: the entries come from the file system port).

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
import time
from urllib.parse import quote

__all__ = ("listing_html",)

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
