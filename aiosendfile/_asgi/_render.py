"""A static core ``Answer`` as ASGI messages: one ``http.response.start``, then its body.

Header names go out lowercase (the ASGI spec asks for it, and Starlette's middlewares look fields
up by lowercase name), values as the core spells them, in the core's order, then
``content-length`` (none on a 304). Bytes bodies (the hot cache, listings, errors, a small
multipart) are one ``http.response.body``. A body from an open descriptor goes, by what the
server lists in ``scope["extensions"]``, as (first match wins):

1. ``aiosendfile.pathsend`` (our uvicorn protocol): one ``http.response.pathsend`` carrying the
   descriptor, the range or the multipart parts (``aiosendfile.*`` keys): zero-copy, and it passes
   Starlette's middlewares, which let pathsend through.
2. ``http.response.pathsend`` (granian, ...) for a full 200: the path of the file we opened and
   checked, read back from ``/proc/self/fd`` (not ``/proc/self/fd/N`` itself: granian opens the path
   in a task of its own after ``send`` returns, when the descriptor number may be another file's).
   Without ``/proc``, only when symlinks are followed anyway.
3. ``http.response.zerocopysend``: the descriptor with an explicit offset and count (ranges too; a
   multipart body interleaves ``http.response.body`` part headers).
4. ``http.response.body`` chunks, read on the loop when their pages are cached, else off it. A
   server older than ASGI 2.4 says nothing when the client leaves (``send`` returns quietly): a
   body of more than one chunk then watches ``receive`` for ``http.disconnect`` and stops reading.

A descriptor stays open until ``send`` returns (the caller closes the answer after).

A ``send`` that raises uvloop's error for a write on a closed transport (:func:`transport_gone`)
ends the answer quietly: the client is gone, and with it the connection. Stock uvicorn raises it
into the app for a pipelined request whose client left; any other error is raised as it is.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from .._coldread import read_range
from .._errors import FileTruncatedError
from .._options import DEFAULT_FALLBACK_CHUNK, default_cold_executor
from .._platform import pread_cached
from .._static._answer import Answer, Archive, FileRange, Multipart
from .._static._policy import ENCODINGS
from .._threads import in_pool

__all__ = (
    "BODY",
    "BODY_TYPE",
    "OURS",
    "PATHSEND",
    "START",
    "ZEROCOPY",
    "Receive",
    "Send",
    "file_mode",
    "header_pairs",
    "off_loop",
    "send_answer",
    "transport_gone",
)

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]
_T = TypeVar("_T")

#: How a file body may leave (bits of :func:`file_mode`): plain body messages only, standard
#: pathsend, zerocopysend, our pathsend with a descriptor, ranges and parts.
BODY, PATHSEND, ZEROCOPY, OURS = 0, 1, 2, 4

START, BODY_TYPE = "http.response.start", "http.response.body"
PATHSEND_TYPE, ZEROCOPY_TYPE = "http.response.pathsend", "http.response.zerocopysend"
_SUFFIX = dict(ENCODINGS)

_NAMES: dict[str, bytes] = {}


def file_mode(scope: MutableMapping[str, Any]) -> int:
    """Which ways of sending a file body the server offers (:data:`OURS` | :data:`PATHSEND` | ...)."""
    ext = scope.get("extensions")
    if not ext:
        return BODY
    mode = BODY
    if "aiosendfile.pathsend" in ext:
        mode |= OURS
    if PATHSEND_TYPE in ext:
        mode |= PATHSEND
    if ZEROCOPY_TYPE in ext:
        mode |= ZEROCOPY
    return mode


def _name(name: str) -> bytes:
    raw = _NAMES.get(name)
    if raw is None:
        raw = _NAMES[name] = name.lower().encode("latin-1")
    return raw


def header_pairs(fields: list[tuple[str, str]], length: int | None) -> list[tuple[bytes, bytes]]:
    """The core's *fields*, then ``content-length`` unless *length* is None, as ASGI header pairs."""
    pairs = [(_name(name), value.encode("latin-1")) for name, value in fields]
    if length is not None:
        pairs.append((b"content-length", b"%d" % length))
    return pairs


