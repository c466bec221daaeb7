"""What the handlers read off a Django response: its fields as Django's ASGI handler sends them,
and the file behind a ``FileResponse``."""

from __future__ import annotations

import io
import os
import stat

from django.http import FileResponse, HttpResponseBase

__all__ = ("django_headers", "file_body")


def django_headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    """The response's fields as Django's ASGI handler sends them (its case kept; cookies last)."""
    headers = []
    for name, value in response.items():
        headers.append(
            (
                name.encode("ascii") if isinstance(name, str) else bytes(name),
                value.encode("latin1") if isinstance(value, str) else bytes(value),
            )
        )
    for cookie in response.cookies.values():
        headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
    return headers


def file_body(response: HttpResponseBase) -> tuple[int, int, int, bool, str | None] | None:
    """(descriptor, offset, count, whether that is the whole file, path) of a ``FileResponse``
    backed by a regular file with a ``Content-Length``; None for any other response (Django
    sends it)."""
    if not isinstance(response, FileResponse):
        return None
    f = getattr(response, "file_to_stream", None)
    length = response.get("Content-Length")
    if f is None or length is None:
        return None
    try:
        fd = f.fileno()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        offset = f.tell()
        count = int(length)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    if offset < 0 or count < 0:
        return None
    name = getattr(f, "name", None)
    whole = offset == 0 and count == st.st_size
    return fd, offset, count, whole, name if isinstance(name, str) else None
