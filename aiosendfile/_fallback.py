"""Userspace copy, for where zero-copy cannot work: TLS, pipes, in-memory files.

Rules:

* Memory is bounded. On a plain transport, the write-buffer limits are set to
  (``chunk``, ``2 * chunk``) for the transfer and we wait for the transport
  to drain below the high-water mark before each read. At most about three
  chunks are held at any time. A TLS transport needs more care: see below.
* A transfer waits for the transport *before* it reads a chunk, so a stalled
  transfer holds no chunk of its own.
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
* Bounded work per wakeup: after ``max_chunk`` bytes sent without a pause the
  transfer yields to the loop once, as the zero-copy path does, even when the
  peer reads as fast as we write.

Memory over TLS
---------------
asyncio's TLS transport (3.11+) and uvloop's encrypt each ``write()`` at once,
whole, into an OpenSSL memory BIO, then pass the ciphertext to the socket
transport under them. Two consequences, measured (``tests/test_stress.py``):

* The BIO's buffer never shrinks: for as long as the connection lives it stays
  as large as the largest write it was given (OpenSSL grows it in 4/3 steps).
  256 KiB writes leave about 256-340 KiB behind on every connection.
* ``get_write_buffer_size()`` counts the BIO, not the socket transport under
  it, which takes each piece of ciphertext whole while it is under its own
  high-water mark (64 KiB). With limits of (256 KiB, 512 KiB), a stalled
  download held 512 KiB in the BIO and as much again in the socket transport:
  1.2-1.5 MiB of RSS per connection.

So over TLS:

* The limits are (1, 0): the transfer is paused while *any* ciphertext waits
  in the TLS layer. Ciphertext waits there only while the socket transport
  under it is paused, so this also waits for that transport to drain.
* A chunk is written in pieces, and a piece the TLS layer keeps ends the
  chunk: the rest is dropped and read again (``pread``) once the transport
  resumes. A stalled transfer thus holds one piece in the BIO and at most one
  piece over the socket transport's high-water mark, and no chunk.
* Pieces are one TLS record (16 KiB) unless ``TLS_BUFFER_BUDGET`` allows more.
  Bytes per ``SSL_write`` and per ``send()`` set the CPU cost of a byte: 16 KiB
  pieces cost 1.5-1.9x the CPU per byte of 256 KiB ones. A connection may grow
  its pieces up to 256 KiB while the growth of all open connections' BIOs past
  16 KiB fits the budget; it gives its share back when it closes. A few fast
  downloads so run as fast as with 256 KiB writes, and a thousand connections
  still cost about 16 KiB each, plus the budget.
* The socket transport under the TLS one is watched too (``TransportLease.watch_socket_under_tls``):
  once it is lost (a failed ``send()``) or closing (uvloop: the peer's EOF), the next piece
  raises ``ConnectionLostError``. The TLS transport learns it a loop iteration or two later
  and, until then, drops every write with a warning.
* While a regular file is sent, the socket under TLS is corked (``TCP_CORK``),
  so small pieces still leave in full segments; the cork is released when the
  transfer ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import IO, Any

from . import _platform
from ._coldread import read_range
from ._errors import ConnectionLostError
from ._job import SendJob
from ._lease import TransportLease
from ._options import DEFAULT_FALLBACK_CHUNK, Options, default_stream_executor
from ._readiness import wait_ready
from ._state import TransferState
from ._target import is_tls

__all__ = (
    "TLS_BUFFER_BUDGET",
    "copy_to_socket",
    "copy_to_transport",
    "ChunkReader",
)

#: The smallest write to a TLS transport: one full TLS record.
TLS_MIN_WRITE = 16 * 1024
#: The largest write to a TLS transport.
TLS_MAX_WRITE = 256 * 1024
#: Bytes of TLS-layer buffers that writes above ``TLS_MIN_WRITE`` may claim, all open connections
#: together: 17 connections at ``TLS_MAX_WRITE``.
TLS_BUFFER_BUDGET = 4 * 1024 * 1024
#: TLS pieces per file read (a read is at most a chunk).
_PIECES_PER_READ = 4


class ChunkReader:
    """Reads the file at the transfer's own position, one fresh bytes object per call."""

    def __init__(self, file: IO[bytes] | Any, regular_fd: int | None, options: Options) -> None:
        self._file = file
        self._fd = regular_fd
        self._in_memory = isinstance(file, io.BytesIO)
        self._read = getattr(file, "read1", None) or file.read
        self._options = options
        self._back = b""  # read from a file that cannot read them again, not sent: given back first

    @property
    def positional(self) -> bool:
        """Reads at any offset (``pread``): bytes read but not sent can simply be read again."""
        return self._fd is not None

    def give_back(self, rest: bytes | bytearray | memoryview) -> None:
        """Bytes of the last read that were not sent, from a file that is not :attr:`positional`:
        the next read returns them first (a positional one reads them again)."""
        if not self.positional:
            self._back = bytes(rest) + self._back

    async def read(self, position: int, size: int) -> bytes | bytearray:
        if self._back:
            data, self._back = self._back[:size], self._back[size:]
            return data
        if self._fd is not None:
            options = self._options
            return await read_range(self._fd, size, position, options.executor, probe=options.probe)
        if self._in_memory:
            return bytes(self._read(size))
        # A stream (a pipe, a socket file) may never give a byte: read in the streams' own pool,
        # never the cold-read pool every file send shares (idle pipes, their callers cancelled,
        # held its threads: every cold file waited) nor the loop's default executor.
        loop = asyncio.get_running_loop()
        pool = self._options.executor or default_stream_executor()
        return bytes(await loop.run_in_executor(pool, self._read, size))


