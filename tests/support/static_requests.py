"""The static-file golden requests: one fixture tree, ~70 raw requests, and how to compare answers.

Every door that serves a directory (the aiohttp plugin in an ``Application`` or on ``web.Server``,
the native engine) must give these requests the same status line, headers (but ``Date`` and
``Server``) and body. ``tests/static/test_static_golden.py`` records the plugin's answers in
``tests/data/static_golden.json``; a door's differential test sends the same bytes.

* ``build_tree(tmp)`` makes the served directory (``tmp/public``) and, beside it, ``tmp/outside``
  (a symlink target that must stay hidden). Every mtime is fixed, so ETags, ``Last-Modified``
  and listing dates do not depend on when the tree was made.
* ``POLICIES`` names the directory policies, as ``StaticResource`` keyword arguments.
* ``requests(policy, prefix)`` lists ``(name, raw request bytes)`` for that policy, with the
  mount *prefix* (``b""`` at the root, ``b"/static"`` under a prefix) in every target.
* ``normalise(raw)`` turns a raw response into a comparable dict.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

__all__ = (
    "GOLDEN_PATH",
    "KNOWN_DIFFERENCES",
    "POLICIES",
    "STAMP_NS",
    "build_tree",
    "etag_of",
    "normalise",
    "requests",
)

#: The recorded table: the plugin's answers to these requests (``tests/static/test_static_golden.py``).
GOLDEN_PATH = Path(__file__).resolve().parent.parent / "data" / "static_golden.json"

#: Requests whose recorded plugin answer is aiohttp's quirk, not the static core's rule.
KNOWN_DIFFERENCES = {
    # yarl's raw_query_string decodes %2F: the plugin's 301 says ``Location: /sub/?q=a/b``; the
    # core, given the query as sent, keeps ``?q=a%2Fb`` (as nginx does).
    "dir-query-pct-slash": "aiohttp decodes %2F in the query of a directory's 301 Location",
}

#: Every file's and directory's mtime: 2026-11-24 03:21:00 UTC, plus a fraction (in ETags only).
STAMP_NS = 1_795_490_460 * 10**9 + 123_456_789
STAMP_HTTP = "Tue, 24 Nov 2026 03:21:00 GMT"
EARLIER_HTTP = "Sun, 06 Nov 1994 08:49:37 GMT"
LATER_HTTP = "Fri, 01 Jan 2100 00:00:00 GMT"

RAW_NAME = b"caf\xe9-\xff.txt"  # Latin-1 bytes: not valid UTF-8

SMALL = b"small file\n" * 40  # 440 bytes
LARGE_SIZE = 200 * 1024 + 7  # above the 64 KiB inline limit: goes through sendfile


def large_bytes() -> bytes:
    return bytes(range(256)) * (LARGE_SIZE // 256) + bytes(range(LARGE_SIZE % 256))


#: ``StaticResource`` keyword arguments of each policy the requests run under.
POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "listing": {"show_index": True},
    "open": {"show_dotfiles": True, "follow_symlinks": True},
}

_FILES: dict[str, bytes] = {
    "a.txt": SMALL,
    "empty.txt": b"",
    "page.html": b"<!DOCTYPE html><title>page</title>\n" + b"<p>para</p>\n" * 800,  # ~9.6 KiB
    "data.json": b'{"k": [1, 2, 3]}\n',
    "archive.tar.gz": b"\x1f\x8b\x08\x00not really gzip",
    "style.css": b"body { color: red }\n" * 20,
    "style.css.gz": b"\x1f\x8b GZ of style.css",
    "style.css.br": b"BR of style.css",
    "app.js": b"console.log('x');\n" * 30,
    "app.js.gz": b"\x1f\x8b GZ of app.js",
    "space name.txt": b"spaced\n",
    "100%.txt": b"percent\n",
    '<odd & "name">.txt': b"odd\n",
    ".env": b"TOKEN=secret\n",
    ".git/config": b"[core] secret\n",
    ".well-known/security.txt": b"Contact: x\n",
    ".well-known/.hidden": b"hidden\n",
    "sub/b.txt": b"b" * 1536,
    "sub/.ssh/id_rsa": b"key\n",
    "sub/deeper/c.txt": b"c\n",
    "withindex/index.html": b"<h1>index</h1>\n",
    "withindex/other.txt": b"other\n",
}


def build_tree(tmp: Path) -> Path:
    """Make ``tmp/public`` (returned) and ``tmp/outside``; fix every mtime to :data:`STAMP_NS`."""
    public, outside = tmp / "public", tmp / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.txt").write_bytes(b"SECRET outside\n")
    public.mkdir()
    for name, body in _FILES.items():
        path = public / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    (public / "large.bin").write_bytes(large_bytes())
    with open(os.fsencode(public) + b"/" + RAW_NAME, "wb") as f:
        f.write(b"raw bytes name\n")
    (public / "space dir").mkdir()
    (public / "space dir" / "x.txt").write_bytes(b"x\n")
    raw_dir = os.fsencode(public) + b"/caf\xe9-dir"
    os.mkdir(raw_dir)
    with open(raw_dir + b"/" + RAW_NAME, "wb") as f:
        f.write(b"raw in raw\n")
    (public / "in-link.txt").symlink_to("a.txt")
    (public / "out-link.txt").symlink_to(outside / "secret.txt")
    (public / "out-dir").symlink_to(outside)
    (public / "broken-link").symlink_to(public / "nowhere")
    os.mkfifo(public / "fifo")
    for directory, dirs, files in os.walk(tmp, topdown=False):
        for name in [*files, *dirs]:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.utime(path, ns=(STAMP_NS, STAMP_NS))
        os.utime(directory, ns=(STAMP_NS, STAMP_NS))
    return public


def etag_of(size: int) -> str:
    """The strong ETag of a tree file of *size* bytes (written from the rule, not the server's code)."""
    return f'"{STAMP_NS:x}-{size:x}"'


def _req(target: bytes, *headers: str, method: bytes = b"GET") -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers).encode("latin-1")
    return method + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + extra + b"\r\n"


