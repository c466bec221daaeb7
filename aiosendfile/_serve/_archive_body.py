"""A folder's archive (tar or zip) as a connection's body (``_static._archive``): headers from memory,
each larger member's bytes by the public ``aiosendfile.sendfile`` (zero-copy on a plain socket,
the bounded copy over TLS), as a :class:`~._sending.BodySender` in a task. Between files it
writes through the connection's transport and waits on the connection's own flow control
(``HttpProtocol.resume_writing`` calls :meth:`ArchiveBody.resumed`).

Members are prepared a batch at a time in the server's pool (an ``open`` or a read may wait for
the disk): their headers made, each file checked to be the one the layout was made from
(``_tree.piece``), a small one (up to ``_tree.SMALL``) read there, a larger one left open to
be sent. A member replaced, gone or shorter than announced, or one that shrinks while it is sent
(``FileTruncatedError``), aborts the connection: never a silently short archive; in a zip, one
rewritten in place since its CRC-32 was read too (``_tree.rewritten``). One that grows is sent
at its announced size. Headers, padding and small files' bytes gather in a buffer of
about :data:`GATHER` bytes, sent with the next larger file (``headers=``) or on their own once
full; a batch holds at most :data:`BATCH` parts, :data:`BATCH_OPEN` files open and about
:data:`BATCH_READ` bytes read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from .._api import sendfile
from .._options import LazyPool
from .._platform import peer_ended
from .._static._answer import Answer, Archive
from .._static._archive import Layout
from .._static._tree import SMALL, Piece, crc_known, piece, sent_as_read

if TYPE_CHECKING:
    from ._protocol import HttpProtocol

__all__ = ("ArchiveBody",)

#: Parts made ready (headers made, files opened and checked) per hop to the pool, and the bytes of
#: small files (``_tree.SMALL``) read in one hop, about.
BATCH = 32
BATCH_READ = 256 * 1024
#: Larger files a hop leaves open to be sent, at most: what a download holds while its client
#: reads nothing, until its send timeout (each such file's send takes longer than a hop anyway).
BATCH_OPEN = 4
#: Header, padding and small-file bytes gathered before they are sent on their own.
GATHER = 256 * 1024

_Span = tuple[int, int, int]


class ArchiveBody:
    """Send an :class:`~.._static._answer.Archive` body after *head* on *conn* (see the module)."""

    __slots__ = ("ans", "conn", "done", "head", "progress", "task", "waiter", "written")

    def __init__(
        self,
        conn: HttpProtocol,
        ans: Answer,
        head: bytes,
        done: Callable[[int, BaseException | None], None],
        progress: Callable[..., None],
    ) -> None:
        self.conn = conn
        self.ans = ans
        self.head = head
        self.written = 0  # bytes handed to the transport or sendfile, the head's included
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
            self.done(max(0, self.written - len(self.head)), exc)  # (about: what was handed on)
            return
        self.done(body.stop - body.start, None)

    async def _send_archive(self, body: Archive) -> None:
        loop = asyncio.get_running_loop()
        transport = self.conn.transport
        layout = body.layout
        pending = bytearray(self.head)
        abandoned = False

        def tick() -> None:  # (from the pool: a zip's CRC read of a large file is progress)
            if abandoned:  # (its client gone: the read stops here, its file closed)
                raise Abandoned("the archive's connection was lost")
            loop.call_soon_threadsafe(self._ticked)

        for batch in _batches(layout, body.start, body.stop):
            if pending and _reads_a_crc(layout, batch[-1]):
                # (a large file read whole first, for a zip's CRC-32: seconds, on a cold disk; the
                # answer's head and what is ready go now, not after it)
                await self._write(pending)
                pending = bytearray()
            job = archive_executor().submit(_prepare, body.path, layout, batch, tick)
            try:
                pieces = await asyncio.shield(asyncio.wrap_future(job))
            except asyncio.CancelledError:
                # Not waited for (a zip's CRC read may take seconds: a stop would wait for it, or
                # leave this task pending): a job not begun is not run, one under way stops at its
                # next tick, and the files it opened are closed as it ends, in its own thread,
                # whether or not the loop is still there.
                abandoned = True
                job.cancel()
                job.add_done_callback(_close_job_pieces)
                raise
            try:
                for before, fd, data, first, length, after, check in pieces:
                    pending += before
                    if data is not None:
                        pending += data
                    elif fd is not None:
                        self.written += len(pending)
                        with io.FileIO(fd, "rb", closefd=False) as file:
                            self.written += await sendfile(
                                transport,
                                file,
                                first,
                                length,
                                headers=bytes(pending),
                                on_progress=self.progress,
                            )
                        if check is not None:  # (a zip's member: its CRC-32 went before its bytes)
                            sent_as_read(fd, check)
                        pending.clear()
                    pending += after
                    if len(pending) >= GATHER:
                        await self._write(pending)
                        pending = bytearray()
            finally:
                _close_pieces(pieces)
        if pending:
            await self._write(pending)

    def _ticked(self) -> None:
        """(On the loop, at each tick of a long read in the pool: a zip's CRC-32 of a large file.)
        Progress, while its client is there: reading is paused while a body is sent, so a client
        gone meanwhile is seen here, not at the next write, which may be minutes away (every CRC
        before a range at a zip's end); its connection is aborted, which stops the read. Gone: a
        reset (a client that closed resets the connection once the head reached it); a client's
        end of stream alone is a half-close, answered (a client that read the head, then closed,
        is seen at the next write, as before)."""
        transport = self.conn.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and peer_ended(sock.fileno(), reset_only=True):
            transport.abort()
            return
        self.progress()

    async def _write(self, data: bytearray) -> None:
        """Write *data* (not touched again: the transport may keep it) and wait while the transport
        is over its high-water mark (the connection's own flow control: ``resumed``)."""
        conn = self.conn
        conn.transport.write(data)
        self.written += len(data)
        self.progress()
        while conn.write_paused:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("the peer went away during an archive")


class Abandoned(Exception):
    """(Raised in the pool.) The archive's connection is gone: its read stops."""


def _reads_a_crc(layout: Layout, span: _Span) -> bool:
    """Whether making *span* ready reads a large file whole, for a zip's CRC-32 not known yet."""
    index = layout.crc_index(span[0])
    return index is not None and layout.members[index].size > SMALL and not crc_known(layout, index)


def _batches(layout: Layout, start: int, stop: int) -> Iterator[list[_Span]]:
    """The spans of [*start*, *stop*), in groups of at most :data:`BATCH` parts and about
    :data:`BATCH_READ` bytes of small files read in the pool; a span that reads a large file's
    CRC-32 ends its group (one such read a hop)."""
    batch: list[_Span] = []
    read = opened = 0
    for span in layout.spans(start, stop):
        batch.append(span)
        member = layout.body_of(span[0])
        if member is not None and member.size <= SMALL:
            read += member.size
        elif member is not None:
            opened += 1
        reads = _reads_a_crc(layout, span)
        if len(batch) == BATCH or read >= BATCH_READ or opened == BATCH_OPEN or reads:
            yield batch
            batch = []
            read = opened = 0
    if batch:
        yield batch


#: Threads that prepare archive parts (open and check files, read small ones and CRC-32s): their
#: own pool, so that archives, whose reads can be long (a zip's first CRC of a large file, a range
#: deep in a zip that needs every CRC before it), never hold the cold-read pool's threads.
ARCHIVE_THREADS = 2
_archive_pool = LazyPool(ARCHIVE_THREADS, "aiosendfile-archive")


def archive_executor() -> ThreadPoolExecutor:
    """The process-wide pool for archive parts, made on first use."""
    return _archive_pool()


def _close_job_pieces(job: concurrent.futures.Future[list[Piece]]) -> None:
    if not job.cancelled() and job.exception() is None:
        _close_pieces(job.result())


def _close_pieces(pieces: list[Piece] | None) -> None:
    """Close the files *pieces* hold open (None: a job that failed, nothing to close)."""
    for held in pieces or ():
        if held.fd is not None:
            os.close(held.fd)


def _prepare(path: str, layout: Layout, batch: list[_Span], tick: Callable[[], None]) -> list[Piece]:
    """(In the pool.) Each span made ready (``_tree.piece``); if one fails, the files opened for
    those before it are closed again."""
    out: list[Piece] = []
    try:
        for span in batch:
            out.append(piece(path, layout, *span, tick))
    except BaseException:
        _close_pieces(out)
        raise
    return out