async def off_loop(
    fn: Callable[..., _T], *args: Any, if_cancelled: Callable[[_T | None], object] | None = None
) -> _T:
    """``fn(*args)`` in a thread: the cold-read pool under asyncio, anyio's threads elsewhere (trio).

    Cancelled meanwhile: a call already running is waited for before re-raising (it may use a
    descriptor the caller closes next), and its result goes to *if_cancelled* (close what it
    opened). Under anyio the result comes back even if cancelled: the caller closes it.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        import anyio.to_thread  # (not asyncio: trio through anyio)

        return await anyio.to_thread.run_sync(fn, *args)
    return await in_pool(default_cold_executor(), fn, *args, if_cancelled=if_cancelled)


async def _read(fd: int, size: int, offset: int) -> bytes:
    """Up to *size* bytes at *offset*: on the loop if cached, else off it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        data: bytes | bytearray | None = pread_cached(fd, size, offset)
        if data is None:
            data = await off_loop(os.pread, fd, size, offset)
    else:
        data = await read_range(fd, size, offset)
    return data if isinstance(data, bytes) else bytes(data)


def sent_path(answer: Answer) -> str:
    """The path of the file *answer*'s body comes from (a pre-compressed sibling's, if chosen)."""
    path = answer.path or ""
    return path + _SUFFIX[answer.encoding] if answer.encoding is not None else path


