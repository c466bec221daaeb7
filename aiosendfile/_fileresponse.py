"""``FileResponse`` for aiohttp: a file as an HTTP response, body sent by aiosendfile.

How a request is answered, in order:

1. Pick the representation: a pre-compressed sibling (``.br``, ``.gz``) when
   ``Accept-Encoding`` allows it and the sibling exists, else the file.
   ``Vary: Accept-Encoding`` is sent whenever a sibling exists.
2. Open it (``O_NONBLOCK``, so a FIFO cannot hang the loop) and ``fstat`` the
   open descriptor. The validators (``ETag``, ``Last-Modified``) and the length
   come from that descriptor, so they describe exactly what is sent.
3. Preconditions (``If-Match`` … ``If-Modified-Since``) give 412 or 304.
4. ``Range`` (subject to ``If-Range``) gives 206 with one range, 206
   ``multipart/byteranges`` with several, or 416 when none is satisfiable.
5. Send. ``HEAD``/304/416 send headers only. Bodies up to ``inline_limit``
   whose pages are in the page cache are read on the loop and leave in one
   write together with the headers. Anything else goes through
   ``aiosendfile.sendfile`` (zero-copy on plain TCP/Unix, bounded copy over TLS).
   A cold small file is read in the executor.

Stat and open run inline: on a hot dentry/inode cache they take microseconds,
and that is the common case for a static server. A body that cannot be sent
whole (the file shrank, the peer vanished) aborts the connection, so a short
body is never passed off as complete on a keep-alive connection.
"""

from __future__ import annotations

import asyncio
import mimetypes
import os
import stat
import uuid
from pathlib import Path
from typing import IO, Any

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.typedefs import LooseHeaders, PathLike

from . import _http, _platform
from ._api import sendfile
from ._errors import SendfileError

__all__ = ("DEFAULT_INLINE_LIMIT", "FileResponse")

#: Bodies up to this size are written with the headers in one write when cached.
DEFAULT_INLINE_LIMIT = 64 * 1024

#: Pre-compressed siblings, in the server's order of preference.
_ENCODINGS = (("br", ".br"), ("gzip", ".gz"))

