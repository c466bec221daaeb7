"""HTTP rules for serving a static file (RFC 9110), kept pure: no I/O, no event loop.

* Range (§14.2): ``parse_ranges`` -> ignore (200), serve these ranges (206) or
  ``RangeNotSatisfiable`` (416); overlapping or adjacent ranges are coalesced and
  many-range or overlapping "amplification" requests are ignored, like nginx.
* Validators (§8.8): ``make_etag`` (strong), ``http_date`` / ``parse_http_date``.
* Conditional requests (§13.2.2): ``evaluate_preconditions`` (412 / 304 / proceed)
  and ``if_range_allows`` (§13.1.5).
* Content coding (§12.5.3): ``choose_encoding`` picks a precompressed sibling.
* multipart/byteranges (§14.6, RFC 2046): ``multipart_byteranges`` lays out the parts.
* A file's response headers: ``file_headers`` builds them, in the order every door sends them.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any, Protocol

__all__ = (
    "ByteRange",
    "HeaderView",
    "InvalidRange",
    "RangeNotSatisfiable",
    "parse_ranges",
    "make_etag",
    "last_modified",
    "settled",
    "http_date",
    "parse_http_date",
    "parse_etag_list",
    "evaluate_preconditions",
    "if_range_allows",
    "choose_encoding",
    "multipart_byteranges",
    "file_headers",
)


class HeaderView(Protocol):
    """Request header fields read by canonical name, case-insensitively (a multidict, a dict).

    A ``getall(name, default)`` method, where present, gives every line of a repeated field.
    """

    def get(self, name: str, /) -> str | None: ...

    def __contains__(self, name: object, /) -> bool: ...


# -- Range -------------------------------------------------------------------------

_OWS = " \t"
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() and int() accept other scripts


@dataclass(frozen=True, slots=True)
class ByteRange:
    """A satisfiable byte range: ``start`` is the first offset, ``stop`` one past the last."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(f"empty or negative byte range: {self.start}..{self.stop}")

    @property
    def length(self) -> int:
        return self.stop - self.start

    def content_range(self, size: int) -> str:
        """The Content-Range value for this range of a representation of ``size`` bytes."""
        return f"bytes {self.start}-{self.stop - 1}/{size}"


class RangeNotSatisfiable(Exception):
    """No requested range overlaps the representation -> 416 with ``Content-Range: bytes */size``."""


class InvalidRange(RangeNotSatisfiable):
    """A ``bytes`` Range whose range set breaks RFC 9110's grammar (``bytes=5-2``, ``bytes=a-b``,
    ``bytes=``) -> 416, as nginx, aiohttp and Go answer (§15.5.17 lets a server reject invalid
    ranges). A range unit other than ``bytes`` is ignored instead, as §14.2 requires."""


