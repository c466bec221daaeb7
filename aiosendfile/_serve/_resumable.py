"""Resumable uploads, the rules (IO-free): which request is which step of the IETF draft
(*Resumable Uploads for HTTP*, interop version 8) or of tus 1.0, and the fields of its answers.

The two protocols share one store (``_partial``) and one kind of address: an upload in progress
is the resource ``<target path>?upload=<token>``, the token 192 random bits (the capability:
nothing else names it). What a request asks (:func:`ask_of`):

* **IETF draft.** A ``PUT`` (or ``POST``) of a file path with ``Upload-Complete`` (``?0``: more
  will come; ``?1``: this is all of it) creates the upload. With ``Upload-Draft-Interop-Version:
  8`` its ``Location`` is sent at once in a ``104 Upload Resumption Supported``, so a client cut
  off mid-body can resume; a ``?0`` creation's final answer (201) carries it too. ``HEAD``
  of the upload resource gives its offset, ``PATCH`` (``application/partial-upload``,
  ``Upload-Offset``, ``Upload-Complete``) appends, ``DELETE`` cancels.
* **tus 1.0** (core, creation, creation-defer-length, creation-with-upload, expiration,
  termination). A ``POST`` of a directory with ``Tus-Resumable: 1.0.0``, ``Upload-Length`` (or
  ``Upload-Defer-Length: 1``) and ``Upload-Metadata`` naming the file (``filename``) creates it
  (201, ``Location``); ``HEAD``, ``PATCH`` (``application/offset+octet-stream``), ``DELETE`` as
  above; ``OPTIONS`` tells what the server supports.

Field values are read strictly: a Structured Field that does not parse counts as absent (RFC 9651),
a tus integer is decimal digits. Offsets and lengths are at most 15 digits (an sf-integer's bound).
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import hashlib
import re
import secrets
from typing import NamedTuple

__all__ = (
    "INTEROP",
    "PARTIAL_TYPE",
    "TUS_RESUMABLE",
    "TUS_TYPE",
    "TUS_VERSIONS",
    "TUS_VERSION",
    "Ask",
    "WANTED",
    "ask_of",
    "id_of",
    "interim",
    "limit_field",
    "new_token",
    "redacted",
    "refusal_fields",
    "token_of",
    "tus_filename",
    "upload_fields",
)

#: The interop version of the IETF draft this server speaks (drafts -09 to -12).
INTEROP = b"8"
PARTIAL_TYPE = b"application/partial-upload"
TUS_TYPE = b"application/offset+octet-stream"
TUS_VERSION = b"1.0.0"
TUS_EXTENSIONS = "creation,creation-defer-length,creation-with-upload,expiration,termination"
#: The field every tus answer carries, and the one that tells the versions taken.
TUS_RESUMABLE = ("Tus-Resumable", TUS_VERSION.decode())
TUS_VERSIONS = ("Tus-Version", TUS_VERSION.decode())

#: The request fields these protocols read (lowercase): the reader keeps them with the core's.
WANTED = (
    b"upload-complete",
    b"upload-offset",
    b"upload-length",
    b"upload-draft-interop-version",
    b"tus-resumable",
    b"upload-metadata",
    b"upload-defer-length",
)

_TOKEN = re.compile(rb"(?:^|&)upload=([A-Za-z0-9_-]{32})(?:&|$)")
_TOKEN_IN_URL = re.compile(rb"([?&])upload=[A-Za-z0-9_-]{32}")
_DIGITS = re.compile(rb"[0-9]{1,15}")
#: What the query of an upload resource holds (and only it): how HEAD, PATCH and DELETE of one
#: are told from those of a file, cheaply.
MARK = b"upload="

# What a request asks (Ask.step).
CREATE, APPEND, STATUS, CANCEL, OPTIONS = "create", "append", "status", "cancel", "options"


class Ask(NamedTuple):
    """One request's step of a resumable upload (:func:`ask_of`)."""

    step: str  # CREATE, APPEND, STATUS, CANCEL, OPTIONS
    tus: bool  # tus 1.0 (else the IETF draft)
    token: bytes | None  # the upload resource's (APPEND, STATUS, CANCEL)
    offset: int | None  # Upload-Offset
    length: int | None  # Upload-Length (or, IETF, known from Upload-Complete: ?1 and the body)
    complete: bool | None  # IETF Upload-Complete; tus: None
    defer: bool  # tus Upload-Defer-Length: 1
    interop: bool  # the client speaks this server's interop version (a 104 may be sent)
    metadata: bytes | None  # tus Upload-Metadata, as sent
    bad: int  # a status to refuse it with (0: none): 400 for a field that does not parse, 412 ...


