"""What a door hands the static core: the request as the core reads it, and a bytes header view.

The core reads the method, the raw (percent-encoded) path and query, and a handful of request
headers by canonical name (``Range``, ``If-None-Match``, ...). aiohttp's ``CIMultiDictProxy``
already answers ``get``/``getall``/``in`` case-insensitively; doors that parse headers as bytes
(the native engine, ASGI) wrap their pairs in :class:`BytesHeaders`, which keeps only the fields
the core reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ._http import HeaderView

__all__ = (
    "EMPTY",
    "MEMO_MAX_ACCEPT_ENCODING",
    "BytesHeaders",
    "HeaderView",
    "Request",
    "accept_encoding_alone",
    "accept_matters",
)

#: The longest ``Accept-Encoding`` value a door may keep an answer for. Browsers send 20 to 60
#: bytes (``gzip, deflate, br, zstd`` is 23), curl and HTTP libraries less; 256 leaves room for
#: q-values and new codings. A longer value is not a browser's: its request goes through the core,
#: answered as any, and a peer cannot make one kept answer cost more than its path and 256 bytes.
MEMO_MAX_ACCEPT_ENCODING = 256


def accept_matters(value: bytes) -> bool:
    """Whether an ``Accept`` value is one the core reads: only a listing reads it, and only when
    it names JSON (so that curl's ``*/*`` or a browser's list leaves a request plain)."""
    return b"json" in value.lower()


def accept_encoding_alone(fields: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether the only field among *fields* (the pairs a door kept of those the core reads) is one
    ``Accept-Encoding`` of at most :data:`MEMO_MAX_ACCEPT_ENCODING` bytes: a browser's plain
    request, whose answer is a plain one's unless a pre-compressed sibling is there to choose."""
    return (
        len(fields) == 1
        and len(fields[0][1]) <= MEMO_MAX_ACCEPT_ENCODING
        and fields[0][0].lower() == b"accept-encoding"
    )


class BytesHeaders:
    """Request header fields from ``(name, value)`` byte pairs: only those the core reads, latin-1 decoded.

    Lookups are case-insensitive; a repeated field keeps every line, in order, for ``getall``.
    """

    #: The lowercase names the core reads: a door may filter on them in its header callback.
    #: ``Accept`` only when it names JSON (:func:`accept_matters`).
    WANTED = frozenset(
        {
            b"accept",
            b"range",
            b"if-range",
            b"if-match",
            b"if-none-match",
            b"if-modified-since",
            b"if-unmodified-since",
            b"accept-encoding",
        }
    )

    __slots__ = ("_fields",)

    def __init__(self, pairs: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self._fields: dict[str, list[str]] = {}
        for name, value in pairs:
            self.add(name, value)

    def add(self, name: bytes, value: bytes) -> None:
        """Keep one field line, if the core reads that field."""
        key = name.lower()
        if key in self.WANTED and (key != b"accept" or accept_matters(value)):
            self._fields.setdefault(key.decode("latin-1"), []).append(value.decode("latin-1"))

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._fields.get(name.lower())
        return values[0] if values else default

    def getall(self, name: str, default: Sequence[str] = ()) -> Sequence[str]:
        return self._fields.get(name.lower()) or default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __bool__(self) -> bool:
        return bool(self._fields)

    def __repr__(self) -> str:
        return f"BytesHeaders({self._fields!r})"


#: No header fields.
EMPTY = BytesHeaders()


class Request(NamedTuple):
    """One request as the static core reads it.

    ``raw_path`` is the percent-encoded path as sent (origin-form; the door cut the query and an
    absolute-form's ``scheme://host``), the mount prefix included; ``raw_query`` goes into a
    directory's 301 ``Location``. ``prefix`` is the mount prefix, decoded, without a trailing
    ``/`` (``""`` at the root). ``rel`` is a door's already decoded path below the prefix
    (aiohttp's ``match_info["filename"]``); None lets the core decode ``raw_path``. ``ranges_ok``
    is False when a middleware compresses the body (a pre-compressed sibling's ranges are still
    honoured: it is sent as it is); ``content_type`` is a caller's Content-Type,
    which wins over the file name's.
    """

    method: str
    raw_path: bytes
    raw_query: bytes = b""
    headers: HeaderView = EMPTY
    prefix: str = ""
    rel: str | None = None
    ranges_ok: bool = True
    content_type: str | None = None