async def copy_to_transport(lease: TransportLease, job: SendJob) -> None:
    """Copy through ``transport.write`` with the transport's flow control."""
    reader = ChunkReader(job.file.file, job.file.fd, job.options)
    state, options, chunk = job.state, job.options, DEFAULT_FALLBACK_CHUNK
    if is_tls(lease.transport):
        await _copy_to_tls(lease, reader, state, options, chunk)
        return
    lease.set_buffer_limits(high=2 * chunk, low=chunk)

    async def send(prefix: bytes, data: bytes | bytearray) -> int:
        lease.write(prefix + data if prefix else data)
        return len(data)

    await _copy(send, reader, state, options, chunk, ready=lease.drain)


async def _copy_to_tls(
    lease: TransportLease,
    reader: ChunkReader,
    state: TransferState,
    options: Options,
    chunk: int,
) -> None:
    """Copy to a TLS transport in pieces that stop where the TLS layer starts to hold them.

    See "Memory over TLS" above.
    """
    transport = lease.transport
    # A write after the socket under TLS is lost would be dropped with a warning: stop at the first.
    lease.watch_socket_under_tls()
    # Paused while any ciphertext waits in the TLS layer, so resumed only once the socket
    # transport under it took it all (that transport is not in get_write_buffer_size()).
    lease.set_buffer_limits(high=1, low=0)
    buffered = transport.get_write_buffer_size
    write = lease.write  # given views of the chunk: no copies
    connection = transport.get_extra_info("ssl_object")
    piece = TLS_MIN_WRITE
    short = 0  # what the last send took, if it stopped short of its chunk

    def read_size() -> int:
        nonlocal piece
        if connection is not None:
            piece = tls_buffers.write_size(connection)
        if not reader.positional:
            return piece  # a stream cannot be read again: one piece, which is always sent
        size = min(chunk, _PIECES_PER_READ * piece)
        # After a chunk stopped short, read about what went then: less to read again.
        return min(size, short + piece) if short else size

    async def send(prefix: bytes, data: bytes | bytearray) -> int:
        nonlocal short
        view = memoryview(data)
        end = len(view)
        write(prefix + view[:piece] if prefix else view[:piece])
        sent = piece
        try:
            while sent < end and not buffered():
                write(view[sent : sent + piece])
                sent += piece
        except ConnectionLostError:
            _advance(state, options, min(sent, end))  # the pieces written before the loss went
            raise
        # Stopped at the first piece the TLS layer kept (the socket under it is full), or at the end.
        short = sent if sent < end else 0
        return min(sent, end)

    sock = transport.get_extra_info("socket") if reader.positional else None
    corked = sock is not None and _platform.set_cork(sock, True)
    try:
        await _copy(send, reader, state, options, read_size, ready=lease.drain)
    finally:
        if corked and sock is not None:
            with contextlib.suppress(OSError, ValueError):  # ValueError: uvloop's socket is closed
                _platform.set_cork(sock, False)  # flush what the cork holds