def upload_fields(fields: list[tuple[bytes, bytes]] | None) -> dict[bytes, bytes]:
    """The resumable-upload fields of a request's kept pairs (lowercase names; a repeated one
    joined with ", ", as a list field is)."""
    found: dict[bytes, bytes] = {}
    if not fields:
        return found
    for name, value in fields:
        name = name.lower()
        if name in WANTED:
            found[name] = value if name not in found else found[name] + b", " + value
    return found


def _sf_boolean(value: bytes | None) -> bool | None:
    if value is None:
        return None
    value = value.strip(b" \t")
    return True if value == b"?1" else False if value == b"?0" else None


def _integer(value: bytes | None) -> int | None:
    """A non-negative integer of at most 15 digits (an sf-integer, a tus one), or None."""
    if value is None:
        return None
    value = value.strip(b" \t")
    return int(value) if _DIGITS.fullmatch(value) else None


def token_of(query: bytes) -> bytes | None:
    """The upload token a request's query names (``upload=<32 characters>``), or None."""
    if MARK not in query:
        return None
    found = _TOKEN.search(query)
    return found.group(1) if found else None


def new_token() -> bytes:
    """A new upload's token: 192 random bits, 32 URL-safe characters."""
    return secrets.token_urlsafe(24).encode()


def redacted(url: bytes) -> bytes:
    """*url* with its upload token hidden (what the access log writes)."""
    return _TOKEN_IN_URL.sub(rb"\1upload=[token]", url)


def id_of(token: bytes) -> str:
    """What the store files an upload under: a hash of its token (a name seen on disk, in a
    listing with dotfiles shown or by another user of the machine, does not give the token)."""
    return hashlib.sha256(token).hexdigest()[:32]


def ask_of(
    method: bytes, path_is_directory: bool, query: bytes, fields: dict[bytes, bytes], ctype: bytes | None
) -> Ask | None:
    """What a request asks of resumable uploads, or None (it is not about them: a plain ``PUT``,
    form ``POST``, ``GET``...). *fields*: :func:`upload_fields`; *ctype*: its Content-Type."""
    tus_version = fields.get(b"tus-resumable")
    tus = tus_version is not None
    token = token_of(query) if query else None
    if method == b"OPTIONS":
        return _ask(OPTIONS, tus, None, fields)
    if token is not None:
        if method == b"HEAD":
            step = STATUS
        elif method == b"PATCH":
            step = APPEND
        elif method == b"DELETE":
            step = CANCEL
        else:
            return None
        ask = _ask(step, tus, token, fields)
        if step == APPEND and not ask.bad:
            kind = (ctype or b"").partition(b";")[0].strip().lower()
            if kind != (TUS_TYPE if tus else PARTIAL_TYPE):
                return ask._replace(bad=415)
            if ask.offset is None or (not tus and ask.complete is None):
                return ask._replace(bad=400)
        return ask
    if tus and method == b"POST":  # (a folder's, with its slash or not: a tus client's endpoint)
        ask = _ask(CREATE, True, None, fields)
        if not ask.bad and ask.length is None and not ask.defer:
            return ask._replace(bad=400)  # (tus: Upload-Length or Upload-Defer-Length: 1)
        return ask
    if not tus and method in (b"PUT", b"POST") and b"upload-complete" in fields and not path_is_directory:
        ask = _ask(CREATE, False, None, fields)
        if ask.complete is None:
            return ask._replace(bad=400)
        if ask.offset not in (None, 0):
            return ask._replace(bad=400)  # (a new upload starts at 0)
        return ask
    return None


