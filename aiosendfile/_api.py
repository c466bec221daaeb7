"""Public coroutines: argument checks, dispatch to zero-copy or fallback, errors.

Semantics follow ``loop.sendfile`` with three deliberate differences, all
stricter or safer:

* ``count=0`` returns 0 (asyncio raises ``ValueError``).
* A file shorter than ``offset + count`` raises :class:`FileTruncatedError`:
  before the first byte when it is short already at the start, with
  ``.sent`` when it shrinks during the transfer. asyncio silently sends less.
* ``offset`` past the end of a regular file is a ``ValueError``.

On return, and on any error once the transfer has begun, the file position
is ``offset + sent``. Argument errors leave the file untouched. ``sent`` and
the return value count file bytes only, never ``headers``/``trailers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import stat
import weakref
from concurrent.futures import Executor
from typing import IO, Any, Literal

from . import _compat
from ._errors import FileTruncatedError, SendfileNotAvailableError, map_exceptions
from ._fallback import copy_to_socket, copy_to_transport
from ._job import SendJob
from ._lease import TransportLease
from ._options import DEFAULT_OPTIONS, Options, ProgressCallback
from ._platform import NotSupportedBySendfile, sendfile_once
from ._state import DEFAULT_MAX_CHUNK, TransferState, check_offset_count
from ._target import FileInfo, Target, _is_os_file, resolve_file, resolve_socket, resolve_target
from ._writer import Start, is_cold, send_at_once, send_zero_copy

__all__ = ("sendfile", "sock_sendfile")


async def sendfile(
    target: Any,
    file: IO[bytes],
    offset: int = 0,
    count: int | None = None,
    *,
    fallback: bool = True,
    headers: bytes = b"",
    trailers: bytes = b"",
    max_chunk: int = DEFAULT_MAX_CHUNK,
    probe: bool = True,
    executor: Executor | None = None,
    on_progress: ProgressCallback | None = None,
) -> int:
    """Send *file* to *target*, zero-copy where possible; return the file bytes sent.

    *target* is an ``asyncio.StreamWriter``, a transport (asyncio or uvloop;
    TCP, Unix or TLS) or a non-blocking stream ``socket.socket``. *count*
    ``None`` sends to the end of the file. With ``fallback=False``,
    :class:`SendfileNotAvailableError` is raised where zero-copy is impossible
    instead of copying in userspace.

    *headers* and *trailers* are sent right before and after the file; the
    headers share the file's first packet where the OS allows (``MSG_MORE`` on
    Linux, ``TCP_NOPUSH`` on BSD). What the socket takes at once is sent
    before the first await, with no event-loop machinery. *max_chunk* bounds the
    bytes sent per event-loop wakeup. *probe* checks the page cache before each
    chunk and sends cold chunks from *executor* (default: a small dedicated
    pool). ``probe=False`` trusts the cache. *on_progress(sent, total)* is
    called after each chunk.

    What was written to the target before the call goes first. What is written
    after the call returns goes after. Do not write to the target while the
    call runs (asyncio transports raise ``RuntimeError``; uvloop's cannot be
    checked).
    """
    cold = False  # the straight line found the first chunk cold
    if not headers and not trailers and on_progress is None and executor is None:
        straight = _straight(target, file, offset, count, probe, max_chunk)
        if straight == "cold":
            cold = True
        elif straight is not None:
            first, left = straight
            if not left:
                return first
            # The socket took part of it: the general path sends the rest, from where it stopped.
            try:
                options = Options(max_chunk, probe)
                return first + await _run(
                    resolve_target(target), resolve_file(file), offset + first, left, fallback, options
                )
            except BaseException as exc:
                exc.sent = first + getattr(exc, "sent", 0)  # type: ignore[attr-defined]
                raise
    check_offset_count(offset, count)
    options = Options(max_chunk, probe, executor, on_progress, headers, trailers)
    info = resolve_file(file)
    resolved = resolve_target(target)
    if resolved.zero_copy and resolved.transport is not None:
        _remember_plain(resolved)
    return await _run(resolved, info, offset, count, fallback, options, cold)


#: Transports found plain (a known class, no TLS, a socket: zero-copy can work) by a first call's
#: ``resolve_target``, with their socket's fd: later calls on them take the straight line.
_plain_transports: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _remember_plain(target: Target) -> None:
    with contextlib.suppress(TypeError):  # no weak reference to it: the general path each time
        _plain_transports[target.transport] = target.sock_fd


def _straight(
    target: Any, file: Any, offset: int, count: int | None, probe: bool, max_chunk: int
) -> tuple[int, int] | Literal["cold"] | None:
    """The common case as a straight line: a transport already found plain, nothing in its buffer,
    no transfer holding it, a regular file whose range is in the page cache and fits one chunk.
    Sends with one ``sendfile`` on the transport's own fd (nothing else runs meanwhile) and
    returns (bytes sent, bytes left). None: nothing was sent, and the general path does it all
    (it checks everything again, and raises what it finds wrong); "cold": the same, but the range
    was found cold, and the general path is not to probe it again (``SendJob.cold``).
    """
    transport = target.transport if type(target) is asyncio.StreamWriter else target
    try:
        out_fd = _plain_transports.get(transport)
    except TypeError:  # unhashable: not a transport we know
        return None
    if out_fd is None or transport.is_closing() or transport.get_write_buffer_size():
        return None
    if TransportLease.held_on(transport):
        return None  # another transfer holds it (ours, or asyncio's own loop.sendfile)
    if isinstance(transport.get_protocol(), _compat.tls_protocol_types()):
        return None  # TLS now runs over it (start_tls)
    if not _is_os_file(file) or file.closed or not file.readable() or type(offset) is not int:
        return None
    if type(max_chunk) is not int or max_chunk <= 0:
        return None  # (the general path refuses it, before any byte)
    if count is not None and (type(count) is not int or count < 0):
        return None
    fd = file.fileno()
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return None
    available = st.st_size - offset
    total = available if count is None else count
    if total <= 0 or total > available or total > max_chunk or offset < 0:
        return None
    if probe and is_cold(fd, offset, total, DEFAULT_OPTIONS, st.st_dev):
        return "cold"
    try:
        sent = sendfile_once(out_fd, fd, offset, total)
    except OSError:  # full (EAGAIN), refused, the peer gone: the general path waits or says so
        return None
    if sent == 0:
        return None  # shrank since the fstat: the general path finds it and raises
    file.seek(offset + sent)
    return sent, total - sent


async def sock_sendfile(
    sock: socket.socket,
    file: IO[bytes],
    offset: int = 0,
    count: int | None = None,
    *,
    fallback: bool = True,
    headers: bytes = b"",
    trailers: bytes = b"",
    max_chunk: int = DEFAULT_MAX_CHUNK,
    probe: bool = True,
    executor: Executor | None = None,
    on_progress: ProgressCallback | None = None,
) -> int:
    """Like :func:`sendfile` for a raw non-blocking socket (``loop.sock_sendfile``)."""
    if not isinstance(sock, socket.socket):
        raise TypeError(f"sock must be a socket.socket, not {type(sock).__name__}")
    check_offset_count(offset, count)
    options = Options(max_chunk, probe, executor, on_progress, headers, trailers)
    info = resolve_file(file)
    return await _run(resolve_socket(sock), info, offset, count, fallback, options)


def _plan(info: FileInfo, offset: int, count: int | None, max_chunk: int) -> TransferState:
    """The transfer's total, checked against the file's size where it is known."""
    if info.size is None:
        if offset and not info.seekable:
            raise ValueError("a non-zero offset needs a seekable file")
        return TransferState(offset, count, max_chunk)
    if offset > info.size:
        if count:  # (bytes asked where the file has none: it is shorter than the range, as below)
            raise FileTruncatedError(
                f"file ends at {info.size}, before offset {offset}: all {count} bytes requested missing",
                sent=0,
                expected=count,
            )
        raise ValueError(f"offset {offset} is past the end of the file ({info.size} bytes)")
    available = info.size - offset
    if count is not None and count > available:
        raise TransferState(offset, count).truncated()
    return TransferState(offset, available if count is None else count, max_chunk)


async def _run(
    target: Target,
    info: FileInfo,
    offset: int,
    count: int | None,
    fallback: bool,
    options: Options,
    cold: bool = False,
) -> int:
    zero_copy = target.zero_copy and info.fd is not None
    if not zero_copy and not fallback:
        reason = target.zero_copy_reason or "the file is not a regular file with a descriptor"
        raise SendfileNotAvailableError(f"zero-copy sendfile is not possible: {reason}")
    state = _plan(info, offset, count, options.max_chunk)
    file = info.file
    if state.total == 0:
        if target.sock is None:  # (before the seek)
            TransportLease.refuse_if_held(target.transport)
        if info.seekable:
            file.seek(offset)
        await _send_frame_only(target, options)
        return 0
    if info.fd is None and info.seekable:
        file.seek(offset)
    job = SendJob(target, info, state, options, zero_copy, fallback, cold=cold)
    try:
        with map_exceptions(state):
            if target.sock is not None:
                await _to_socket(job)
            else:
                await _to_transport(job)
    finally:
        if info.seekable:
            file.seek(state.position)
    return state.sent


async def _send_frame_only(target: Target, options: Options) -> None:
    """Headers and trailers around an empty body: plain writes keep the order (the caller has
    refused a transport another transfer holds, as any transfer is refused: a plain write there
    would land inside that transfer's body, and uvloop's transport cannot be guarded)."""
    frame = bytes(options.headers) + bytes(options.trailers)
    if not frame:
        return
    if target.sock is not None:
        await asyncio.get_running_loop().sock_sendall(target.sock, frame)
    else:
        target.transport.write(frame)


def _decline(job: SendJob, exc: NotSupportedBySendfile) -> None:
    """The kernel refused sendfile for this pair of fds: the userspace copy is to finish the job.

    (A file system without splice support.) The copy carries on from where
    zero-copy stopped, without resending headers that already went out: the
    refusal comes from the first ``sendfile``, after the last header byte.
    """
    if not job.fallback:
        raise SendfileNotAvailableError(f"the kernel refused sendfile: {exc.strerror}") from exc
    job.options = dataclasses.replace(job.options, headers=b"")
    job.zero_copy = False


async def _to_socket(job: SendJob) -> None:
    if job.zero_copy:
        try:
            start = send_at_once(job)
            if start is None:
                return
            await send_zero_copy(job, None, start)
            return
        except NotSupportedBySendfile as exc:
            _decline(job, exc)
    await copy_to_socket(job)


async def _to_transport(job: SendJob) -> None:
    transport = job.target.transport
    start: Start = "go"
    # Nothing is buffered ahead of the file, no other transfer holds the transport, and
    # nothing else runs until our first await: what the socket takes now needs no lease
    # (see _writer, "Starting at once"). A held transport gets the lease's error below.
    # Only on_progress could write meanwhile: where a lease would refuse that, take one.
    progress_may_write = job.options.on_progress is not None and TransportLease.guards_writes(
        transport, job.target.writer
    )
    if (
        job.zero_copy
        and transport.get_write_buffer_size() == 0
        and not TransportLease.held_on(transport)
        and not progress_may_write
    ):
        try:
            start_now = send_at_once(job)
        except NotSupportedBySendfile as exc:
            _decline(job, exc)
        else:
            if start_now is None:
                return
            start = start_now
    lease = TransportLease(transport, job.target.writer)
    lease.acquire()
    try:
        await lease.flushed()
        if job.zero_copy:
            try:
                await send_zero_copy(job, lease, start)
                return
            except NotSupportedBySendfile as exc:
                _decline(job, exc)
        await copy_to_transport(lease, job)
    finally:
        lease.release()
