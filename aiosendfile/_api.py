"""Public coroutines: argument checks, dispatch to zero-copy or fallback, errors.

Semantics follow ``loop.sendfile`` with three deliberate differences, all
stricter or safer:

* ``count=0`` returns 0 (asyncio raises ``ValueError``).
* A file shorter than ``offset + count`` raises :class:`FileTruncatedError`:
  before the first byte when it is short already at the start, with
  ``.sent`` when it shrinks during the transfer. asyncio silently sends less.
* ``offset`` past the end of a regular file is a ``ValueError``.

On return, and on any error once the transfer has begun, the file position
is ``offset + sent``. Argument errors leave the file untouched.
"""

from __future__ import annotations

import socket
from typing import IO, Any

from ._errors import SendfileNotAvailableError, _Progress, map_exceptions
from ._fallback import ChunkReader, copy_to_socket, copy_to_transport
from ._lease import TransportLease
from ._platform import NotSupportedBySendfile
from ._state import DEFAULT_MAX_CHUNK, TransferState
from ._target import FileInfo, Target, check_offset_count, resolve_file, resolve_socket, resolve_target
from ._writer import send_zero_copy

__all__ = ("sendfile", "sock_sendfile")


async def sendfile(
    target: Any,
    file: IO[bytes],
    offset: int = 0,
    count: int | None = None,
    *,
    fallback: bool = True,
    max_chunk: int = DEFAULT_MAX_CHUNK,
) -> int:
    """Send *file* to *target*, zero-copy where possible; return the bytes sent.

    *target* is an ``asyncio.StreamWriter``, a transport (asyncio or uvloop;
    TCP, Unix or TLS) or a non-blocking stream ``socket.socket``. *count*
    ``None`` sends to the end of the file. With ``fallback=False``,
    :class:`SendfileNotAvailableError` is raised where zero-copy is impossible
    instead of copying in userspace. *max_chunk* bounds the bytes sent per
    event-loop wakeup.

    What was written to the target before the call goes first. What is written
    after the call returns goes after. Do not write to the target while the
    call runs (asyncio transports raise ``RuntimeError``; uvloop's cannot be
    checked).
    """
    check_offset_count(offset, count)
    info = resolve_file(file)
    return await _run(resolve_target(target), info, offset, count, fallback, max_chunk)


async def sock_sendfile(
    sock: socket.socket,
    file: IO[bytes],
    offset: int = 0,
    count: int | None = None,
    *,
    fallback: bool = True,
    max_chunk: int = DEFAULT_MAX_CHUNK,
) -> int:
    """Like :func:`sendfile` for a raw non-blocking socket (``loop.sock_sendfile``)."""
    if not isinstance(sock, socket.socket):
        raise TypeError(f"sock must be a socket.socket, not {type(sock).__name__}")
    check_offset_count(offset, count)
    info = resolve_file(file)
    return await _run(resolve_socket(sock), info, offset, count, fallback, max_chunk)


def _plan(info: FileInfo, offset: int, count: int | None, max_chunk: int) -> TransferState:
    """The transfer's total, checked against the file's size where it is known."""
    if info.size is None:
        if offset and not info.seekable:
            raise ValueError("a non-zero offset needs a seekable file")
        return TransferState(offset, count, max_chunk)
    if offset > info.size:
        raise ValueError(f"offset {offset} is past the end of the file ({info.size} bytes)")
    available = info.size - offset
    if count is not None and count > available:
        raise TransferState(offset, count).truncated()
    return TransferState(offset, available if count is None else count, max_chunk)


async def _run(
    target: Target, info: FileInfo, offset: int, count: int | None, fallback: bool, max_chunk: int
) -> int:
    zero_copy = target.zero_copy and info.fd is not None
    if not zero_copy and not fallback:
        reason = target.zero_copy_reason or "the file is not a regular file with a descriptor"
        raise SendfileNotAvailableError(f"zero-copy sendfile is not possible: {reason}")
    state = _plan(info, offset, count, max_chunk)
    file = info.file
    if state.total == 0:
        if info.seekable:
            file.seek(offset)
        return 0
    if info.fd is None and info.seekable:
        file.seek(offset)
    progress = _Progress()
    try:
        with map_exceptions(progress):
            if target.sock is not None:
                await _to_socket(target, info, state, progress, zero_copy, fallback)
            else:
                await _to_transport(target, info, state, progress, zero_copy, fallback)
    finally:
        if info.seekable:
            file.seek(offset + progress.sent)
    return state.sent


async def _zero_copy_or_decline(
    target: Target,
    info: FileInfo,
    state: TransferState,
    progress: _Progress,
    fallback: bool,
    lease: TransportLease | None,
) -> bool:
    """Try zero-copy; False if the kernel declined before the first byte and fallback is allowed."""
    assert info.fd is not None
    try:
        await send_zero_copy(target.sock_fd, info.fd, state, progress, lease)
    except NotSupportedBySendfile as exc:
        if state.sent:
            raise
        if not fallback:
            raise SendfileNotAvailableError(f"the kernel refused sendfile: {exc.strerror}") from exc
        return False
    return True


async def _to_socket(
    target: Target,
    info: FileInfo,
    state: TransferState,
    progress: _Progress,
    zero_copy: bool,
    fallback: bool,
) -> None:
    if zero_copy and await _zero_copy_or_decline(target, info, state, progress, fallback, None):
        return
    await copy_to_socket(target.sock, ChunkReader(info.file, info.fd), state, progress)


async def _to_transport(
    target: Target,
    info: FileInfo,
    state: TransferState,
    progress: _Progress,
    zero_copy: bool,
    fallback: bool,
) -> None:
    lease = TransportLease(target.transport, target.writer)
    lease.acquire()
    try:
        await lease.flushed()
        if zero_copy and await _zero_copy_or_decline(target, info, state, progress, fallback, lease):
            return
        await copy_to_transport(lease, ChunkReader(info.file, info.fd), state, progress)
    finally:
        lease.release()