def requests(policy: str = "default", prefix: bytes = b"") -> list[tuple[str, bytes]]:
    """``(name, raw request)`` for *policy*, every target under the mount *prefix*."""
    p = prefix
    if policy == "listing":
        return [
            ("listing-root", _req(p + b"/")),
            ("listing-sub", _req(p + b"/sub/")),
            ("listing-sub-head", _req(p + b"/sub/", method=b"HEAD")),
            ("listing-query", _req(p + b"/sub/?sort=x")),
            ("listing-index-wins", _req(p + b"/withindex/")),
            ("listing-dot-dir", _req(p + b"/.git/")),
            ("listing-sub-no-slash", _req(p + b"/sub")),
            ("listing-pct-slash", _req(p + b"/sub%2F")),
            ("listing-pct-name", _req(p + b"/sp%61ce%20dir/")),
            ("listing-raw-name", _req(p + b"/caf%E9-dir/")),
        ]
    if policy == "open":
        return [
            ("open-dotfile", _req(p + b"/.env")),
            ("open-dot-dir-file", _req(p + b"/.git/config")),
            ("open-symlink-out", _req(p + b"/out-link.txt")),
            ("open-symlink-dir-out", _req(p + b"/out-dir/secret.txt")),
            ("open-pct-dotdot", _req(p + b"/%2e%2e/outside/secret.txt")),
        ]
    small, large, css = etag_of(len(SMALL)), etag_of(LARGE_SIZE), etag_of(len(_FILES["style.css"]))
    return [
        # plain files
        ("get-small", _req(p + b"/a.txt")),
        ("get-small-again", _req(p + b"/a.txt")),  # from the hot cache now
        ("head-small", _req(p + b"/a.txt", method=b"HEAD")),
        ("get-empty", _req(p + b"/empty.txt")),
        ("head-empty", _req(p + b"/empty.txt", method=b"HEAD")),
        ("get-large", _req(p + b"/large.bin")),
        ("head-large", _req(p + b"/large.bin", method=b"HEAD")),
        ("get-html", _req(p + b"/page.html")),
        ("get-json", _req(p + b"/data.json")),
        ("get-tar-gz", _req(p + b"/archive.tar.gz")),
        ("get-query-ignored", _req(p + b"/a.txt?v=1")),
        # directories
        ("dir-no-slash", _req(p + b"/sub")),
        ("dir-no-slash-query", _req(p + b"/sub?x=1&y=%20")),
        ("dir-no-slash-head", _req(p + b"/sub", method=b"HEAD")),
        ("dir-index", _req(p + b"/withindex/")),
        ("dir-index-no-slash", _req(p + b"/withindex")),
        ("dir-no-index", _req(p + b"/sub/")),
        ("dir-root", _req(p + b"/")),
        ("dir-pct-slash", _req(p + b"/sub%2F")),
        ("dir-pct-name-no-slash", _req(p + b"/space%20dir?q=%20")),
        ("dir-query-pct-slash", _req(p + b"/sub?q=a%2Fb")),  # see KNOWN_DIFFERENCES
        ("dir-raw-name-no-slash", _req(p + b"/caf%E9-dir")),
        ("file-with-slash", _req(p + b"/a.txt/")),
        ("missing", _req(p + b"/nope.txt")),
        ("missing-head", _req(p + b"/nope.txt", method=b"HEAD")),
        ("fifo", _req(p + b"/fifo")),
        ("broken-link", _req(p + b"/broken-link")),
        # dotfiles
        ("dotfile", _req(p + b"/.env")),
        ("dot-dir-file", _req(p + b"/.git/config")),
        ("dot-dir", _req(p + b"/.git")),
        ("dot-pct", _req(p + b"/%2egit/config")),
        ("dot-nested", _req(p + b"/sub/.ssh/id_rsa")),
        ("well-known", _req(p + b"/.well-known/security.txt")),
        ("well-known-hidden", _req(p + b"/.well-known/.hidden")),
        ("dot-segment", _req(p + b"/./a.txt")),
        # hostile spellings
        ("pct-dotdot", _req(p + b"/%2e%2e/outside/secret.txt")),
        ("pct-dotdot-deep", _req(p + b"/sub/%2e%2e/%2e%2e/outside/secret.txt")),
        ("pct-dotdot-upper", _req(p + b"/%2E%2E/outside/secret.txt")),
        ("pct-slash-dotdot", _req(p + b"/sub%2f..%2f..%2foutside%2fsecret.txt")),
        ("raw-dotdot", _req(p + b"/../outside/secret.txt")),
        ("nul", _req(p + b"/a.txt%00.html")),
        ("backslash", _req(p + b"/sub%5c..%5ca.txt")),
        ("double-slash", _req(p + b"//a.txt")),
        ("double-slash-abs", _req(p + b"//etc/passwd")),
        ("non-utf8", _req(p + b"/caf%E9-%FF.txt")),
        ("pct-space", _req(p + b"/space%20name.txt")),
        ("pct-percent", _req(p + b"/100%25.txt")),
        ("double-encoded", _req(p + b"/space%2520name.txt")),
        ("odd-name", _req(p + b"/%3Codd%20%26%20%22name%22%3E.txt")),
        # methods
        ("post", _req(p + b"/a.txt", "Content-Length: 0", method=b"POST")),
        ("delete", _req(p + b"/a.txt", method=b"DELETE")),
        ("options-missing", _req(p + b"/nope.txt", method=b"OPTIONS")),
        # ranges
        ("range-single", _req(p + b"/large.bin", "Range: bytes=0-9")),
        ("range-suffix-small", _req(p + b"/a.txt", "Range: bytes=-5")),
        ("range-open", _req(p + b"/large.bin", "Range: bytes=204790-")),
        ("range-multi", _req(p + b"/large.bin", "Range: bytes=0-0,100-199,-3")),
        ("range-multi-small", _req(p + b"/a.txt", "Range: bytes=0-1,10-12")),
        ("range-coalesced", _req(p + b"/a.txt", "Range: bytes=0-5,3-9")),
        ("range-unsatisfiable", _req(p + b"/large.bin", "Range: bytes=999999-")),
        ("range-empty-file", _req(p + b"/empty.txt", "Range: bytes=0-")),
        ("range-invalid", _req(p + b"/a.txt", "Range: bytes=abc")),
        ("range-head", _req(p + b"/large.bin", "Range: bytes=0-9", method=b"HEAD")),
        ("if-range-match", _req(p + b"/large.bin", "Range: bytes=5-9", f"If-Range: {large}")),
        ("if-range-mismatch", _req(p + b"/large.bin", "Range: bytes=5-9", 'If-Range: "nope"')),
        ("if-range-date", _req(p + b"/a.txt", "Range: bytes=5-9", f"If-Range: {STAMP_HTTP}")),
        # preconditions
        ("inm-match", _req(p + b"/a.txt", f"If-None-Match: {small}")),
        ("inm-match-head", _req(p + b"/a.txt", f"If-None-Match: {small}", method=b"HEAD")),
        ("inm-star", _req(p + b"/large.bin", "If-None-Match: *")),
        ("inm-mismatch", _req(p + b"/a.txt", 'If-None-Match: "other"')),
        ("ims-later", _req(p + b"/a.txt", f"If-Modified-Since: {LATER_HTTP}")),
        ("ims-earlier", _req(p + b"/a.txt", f"If-Modified-Since: {EARLIER_HTTP}")),
        ("im-mismatch", _req(p + b"/a.txt", 'If-Match: "other"')),
        ("im-match", _req(p + b"/a.txt", f"If-Match: {small}")),
        ("ius-earlier", _req(p + b"/large.bin", f"If-Unmodified-Since: {EARLIER_HTTP}")),
        ("ius-later", _req(p + b"/a.txt", f"If-Unmodified-Since: {LATER_HTTP}")),
        # pre-compressed siblings
        ("ae-br", _req(p + b"/style.css", "Accept-Encoding: gzip, br")),
        ("ae-gzip", _req(p + b"/style.css", "Accept-Encoding: gzip")),
        ("ae-br-head", _req(p + b"/style.css", "Accept-Encoding: br", method=b"HEAD")),
        ("ae-identity", _req(p + b"/style.css", "Accept-Encoding: identity")),
        ("ae-q0", _req(p + b"/style.css", "Accept-Encoding: gzip;q=0, br;q=0")),
        ("ae-gz-only-sibling", _req(p + b"/app.js", "Accept-Encoding: br, gzip")),
        ("ae-no-sibling", _req(p + b"/a.txt", "Accept-Encoding: gzip, br")),
        ("ae-range", _req(p + b"/style.css", "Accept-Encoding: gzip", "Range: bytes=0-3")),
        ("ae-inm-plain-etag", _req(p + b"/style.css", "Accept-Encoding: gzip", f"If-None-Match: {css}")),
        # symlinks
        ("symlink-in", _req(p + b"/in-link.txt")),
        ("symlink-out", _req(p + b"/out-link.txt")),
        ("symlink-dir-out", _req(p + b"/out-dir/secret.txt")),
    ]


_BOUNDARY = re.compile(rb"multipart/byteranges; boundary=([0-9A-Za-z'()+_,\-./:=?]+)")


def normalise(raw: bytes) -> dict[str, Any]:
    """Status line, headers (in order, but ``Date``/``Server``), body; the multipart boundary → ``B…``.

    A body over 2 KiB is kept as its length and SHA-256.
    """
    found = _BOUNDARY.search(raw)
    if found:
        boundary = found.group(1)
        raw = raw.replace(boundary, b"B" * len(boundary))
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = [
        [name, value.strip()]
        for name, _, value in (line.partition(":") for line in lines[1:])
        if name.lower() not in ("date", "server")
    ]
    shown: str | dict[str, Any]
    if len(body) <= 2048:
        shown = body.decode("latin-1")
    else:
        shown = {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    return {"status": lines[0], "headers": headers, "body": shown}