class TLSBuffers:
    """How large our writes made each open TLS connection's buffer (see "Memory over TLS").

    Writes above ``TLS_MIN_WRITE`` draw on ``TLS_BUFFER_BUDGET``, shared by all
    open TLS connections of the process; a connection gives its share back when
    it is gone (its SSL object is freed).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.claimed = 0
        self._lock = threading.RLock()  # a finalizer may run in any thread, or during a claim
        self._sizes: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()

    def write_size(self, connection: Any) -> int:
        """The largest write for *connection* now: the most it has made, or more while the budget allows."""
        with self._lock:
            record = self._sizes.get(connection)
            if record is None:
                record = self._sizes[connection] = [TLS_MIN_WRITE]
                weakref.finalize(connection, self._release, record).atexit = False
            have = record[0]
            size = TLS_MAX_WRITE
            while size > have and self.claimed + size - have > self.budget:
                size //= 2
            if size <= have:
                return have
            self.claimed += size - have
            record[0] = size
            return size

    def _release(self, record: list[int]) -> None:
        with self._lock:
            self.claimed -= record[0] - TLS_MIN_WRITE


tls_buffers = TLSBuffers(TLS_BUFFER_BUDGET)


async def copy_to_socket(job: SendJob) -> None:
    """Copy to a raw non-blocking socket: each ``send`` counted as it goes (``loop.sock_sendall``
    counted a chunk only once all of it went: a cancelled one left what it had sent uncounted,
    and a caller resuming from the file's position sent it twice)."""
    loop = asyncio.get_running_loop()
    sock = job.target.sock
    assert sock is not None  # _api sends here only for a socket target
    fd = sock.fileno()

    async def send(prefix: bytes, data: bytes | bytearray) -> int:
        # *prefix* whole, then what of *data* the socket takes: once some of it went, that is
        # counted before anything waits again (the rest is read again, or given back).
        out = memoryview(prefix + data if prefix else data)
        head = len(prefix)
        done = 0
        while True:
            try:
                done += _platform.send_once(sock, out[done:])
            except (BlockingIOError, InterruptedError):
                await wait_ready(loop, fd, None, writable=True)
                continue
            if done > head or done == len(out):
                if done < len(out):
                    reader.give_back(out[done:])
                return done - head

    reader = ChunkReader(job.file.file, job.file.fd, job.options)
    await _copy(send, reader, job.state, job.options, DEFAULT_FALLBACK_CHUNK)


async def _copy(
    send: Callable[[bytes, bytes | bytearray], Awaitable[int]],
    reader: ChunkReader,
    state: TransferState,
    options: Options,
    chunk: int | Callable[[], int],
    ready: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Read fresh chunks and *send* them: headers with the first, trailers after the last.

    *chunk* is the read size (or says it, per read). *ready* (if given) is
    awaited before each read. ``send(prefix, data)`` sends *prefix* and some of
    *data*, and returns how much of *data*: the rest is read again next time.
    The last send (headers if nothing else went, then trailers) is whole.
    """
    prefix = bytes(options.headers)
    unyielded = 0
    while not state.done:
        if ready is not None:
            await ready()
        if unyielded >= options.max_chunk:
            unyielded = 0
            await asyncio.sleep(0)  # the peer keeps up: let other connections run
        size = chunk() if callable(chunk) else chunk
        data = await reader.read(state.position, state.next_chunk(size))
        if not data:
            if state.hit_eof():
                raise state.truncated()
            break  # unknown size: EOF is the end
        n = await send(prefix, data)
        del data  # not kept while the next ready() waits
        prefix = b""
        _advance(state, options, n)
        unyielded += n
    if prefix or options.trailers:
        if ready is not None:
            await ready()
        frame = prefix + bytes(options.trailers)
        while frame:  # whole: a TLS send may take it in more than one call
            frame = frame[await send(b"", frame) :]


def _advance(state: TransferState, options: Options, n: int) -> None:
    state.advance(n)
    if options.on_progress is not None:
        options.on_progress(state.sent, state.total)
