"""``FileResponse`` for aiohttp: a file as an HTTP response, body sent by aiosendfile.

The decisions are the static core's (``aiosendfile._static``: representation, open and
containment, validators, preconditions, ranges, hot cache); this class renders its ``Answer``
through aiohttp, so middlewares, signals and access logs see an ordinary ``StreamResponse``:

* Headers: the core's fields join the response's own; ``Vary`` is added to a caller's, every
  other field replaces the caller's, and a caller's ``Content-Type`` wins over the file name's.
  A 304 drops Content-Type/Length/Encoding; 412/416 and errors found on opening the file
  (symlink out of the root, a FIFO) are sent with ``Content-Length: 0``.
* A pre-compressed sibling turns a middleware's compression off; a body a middleware compresses
  gets no ranges and goes through aiohttp's writer, as does a chunked one.
* Bodies: cached bytes in one write with the headers; a range up to ``inline_limit`` read (on
  the loop when cached, else in the cold-read pool) and written with the headers; anything else
  through ``aiosendfile.sendfile`` with aiohttp's buffered headers in front (zero-copy on plain
  TCP/Unix, bounded copy over TLS), counted into aiohttp's output size (access log ``%b``).

The decision runs inline: stat and open take microseconds on a hot dentry/inode cache, the
common case for a static server. A body that cannot be sent whole (the file shrank, the peer
vanished) aborts the connection, so a short body is never passed off as complete on a
keep-alive connection.
"""

from __future__ import annotations

import io
import os
from typing import Any

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.typedefs import LooseHeaders, PathLike

from .. import _compat
from .._api import sendfile
from .._coldread import read_range
from .._errors import SendfileError
from .._options import DEFAULT_FALLBACK_CHUNK
from .._static import _http
from .._static._answer import Answer, FileRange, Multipart
from .._static._core import Located, respond
from .._static._policy import DEFAULT_INLINE_LIMIT, file_policy
from .._static._request import Request

__all__ = ("DEFAULT_INLINE_LIMIT", "FileResponse")


