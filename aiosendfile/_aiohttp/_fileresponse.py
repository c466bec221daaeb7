"""``FileResponse`` for aiohttp: a file as an HTTP response, body sent by aiosendfile.

How a request is answered, in order:

1. Pick the representation: a pre-compressed sibling (``.br``, ``.gz``) when
   ``Accept-Encoding`` allows it and the sibling exists, else the file. A
   sibling that cannot be opened (unreadable, replaced by a directory) counts
   as absent: the file is served, as nginx's ``gzip_static`` does. Without a
   static root (``FileResponse(path)`` in a handler) a symlinked sibling counts
   as absent too, as in aiohttp's class: nothing would contain where it points.
   ``Vary: Accept-Encoding`` is sent whenever pre-compressed variants are on.
2. Open it (``O_NONBLOCK``, so a FIFO cannot hang the loop). Under a static
   root, check that the *opened descriptor* lies inside the root (its
   ``/proc/self/fd`` link): a symlinked sibling or index cannot escape, and
   nothing can be swapped between the check and the open. Then ``fstat`` it.
   The validators (``ETag``, ``Last-Modified``) and the length come from that
   descriptor, so they describe exactly what is sent.
3. Preconditions (``If-Match`` … ``If-Modified-Since``) give 412 or 304.
4. ``Range`` (subject to ``If-Range``) gives 206 with one range, 206
   ``multipart/byteranges`` with several, or 416 when none is satisfiable.
5. Send. ``HEAD``/304/416 send headers only. Bodies up to ``inline_limit``
   whose pages are in the page cache are read on the loop and leave in one
   write together with the headers. Anything else goes through
   ``aiosendfile.sendfile`` (zero-copy on plain TCP/Unix, bounded copy over TLS).
   A cold small file is read in the cold-read pool (``_coldread``), never in
   the loop's default executor. If a middleware enabled
   compression, the body goes through aiohttp's writer, which compresses and
   frames it.

Stat and open run inline: on a hot dentry/inode cache they take microseconds,
and that is the common case for a static server. A body that cannot be sent
whole (the file shrank, the peer vanished) aborts the connection, so a short
body is never passed off as complete on a keep-alive connection.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import uuid
from typing import IO, Any

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.typedefs import LooseHeaders, PathLike

from .. import _compat, _platform
from .._api import sendfile
from .._coldread import read_range
from .._errors import SendfileError
from .._options import DEFAULT_FALLBACK_CHUNK
from .._static import _http
from .._static._hot import HOT_FILES_MAX_BYTES, HOT_FILES_MAX_ENTRIES, HotEntry, HotFiles, hot_files
from .._static._mime import content_type_for
from .._static._paths import inside
from .._static._policy import DEFAULT_INLINE_LIMIT, ENCODINGS

__all__ = (
    "DEFAULT_INLINE_LIMIT",
    "HOT_FILES_MAX_BYTES",
    "HOT_FILES_MAX_ENTRIES",
    "FileResponse",
    "HotEntry",
    "HotFiles",
    "content_type_for",
    "hot_files",
    "inside",
)

_O_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
#: For a sibling with no root to contain it: a symlink is refused (ELOOP), as aiohttp's class does.
_O_NOFOLLOW_FLAGS = _O_FLAGS | getattr(os, "O_NOFOLLOW", 0)


class _Cached:
    """A file answered from :data:`hot_files`: nothing is open."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __enter__(self) -> _Cached:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


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
        self._root = root  # set by the static resource: every file opened must lie inside it
        self._follow_symlinks = follow_symlinks
        self._chunk_size = chunk_size  # kept for aiohttp compatibility; sendfile sizes its own chunks
        self._inline_limit = inline_limit
        self._precompressed = precompressed
        self._hot_cache = hot_cache  # small files answered from memory while unchanged (HotFiles)
        self._stat_hint = stat_result  # the static handler's stat of path (saves one syscall)
        # The static handler's lookup of pre-compressed siblings for this request (saves their stats).
        self._siblings_hint: list[tuple[str, str]] | None = None

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

    def _open(self, request: web.BaseRequest) -> tuple[IO[bytes] | _Cached, os.stat_result, str | None, bool]:
        """Open the best representation: (file, its fstat, its encoding, whether to send Vary).

        Siblings are looked up only when ``Accept-Encoding`` admits them, and
        ``Vary: Accept-Encoding`` is sent whenever pre-compressed variants are on
        (as nginx's ``gzip_vary``), so a plain request costs no extra ``stat``.
        """
        candidates: list[tuple[str | None, str]] = []
        accept = request.headers.get(hdrs.ACCEPT_ENCODING) if self._precompressed else None
        if accept:
            present = self._siblings_hint
            if present is None:
                present = precompressed_siblings(self._path, accept)
            if present:
                chosen = _http.choose_encoding(accept, [enc for enc, _ in present])
                candidates += [(enc, p) for enc, p in present if enc == chosen]
        candidates.append((None, self._path))
        cache_root = self._root if not self._follow_symlinks else None
        # With no root to check containment against, a symlinked sibling could name any file.
        sibling_flags = _O_NOFOLLOW_FLAGS if self._root is None and not self._follow_symlinks else _O_FLAGS
        for encoding, path in candidates:
            if self._hot_cache:
                try:
                    st = self._stat_hint if encoding is None and self._stat_hint else os.stat(path)
                except OSError:
                    st = None  # let the open below say what is wrong
                if st is not None and st.st_size <= self._inline_limit and stat.S_ISREG(st.st_mode):
                    body = hot_files.get(path, cache_root, st)
                    if body is not None:
                        return _Cached(body), st, encoding, self._precompressed
            try:
                fd = os.open(path, _O_FLAGS if encoding is None else sibling_flags)
            except OSError as exc:
                if encoding is not None:
                    # A sibling that vanished or that we may not read (EACCES, ELOOP, ...): serve the
                    # next candidate, as nginx's gzip_static declines on any open error.
                    continue
                if isinstance(exc, PermissionError) or exc.errno == errno.ENXIO:  # ENXIO: a socket
                    raise web.HTTPForbidden() from exc
                raise web.HTTPNotFound() from exc  # ENOENT, ENOTDIR, ELOOP, ENAMETOOLONG, ...
            if not self._opened_inside_root(fd, path):  # a symlink (sibling, index, race) pointing out
                os.close(fd)
                if encoding is not None:
                    continue  # a sibling that escapes counts as absent
                raise web.HTTPNotFound()
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):  # a directory, FIFO or device
                    if encoding is not None:  # a sibling replaced since its stat: as if absent
                        os.close(fd)
                        continue
                    raise web.HTTPForbidden()
                if self._hot_cache and st.st_size <= self._inline_limit:
                    read = _platform.pread_cached(fd, st.st_size, 0)
                    if read is not None and len(read) == st.st_size:
                        body = bytes(read)  # shared by every request while cached: immutable
                        hot_files.put(path, cache_root, st, body)
                        os.close(fd)
                        return _Cached(body), st, encoding, self._precompressed
                os.set_blocking(fd, True)
                return open(fd, "rb", buffering=0), st, encoding, self._precompressed
            except BaseException:
                os.close(fd)
                raise
        raise web.HTTPNotFound()

    def _opened_inside_root(self, fd: int, path: str) -> bool:
        """Whether the file actually opened lies inside the root (checked on the open fd: no race)."""
        if self._root is None or self._follow_symlinks:
            return True
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = os.path.realpath(path)  # no /proc (macOS/BSD): check the path instead
        return inside(real, self._root)

    # -- the response ----------------------------------------------------------------------

    async def _respond(
        self,
        request: web.BaseRequest,
        file: IO[bytes] | _Cached,
        st: os.stat_result,
        encoding: str | None,
        vary: bool,
    ) -> AbstractStreamWriter | None:
        size = st.st_size
        etag = _http.make_etag(st.st_mtime_ns, size)
        last_modified = int(st.st_mtime)

        request_headers = request.headers
        if any(name in request_headers for name in _CONDITIONAL):
            status = _http.evaluate_preconditions(request.method, request_headers, etag, last_modified)
            if status is not None:
                self._add_file_headers(_http.file_headers(etag, last_modified, vary=vary))
                return await self._headers_only(request, status)

        # The headers of every answer from here on: the validators, Vary, Content-Encoding, and what is given.
        answer = functools.partial(_http.file_headers, etag, last_modified, vary=vary, encoding=encoding)
        content_type = self._guess_content_type()
        if encoding is not None:
            _compat.turn_off_compression(self)  # already compressed: a middleware must not do it again
        ranges: list[_http.ByteRange] | None = None
        # Ranges apply to GET only (RFC 9110 §14.2), and not to a body a middleware compresses.
        if (
            request.method == hdrs.METH_GET
            and not self.compression
            and hdrs.RANGE in request.headers
            and _http.if_range_allows(request.headers.get(hdrs.IF_RANGE), etag, last_modified)
        ):
            try:
                ranges = _http.parse_ranges(request.headers[hdrs.RANGE], size)
            except _http.RangeNotSatisfiable:
                self._add_file_headers(answer(content_range=f"bytes */{size}"))
                return await self._headers_only(request, 416)

        if ranges is None:
            self._add_file_headers(answer(content_type=content_type))
            if size == 0:
                return await self._headers_only(request, 200)
            return await self._send_ranges(request, file, [_http.ByteRange(0, size)], size, 200)
        if len(ranges) == 1:
            self._add_file_headers(
                answer(content_type=content_type, content_range=ranges[0].content_range(size))
            )
            return await self._send_ranges(request, file, ranges, ranges[0].length, 206)
        boundary = uuid.uuid4().hex
        parts, closing, length = _http.multipart_byteranges(ranges, size, content_type, boundary)
        self._add_file_headers(answer(content_type=f"multipart/byteranges; boundary={boundary}"))
        return await self._send_ranges(request, file, ranges, length, 206, parts, closing)

    def _add_file_headers(self, answer: list[tuple[str, str]]) -> None:
        """Put :func:`_http.file_headers`' list into this response's headers.

        ``Vary`` joins a ``Vary`` the caller set; every other field replaces the caller's.
        """
        headers = self.headers
        for name, value in answer:
            if name == hdrs.VARY:
                headers.add(name, value)
            else:
                headers[name] = value

    def _guess_content_type(self) -> str:
        if hdrs.CONTENT_TYPE in self.headers:
            return self.headers[hdrs.CONTENT_TYPE]
        return content_type_for(os.path.basename(self._path))

    async def _headers_only(self, request: web.BaseRequest, status: int) -> AbstractStreamWriter | None:
        self.set_status(status)
        if status == 304:
            for name in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH, hdrs.CONTENT_ENCODING):
                self.headers.popall(name, None)
            _compat.skip_length_check(self)
        else:
            self.content_length = 0
        writer = await super().prepare(request)
        await super().write_eof()
        return writer

    async def _send_ranges(
        self,
        request: web.BaseRequest,
        file: IO[bytes] | _Cached,
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
        if request.transport is None:  # the client left before its body: what aiohttp's class raises
            raise ConnectionResetError("Connection lost")
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
        file: IO[bytes] | _Cached,
        byte_range: _http.ByteRange,
        prefix: bytes = b"",
        suffix: bytes = b"",
    ) -> None:
        """One range of the file, with *prefix* before and *suffix* after it (multipart framing)."""
        if isinstance(file, _Cached):  # a hot small file: its bytes are in memory
            part = file.body[byte_range.start : byte_range.stop]
            await writer.write(prefix + part + suffix if prefix or suffix else part)
            return
        if self.compression or self.chunked:
            # aiohttp must frame or compress the body: it has to go through its writer.
            await self._send_through_writer(writer, file, byte_range, prefix, suffix)
            return
        if byte_range.length <= self._inline_limit:
            # On the loop when cached, else in the cold-read pool.
            data = await read_range(file.fileno(), byte_range.length, byte_range.start)
            if len(data) != byte_range.length:
                raise _http_truncated(byte_range, len(data))
            await writer.write(prefix + data + suffix if prefix or suffix else data)  # with the headers
            return
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("Connection lost")
        headers = _compat.take_buffered_headers(writer) + prefix
        sent = await sendfile(
            transport, file, byte_range.start, byte_range.length, headers=headers, trailers=suffix
        )
        _count_output(writer, sent + len(headers) + len(suffix))

    async def _send_through_writer(
        self,
        writer: AbstractStreamWriter,
        file: IO[bytes],
        byte_range: _http.ByteRange,
        prefix: bytes,
        suffix: bytes,
    ) -> None:
        if prefix:
            await writer.write(prefix)
        position, end = byte_range.start, byte_range.stop
        while position < end:
            size = min(self._chunk_size, end - position)
            data = await read_range(file.fileno(), size, position)  # on the loop when cached
            if not data:
                raise _http_truncated(byte_range, position - byte_range.start)
            await writer.write(data)
            position += len(data)
        if suffix:
            await writer.write(suffix)


_CONDITIONAL = (hdrs.IF_MATCH, hdrs.IF_NONE_MATCH, hdrs.IF_MODIFIED_SINCE, hdrs.IF_UNMODIFIED_SINCE)


def precompressed_siblings(path: str, accept: str) -> list[tuple[str, str]]:
    """(encoding, sibling path) of the ``.br``/``.gz`` siblings *accept* admits and that exist."""
    return [
        (enc, path + ext)
        for enc, ext in ENCODINGS
        if _http.choose_encoding(accept, (enc,)) == enc and _is_file(path + ext)
    ]


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


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
