"""What the static core decides: an ``Answer`` (status, header fields, length, body source).

A door renders it: the status line, ``fields`` in order, ``Content-Length: length`` (none when
``length`` is None: a 304), then the body unless ``head_only``. The body is cached bytes (a hot
file's slice, a listing, an error text), a ``FileRange`` of an open descriptor, a ``Multipart``
of several ranges, or an ``Archive`` of a folder (``_archive``). A ``head_only`` answer may still
hold its bytes (a HEAD of a hot file, a listing or an error: a door may build its head from them),
never a descriptor. ``fields`` never carries
``Content-Length``, ``Date``, ``Server`` or ``Connection``: those are the door's. ``decided`` is
set on a plain ``200`` of a whole file: what a door may keep in its answer cache (``_answers``).

An Answer that owns a descriptor closes it in ``close()``/``__exit__`` (idempotent); one with
``head_only`` set owns none (the core closed it already).
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, NamedTuple

from ._http import ByteRange

if TYPE_CHECKING:
    from ._answers import Decided
    from ._archive import Layout
    from ._hot import HotEntry

__all__ = ("Answer", "Archive", "Body", "FileRange", "Multipart", "error")


class FileRange(NamedTuple):
    """``length`` bytes of the open descriptor *fd* from ``start``."""

    fd: int
    start: int
    length: int


class Multipart(NamedTuple):
    """A ``multipart/byteranges`` body: each part header then its range of *source*, then ``closing``.

    *source* is an open descriptor or the file's cached bytes.
    """

    source: int | bytes
    parts: list[tuple[bytes, ByteRange]]
    closing: bytes


class Archive(NamedTuple):
    """Bytes [``start``, ``stop``) of the tar archive of the folder *path* (``_archive.Layout``):
    the door opens each member's file as it comes to it (``_tree.open_member``)."""

    path: str
    layout: Layout
    start: int
    stop: int


Body = None | bytes | FileRange | Multipart | Archive


class Answer:
    """One response, decided (see the module docstring)."""

    __slots__ = (
        "_close",
        "body",
        "decided",
        "encoding",
        "entry",
        "fd",
        "fields",
        "head_only",
        "length",
        "path",
        "status",
    )

    def __init__(
        self,
        status: int,
        fields: list[tuple[str, str]],
        length: int | None,
        head_only: bool = False,
        body: Body = None,
        encoding: str | None = None,
        entry: HotEntry | None = None,
        path: str | None = None,
        fd: int | None = None,
        close: Callable[[int], None] | None = None,
    ) -> None:
        self.status, self.fields, self.length = status, fields, length
        self.head_only, self.body, self.encoding = head_only, body, encoding
        self.entry, self.path = entry, path
        #: The descriptor this answer owns (the body's source), closed by :meth:`close`.
        self.fd = fd
        self._close = close
        #: Set by the core on a plain 200 of a whole file: what a door may keep in its answer cache.
        self.decided: Decided | None = None

    def close(self) -> None:
        """Close the owned descriptor, if any (idempotent)."""
        fd, self.fd = self.fd, None
        if fd is not None and self._close is not None:
            self._close(fd)

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        body = self.body if not isinstance(self.body, bytes) else f"<{len(self.body)} bytes>"
        return (
            f"Answer({self.status}, {self.fields!r}, length={self.length}, "
            f"head_only={self.head_only}, body={body})"
        )


def error(status: int, method: str, *extra: tuple[str, str]) -> Answer:
    """An error answer as aiohttp's ``web.HTTPException`` gives it: ``"404: Not Found"``, text/plain.

    *extra* fields follow Content-Type (``Allow`` of a 405, ``Location`` of a 301).
    """
    text = f"{status}: {HTTPStatus(status).phrase}".encode()
    fields = [("Content-Type", "text/plain; charset=utf-8"), *extra]
    return Answer(status, fields, len(text), head_only=method == "HEAD", body=text)
