"""A directory listing, as a page people use or as JSON, and the cache of those built recently.

Pure (the entries come from the file system port). Building one can take ten thousand ``stat``
calls, so the core keeps what it built in :data:`listings` for ``LISTING_SECONDS``, checked
against the directory's own ``stat`` (an entry added, removed or renamed changes its mtime),
bounded by entries and bytes (page and key); a door builds one in its pool, never on the loop
(``_fs.DecideInPool``).

The page: breadcrumbs (each a relative link, right behind a proxy's prefix too), a parent link
except at the root, directories first, then files; name, UTC modification date and size
(``ls -h`` style, the exact bytes in its tooltip); column headings that sort by name, date or
size, either way (``?sort=size&order=desc``: links, no script); a viewport for phones. Only what
a request could fetch is listed: no dotfile unless they are served, no name with a backslash
(the scan already left out broken symlinks and symlinks out of the root). Every name is escaped
as text and percent-encoded from its bytes as a link: no markup in a name ever runs.

The JSON (``?json``, or an ``Accept`` that prefers ``application/json``): the path and the
entries in the same order, each with its ``name`` (U+FFFD for bytes that are not UTF-8), its
``href`` (the name's bytes percent-encoded: what fetches it), ``type`` (``dir``/``file``),
``size`` (bytes; null for a directory) and ``mtime`` (seconds since the epoch, UTC).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import stat
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple
from urllib.parse import quote

from ._paths import RESERVED

__all__ = (
    "LISTING_POLICY",
    "LISTINGS_MAX_BYTES",
    "LISTINGS_MAX_ENTRIES",
    "DEFAULT_VIEW",
    "LISTING_SECONDS",
    "Listings",
    "View",
    "listing_html",
    "listing_json",
    "view_of",
)

#: A page built this recently is served again while its directory's stat is unchanged (a file in
#: it that changes size or date shows within this delay; a name added or removed at once).
LISTING_SECONDS = 1.0
#: Pages kept at most, and their bytes (pages and keys) at most.
LISTINGS_MAX_ENTRIES = 64
LISTINGS_MAX_BYTES = 16 * 1024 * 1024

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SORTS = ("name", "date", "size")
_HEADINGS = (("name", "Name", ""), ("date", "Last modified (UTC)", "date"), ("size", "Size", "size"))

_STYLE = (
    "body{font:15px/1.4 system-ui,sans-serif;margin:1em auto;max-width:60em;padding:0 .6em;"
    "color:#222;background:#fff}"
    "h1{font-size:1.2em;font-weight:600;overflow-wrap:anywhere}h1 a{text-decoration:none}"
    "table{border-collapse:collapse;width:100%}"
    "th,td{padding:.3em .6em .3em 0;text-align:left;vertical-align:top}"
    "th{border-bottom:1px solid #ccc;white-space:nowrap}th a{color:inherit}"
    "td:first-child{overflow-wrap:anywhere}tbody tr:hover{background:#f3f6fa}"
    ".date,.size{white-space:nowrap}.size{text-align:right}a{color:#0550ae}"
    "@media (max-width:36em){.date{display:none}}"
    "@media (prefers-color-scheme:dark){body{color:#ddd;background:#161616}a{color:#79b8ff}"
    "th{border-color:#444}tbody tr:hover{background:#222}}"
)
_FORM_STYLE = (
    "form{margin:0 0 1em;display:flex;flex-wrap:wrap;gap:.5em;align-items:center}"
    "progress{width:12em}body.drop{outline:3px dashed #0550ae;outline-offset:-4px}"
)


class View(NamedTuple):
    """How a listing is asked for: as JSON or a page, sorted by which column, which way."""

    json: bool = False
    sort: str = "name"
    descending: bool = False


#: A page, by name, A to Z.
DEFAULT_VIEW = View()


def view_of(raw_query: bytes, accept: str | None) -> View:
    """The view a request asks for: ``json`` in the query or an ``Accept`` preferring JSON to
    HTML; ``sort`` (name, date, size) and ``order`` (asc, desc) from the query. Anything else in
    the query is ignored, as an unknown value is (the default stays)."""
    as_json = accept is not None and _prefers_json(accept)
    sort, descending = "name", False
    if raw_query:
        for pair in raw_query.split(b"&"):
            name, _, value = pair.partition(b"=")
            if name == b"json":
                as_json = True
            elif name == b"sort" and value.decode("latin-1") in _SORTS:
                sort = value.decode("latin-1")
            elif name == b"order" and value in (b"asc", b"desc"):
                descending = value == b"desc"
    return View(as_json, sort, descending)


def _prefers_json(accept: str) -> bool:
    """Whether ``application/json`` has a higher weight in *accept* than ``text/html`` (and than
    ``*/*`` when HTML is not named): browsers name HTML; ``curl -H 'Accept: application/json'``
    and API clients name JSON."""
    weights: dict[str, float] = {}
    for item in accept.split(","):
        media, *params = item.split(";")
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[media.strip().lower()] = max(q, weights.get(media.strip().lower(), 0.0))
    json_q = weights.get("application/json", 0.0)
    html_q = weights.get("text/html", weights.get("text/*", weights.get("*/*", 0.0)))
    return json_q > 0 and json_q > html_q


def _shown(
    entries: list[tuple[str, os.stat_result]], dotfiles: bool, view: View
) -> list[tuple[bytes, bool, os.stat_result]]:
    """(name's bytes, is a directory, stat) of what is listed, in *view*'s order (directories
    first either way)."""
    shown = []
    for name, st in entries:
        if name.startswith(".") and (not dotfiles or name[:8].lower() == RESERVED):
            continue
        if "\\" in name:  # refused by the path rules: nothing to fetch
            continue
        shown.append((os.fsencode(name), stat.S_ISDIR(st.st_mode), st))
    if view.sort == "size":
        shown.sort(key=lambda e: (0 if e[1] else e[2].st_size, e[0]))
    elif view.sort == "date":
        shown.sort(key=lambda e: (e[2].st_mtime, e[0]))
    else:
        shown.sort(key=lambda e: e[0])
    if view.descending:
        shown.reverse()
    shown.sort(key=lambda e: not e[1])  # (stable: directories first, each group in its order)
    return shown


def listing_json(
    shown_path: bytes, entries: list[tuple[str, os.stat_result]], dotfiles: bool, view: View = DEFAULT_VIEW
) -> bytes:
    """The listing as JSON (see the module docstring)."""
    items = [
        {
            "name": _display(raw),
            "href": quote(raw) + ("/" if is_dir else ""),
            "type": "dir" if is_dir else "file",
            "size": None if is_dir else st.st_size,
            "mtime": int(st.st_mtime),
        }
        for raw, is_dir, st in _shown(entries, dotfiles, view)
    ]
    return json.dumps({"path": _display(shown_path), "entries": items}, ensure_ascii=False).encode()


#: The upload form (``upload_form``): without script, a plain form post of the files chosen (the
#: answer, 303, comes back to this page); with it, files dropped anywhere on the page or chosen
#: are sent one request each, with a progress bar, then the page reloads. Names are shown with
#: textContent: never as markup.
_FORM = (
    '<form id="upload" method="post" enctype="multipart/form-data">'
    '<input type="file" name="file" multiple aria-label="Files to upload">'
    '<button type="submit">Upload</button>'
    '<progress hidden max="1" value="0"></progress><span id="upload-status" role="status"></span>'
    "</form>\n"
)
_FORM_RESUMABLE = _FORM.replace('<form id="upload"', '<form id="upload" data-resumable')
#: With resumable uploads (``data-resumable``), each file is a resumable upload of the IETF draft's:
#: made by a PUT with ``Upload-Complete: ?0``, sent by one PATCH; a dropped connection (or a 409,
#: 423, or a 5xx that may pass) is retried with a HEAD for the offset, then a PATCH of the rest:
#: eight times with growing pauses, counted afresh only when the upload got further.
_SCRIPT = """<script>
(function () {
  var form = document.getElementById("upload"), input = form.querySelector("input");
  var bar = form.querySelector("progress"), said = document.getElementById("upload-status");
  var resumable = form.hasAttribute("data-resumable");
  function send(files) {
    var list = Array.prototype.slice.call(files), total = 0, done = 0, i = 0;
    if (!list.length) return;
    list.forEach(function (f) { total += f.size; });
    bar.hidden = false;
    function show(file, sent) {
      bar.value = total ? Math.min(1, (done + Math.min(sent, file.size)) / total) : 1;
      said.textContent = file.name + " " + Math.round(100 * bar.value) + "%";
    }
    function failed(file, x) {
      var why = x && x.status ? x.status + " " + x.statusText : "the upload failed";
      said.textContent = file.name + ": " + why;
    }
    function next() {
      if (i >= list.length) { said.textContent = "Uploaded"; location.reload(); return; }
      var file = list[i++];
      (resumable ? resumably : whole)(file, function () { done += file.size; next(); });
    }
    function whole(file, then) {
      var data = new FormData(), x = new XMLHttpRequest();
      data.append("file", file, file.name);
      x.open("POST", location.pathname);
      x.upload.onprogress = function (e) { show(file, e.loaded); };
      x.onload = function () { if (x.status >= 400) failed(file, x); else then(); };
      x.onerror = function () { failed(file); };
      x.send(data);
    }
    function resumably(file, then) {
      var where = null, tries = 0, reached = -1, last = null;
      function ask(method, url, fields, body, at, ok) {
        var x = new XMLHttpRequest();
        x.open(method, url);
        x.setRequestHeader("Upload-Draft-Interop-Version", "8");
        Object.keys(fields).forEach(function (k) { x.setRequestHeader(k, fields[k]); });
        if (body) x.upload.onprogress = function (e) { show(file, at + e.loaded); };
        x.onload = function () {
          last = x;
          if (x.status == 423 || (x.status >= 500 && x.status != 501 && x.status != 507)) retry(); else ok(x);
        };
        x.onerror = x.ontimeout = function () { last = null; retry(); };
        x.send(body);
      }
      function retry() {
        if (++tries > 8) { failed(file, last); return; }
        said.textContent = file.name + ": the connection dropped, resuming";
        setTimeout(where ? probe : create, Math.min(30000, 250 * Math.pow(2, tries)));
      }
      function create() {
        var fields = {"Upload-Complete": "?0", "Upload-Length": String(file.size)};
        ask("PUT", location.pathname + encodeURIComponent(file.name), fields, null, 0, function (x) {
          where = x.status == 201 && x.getResponseHeader("Location");
          if (!where) { failed(file, x); return; }
          // (its last step, from this page's folder: a proxy in front may strip a prefix)
          var q = where.indexOf("?"), path = q < 0 ? where : where.slice(0, q);
          where = location.pathname + path.slice(path.lastIndexOf("/") + 1) + (q < 0 ? "" : where.slice(q));
          append(0);
        });
      }
      function probe() {
        ask("HEAD", where, {}, null, 0, function (x) {
          var at = parseInt(x.getResponseHeader("Upload-Offset"), 10);
          if (x.status >= 400 || isNaN(at)) { failed(file, x); return; }
          if (x.getResponseHeader("Upload-Complete") == "?1") { then(); return; }
          if (at > reached) { reached = at; tries = 0; }  // (only progress earns more tries)
          append(at);
        });
      }
      function append(at) {
        var fields = {"Content-Type": "application/partial-upload", "Upload-Offset": String(at),
                      "Upload-Complete": "?1"};
        ask("PATCH", where, fields, file.slice(at), at, function (x) {
          if (x.status == 409) retry(); else if (x.status >= 400) failed(file, x); else then();
        });
      }
      create();
    }
    next();
  }
  form.addEventListener("submit", function (e) { e.preventDefault(); send(input.files); });
  var body = document.body;
  body.addEventListener("dragover", function (e) { e.preventDefault(); body.classList.add("drop"); });
  body.addEventListener("dragleave", function () { body.classList.remove("drop"); });
  body.addEventListener("drop", function (e) {
    e.preventDefault();
    body.classList.remove("drop");
    send(e.dataTransfer.files);
  });
})();
</script>
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


#: The folder as an archive (``archives``): the whole tree below, as ``_archive`` lays it out.
_ARCHIVE_LINK = (
    '<p class="archive">Download this folder: <a href="?tar" download>tar</a> '
    '<a href="?zip" download>zip</a></p>\n'
)


def _policy(upload_form: bool) -> str:
    """The page's ``Content-Security-Policy``: its own style and script, by their hashes, and
    nothing else (no other script, no plugin, no frame around it, forms and requests to its
    own origin only): a name shown on it cannot become markup that runs."""
    style = _STYLE + (_FORM_STYLE if upload_form else "")
    script = _SCRIPT[len("<script>") : -len("</script>\n")]
    return (
        "default-src 'none'; "
        + (f"script-src {_sha256(script)}; connect-src 'self'; " if upload_form else "")
        + f"style-src {_sha256(style)}; img-src 'self'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'"
    )


#: ``Content-Security-Policy`` of a listing page (index: with the upload form).
LISTING_POLICY = (_policy(False), _policy(True))


def listing_html(
    shown_path: bytes,
    at_root: bool,
    entries: list[tuple[str, os.stat_result]],
    dotfiles: bool,
    view: View = DEFAULT_VIEW,
    upload_form: bool = False,
    archives: bool = False,
    resumable: bool = False,
    prefix: str = "",
) -> bytes:
    """The page (see the module docstring); with *upload_form*, a form that uploads files here
    (*resumable*: its script sends each as a resumable upload); with *archives*, links that
    download the folder as a tar or zip archive (``?tar``, ``?zip``); *prefix*: the mount's, whose
    levels the breadcrumbs do not link."""
    title = html.escape(f"Index of {_display(shown_path)}")
    rows = []
    if not at_root:
        rows.append('<tr><td><a href="../">../</a></td><td class="date"></td><td class="size"></td></tr>')
    for raw, is_dir, st in _shown(entries, dotfiles, view):
        slash = "/" if is_dir else ""
        href = html.escape(quote(raw) + slash)
        if is_dir:
            size = '<td class="size">-</td>'
        else:
            size = f'<td class="size" title="{st.st_size} bytes">{_human_size(st.st_size)}</td>'
        rows.append(
            f'<tr><td><a href="{href}">{html.escape(_display(raw) + slash)}</a></td>'
            f'<td class="date">{_listing_date(st.st_mtime)}</td>{size}</tr>'
        )
    headings = []
    for sort, label, css in _HEADINGS:
        descending = sort == view.sort and not view.descending  # (a second click turns it)
        mark = (" \u25be" if view.descending else " \u25b4") if sort == view.sort else ""
        order = "desc" if descending else "asc"
        cls = f' class="{css}"' if css else ""
        headings.append(f'<th{cls}><a href="?sort={sort}&amp;order={order}">{label}</a>{mark}</th>')
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title}</title>\n<style>{_STYLE}{_FORM_STYLE if upload_form else ''}</style>\n"
        f"</head>\n<body>\n<h1>Index of {_breadcrumbs(shown_path, prefix)}</h1>\n"
        + ((_FORM_RESUMABLE if resumable else _FORM) if upload_form else "")
        + (_ARCHIVE_LINK if archives else "")
        + f"<table>\n<thead><tr>{''.join(headings)}</tr></thead>\n<tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table>\n"
        + (_SCRIPT if upload_form else "")
        + "</body></html>\n"
    )
    return page.encode()


def _breadcrumbs(shown_path: bytes, prefix: str = "") -> str:
    """``/a/b/`` as links to ``/``, ``/a/`` and ``/a/b/``, each relative (``../../``, ``../``,
    ``./``): right wherever the server is mounted. Under a mount *prefix* (``/files``), the
    levels above the served tree are text, not links out of it (its root is the prefix's last)."""
    parts = [p for p in shown_path.split(b"/") if p]
    mounted = sum(1 for p in prefix.split("/") if p)
    up = len(parts)
    crumbs = ["/" if mounted else f'<a href="{"../" * up or "./"}">/</a>']
    for i, part in enumerate(parts):
        name = html.escape(_display(part))
        if i < mounted - 1:
            crumbs.append(f"{name}/")
        else:
            crumbs.append(f'<a href="{"../" * (up - i - 1) or "./"}">{name}</a>/')
    return "".join(crumbs)


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