def _checked_path(fd: int, answer: Answer, follow_symlinks: bool) -> str | None:
    """A path that names the file open on *fd* (see the module docstring), or None."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return sent_path(answer) if follow_symlinks else None
    if real.endswith(" (deleted)") or not real.startswith("/"):
        return None  # removed since we opened it: no path names it any more
    return real


def transport_gone(exc: RuntimeError) -> bool:
    """Whether *exc*, raised by the server's ``send``, is uvloop refusing to write on a transport
    already closed (``unable to perform operation on <TCPTransport closed=True ...>; the handler is
    closed``): the connection is gone, nothing more can be sent on it. Stock uvicorn's httptools
    protocol, when a client that pipelines goes away, marks only the last request it parsed as
    disconnected; the one running (an earlier one) then writes on the closed transport. (asyncio's
    transports drop such writes; ``aiosendfile.uvicorn``'s protocol marks the running request too.)"""
    text = str(exc)
    return text.startswith("unable to perform operation on <") and text.endswith("; the handler is closed")


async def send_answer(
    answer: Answer,
    send: Send,
    mode: int,
    headers: list[tuple[bytes, bytes]],
    *,
    status: int | None = None,
    follow_symlinks: bool = False,
    chunk_size: int = DEFAULT_FALLBACK_CHUNK,
    receive: Receive | None = None,
) -> None:
    """Send *answer* with *headers* (its :func:`header_pairs`, maybe with more) and status
    *status* (default the answer's). *receive*: the server's, to hear a client leave during a
    long body (servers before ASGI 2.4). The caller closes the answer after. Returns quietly if
    ``send`` finds the transport closed (:func:`transport_gone`)."""
    try:
        await _send_answer(answer, send, mode, headers, status, follow_symlinks, chunk_size, receive)
    except RuntimeError as exc:
        if not transport_gone(exc):
            raise


async def _send_answer(
    answer: Answer,
    send: Send,
    mode: int,
    headers: list[tuple[bytes, bytes]],
    status: int | None,
    follow_symlinks: bool,
    chunk_size: int,
    receive: Receive | None,
) -> None:
    await send({"type": START, "status": answer.status if status is None else status, "headers": headers})
    body = answer.body
    if answer.head_only or body is None:
        await send({"type": BODY_TYPE, "body": b""})
        return
    if isinstance(body, bytes):
        await send({"type": BODY_TYPE, "body": body})
        return
    assert not isinstance(body, Archive)  # (folder archives are serve's alone: its policy has them)
    source = body.fd if isinstance(body, FileRange) else body.source
    if isinstance(source, bytes):
        assert isinstance(body, Multipart)
        chunks: list[bytes] = []
        for part_head, r in body.parts:
            chunks += (part_head, source[r.start : r.stop])
        chunks.append(body.closing)
        await send({"type": BODY_TYPE, "body": b"".join(chunks)})
        return
    fd = source
    if mode & OURS:
        message: Message = {"type": PATHSEND_TYPE, "path": sent_path(answer), "aiosendfile.fd": fd}
        if isinstance(body, FileRange):
            message["aiosendfile.offset"] = body.start
            message["aiosendfile.count"] = body.length
        else:
            message["aiosendfile.parts"] = [(head, r.start, r.length) for head, r in body.parts]
            message["aiosendfile.closing"] = body.closing
        await send(message)
        return
    if mode & PATHSEND and isinstance(body, FileRange) and answer.status == 200 and status in (None, 200):
        path = _checked_path(fd, answer, follow_symlinks)
        if path is not None:
            await send({"type": PATHSEND_TYPE, "path": path})
            return
    if mode & ZEROCOPY:
        await _zerocopy(send, fd, body)
        return
    if isinstance(body, FileRange):
        pieces, closing = [(b"", body.start, body.length)], b""
    else:
        pieces, closing = [(head, r.start, r.length) for head, r in body.parts], body.closing
    sending = _chunks(send, fd, pieces, closing, chunk_size)
    if receive is not None and (answer.length or 0) > chunk_size:
        await _until_disconnect(sending, receive)
    else:
        await sending


async def _checkpoint() -> None:
    """Let other tasks run (the loop's other connections, a disconnect watcher)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        import anyio.lowlevel

        await anyio.lowlevel.checkpoint()
    else:
        await asyncio.sleep(0)


async def _until_disconnect(body: Awaitable[None], receive: Receive) -> None:
    """Await *body*, or stop it when *receive* says the client left (anyio: asyncio or trio)."""
    import anyio

    try:
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(watch)
            await body
            group.cancel_scope.cancel()
    except BaseException as exc:  # the task group wraps the body's own error: raise it as it was
        lone = _lone(exc)
        if lone is exc:
            raise
        context = lone.__context__
        try:
            raise lone from None
        finally:
            lone.__context__ = context


def _lone(exc: BaseException) -> BaseException:
    """The one exception inside (nested) one-exception groups, else *exc* itself."""
    while True:
        inner = getattr(exc, "exceptions", None)  # BaseExceptionGroup (exceptiongroup's on 3.10)
        if not isinstance(inner, tuple) or len(inner) != 1 or not isinstance(inner[0], BaseException):
            return exc
        exc = inner[0]


async def _zerocopy(send: Send, fd: int, body: FileRange | Multipart) -> None:
    with io.FileIO(fd, "rb", closefd=False) as file:  # (a wrapper: the answer owns the descriptor)
        if isinstance(body, FileRange):
            await send({"type": ZEROCOPY_TYPE, "file": file, "offset": body.start, "count": body.length})
            return
        for part_head, r in body.parts:
            await send({"type": BODY_TYPE, "body": part_head, "more_body": True})
            await send(
                {
                    "type": ZEROCOPY_TYPE,
                    "file": file,
                    "offset": r.start,
                    "count": r.length,
                    "more_body": True,
                }
            )
        await send({"type": BODY_TYPE, "body": body.closing})


async def _chunks(
    send: Send, fd: int, pieces: list[tuple[bytes, int, int]], closing: bytes, chunk_size: int
) -> None:
    """Body messages of at most *chunk_size* file bytes: each piece's prefix with its first chunk,
    *closing* with the last. A file that ends early raises (never a short body passed off)."""
    if not any(length for _, _, length in pieces):
        await send({"type": BODY_TYPE, "body": b"".join(prefix for prefix, _, _ in pieces) + closing})
        return
    last_piece = len(pieces) - 1
    for i, (prefix, start, length) in enumerate(pieces):
        position, end = start, start + length
        while position < end:
            data = await _read(fd, min(chunk_size, end - position), position)
            if not data:
                raise FileTruncatedError(
                    f"file ended {end - position} bytes short of its range", sent=0, expected=length
                )
            chunk_start = position
            position += len(data)
            if prefix and chunk_start == start:
                data = prefix + data
            done = i == last_piece and position >= end
            if done and closing:
                data += closing
            await send({"type": BODY_TYPE, "body": data, "more_body": not done})
            if not done:
                await _checkpoint()  # (a send that never waits must not hold the loop for the whole file)