_O_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class FileResponse(web.StreamResponse):
    """A drop-in for ``aiohttp.web.FileResponse`` whose body goes out through aiosendfile."""

    _send_headers_immediately = False  # keep aiohttp's header buffer: they may leave with the body

    def __init__(
        self,
        path: PathLike,
        chunk_size: int = 256 * 1024,
        status: int = 200,
        reason: str | None = None,
        headers: LooseHeaders | None = None,
        *,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        precompressed: bool = True,
    ) -> None:
        super().__init__(status=status, reason=reason, headers=headers)
        self._path = Path(path)
        self._chunk_size = chunk_size  # kept for aiohttp compatibility; sendfile sizes its own chunks
        self._inline_limit = inline_limit
        self._precompressed = precompressed

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self.prepared:
            return await super().prepare(request)
        try:
            file, st, encoding, vary = self._open(request)
        except web.HTTPException as exc:
            # prepare() runs outside the handler: answer the error instead of raising it.
            return await self._headers_only(request, exc.status)
        with file:
            return await self._respond(request, file, st, encoding, vary)

    # -- choosing and opening the file ---------------------------------------------------

    def _open(self, request: web.BaseRequest) -> tuple[IO[bytes], os.stat_result, str | None, bool]:
        """Open the best representation: (file, its fstat, its encoding, whether to send Vary)."""
        candidates: list[tuple[str | None, Path]] = []
        vary = False
        if self._precompressed:
            siblings = [(enc, self._path.with_name(self._path.name + ext)) for enc, ext in _ENCODINGS]
            present = [(enc, p) for enc, p in siblings if _is_file(p)]
            vary = bool(present)
            if present:
                chosen = _http.choose_encoding(
                    request.headers.get(hdrs.ACCEPT_ENCODING), [e for e, _ in present]
                )
                candidates += [(enc, p) for enc, p in present if enc == chosen]
        candidates.append((None, self._path))
        for encoding, path in candidates:
            try:
                fd = os.open(path, _O_FLAGS)
            except (FileNotFoundError, NotADirectoryError):
                continue  # a sibling that vanished: fall back to the next candidate
            except PermissionError as exc:
                raise web.HTTPForbidden() from exc
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):  # a directory, FIFO or device
                    raise web.HTTPForbidden()
                os.set_blocking(fd, True)
                return open(fd, "rb", buffering=0), st, encoding, vary
            except BaseException:
                os.close(fd)
                raise
        raise web.HTTPNotFound()

    # -- the response ----------------------------------------------------------------------

    async def _respond(
        self, request: web.BaseRequest, file: IO[bytes], st: os.stat_result, encoding: str | None, vary: bool
    ) -> AbstractStreamWriter | None:
        size = st.st_size
        etag = _http.make_etag(st.st_mtime_ns, size)
        last_modified = int(st.st_mtime)
        headers = self.headers
        headers[hdrs.ETAG] = etag
        headers[hdrs.LAST_MODIFIED] = _http.http_date(last_modified)
        headers[hdrs.ACCEPT_RANGES] = "bytes"
        if vary:
            headers.add(hdrs.VARY, hdrs.ACCEPT_ENCODING)

        status = _http.evaluate_preconditions(request.method, request.headers, etag, last_modified)
        if status is not None:
            return await self._headers_only(request, status)

        content_type = self._guess_content_type()
        if encoding is not None:
            headers[hdrs.CONTENT_ENCODING] = encoding
        ranges: list[_http.ByteRange] | None = None
        if hdrs.RANGE in request.headers and _http.if_range_allows(
            request.headers.get(hdrs.IF_RANGE), etag, last_modified
        ):
            try:
                ranges = _http.parse_ranges(request.headers[hdrs.RANGE], size)
            except _http.RangeNotSatisfiable:
                headers[hdrs.CONTENT_RANGE] = f"bytes */{size}"
                return await self._headers_only(request, 416)

        if ranges is None:
            headers[hdrs.CONTENT_TYPE] = content_type
            if size == 0:
                return await self._headers_only(request, 200)
            return await self._send_ranges(request, file, [_http.ByteRange(0, size)], size, 200)
        if len(ranges) == 1:
            headers[hdrs.CONTENT_TYPE] = content_type
            headers[hdrs.CONTENT_RANGE] = ranges[0].content_range(size)
            return await self._send_ranges(request, file, ranges, ranges[0].length, 206)
        boundary = uuid.uuid4().hex
        parts, closing, length = _http.multipart_byteranges(ranges, size, content_type, boundary)
        headers[hdrs.CONTENT_TYPE] = f"multipart/byteranges; boundary={boundary}"
        return await self._send_ranges(request, file, ranges, length, 206, parts, closing)

    def _guess_content_type(self) -> str:
        if hdrs.CONTENT_TYPE in self.headers:
            return self.headers[hdrs.CONTENT_TYPE]
        guessed, _ = mimetypes.guess_type(self._path.name)
        return guessed or "application/octet-stream"

    async def _headers_only(self, request: web.BaseRequest, status: int) -> AbstractStreamWriter | None:
        self.set_status(status)
        if status == 304:
            for name in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH, hdrs.CONTENT_ENCODING):
                self.headers.popall(name, None)
            self._length_check = False
        else:
            self.content_length = 0
        writer = await super().prepare(request)
        await super().write_eof()
        return writer

    async def _send_ranges(
        self,
        request: web.BaseRequest,
        file: IO[bytes],
        ranges: list[_http.ByteRange],
        length: int,
        status: int,
        parts: list[tuple[bytes, _http.ByteRange]] | None = None,
        closing: bytes = b"",
    ) -> AbstractStreamWriter | None:
        self.set_status(status)
        self.content_length = length
        writer = await super().prepare(request)
        assert writer is not None
        if request.method == hdrs.METH_HEAD or length == 0:
            await super().write_eof()
            return writer
        try:
            if parts is None:
                await self._send_body(request, writer, file, ranges[0])
            else:
                for i, (part_header, byte_range) in enumerate(parts):
                    last = i == len(parts) - 1
                    await self._send_body(
                        request, writer, file, byte_range, part_header, closing if last else b""
                    )
        except (SendfileError, OSError):
            # Never pass off a short body as complete: the connection cannot be reused.
            self.force_close()
            transport = request.transport
            if transport is not None:
                transport.abort()
            raise
        await super().write_eof()
        return writer

    async def _send_body(
        self,
        request: web.BaseRequest,
        writer: AbstractStreamWriter,
        file: IO[bytes],
        byte_range: _http.ByteRange,
        prefix: bytes = b"",
        suffix: bytes = b"",
    ) -> None:
        """One range of the file, with *prefix* before and *suffix* after it (multipart framing)."""
        if byte_range.length <= self._inline_limit:
            data = _platform.pread_cached(file.fileno(), byte_range.length, byte_range.start)
            if data is None:  # cold (or cannot tell): read off the loop thread
                loop = asyncio.get_running_loop()
                data = await loop.run_in_executor(
                    None, os.pread, file.fileno(), byte_range.length, byte_range.start
                )
            if len(data) != byte_range.length:
                raise _http_truncated(byte_range, len(data))
            await writer.write(prefix + data + suffix if prefix or suffix else data)  # with the headers
            return
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("Connection lost")
        headers = _take_buffered_headers(writer) + prefix
        sent = await sendfile(
            transport, file, byte_range.start, byte_range.length, headers=headers, trailers=suffix
        )
        _count_output(writer, sent + len(headers) + len(suffix))


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _http_truncated(byte_range: _http.ByteRange, got: int) -> SendfileError:
    from ._errors import FileTruncatedError

    return FileTruncatedError(
        f"file ended {byte_range.length - got} bytes short of the range {byte_range}",
        sent=0,
        expected=byte_range.length,
    )


def _take_buffered_headers(writer: Any) -> bytes:
    """Take aiohttp's not-yet-sent response headers, to send them with the file's first bytes.

    aiohttp (3.10+) buffers them until the first body write. Where its writer
    does not look as expected, send them now the ordinary way: the order is
    right either way, only the packet count differs.
    """
    buf = getattr(writer, "_headers_buf", None)
    if isinstance(buf, bytes) and buf and getattr(writer, "_headers_written", True) is False:
        writer._headers_buf = None
        writer._headers_written = True
        return buf
    send_headers = getattr(writer, "send_headers", None)
    if send_headers is not None:
        send_headers()
    return b""


def _count_output(writer: Any, sent: int) -> None:
    """Keep aiohttp's byte accounting (access log ``%b``) right for bytes sent around it."""
    if hasattr(writer, "output_size"):
        writer.output_size += sent