def _ask(step: str, tus: bool, token: bytes | None, fields: dict[bytes, bytes]) -> Ask:
    bad = 0
    if tus and step != OPTIONS and fields.get(b"tus-resumable", b"").strip() != TUS_VERSION:
        bad = 412
    offset_field = fields.get(b"upload-offset")
    offset = _integer(offset_field)
    length_field = fields.get(b"upload-length")
    length = _integer(length_field)
    if (offset_field is not None and offset is None) or (length_field is not None and length is None):
        bad = bad or 400  # (tus: a malformed value; IETF: a field given twice or not an integer)
    defer = False
    defer_field = fields.get(b"upload-defer-length")
    if tus and defer_field is not None:
        if defer_field.strip() != b"1" or length is not None:
            bad = bad or 400
        defer = True
    complete = None if tus else _sf_boolean(fields.get(b"upload-complete"))
    interop = fields.get(b"upload-draft-interop-version", b"").strip() == INTEROP
    metadata = fields.get(b"upload-metadata") if tus else None
    return Ask(step, tus, token, offset, length, complete, defer, interop, metadata, bad)


def refusal_fields(ask: Ask, status: int) -> tuple[tuple[str, str], ...]:
    """The fields a refusal of *ask* with *status* carries: tus's version in every tus answer, and
    the versions taken in a 412."""
    if not ask.tus:
        return ()
    return (TUS_RESUMABLE, TUS_VERSIONS) if status == 412 else (TUS_RESUMABLE,)


def tus_filename(metadata: bytes | None) -> str | None:
    """The ``filename`` a tus ``Upload-Metadata`` gives (``key base64, key base64...``), or None:
    none given, or a value that is not Base64 of UTF-8 (ValueError for a malformed field)."""
    if not metadata:
        return None
    found = None
    keys: set[bytes] = set()
    for pair in metadata.split(b","):
        key, _, value = pair.strip().partition(b" ")
        if not key or key in keys or b" " in value.strip():
            raise ValueError("a malformed Upload-Metadata")
        keys.add(key)
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("Upload-Metadata: a value that is not Base64") from None
        if key == b"filename":
            try:
                found = decoded.decode()
            except UnicodeDecodeError:
                raise ValueError("Upload-Metadata: a file name that is not UTF-8") from None
    return found


def limit_field(max_size: int | None, max_age: float | None = None) -> tuple[str, str]:
    """``Upload-Limit``: the largest upload, the seconds an upload has left (``min-size=0`` when
    there is neither: the field is never empty)."""
    parts = []
    if max_size is not None:
        parts.append(f"max-size={max_size}")
    if max_age is not None:
        parts.append(f"max-age={max(0, int(max_age))}")
    return ("Upload-Limit", ", ".join(parts) if parts else "min-size=0")


def expires_field(when: float) -> tuple[str, str]:
    """tus's ``Upload-Expires`` (an HTTP date)."""
    return ("Upload-Expires", email.utils.formatdate(when, usegmt=True))


def interim(location: str, limit: tuple[str, str]) -> bytes:
    """The ``104 Upload Resumption Supported`` a creation gets once its upload exists: where to
    resume it."""
    return (
        f"HTTP/1.1 104 Upload Resumption Supported\r\nLocation: {location}\r\n"
        f"Upload-Draft-Interop-Version: 8\r\n{limit[0]}: {limit[1]}\r\n\r\n"
    ).encode("latin-1")
