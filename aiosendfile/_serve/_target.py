"""A request target's pure rules, for serve's reader and doors: its path and query, the authority
of an absolute-form target, and a read split into its head's block and its target (what the
heads memo keys on). IO-free; tested by tables in ``tests/serve/test_serve_reader.py``."""

from __future__ import annotations

import httptools

__all__ = ("split_head", "split_target", "target_authority")


def target_authority(url: bytes) -> bytes | None:
    """The host (and port) of an absolute-form target (``http://user@host:port/path``), which a
    server judges instead of the ``Host`` field (RFC 9112 3.2.2, as nginx and Go do); None for a
    target of another form."""
    start = url.find(b"://")
    if start <= 0:
        return None
    start += 3
    end = len(url)
    for stop in b"/?#":
        at = url.find(stop, start, end)
        if at >= 0:
            end = at
    return url[start:end].rpartition(b"@")[2]


def split_target(url: bytes) -> tuple[bytes, bytes] | None:
    """The raw path and query of a request target: origin-form (a fragment, which clients should
    not send, is neither) or absolute-form (``http://host/path?query``); None for anything else
    (``*``, authority-form)."""
    if url[:1] == b"/":
        raw, _, query = (url.partition(b"#")[0] if b"#" in url else url).partition(b"?")
        return raw, query
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return None
    if not parsed.schema:
        return None
    return parsed.path or b"/", parsed.query or b""


#: What a request target may hold for :func:`split_head` to take it: RFC 3986's unreserved and
#: reserved characters but ``#``, ``[`` and ``]``, and ``%``. llhttp takes every one of them in a
#: target and gives the target as it came (a test holds it to that, byte by byte).
_PLAIN_TARGET_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/?%"


def split_head(data: bytes, max_url: int) -> tuple[bytes, bytes] | None:
    """A read as its head's *block* (the request line without its target, and every header field
    after it: ``GET HTTP/1.1\r\nHost: ...\r\n\r\n``) and its target, where the request line
    is a method, one space, an origin-form target of plain bytes (``_PLAIN_TARGET_BYTES``) of at
    most *max_url* bytes, one space and a version; else None. Two reads with the same block are
    the same head but for the target: a block the parser read and judged (``Engine.learn``) tells
    what a read of it with another such target parses to, with no parse."""
    line_end = data.find(b"\r\n")
    space = data.find(b" ", 0, line_end)
    last = data.rfind(b" ", 0, line_end)
    if line_end < 0 or last <= space or last - space - 1 > max_url or data[space + 1 : space + 2] != b"/":
        return None
    target = data[space + 1 : last]
    if target.translate(None, _PLAIN_TARGET_BYTES):
        return None  # (a byte outside the set: a space, a control, a fragment, UTF-8...)
    return data[:space] + data[last:], target
