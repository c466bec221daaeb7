"""``serve --upload``: a ``POST`` of ``multipart/form-data`` to a directory (the listing page's
form, ``curl -F file=@x``), each file part landing as a ``PUT`` body does.

The body is parsed as it comes, in the cold pool (the thread that writes it), by python-multipart's
streaming parser: no part is held in memory, whatever its size. A part with a file name
(``Content-Disposition: form-data; name=...; filename=...``) is written to its own
:class:`~._upload.Upload` (a nameless temporary file in the directory) and given its name as soon as
its closing boundary is read: a file that is visible is whole; a part cut short (the client left,
the body ended without its last boundary, the disk filled) leaves nothing. Other parts (fields)
are read and dropped; a file part with an empty name (a form sent with no file chosen) too.

A file name is one name: browsers send the base name, older ones a whole Windows path (its last
component is taken). It is held to the rules a ``PUT`` path is (no dotfile unless they are served,
no control character, not ``.`` or ``..``, no ``/`` or ``\\``, valid UTF-8); a name refused refuses
the request (the files already landed stay, as ``PUT`` requests answered before would).

Bounds: ``MAX_PARTS`` parts a request (413 past it, as aiohttp's 1,000 fields); a part's header
fields are bounded by the parser (8 fields of at most 4 KiB: 400 past them); the size limit counts
the whole body, as for ``PUT``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from .._static._answer import Answer, error
from .._static._paths import checked
from .._static._policy import DirectoryPolicy
from ._upload import Target, Upload, UploadRefused, bad_name, open_directory

__all__ = ("MAX_PARTS", "FormUpload", "form_boundary")

#: Parts (files and fields) one request may hold: a body of 10,000 tiny parts is refused (413) at
#: the first over this, not parsed to its end (each file part costs a file, an fsync, a link).
MAX_PARTS = 1000
#: RFC 2046 5.1.1: a boundary is 1 to 70 characters.
_MAX_BOUNDARY = 70


def form_boundary(content_type: bytes | None) -> bytes | None:
    """The boundary of a ``multipart/form-data`` *content_type*, or None (not a form: 415)."""
    if not content_type:
        return None
    kind, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary or len(boundary) > _MAX_BOUNDARY:
        return None
    return boundary


class FormUpload:
    """One form body into *directory* (see the module). Pool-thread calls, as :class:`Upload`'s:
    :meth:`open`, :meth:`write` any number of times, then :meth:`commit` or :meth:`abort`."""

    zero_copy = False  # (every byte passes the parser)

    def __init__(
        self, directory: str, policy: DirectoryPolicy, overwrite: bool, boundary: bytes, location: str
    ) -> None:
        self.directory = directory
        self.location = location  # where the answer sends a browser: the directory's listing
        self.policy = policy
        self.overwrite = overwrite
        self.dir_fd = -1  # the directory, once open: every part lands in it (open_directory)
        root = policy.root or ""
        self.relative = directory[len(root) :].strip("/") if directory.startswith(root) else directory
        self.landed: list[str] = []  # the names given, in order
        self.parts = 0
        self.ended = False
        self._part: Upload | None = None
        self._head: list[tuple[bytes, bytes]] = []
        self._field = self._value = b""
        self._failure: UploadRefused | OSError | None = None
        callbacks: Any = {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }
        self._parser = MultipartParser(boundary, callbacks)

    def open(self) -> None:
        """Open and check the directory (UploadRefused if nothing may go there)."""
        self.dir_fd = open_directory(self.directory, self.policy)

    def write(self, data: bytes) -> None:
        """Parse *data*: file parts are written, and named once whole (UploadRefused: a malformed
        body, a refused name, too many parts; OSError as the disk says)."""
        if self.ended:
            return  # (an epilogue after the closing boundary: ignored, as RFC 2046 says)
        try:
            self._parser.write(data)
        except MultipartParseError:
            raise self._failure or UploadRefused(400, "a malformed form body") from None
        if self._failure is not None:
            raise self._failure

    def commit(self, size: int) -> list[str]:
        """The body is complete: it must have ended with its closing boundary (else 400). The
        names given, in order."""
        if not self.ended:
            raise UploadRefused(400, "the form body ends before its closing boundary")
        self._close()
        return self.landed

    def answer(self, _landed: list[str]) -> Answer:
        """The answer once :meth:`commit` returned: 303 See Other, to the directory's listing (a
        form posted without script lands on the page that shows what it sent)."""
        return error(303, "POST", ("Location", self.location))

    def abort(self) -> None:
        """Drop the part being written (the files already named stay)."""
        part, self._part = self._part, None
        if part is not None:
            part.abort()
        self._close()

    def _close(self) -> None:
        if self.dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.dir_fd)
            self.dir_fd = -1

    # -- the parser's callbacks (in write) ------------------------------------------------------

    def _stop(self, failure: UploadRefused | OSError) -> None:
        """Fail the parse here (the parser raises once a callback has; write raises *failure*)."""
        self._failure = failure
        raise MultipartParseError(str(failure))

    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            self._stop(UploadRefused(413, "too many parts"))
        self._head.clear()
        self._field = self._value = b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._head.append((self._field.lower(), self._value))
        self._field = self._value = b""

    def _headers_finished(self) -> None:
        disposition = next((v for k, v in self._head if k == b"content-disposition"), None)
        _, options = parse_options_header(disposition)
        raw = options.get(b"filename")
        if not raw:
            return  # a field, or no file chosen: read and dropped
        name = self._name(raw)
        part = Upload(Target(self.directory, name), self.policy, self.overwrite, dir_fd=self.dir_fd)
        try:
            part.open()
        except (UploadRefused, OSError) as exc:
            part.abort()
            self._stop(exc)
        self._part = part

    def _name(self, raw: bytes) -> str:
        """The file name a part's *raw* ``filename`` gives (its last path component), or 400/403."""
        raw = raw.replace(b"\\", b"/").rsplit(b"/", 1)[-1]
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._stop(UploadRefused(400, "a file name that is not UTF-8"))
        # (held to the read rules where it lands: ``.well-known`` is a dotfile below the root)
        where = f"{self.relative}/{name}" if self.relative else name
        if bad_name(name) or not checked(where, self.policy.dotfiles):
            self._stop(UploadRefused(403, "not a name a file may have"))
        return name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        if part is not None:
            try:
                part.write(memoryview(data)[start:end])
            except OSError as exc:
                self._stop(exc)

    def _part_end(self) -> None:
        part, self._part = self._part, None
        if part is None:
            return
        try:
            part.commit(part.written)
        except (UploadRefused, OSError) as exc:
            part.abort()
            self._stop(exc)
        self.landed.append(part.target.name)

    def _end(self) -> None:
        self.ended = True