def _capped(digits: str, cap: int) -> int:
    """``min(int(digits), cap)`` without converting absurdly long digit strings."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(cap)):
        return cap
    return min(int(digits), cap)


def _not_greater(a: str, b: str) -> bool:
    """``int(a) <= int(b)`` for digit strings of any length."""
    a, b = a.lstrip("0"), b.lstrip("0")
    return (len(a), a) <= (len(b), b)


def parse_ranges(header: str | None, size: int, *, max_ranges: int = 16) -> list[ByteRange] | None:
    """Apply a Range header to a representation of ``size`` bytes.

    Returns None to ignore the header and serve the full 200 (absent, not ``unit=...``, a unit
    other than ``bytes``, or an amplification guard tripped), else a non-empty list of ranges to
    serve. Raises InvalidRange if any spec is invalid (or there is none), RangeNotSatisfiable if
    the header is valid but no spec is satisfiable (always so for ``size == 0``).
    """
    if not header:
        return None
    unit, eq, range_set = header.partition("=")
    if not eq or unit.strip(_OWS).lower() != "bytes":
        return None
    cap = max(size, 0)
    ranges: list[ByteRange] = []
    requested = 0  # sum of the satisfiable lengths as requested, before coalescing
    seen_spec = False
    for element in range_set.split(","):
        spec = element.strip(_OWS)
        if not spec:
            continue  # empty list elements are allowed by the #rule
        seen_spec = True
        first, dash, last = spec.partition("-")
        if not dash:
            raise InvalidRange(spec)
        if first:
            if not _DIGITS.fullmatch(first) or (last and not _DIGITS.fullmatch(last)):
                raise InvalidRange(spec)
            if last and not _not_greater(first, last):
                raise InvalidRange(spec)  # a-b with a > b is invalid, not unsatisfiable
            start = _capped(first, cap)
            stop = _capped(last, cap - 1) + 1 if last else cap
        else:
            if not _DIGITS.fullmatch(last):
                raise InvalidRange(spec)  # "-" alone, or a signed / non-digit suffix
            start = cap - _capped(last, cap)
            stop = cap
        if start < stop:  # satisfiable (start < size, or a non-zero suffix of a non-empty file)
            ranges.append(ByteRange(start, stop))
            requested += stop - start
    if not seen_spec:
        raise InvalidRange(range_set)  # the grammar asks for at least one spec
    if not ranges:
        raise RangeNotSatisfiable(f"bytes */{size}")
    if requested > size:
        return None  # heavily overlapping ranges: a broken client or an amplification attempt
    ranges = _coalesce(ranges)
    if len(ranges) > max_ranges:
        return None
    return ranges


def _coalesce(ranges: list[ByteRange]) -> list[ByteRange]:
    """Merge all ranges (sorted) if any two overlap or touch; else keep the request order."""
    ordered = sorted(ranges, key=lambda r: r.start)
    if all(a.stop < b.start for a, b in itertools.pairwise(ordered)):
        return ranges
    merged = [ordered[0]]
    for r in ordered[1:]:
        last = merged[-1]
        if r.start <= last.stop:
            if r.stop > last.stop:
                merged[-1] = ByteRange(last.start, r.stop)
        else:
            merged.append(r)
    return merged


# -- validators --------------------------------------------------------------------


def make_etag(mtime_ns: int, size: int) -> str:
    """A strong entity tag from the file's modification time (ns) and size."""
    return f'"{mtime_ns:x}-{size:x}"'


def last_modified(mtime: float, now: float) -> int:
    """A file's ``Last-Modified`` in whole seconds (truncated, as the validators compare it): its
    *mtime*, or for a file dated later than *now* (not :func:`settled`) the second before now.
    RFC 9110 8.8.2.1: a server MUST NOT send a date later than its message's ``Date``, and sends
    the time of the message instead (a clock set wrong, a file unpacked with times from a machine
    ahead of this one, ``touch -d`` in the future), as Apache httpd does; a second before it, as
    the doors' ``Date`` is a clock read once a second. The validators compare the file's own time:
    a later ``If-Modified-Since`` with the date sent is older than the file, which is sent again.
    (It also keeps a time past the year 9999, which no HTTP date can name, out of the header.)"""
    return int(mtime) if mtime <= now else int(now) - 1


def settled(mtime: float, now: float) -> bool:
    """Whether a file's ``Last-Modified`` is its own time (see :func:`last_modified`), so that an
    answer carrying it may be kept: one made for a file dated later would keep a date that is
    neither the file's nor, once the clock passes the file's, an answer's."""
    return mtime <= now


