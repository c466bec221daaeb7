"""``aiosendfile recv``: take one file from the first peer with a valid handshake, write it zero-copy
(splice), check its SHA-256. Stray peers are logged and dropped; OUT keeps exactly what arrived
on any failure (see :mod:`._protocol`)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import shutil
import stat
import sys
from collections.abc import Callable
from typing import IO, Any, TypeVar, cast

from .._cli._common import announce, fail, in_words
from .._recv import recvfile
from ._protocol import (
    BUSY,
    FAREWELL_TIMEOUT,
    HASH_RATE,
    IDLE_TIMEOUT,
    LINE_LIMIT,
    BadPeer,
    Refused,
    TransferFailed,
    check_announcement,
    is_int,
    json_object,
    short,
)
from ._session import Idle, Progress, hash_file, in_thread, run, send_message, summary, until_idle

__all__ = ("check_out", "recv_main")

MAX_PENDING = 64  # connections in their handshake at once; more are dropped
DRAIN_TIMEOUT = 5.0  # seconds we keep reading a body we cannot write, so the sender hears why

T = TypeVar("T")


def _peer_name(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        host = f"[{name[0]}]" if ":" in str(name[0]) else name[0]
        return f"{host}:{name[1]}"
    return str(name or "a peer")


def check_out(out: str, *, resume: bool, force: bool) -> str | None:
    """Why OUT cannot be written (checked before listening), or None."""
    if not out:
        return "OUT is empty; name the file to write"
    if os.path.isdir(out):
        return f"{out} is a directory; name the file to write, e.g. {os.path.join(out, 'NAME')}"
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        reason = "does not exist" if not os.path.lexists(parent) else "is not a directory"
        return f"cannot write {out}: the directory {parent} {reason}"
    if not os.access(parent, os.W_OK | os.X_OK) and not os.path.exists(out):
        return f"cannot write {out}: no permission to create files in {parent}"
    if os.path.lexists(out):
        if not (resume or force):
            return (
                f"{out} already exists; use --force to overwrite it, or --resume to continue "
                "a partial transfer"
            )
        if not os.access(out, os.W_OK):
            return f"cannot write {out}: permission denied"
    return None


def _open_out(out: str, start: int) -> IO[bytes]:
    """OUT opened for the transfer (at *start* to resume). A FIFO is opened without waiting for a
    reader: with none, ENXIO at once (a blocking open would hold the loop, its timeouts and its
    signals, until one came); its writes wait for room in the pool, and a receive given up (idle,
    interrupted) closes it and leaves no thread behind (a blocked write held the process)."""
    try:
        fifo = stat.S_ISFIFO(os.stat(out).st_mode)
    except OSError:
        fifo = False
    if fifo:  # (kept non-blocking and unbuffered: a write waits in poll, which a close ends)
        fd = os.open(out, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        return open(fd, "wb", buffering=0)
    return open(out, "r+b" if start else "wb")


class _Hashed(io.RawIOBase):
    """OUT that is no regular file (a pipe, ``/dev/null``), written through and hashed on the way:
    it cannot be read back to check it (a FIFO's open waited for ever, a device's read gave the
    empty file's hash: a checksum mismatch for every byte delivered)."""

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__()
        self.out = out
        self.digest = hashlib.sha256()
        self.written = 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.out.fileno()

    def write(self, data: Any) -> int | None:
        n = self.out.write(data)
        if n:
            self.digest.update(memoryview(data)[:n])
            self.written += n
        return n


class _Receiver:
    """One ``recv``: at most one transfer, from the first peer with a valid handshake."""

    def __init__(
        self, out: str, resume: bool, handshake_timeout: float, idle_timeout: float = IDLE_TIMEOUT
    ) -> None:
        self.out, self.resume, self.timeout, self.idle = out, resume, handshake_timeout, idle_timeout
        self.busy = False
        self.pending = 0
        self.connections: set[asyncio.StreamWriter] = set()
        self.prefix: tuple[int, str] | None = None  # (length, sha256) of OUT, hashed once
        self.size: int | None = None
        self.kept: int | None = None  # bytes OUT holds once a transfer touched it
        self.done: asyncio.Future[str] | None = None

    @staticmethod
    def log(message: str) -> None:
        print(f"aiosendfile recv: {message}", file=sys.stderr, flush=True)

    async def run(self, host: str, port: int, ready: Callable[[int], None]) -> str:
        self.done = asyncio.get_running_loop().create_future()
        try:
            server = await asyncio.start_server(self.handle, host, port, limit=LINE_LIMIT)
        except OSError as exc:
            raise TransferFailed(f"cannot listen on {host}:{port}: {in_words(exc)}") from exc
        try:
            ready(server.sockets[0].getsockname()[1])
            return await self.done
        finally:
            server.close()
            for writer in list(self.connections):
                writer.transport.abort()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.done is not None
        peer = _peer_name(writer)
        if self.done.done() or self.pending >= MAX_PENDING:
            if not self.done.done():
                self.log(f"dropped {peer}: {MAX_PENDING} other connections are in their handshake")
            writer.transport.abort()
            return
        self.pending += 1
        self.connections.add(writer)
        try:
            if self.busy:
                self.log(f"refused {peer}: a transfer is in progress")
                await self.refuse(reader, writer, BUSY)
                return
            try:
                await self.serve(reader, writer, peer)
            except BadPeer as exc:
                if self.done.done():
                    return  # we are closing it ourselves: the transfer is over
                if isinstance(exc, Refused):
                    self.log(f"refused {peer}: {exc}")
                    await self.refuse(reader, writer, str(exc))
                else:
                    self.log(f"ignored {peer}: {exc}")
                    await self.refuse(reader, writer, f"not accepted: {exc}")
            except TransferFailed as exc:
                if not self.done.done():
                    self.done.set_exception(exc)
            except asyncio.CancelledError:
                # Stopping (a signal, or the transfer is over). Not re-raised: on 3.10/3.11 the
                # stream server's done-callback reports a cancelled handler task as an error.
                self.done.cancel()
            except Exception as exc:  # an error we did not foresee: say it, never a traceback
                if not self.done.done():
                    self.done.set_exception(TransferFailed(f"unexpected error: {in_words(exc)}"))
        finally:
            self.pending -= 1
            self.connections.discard(writer)
            writer.transport.abort()

    async def line(self, reader: asyncio.StreamReader, timeout: float, what: str) -> dict[str, Any]:
        """One handshake line as a JSON object; BadPeer for silence, garbage or a close."""
        try:
            raw = await asyncio.wait_for(reader.readline(), timeout)
        except asyncio.TimeoutError:
            raise BadPeer(f"sent no complete {what} within {timeout:g}s") from None
        except ValueError:
            raise BadPeer(f"sent a {what} line longer than {LINE_LIMIT} bytes") from None
        except OSError as exc:
            raise BadPeer(f"dropped the connection during the handshake ({in_words(exc)})") from None
        if not raw:
            raise BadPeer("closed the connection without a handshake")
        if not raw.endswith(b"\n"):
            raise BadPeer(f"closed the connection in the middle of its {what}")
        message = json_object(raw)
        if message is None:
            raise BadPeer(f"not an aiosendfile sender (it sent {short(raw.rstrip()[:60])})")
        return message

    async def refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, why: str) -> None:
        """Tell the peer why, and let it read that before we close (no reset under its feet)."""
        with contextlib.suppress(Exception):
            send_message(writer, {"error": why})
            if writer.can_write_eof():
                writer.write_eof()

            async def until_eof() -> None:
                while await reader.read(LINE_LIMIT):
                    pass

            await asyncio.wait_for(until_eof(), min(FAREWELL_TIMEOUT, self.timeout))

    def check_room(self, size: int) -> None:
        """Refuse a file the disk has no room for, before anything is written."""
        try:
            st = os.stat(self.out)
        except OSError:
            have = 0  # not there yet: a new regular file
        else:
            if not stat.S_ISREG(st.st_mode):
                return  # a device or a pipe (/dev/null, /dev/stdout): not the directory's disk
            have = st.st_size
        try:
            free = shutil.disk_usage(os.path.dirname(os.path.realpath(self.out))).free  # (a link's target's)
        except OSError:
            return  # cannot tell: the writes will say
        if size - have > free:
            raise Refused(f"not enough disk space: the file is {size} bytes, {free} are free")

    async def offer(self, size: int) -> tuple[int, str, str | None]:
        """(offset, prefix hash, notice): only the whole of OUT, only to a file at least as long."""
        if not self.resume or not os.path.exists(self.out):
            return 0, "", None
        have = os.path.getsize(self.out)
        if have == 0:
            return 0, "", None
        if have > size:
            self.log(f"{self.out} holds {have} bytes, more than the {size} being sent: starting over")
            return 0, "", f"its partial file is longer than the {size} bytes being sent: starting over"
        if self.prefix is None or self.prefix[0] != have:
            try:
                self.prefix = (have, await in_thread(hash_file, self.out, have))
            except OSError as exc:
                raise TransferFailed(f"cannot read {self.out} to resume it: {in_words(exc)}") from exc
        return have, self.prefix[1], None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        assert self.done is not None
        size, expected = check_announcement(await self.line(reader, self.timeout, "handshake"))
        if self.busy:  # another peer took the slot while this one was announcing
            self.log(f"refused {peer}: a transfer is in progress")
            await self.refuse(reader, writer, BUSY)
            return
        self.busy = True
        try:
            self.check_room(size)
            have, prefix, notice = await self.offer(size)
            message: dict[str, Any] = {"offset": have, "prefix_sha256": prefix}
            if notice:
                message["notice"] = notice
            send_message(writer, message)
            reply = await self.line(reader, self.timeout + have / HASH_RATE, "start line")
            start = reply.get("start")
            if not is_int(start) or start not in (0, have):
                offered = f"0 or {have}" if have else "0"
                raise BadPeer(f"asked to start at {short(start)}, but only {offered} was offered")
        except BaseException:
            self.busy = False
            raise
        if have and start == 0:
            self.log(f"the sender's file does not start with the {have} bytes in {self.out}: starting over")
        self.done.set_result(await self.receive(reader, writer, peer, size, expected, start))

    async def receive(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        size: int,
        expected: str,
        start: int,
    ) -> str:
        out = self.out
        self.size = size
        try:
            f = _open_out(out, start)
        except OSError as exc:
            send_message(writer, {"error": f"the receiver cannot write its file: {in_words(exc)}"})
            await self.drain_body(reader, size - start)
            raise TransferFailed(f"cannot write {out}: {in_words(exc)}") from exc
        progress = Progress(size, start, "recv")
        hashed = None if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else _Hashed(f)
        with f:
            self.kept = start
            try:
                if hashed is None:
                    f.truncate(start)
                loop = asyncio.get_running_loop()
                last = loop.time()

                def landed(got: int, _total: int | None) -> None:
                    nonlocal last
                    last = loop.time()
                    progress.update(start + got)

                await until_idle(
                    recvfile(
                        reader, cast("IO[bytes]", hashed or f), size - start, offset=start, on_progress=landed
                    ),
                    self.idle,
                    lambda: last,
                )
            except BaseException as exc:
                self.kept = _settle(f, start) if hashed is None else hashed.written
                progress.close()
                kept = f"kept the first {self.kept} of {size} bytes in {out}"
                if isinstance(exc, Idle):
                    if hashed is None:
                        told = f"sent nothing for {self.idle:g}s"
                        said = f"{peer} {told} mid-transfer; {kept} (--resume continues it)"
                    else:  # (a pipe: its reader may be the one that stalled; no resuming it)
                        told = f"nothing moved for {self.idle:g}s: {out} took nothing, or {peer} sent nothing"
                        said = f"{told}; {kept}"
                    with contextlib.suppress(Exception):  # it may be gone for good
                        send_message(writer, {"error": f"{told}; giving up"})
                    raise TransferFailed(said) from None
                if isinstance(exc, (EOFError, ConnectionError)):
                    how = "disconnected" if isinstance(exc, EOFError) else f"was lost ({in_words(exc)})"
                    raise TransferFailed(
                        f"the connection from {peer} {how} mid-transfer; {kept} (--resume continues it)"
                    ) from exc
                if isinstance(exc, OSError):
                    reason = f"cannot write {out}: {in_words(exc)}"
                    send_message(
                        writer, {"error": f"{reason}; it kept the first {self.kept} of {size} bytes"}
                    )
                    await self.drain_body(reader, size - self.kept)
                    raise TransferFailed(f"{reason}; {kept}") from exc
                raise
            self.kept = _settle(f, start) if hashed is None else hashed.written
        elapsed = progress.close()
        if hashed is not None:
            actual = hashed.digest.hexdigest()
        else:
            try:
                actual = await in_thread(hash_file, out)
            except OSError as exc:
                raise TransferFailed(f"cannot read {out} back to check it: {in_words(exc)}") from exc
        ok = actual == expected
        with contextlib.suppress(OSError):
            send_message(writer, {"ok": ok, "sha256": actual})
            await writer.drain()
        if not ok:
            raise TransferFailed(f"checksum mismatch: got {actual}, the sender has {expected}; kept {out}")
        resumed = f", resumed at {start}" if start else ""
        return summary("received", size - start, elapsed, f"{resumed} into {out}; sha256 verified")

    async def drain_body(self, reader: asyncio.StreamReader, remaining: int) -> None:
        """Read (and drop) the rest of a body we cannot write, for a while, so the sender finishes
        sending and then reads our error instead of a reset connection."""

        async def discard() -> None:
            left = remaining
            while left > 0:
                data = await reader.read(min(left, 1 << 20))
                if not data:
                    return
                left -= len(data)

        with contextlib.suppress(Exception):
            await asyncio.wait_for(discard(), DRAIN_TIMEOUT)


def _settle(f: IO[bytes], start: int) -> int:
    """Flush what OUT holds to disk; return its length (recvfile leaves the position there)."""
    try:
        kept = f.tell()
    except (OSError, ValueError):
        kept = start
    with contextlib.suppress(OSError, ValueError):
        f.flush()
        os.fsync(f.fileno())
    return kept


def recv_main(args: Any) -> int:
    prog = "aiosendfile recv"
    problem = check_out(args.out, resume=args.resume, force=args.force)
    if problem:
        return fail(prog, problem, 2)
    host, port = args.listen
    receiver = _Receiver(args.out, args.resume, args.handshake_timeout, args.idle_timeout)

    def ready(bound: int) -> None:
        announce(f"aiosendfile recv listening on {host}:{bound}, writing {args.out} (Ctrl-C to stop)")

    def interrupted() -> str:
        if receiver.kept is None:
            return f"interrupted before any transfer; {args.out} untouched"
        return (
            f"interrupted; kept the first {receiver.kept} of {receiver.size} bytes in {args.out} "
            "(recv --resume continues it)"
        )

    return run(prog, args.loop, receiver.run(host, port, ready), interrupted)
