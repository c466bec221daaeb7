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
* A regular file is read with ``pread`` at our own offset. A stream (pipe,
  socket file) is read in the default executor, because its ``read`` may block.
  In-memory files (``BytesIO``) are read inline.
"""

from __future__ import annotations

import asyncio
import io
import os
from typing import IO, Any

from ._errors import _Progress
from ._lease import TransportLease
from ._state import TransferState

__all__ = ("DEFAULT_FALLBACK_CHUNK", "copy_to_socket", "copy_to_transport", "ChunkReader")

#: Bytes per userspace read/write (aiohttp uses 256 KiB too).
DEFAULT_FALLBACK_CHUNK = 256 * 1024


class ChunkReader:
    """Reads the file at the transfer's own position, one fresh bytes object per call."""

    def __init__(self, file: IO[bytes] | Any, regular_fd: int | None) -> None:
        self._file = file
        self._fd = regular_fd
        self._inline = regular_fd is not None or isinstance(file, io.BytesIO)
        self._read = getattr(file, "read1", None) or file.read

    async def read(self, position: int, size: int) -> bytes:
        if self._fd is not None:
            return os.pread(self._fd, size, position)
        if self._inline:
            return bytes(self._read(size))
        loop = asyncio.get_running_loop()
        return bytes(await loop.run_in_executor(None, self._read, size))


async def copy_to_transport(
    lease: TransportLease,
    reader: ChunkReader,
    state: TransferState,
    progress: _Progress,
    chunk: int = DEFAULT_FALLBACK_CHUNK,
) -> None:
    """Copy through ``transport.write`` with the transport's flow control."""
    lease.set_buffer_limits(high=2 * chunk, low=chunk)
    while not state.done:
        await lease.drain()
        data = await reader.read(state.position, state.next_chunk(chunk))
        if not data:
            if state.hit_eof():
                raise state.truncated()
            return  # unknown size: EOF is the end
        lease.write(data)
        state.advance(len(data))
        progress.sent = state.sent


async def copy_to_socket(
    sock: Any,
    reader: ChunkReader,
    state: TransferState,
    progress: _Progress,
    chunk: int = DEFAULT_FALLBACK_CHUNK,
) -> None:
    """Copy to a raw non-blocking socket with ``loop.sock_sendall``."""
    loop = asyncio.get_running_loop()
    while not state.done:
        data = await reader.read(state.position, state.next_chunk(chunk))
        if not data:
            if state.hit_eof():
                raise state.truncated()
            return
        await loop.sock_sendall(sock, data)
        state.advance(len(data))
        progress.sent = state.sent