def http_date(timestamp: float) -> str:
    """IMF-fixdate for a unix timestamp (fractions dropped): ``Sun, 06 Nov 1994 08:49:37 GMT``."""
    return format_datetime(datetime.fromtimestamp(int(timestamp // 1), timezone.utc), usegmt=True)


def parse_http_date(value: str | None) -> int | None:
    """Unix seconds of an HTTP-date (IMF-fixdate, RFC 850 or asctime); None if absent or invalid."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if parsed.tzinfo is None:  # asctime and "-0000" carry no zone; HTTP dates are GMT
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp())


# -- conditional requests ------------------------------------------------------------

# entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE ; etagc = %x21 / %x23-7E / obs-text
_ETAG = re.compile(r'(W/)?("[\x21\x23-\x7e\x80-\U0010ffff]*")')


def parse_etag_list(value: str) -> list[tuple[bool, str]] | None:
    """Parse ``"*" / #entity-tag`` into ``[(weak, '"opaque"'), ...]``; None means ``*``.

    Opaque tags may contain commas, so the list is scanned rather than split.
    Malformed members are skipped.
    """
    if value.strip(_OWS) == "*":
        return None
    tags: list[tuple[bool, str]] = []
    pos, end = 0, len(value)
    while True:
        while pos < end and value[pos] in " \t,":
            pos += 1
        if pos >= end:
            return tags
        m = _ETAG.match(value, pos)
        if m:
            after = m.end()
            while after < end and value[after] in _OWS:
                after += 1
            if after == end or value[after] == ",":
                tags.append((m.group(1) is not None, m.group(2)))
                pos = after
                continue
        comma = value.find(",", pos)  # malformed member: resynchronise at the next comma
        pos = end if comma < 0 else comma + 1


def _split_etag(etag: str) -> tuple[bool, str]:
    return (True, etag[2:]) if etag.startswith("W/") else (False, etag)


def _strong_match(tags: list[tuple[bool, str]] | None, etag: str) -> bool:
    if tags is None:
        return True
    weak, opaque = _split_etag(etag)
    return not weak and any(not w and t == opaque for w, t in tags)


def _weak_match(tags: list[tuple[bool, str]] | None, etag: str) -> bool:
    if tags is None:
        return True
    opaque = _split_etag(etag)[1]
    return any(t == opaque for _, t in tags)


def _field_lines(headers: HeaderView, name: str) -> list[str]:
    """Every field line of ``name`` (a multidict's getall), or the mapping's single value."""
    getall: Any = getattr(headers, "getall", None)
    if callable(getall):
        return [str(v) for v in getall(name, ())]
    value = headers.get(name)
    return [] if value is None else [value]


def _list_field(headers: HeaderView, name: str) -> str | None:
    lines = _field_lines(headers, name)
    return ", ".join(lines) if lines else None


def _date_field(headers: HeaderView, name: str) -> int | None:
    lines = _field_lines(headers, name)
    return parse_http_date(lines[0]) if len(lines) == 1 else None  # more than one member: ignore


def evaluate_preconditions(method: str, headers: HeaderView, etag: str, last_modified: int) -> int | None:
    """RFC 9110 §13.2.2: 412 or 304 if a precondition says so, None to proceed.

    ``headers`` is read with canonical names, so pass a case-insensitive mapping.
    If-Range is not evaluated here (see ``if_range_allows``).
    """
    safe = method in ("GET", "HEAD")
    if_match = _list_field(headers, "If-Match")
    if if_match is not None:
        if not _strong_match(parse_etag_list(if_match), etag):
            return 412
    else:
        unmodified_since = _date_field(headers, "If-Unmodified-Since")
        if unmodified_since is not None and last_modified > unmodified_since:
            return 412
    if_none_match = _list_field(headers, "If-None-Match")
    if if_none_match is not None:
        if _weak_match(parse_etag_list(if_none_match), etag):
            return 304 if safe else 412
    elif safe:
        modified_since = _date_field(headers, "If-Modified-Since")
        if modified_since is not None and last_modified <= modified_since:
            return 304
    return None


def if_range_allows(if_range: str | None, etag: str, last_modified: int) -> bool:
    """RFC 9110 §13.1.5: True to honour Range, False to ignore it and send the full 200.

    An entity tag must match strongly (a weak tag never does); a date must equal
    Last-Modified exactly. Anything invalid means False.
    """
    if if_range is None:
        return True
    value = if_range.strip(_OWS)
    if value.startswith(('"', "W/")):
        m = _ETAG.fullmatch(value)
        return m is not None and m.group(1) is None and _strong_match([(False, m.group(2))], etag)
    date = parse_http_date(value)
    return date is not None and date == last_modified


# -- content coding ----------------------------------------------------------------

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")
_ALIASES = {"x-gzip": "gzip", "x-compress": "compress"}


def _coding(name: str) -> str:
    name = name.lower()
    return _ALIASES.get(name, name)


def _parse_accept_encoding(value: str) -> dict[str, int]:
    """``{coding: q in thousandths}``; malformed members are skipped; a repeated coding keeps its lowest q."""
    weights: dict[str, int] = {}
    for member in value.split(","):
        coding, *params = (p.strip(_OWS) for p in member.split(";"))
        if not _TOKEN.fullmatch(coding):
            continue
        q: int | None = 1000
        for param in params:
            key, eq, val = param.partition("=")
            if key.strip(_OWS).lower() == "q":
                val = val.strip(_OWS)
                if not (eq and _QVALUE.fullmatch(val)):
                    q = None
                    break
                q = round(float(val) * 1000)
        if q is None:
            continue
        name = _coding(coding)
        weights[name] = min(q, weights.get(name, q))
    return weights


def choose_encoding(accept_encoding: str | None, available: Sequence[str]) -> str | None:
    """The content coding to serve from ``available`` (server preference order), None for identity.

    The highest q wins, ties go to the server's order; ``*`` covers unlisted codings
    and q=0 forbids. Identity competes only when the client weighs it (``identity``
    or ``*``): a coding wins a tie with it, a strictly higher identity q wins.
    If nothing is acceptable, not even identity (``identity;q=0``), it is still None:
    like nginx, serve the file unencoded rather than a 406.
    """
    if not accept_encoding:
        return None  # absent: any coding would do, but identity is the safe answer
    weights = _parse_accept_encoding(accept_encoding)
    star = weights.get("*")
    best: str | None = None
    best_q = 0
    for coding in available:
        name = _coding(coding)
        if name == "identity":
            continue
        q = weights.get(name, star if star is not None else 0)
        if q > best_q:
            best, best_q = coding, q
    if best is None:
        return None
    identity_q = weights.get("identity", star)
    if identity_q is not None and identity_q > best_q:
        return None
    return best


# -- multipart/byteranges ----------------------------------------------------------

# RFC 2046: boundary := 0*69<bchars> bcharsnospace
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")


def multipart_byteranges(
    ranges: Sequence[ByteRange], size: int, content_type: str, boundary: str
) -> tuple[list[tuple[bytes, ByteRange]], bytes, int]:
    """Lay out a multipart/byteranges body (RFC 9110 §14.6).

    Returns ``([(part_header, range), ...], closing, total_length)``: the body is each
    part header followed by that range's bytes, then ``closing``; ``total_length`` is
    its exact size, for Content-Length. Every part header starts with CRLF (the
    first one is an empty preamble's CRLF), as nginx does. An empty ``content_type``
    omits the part's Content-Type line.
    """
    if not ranges:
        raise ValueError("multipart/byteranges needs at least one range")
    if not _BOUNDARY.fullmatch(boundary):
        raise ValueError(f"invalid multipart boundary: {boundary!r}")
    if any(c in content_type for c in "\r\n\0"):
        raise ValueError(f"invalid content type: {content_type!r}")
    dash_boundary = b"\r\n--" + boundary.encode("ascii")
    type_line = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n" if content_type else b""
    parts: list[tuple[bytes, ByteRange]] = []
    total = 0
    for r in ranges:
        if r.stop > size:
            raise ValueError(f"range {r.start}..{r.stop} is beyond the size {size}")
        header = b"%s\r\n%sContent-Range: %s\r\n\r\n" % (
            dash_boundary,
            type_line,
            r.content_range(size).encode("ascii"),
        )
        parts.append((header, r))
        total += len(header) + r.length
    closing = dash_boundary + b"--\r\n"
    return parts, closing, total + len(closing)


# -- a file's response headers -----------------------------------------------------


@functools.lru_cache(maxsize=1024)
def cached_http_date(timestamp: int) -> str:
    """:func:`http_date` of whole seconds, memoised (a file's ``Last-Modified``)."""
    return http_date(timestamp)


def file_headers(
    etag: str,
    last_modified: int,
    *,
    vary: bool = False,
    encoding: str | None = None,
    content_type: str | None = None,
    content_range: str | None = None,
) -> list[tuple[str, str]]:
    """The headers an answer about a file adds, in the order they are sent.

    Every answer carries the validators and range support: ``ETag``, ``Last-Modified`` (from
    *last_modified*, unix seconds) and ``Accept-Ranges: bytes``; then ``Vary: Accept-Encoding``
    when pre-compressed variants are on (*vary*), ``Content-Encoding`` of a pre-compressed
    representation, ``Content-Type`` and ``Content-Range``, each where given. ``Content-Length``
    is the server's to add. ``Vary`` is a list field (add it to any ``Vary`` already there); the
    others are single fields (replace).
    """
    headers = [
        ("Etag", etag),  # spelled as aiohttp's hdrs.ETAG: the bytes on the wire stay the same
        ("Last-Modified", cached_http_date(last_modified)),
        ("Accept-Ranges", "bytes"),
    ]
    if vary:
        headers.append(("Vary", "Accept-Encoding"))
    if encoding is not None:
        headers.append(("Content-Encoding", encoding))
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    if content_range is not None:
        headers.append(("Content-Range", content_range))
    return headers
