"""A folder's tar archive as a connection's body (``_static._archive``): headers from memory,
each larger member's bytes by the public ``aiosendfile.sendfile`` (zero-copy on a plain socket,
the bounded copy over TLS), as a :class:`~._sending.BodySender` in a task. Between files it
writes through the connection's transport and waits on the connection's own flow control
(``HttpProtocol.resume_writing`` calls :meth:`ArchiveBody.resumed`).

Members are prepared a batch at a time in the server's pool (an ``open`` or a read may wait for
the disk): their headers made, each file checked to be the one the layout was made from
(``_tree.open_member``), a small one (up to :data:`SMALL`) read there, a larger one left open to
be sent. A member replaced, gone or shorter than announced, or one that shrinks while it is sent
(``FileTruncatedError``), aborts the connection: never a silently short archive. One that grows
is sent at its announced size. Headers, padding and small files' bytes gather in a buffer of
about :data:`GATHER` bytes, sent with the next larger file (``headers=``) or on their own once
full; a batch holds at most :data:`BATCH` descriptors and about :data:`BATCH_READ` bytes read.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from .._api import sendfile
from .._static._answer import Answer, Archive
from .._static._archive import END, Layout, Member, tar_header
from .._static._tree import MemberChanged, open_member

if TYPE_CHECKING:
    from ._protocol import HttpProtocol

__all__ = ("ArchiveBody",)

#: Members opened (and their headers made) per hop to the pool.
BATCH = 32
#: A member file this small is read in the pool, its bytes sent with the headers around it (one
#: ``sendfile`` call costs more than copying this much), at most about :data:`BATCH_READ` a hop.
SMALL = 64 * 1024
BATCH_READ = 256 * 1024
#: Header, padding and small-file bytes gathered before they are sent on their own.
GATHER = 256 * 1024

_Span = tuple[int, int, int]


class ArchiveBody:
    """Send an :class:`~.._static._answer.Archive` body after *head* on *conn* (see the module)."""

    __slots__ = ("ans", "conn", "done", "executor", "head", "progress", "task", "waiter")

    def __init__(
        self,
        conn: HttpProtocol,
        ans: Answer,
        head: bytes,
        executor: Executor,
        done: Callable[[int, BaseException | None], None],
        progress: Callable[..., None],
    ) -> None:
        self.conn = conn
        self.ans = ans
        self.head = head
        self.executor = executor
        self.done = done
        self.progress = progress
        self.task: asyncio.Task[None] | None = None
        self.waiter: asyncio.Future[None] | None = None

    def run(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._send())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def resumed(self) -> None:
        """The connection's transport takes writes again (``resume_writing``)."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _send(self) -> None:
        body = self.ans.body
        assert isinstance(body, Archive)
        transport = self.conn.transport
        try:
            await self._send_archive(body)
        except asyncio.CancelledError:  # the connection was lost (stop): done is not called
            transport.abort()
            raise
        except Exception as exc:  # the peer went away, a member changed; else a bug, reported
            if isinstance(exc, RuntimeError) and transport.is_closing():
                exc = ConnectionResetError("the peer went away during an archive")
            self.done(0, exc)
            return
        self.done(body.stop - body.start, None)

    async def _send_archive(self, body: Archive) -> None:
        loop = asyncio.get_running_loop()
        transport = self.conn.transport
        layout = body.layout
        members = layout.members
        pending = bytearray(self.head)
        for batch in _batches(layout, body.start, body.stop):
            prepared = await loop.run_in_executor(self.executor, _prepare, body.path, layout, batch)
            try:
                for (i, lo, hi), (header, fd, data) in zip(batch, prepared, strict=True):
                    if i == len(members):  # the end blocks
                        pending += END[lo:hi]
                        continue
                    size = members[i].size
                    h = len(header)
                    if lo < h:
                        pending += header[lo : min(hi, h)]
                    if data is not None:
                        pending += data
                    elif fd is not None:
                        first, last = _body_part(members[i], lo, hi, h)
                        with io.FileIO(fd, "rb", closefd=False) as file:
                            await sendfile(
                                transport,
                                file,
                                first,
                                last - first,
                                headers=bytes(pending),
                                on_progress=self.progress,
                            )
                        pending.clear()
                    pad = hi - max(lo, h + size)
                    if pad > 0:
                        pending += bytes(pad)
                    if len(pending) >= GATHER:
                        await self._write(pending)
                        pending = bytearray()
            finally:
                for _, fd, _ in prepared:
                    if fd is not None:
                        os.close(fd)
        if pending:
            await self._write(pending)

    async def _write(self, data: bytearray) -> None:
        """Write *data* (not touched again: the transport may keep it) and wait while the transport
        is over its high-water mark (the connection's own flow control: ``resumed``)."""
        conn = self.conn
        conn.transport.write(data)
        self.progress()
        while conn.write_paused:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("the peer went away during an archive")


def _body_part(member: Member, lo: int, hi: int, header_length: int) -> tuple[int, int]:
    """The part [first, last) of *member*'s file a span [*lo*, *hi*) of its bytes takes."""
    return max(lo, header_length) - header_length, min(hi, header_length + member.size) - header_length


def _batches(layout: Layout, start: int, stop: int) -> Iterator[list[_Span]]:
    """The spans of [*start*, *stop*), in groups of at most :data:`BATCH` members and about
    :data:`BATCH_READ` bytes of small files read in the pool."""
    members = layout.members
    batch: list[_Span] = []
    read = 0
    for span in layout.spans(start, stop):
        batch.append(span)
        i = span[0]
        if i < len(members) and members[i].size <= SMALL:
            read += members[i].size
        if len(batch) == BATCH or read >= BATCH_READ:
            yield batch
            batch = []
            read = 0
    if batch:
        yield batch


def _prepare(path: str, layout: Layout, batch: list[_Span]) -> list[tuple[bytes, int | None, bytes | None]]:
    """(In the pool.) Each span's member header and, where the span takes some of its file, that
    part read (a small file: at most :data:`SMALL` bytes) or the file opened to be sent; each file
    checked first (``open_member``). If one fails, those opened are closed again."""
    members = layout.members
    out: list[tuple[bytes, int | None, bytes | None]] = []
    try:
        for i, lo, hi in batch:
            if i == len(members):
                out.append((b"", None, None))
                continue
            member = members[i]
            header = tar_header(member)
            first, last = _body_part(member, lo, hi, len(header))
            if last <= first:
                out.append((header, None, None))
                continue
            fd = open_member(path, member)
            if member.size > SMALL:
                out.append((header, fd, None))
                continue
            try:
                data = os.pread(fd, last - first, first)
            finally:
                os.close(fd)
            if len(data) < last - first:  # (shrunk since it was checked)
                raise MemberChanged(f"{member.name} shrank while it was read")
            out.append((header, None, data))
    except BaseException:
        for _, held, _ in out:
            if held is not None:
                os.close(held)
        raise
    return out
