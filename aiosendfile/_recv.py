"""Zero-copy receive: ``recvfile`` moves bytes from a socket into a file with ``splice(2)``.

Theory of operation
-------------------
* **The path.** socket → pipe → file, both legs ``splice``: the bytes never
  enter userspace. The splice driver (``_splice``) does it, on the loop.
* **Nothing lost, nothing reordered.** The transport's reading is paused, and
  its protocol swapped (``TransportLease(receiving=True)``) before we look at
  the ``StreamReader``. Whatever the reader had already buffered (the start of
  a body that arrived with the headers) goes to the file first, then the
  socket's bytes. We never read past ``count``, so the next message stays in
  the socket for the reader.
* **Consistency.** ``received`` counts bytes that are in the file. Bytes still
  in the pipe when we stop (an error, a cancellation) are written out first,
  so the file always holds exactly ``offset .. offset + received``. A peer
  that closes early raises :class:`IncompleteTransferError` with ``.received``.
* **Fallback.** TLS transports, non-regular files and platforms without
  splice read through the ``StreamReader`` (or ``sock_recv``) and write in
  bounded chunks from the cold-read pool, so a slow disk never blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import stat
import sys
from collections.abc import Callable
from concurrent.futures import Executor
from typing import IO, Any

from . import _compat, _platform
from ._errors import SendfileNotAvailableError, map_exceptions
from ._lease import TransportLease
from ._options import DEFAULT_FALLBACK_CHUNK, default_cold_executor, default_stream_executor
from ._sink import FileSink
from ._splice import splice_to_file
from ._state import check_int
from ._target import is_tls, resolve_socket

__all__ = ("recvfile",)


async def recvfile(
    source: Any,
    file: IO[bytes],
    count: int,
    *,
    offset: int | None = None,
    fallback: bool = True,
    executor: Executor | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Receive exactly *count* bytes from *source* into *file*; return *count*.

    *source* is an ``asyncio.StreamReader`` (of a stock asyncio or uvloop
    connection) or a non-blocking stream ``socket.socket``. The bytes go to
    *file* at *offset* (default: its current position; a file opened for
    appending, its end, where its bytes land). Afterwards the file
    position is ``offset + received``, on success and on error. Errors carry
    ``.received`` (``.sent``) where it applies.
    """
    check_int("count", count)  # the count, then the file, then the offset: which error wins
    if isinstance(file, io.TextIOBase) or "b" not in getattr(file, "mode", "b"):
        raise ValueError("file should be opened in binary mode")
    if getattr(file, "closed", False):
        raise ValueError("I/O operation on closed file")
    writable = getattr(file, "writable", None)
    if callable(writable) and not writable():
        raise ValueError("file is not open for writing")
    check_int("offset", offset, optional=True)
    end = _append_end(file)
    if offset is None:
        offset = _position(file) if end is None else end  # (appending: where the bytes land)
    elif end is not None and offset != end:
        raise ValueError(f"a file opened for appending takes bytes at its end ({end}), not at {offset}")
    file_fd = _regular_fd(file)
    reader: asyncio.StreamReader | None = None
    transport: Any = None
    sock_fd = -1
    if isinstance(source, socket.socket):
        target = resolve_socket(source)
        sock_fd = target.sock_fd
    elif isinstance(source, asyncio.StreamReader):
        reader = source
        transport = _compat.reader_transport(reader)
        if transport is None:
            raise ValueError("the StreamReader has no transport")
        sock = None if is_tls(transport) else transport.get_extra_info("socket")
        sock_fd = sock.fileno() if sock is not None else -1
    else:
        raise TypeError(
            f"source must be an asyncio.StreamReader or a socket.socket, not {type(source).__name__}"
        )
    zero_copy = _platform.HAS_SPLICE and file_fd is not None and sock_fd >= 0
    if not zero_copy and not fallback:
        raise SendfileNotAvailableError("zero-copy receive is not possible for this source and file")
    # A stream (a pipe, a socket) may never take a write: its writes wait in the streams' own
    # pool, never in the cold-read pool every file send shares.
    streaming = not _seekable(file)
    pool = executor or (default_stream_executor() if streaming else default_cold_executor())
    sink = FileSink(file, file_fd, offset, count, pool, on_progress, streaming)
    try:
        with map_exceptions(sink.state):
            if count == 0:
                return 0
            if reader is not None and zero_copy:
                await _from_reader_zero_copy(reader, transport, sock_fd, sink)
            elif reader is not None:
                await _from_reader_copy(reader, sink)
            elif zero_copy:
                await splice_to_file(sock_fd, sink, None)
            else:
                await _from_socket_copy(source, sink)
    finally:
        with contextlib.suppress(OSError, ValueError):
            file.seek(sink.state.position)
    return count


def _append_end(file: Any) -> int | None:
    """The size of *file* if it is open for appending (every write lands at its end), else None."""
    try:
        fd = file.fileno()
        return os.fstat(fd).st_size if _appends(fd) else None
    except (AttributeError, OSError, io.UnsupportedOperation, ImportError):
        return None


def _seekable(file: Any) -> bool:
    try:
        return bool(file.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _position(file: Any) -> int:
    """Where *file*'s bytes go by default: its position; 0 for a pipe or socket, which has none."""
    try:
        return int(file.tell())
    except (OSError, io.UnsupportedOperation):
        return 0


def _regular_fd(file: Any) -> int | None:
    try:
        fd = file.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    file.flush()  # anything the file object buffered goes before our bytes
    if _appends(fd):
        return None  # positioned writes do not work in append mode: copy instead
    return int(fd)


def _appends(fd: int) -> bool:
    """Whether *fd* is open for appending (every write lands at the file's end)."""
    return bool(getattr(os, "O_APPEND", 0) and _fd_flags(fd) & os.O_APPEND)


def _fd_flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


async def _from_reader_zero_copy(
    reader: asyncio.StreamReader, transport: Any, sock_fd: int, sink: FileSink
) -> None:
    lease = TransportLease(transport, receiving=True)
    lease.acquire()  # reading paused: the reader's buffer can no longer grow
    try:
        buffered = _compat.reader_buffer(reader)
        take = min(len(buffered), sink.remaining)
        if take:
            data = bytes(buffered[:take])
            del buffered[:take]
            await sink.write(data)
        if sink.remaining and reader.at_eof():
            raise sink.incomplete()
        exc = reader.exception()
        if sink.remaining and exc is not None:
            raise exc
        if sink.remaining:
            await splice_to_file(sock_fd, sink, lease)
    finally:
        lease.release()


async def _from_reader_copy(reader: asyncio.StreamReader, sink: FileSink) -> None:
    while sink.remaining:
        _compat.defuse_py310_tls_resume(reader)
        try:
            data = await reader.read(min(DEFAULT_FALLBACK_CHUNK, sink.remaining))
        except AttributeError as exc:
            # CPython 3.10's TLS transport: StreamReader.read() crashes resuming a
            # transport whose connection is gone (its TLS layer is torn down). That
            # read's bytes are lost inside asyncio; the file still holds `received`.
            if sys.version_info >= (3, 11):
                raise
            raise sink.incomplete() from exc
        if not data:
            raise sink.incomplete()
        await sink.write(data)


async def _from_socket_copy(sock: socket.socket, sink: FileSink) -> None:
    loop = asyncio.get_running_loop()
    while sink.remaining:
        data = await loop.sock_recv(sock, min(DEFAULT_FALLBACK_CHUNK, sink.remaining))
        if not data:
            raise sink.incomplete()
        await sink.write(data)
