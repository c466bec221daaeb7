"""Userspace copy, for where zero-copy cannot work: TLS, pipes, in-memory files.

Rules:

* Memory is bounded. On a transport, the write-buffer limits are set to
  (``chunk``, ``2 * chunk``) for the transfer and we wait for the transport
  to drain below the high-water mark before each read. At most about three
  chunks are held at any time.
* Every chunk is a **new** bytes object that nobody touches after
  ``transport.write()``. The transport may keep a view of it until the peer
  reads it (CPython 3.12+ does), so reusing one buffer corrupts data under a
  slow reader.
* A regular file is read with ``pread`` at our own offset: on the loop when its
  pages are cached (a ``RWF_NOWAIT`` read), in the cold-read pool otherwise.
  A stream (pipe, socket file) is read in that pool too, because its ``read``
  may block. In-memory files (``BytesIO``) are read inline.
* Headers go in the first write, with the file's first chunk. Trailers go in
  the last write.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Awaitable, Callable
from typing import IO, Any

from . import _platform
from ._errors import _Progress
from ._lease import TransportLease
from ._options import Options
from ._state import TransferState

__all__ = ("DEFAULT_FALLBACK_CHUNK", "copy_to_socket", "copy_to_transport", "ChunkReader")

#: Bytes per userspace read/write (aiohttp uses 256 KiB too).
DEFAULT_FALLBACK_CHUNK = 256 * 1024


class ChunkReader:
    """Reads the file at the transfer's own position, one fresh bytes object per call."""

    def __init__(self, file: IO[bytes] | Any, regular_fd: int | None, options: Options) -> None:
        self._file = file
        self._fd = regular_fd
        self._in_memory = isinstance(file, io.BytesIO)
        self._read = getattr(file, "read1", None) or file.read
        self._options = options

    async def read(self, position: int, size: int) -> bytes:
        loop = asyncio.get_running_loop()
        if self._fd is not None:
            if self._options.probe:
                data = _platform.pread_cached(self._fd, size, position)
                if data is not None:
                    return data
                _platform.counters.cold += 1
            else:
                return os.pread(self._fd, size, position)
            return await loop.run_in_executor(self._options.cold_executor, os.pread, self._fd, size, position)
        if self._in_memory:
            return bytes(self._read(size))
        return bytes(await loop.run_in_executor(self._options.cold_executor, self._read, size))


async def copy_to_transport(
    lease: TransportLease,
    reader: ChunkReader,
    state: TransferState,
    progress: _Progress,
    options: Options,
    chunk: int = DEFAULT_FALLBACK_CHUNK,
) -> None:
    """Copy through ``transport.write`` with the transport's flow control."""
    lease.set_buffer_limits(high=2 * chunk, low=chunk)

    async def send(data: bytes) -> None:
        await lease.drain()
        lease.write(data)

    await _copy(send, reader, state, progress, options, chunk)


async def copy_to_socket(
    sock: Any,
    reader: ChunkReader,
    state: TransferState,
    progress: _Progress,
    options: Options,
    chunk: int = DEFAULT_FALLBACK_CHUNK,
) -> None:
    """Copy to a raw non-blocking socket with ``loop.sock_sendall``."""
    loop = asyncio.get_running_loop()

    async def send(data: bytes) -> None:
        await loop.sock_sendall(sock, data)

    await _copy(send, reader, state, progress, options, chunk)


async def _copy(
    send: Callable[[bytes], Awaitable[None]],
    reader: ChunkReader,
    state: TransferState,
    progress: _Progress,
    options: Options,
    chunk: int,
) -> None:
    """Read fresh chunks and *send* them: headers with the first, trailers after the last."""
    prefix = bytes(options.headers)
    while not state.done:
        data = await reader.read(state.position, state.next_chunk(chunk))
        if not data:
            if state.hit_eof():
                raise state.truncated()
            break  # unknown size: EOF is the end
        await send(prefix + data if prefix else data)
        prefix = b""
        _advance(state, progress, options, len(data))
    if prefix or options.trailers:
        await send(prefix + bytes(options.trailers))


def _advance(state: TransferState, progress: _Progress, options: Options, n: int) -> None:
    state.advance(n)
    progress.sent = state.sent
    if options.on_progress is not None:
        options.on_progress(state.sent, state.total)
