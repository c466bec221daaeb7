"""A folder's tar archive as a connection's body (``_static._archive``): headers from memory,
each member's bytes by the public ``aiosendfile.sendfile`` (zero-copy on a plain socket, the
bounded copy over TLS), as a :class:`~._sending.BodySender` in a task.

Members are opened a batch at a time in the server's pool (an ``open`` may wait for the disk),
their headers made there too, and each file checked to be the one the layout was made from
(``_tree.open_member``). A member replaced, gone or shorter than announced, or one that shrinks
while it is sent (``FileTruncatedError``), aborts the connection: never a silently short archive.
One that grows is sent at its announced size. Headers, padding and empty members gather in a
buffer of at most :data:`GATHER` bytes, sent with the next file's bytes (``headers=``) or on
their own once full; at most :data:`BATCH` members' descriptors are open at once.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor

from .._api import sendfile
from .._static._answer import Answer, Archive
from .._static._archive import END, Layout, tar_header
from .._static._tree import open_member

__all__ = ("ArchiveBody",)

#: Members opened (and their headers made) per hop to the pool.
BATCH = 32
#: Header, padding and empty-member bytes gathered before they are sent on their own.
GATHER = 64 * 1024

_Span = tuple[int, int, int]


class ArchiveBody:
    """Send an :class:`~.._static._answer.Archive` body after *head* (see the module)."""

    __slots__ = ("ans", "done", "executor", "head", "progress", "task", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        ans: Answer,
        head: bytes,
        executor: Executor,
        done: Callable[[int, BaseException | None], None],
        progress: Callable[..., None],
    ) -> None:
        self.transport = transport
        self.ans = ans
        self.head = head
        self.executor = executor
        self.done = done
        self.progress = progress
        self.task: asyncio.Task[None] | None = None

    def run(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._send())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _send(self) -> None:
        body = self.ans.body
        assert isinstance(body, Archive)
        transport = self.transport
        try:
            await _send_archive(transport, body, self.head, self.executor, self.progress)
        except asyncio.CancelledError:  # the connection was lost (stop): done is not called
            transport.abort()
            raise
        except Exception as exc:  # the peer went away, a member changed; else a bug, reported
            if isinstance(exc, RuntimeError) and transport.is_closing():
                exc = ConnectionResetError("the peer went away during an archive")
            self.done(0, exc)
            return
        self.done(body.stop - body.start, None)


async def _send_archive(
    transport: asyncio.Transport,
    body: Archive,
    head: bytes,
    executor: Executor,
    progress: Callable[..., None],
) -> None:
    loop = asyncio.get_running_loop()
    layout = body.layout
    members = layout.members
    pending = bytearray(head)
    for batch in _batches(layout, body.start, body.stop):
        opened = await loop.run_in_executor(executor, _open_batch, body.path, layout, batch)
        try:
            for (i, lo, hi), (header, fd) in zip(batch, opened, strict=True):
                if i == len(members):  # the end blocks
                    pending += END[lo:hi]
                    continue
                size = members[i].size
                h = len(header)
                if lo < h:
                    pending += header[lo : min(hi, h)]
                first, last = max(lo, h) - h, min(hi, h + size) - h
                if last > first:
                    assert fd is not None
                    with io.FileIO(fd, "rb", closefd=False) as file:
                        await sendfile(
                            transport, file, first, last - first, headers=bytes(pending), on_progress=progress
                        )
                    pending.clear()
                pad = hi - max(lo, h + size)
                if pad > 0:
                    pending += bytes(pad)
                if len(pending) >= GATHER:
                    await _send_bytes(transport, pending, progress)
        finally:
            for _, fd in opened:
                if fd is not None:
                    os.close(fd)
    if pending:
        await _send_bytes(transport, pending, progress)


async def _send_bytes(
    transport: asyncio.Transport, pending: bytearray, progress: Callable[..., None]
) -> None:
    """Send and empty *pending*, waiting while the transport is full (the public call's rules)."""
    await sendfile(transport, io.BytesIO(bytes(pending)), on_progress=progress)
    pending.clear()


def _batches(layout: Layout, start: int, stop: int) -> Iterator[list[_Span]]:
    """The spans of [*start*, *stop*) in groups of at most :data:`BATCH`."""
    batch: list[_Span] = []
    for span in layout.spans(start, stop):
        batch.append(span)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _open_batch(path: str, layout: Layout, batch: list[_Span]) -> list[tuple[bytes, int | None]]:
    """(In the pool.) Each span's member header, and its file opened and checked where the span
    takes some of its bytes; all closed again if one fails."""
    members = layout.members
    out: list[tuple[bytes, int | None]] = []
    try:
        for i, lo, hi in batch:
            if i == len(members):
                out.append((b"", None))
                continue
            member = members[i]
            header = tar_header(member)
            h = len(header)
            fd = None
            if member.size and hi > h and lo < h + member.size:
                fd = open_member(path, member)
            out.append((header, fd))
    except BaseException:
        for _, fd in out:
            if fd is not None:
                os.close(fd)
        raise
    return out