@_compat.keep_headers_buffered  # keep aiohttp's header buffer: they may leave with the body
class FileResponse(web.StreamResponse):
    """A drop-in for ``aiohttp.web.FileResponse`` whose body goes out through aiosendfile."""

    def __init__(
        self,
        path: PathLike,
        chunk_size: int = DEFAULT_FALLBACK_CHUNK,
        status: int = 200,
        reason: str | None = None,
        headers: LooseHeaders | None = None,
        *,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        precompressed: bool = True,
        root: str | None = None,
        follow_symlinks: bool = False,
        hot_cache: bool = True,
        stat_result: os.stat_result | None = None,
    ) -> None:
        super().__init__(status=status, reason=reason, headers=headers)
        self._path = os.fspath(path)
        self._chunk_size = chunk_size  # the copy's chunk where aiohttp's writer must carry the body
        # root: set by the static resource, every file opened must lie inside it.
        self._policy = file_policy(root, follow_symlinks, precompressed, hot_cache, inline_limit)
        # What to answer: the path, the static handler's stat of it and its lookup of the
        # pre-compressed siblings for this request, if any (each saves syscalls).
        self._located = Located(self._path, stat_result)

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self.prepared:
            return await super().prepare(request)
        req = Request(
            request.method,
            b"",
            headers=request.headers,
            ranges_ok=not _compat.compresses(self, request),
            content_type=self.headers.get(hdrs.CONTENT_TYPE),
        )
        with respond(req, self._located, self._policy) as answer:
            return await self._render(request, answer)

    async def _render(self, request: web.BaseRequest, answer: Answer) -> AbstractStreamWriter | None:
        self._add_file_headers(answer.fields)
        if answer.encoding is not None:
            _compat.turn_off_compression(self)  # already compressed: a middleware must not do it again
        if answer.status != 200:  # (a whole file keeps the status the caller asked for, as aiohttp's)
            self.set_status(answer.status)
        if answer.length is None:  # 304: no body, and none announced
            for name in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH, hdrs.CONTENT_ENCODING):
                self.headers.popall(name, None)
            _compat.skip_length_check(self)
        else:
            self.content_length = answer.length
        writer = await super().prepare(request)
        if answer.head_only:
            await super().write_eof()
            return writer
        assert writer is not None
        if request.transport is None:  # the client left before its body: what aiohttp's class raises
            raise ConnectionResetError("Connection lost")
        body = answer.body
        try:
            if isinstance(body, bytes):
                await writer.write(body)
            elif isinstance(body, FileRange):
                byte_range = _http.ByteRange(body.start, body.start + body.length)
                await self._send_body(request, writer, body.fd, byte_range)
            elif isinstance(body, Multipart):
                last = len(body.parts) - 1
                for i, (part_header, byte_range) in enumerate(body.parts):
                    await self._send_body(
                        request,
                        writer,
                        body.source,
                        byte_range,
                        part_header,
                        body.closing if i == last else b"",
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

    def _add_file_headers(self, fields: list[tuple[str, str]]) -> None:
        """Put the core's fields into this response's headers.

        ``Vary`` joins a ``Vary`` the caller set; every other field replaces the caller's.
        """
        headers = self.headers
        for name, value in fields:
            if name == hdrs.VARY:
                headers.add(name, value)
            else:
                headers[name] = value

    async def _send_body(
        self,
        request: web.BaseRequest,
        writer: AbstractStreamWriter,
        source: int | bytes,
        byte_range: _http.ByteRange,
        prefix: bytes = b"",
        suffix: bytes = b"",
    ) -> None:
        """One range of *source* (the file's cached bytes, or its open descriptor), with *prefix*
        before and *suffix* after it (multipart framing)."""
        if isinstance(source, bytes):  # a hot small file: its bytes are in memory
            part = source[byte_range.start : byte_range.stop]
            await writer.write(prefix + part + suffix if prefix or suffix else part)
            return
        if self.compression or self.chunked:
            # aiohttp must frame or compress the body: it has to go through its writer.
            await self._send_through_writer(writer, source, byte_range, prefix, suffix)
            return
        if byte_range.length <= self._policy.inline_limit:
            # On the loop when cached, else in the cold-read pool.
            data = await read_range(source, byte_range.length, byte_range.start)
            if len(data) != byte_range.length:
                raise _http_truncated(byte_range, len(data))
            await writer.write(prefix + data + suffix if prefix or suffix else data)  # with the headers
            return
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("Connection lost")
        headers = _compat.take_buffered_headers(writer) + prefix
        with io.FileIO(source, "rb", closefd=False) as file:  # (a wrapper: the answer owns the descriptor)
            sent = await sendfile(
                transport, file, byte_range.start, byte_range.length, headers=headers, trailers=suffix
            )
        _count_output(writer, sent + len(headers) + len(suffix))

    async def _send_through_writer(
        self,
        writer: AbstractStreamWriter,
        fd: int,
        byte_range: _http.ByteRange,
        prefix: bytes,
        suffix: bytes,
    ) -> None:
        if prefix:
            await writer.write(prefix)
        position, end = byte_range.start, byte_range.stop
        while position < end:
            size = min(self._chunk_size, end - position)
            data = await read_range(fd, size, position)  # on the loop when cached
            if not data:
                raise _http_truncated(byte_range, position - byte_range.start)
            await writer.write(data)
            position += len(data)
        if suffix:
            await writer.write(suffix)


def _http_truncated(byte_range: _http.ByteRange, got: int) -> SendfileError:
    from .._errors import FileTruncatedError

    return FileTruncatedError(
        f"file ended {byte_range.length - got} bytes short of the range {byte_range}",
        sent=0,
        expected=byte_range.length,
    )


def _count_output(writer: Any, sent: int) -> None:
    """Keep aiohttp's byte accounting (access log ``%b``) right for bytes sent around it."""
    if hasattr(writer, "output_size"):
        writer.output_size += sent
