"""Helpers of the page reader's tests (``tests/core/test_page_reader*.py``): its done tokens and
sends waited for as a loop does, an idle reader, and :class:`ColdSend`, a cold file sent on one
end of a socketpair by a transfer (or a ``ColdWhole``) whose owner waits with given page waits."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import socket
from pathlib import Path
from typing import Any

from aiosendfile import _bodies, _coldread, _outlet

from .fds import describe_fd
from .files import evict, pattern


def tokens_of(reader: Any, count: int, timeout: float = 10.0) -> list[int]:
    """The reader's done tokens until *count* came (waiting on its eventfd, as a loop does)."""
    got: list[int] = []
    while len(got) < count:
        readable, _, _ = select.select([reader.fileno()], [], [], timeout)
        assert readable, f"the reader said nothing in {timeout} s (tokens so far: {got})"
        got += reader.done()
    return got


class ColdSend:
    """A cold file of *size* bytes (written, then evicted) sent after *head* by a transfer on one
    end of a socketpair, whose owner waits for pages with *pages*: ``transfer`` (not run yet),
    ``ended`` (what ``done`` was first called with), ``done`` and ``released`` (every call),
    ``received()`` (what the other end read). A context manager: the file and sockets close."""

    def __init__(self, tmp_path: Path, size: int, seed: int, pages: Any, head: bytes = b"") -> None:
        loop = asyncio.get_running_loop()
        path = tmp_path / "cold.bin"
        self.data = pattern(size, seed=seed)
        path.write_bytes(self.data)
        evict(path)
        self.ended: asyncio.Future[tuple[int, Exception | None]] = loop.create_future()
        self.done: list[tuple[int, Exception | None]] = []
        self.released: list[int] = []
        self.got = b""  # (what read_to_end read)
        self.ours, self.peer = socket.socketpair()
        self.ours.setblocking(False)
        self.fd = os.open(path, os.O_RDONLY)
        self.transfer = _bodies.Transfer(
            _outlet.Outlet(loop, self.ours, 0),
            head,
            self.fd,
            0,
            size,
            self._done,
            lambda: None,
            lambda: self.released.append(1),
            pages=pages,
        )

    def _done(self, sent: int, exc: Exception | None) -> None:
        self.done.append((sent, exc))
        if not self.ended.done():
            self.ended.set_result((sent, exc))

    async def end(self) -> tuple[int, Exception | None]:
        return await asyncio.wait_for(self.ended, 10)

    def received(self) -> bytes:
        self.peer.setblocking(False)
        got = b""
        try:
            while chunk := self.peer.recv(1 << 20):
                got += chunk
        except BlockingIOError:
            pass
        return got

    def __enter__(self) -> ColdSend:
        return self

    def whole(self) -> _bodies.ColdWhole:
        """A ``ColdWhole`` of the file instead (the transfer is dropped): it closes the file
        itself, so this one's descriptor is a duplicate (``fd_closed`` tells when it went)."""
        fd = os.dup(self.fd)
        self.whole_fd = fd
        transfer = self.transfer
        return _bodies.ColdWhole(
            transfer.outlet,
            b"HEAD\r\n\r\n",
            fd,
            len(self.data),
            self._done,
            lambda: None,
            None,
            transfer.pages,
            None,
        )

    def fd_closed(self) -> bool:
        return describe_fd(self.whole_fd) != describe_fd(self.fd)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
        self.ours.close()
        self.peer.close()


class StuckWaits:
    """Page waits whose reader never gives a chunk back (a hung file), or cannot be asked."""

    closed = False

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.asked: list[tuple[int, int]] = []
        self.cancelled: list[int] = []

    def ask(self, fd: int, offset: int, size: int, then: Any, late: Any, key: Any = None) -> int:
        if self.fails:
            raise OSError(errno.EMFILE, "Too many open files")
        self.asked.append((offset, size))
        asyncio.get_running_loop().call_later(0.05, late)  # (its patience: forgotten, then late)
        return len(self.asked)

    def ask_send(self, fd: int, offset: int, size: int, sock: int, head: Any, *args: Any) -> int:
        _flags, then, late, *key = args
        return self.ask(fd, offset, size, then, late, *key)  # (held back when late, as the waits do)

    def cancel(self, token: int) -> None:
        self.cancelled.append(token)


def sent_of(reader: Any, timeout: float = 10.0) -> Any:
    """The reader's next done item (waiting on its eventfd)."""
    got = tokens_of(reader, 1, timeout)
    assert len(got) == 1
    return got[0]


def drain(sock: socket.socket, want: int, timeout: float = 10.0) -> bytes:
    got = b""
    sock.settimeout(timeout)
    while len(got) < want:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got += chunk
    return got


def idle(reader: Any, fd: int) -> None:
    """Have the reader's thread made, and asleep: a range asked then waits for ``start()`` (the
    first ``ask`` makes the thread, which may take it at once)."""
    reader.ask(fd, 0, 1, -1)
    reader.start()
    assert tokens_of(reader, 1) == [-1]


async def idle_waits(waits: _coldread.PageWaits, tmp_path: Path) -> None:
    """:func:`idle` for the reader of *waits*: what they ask next waits for the loop's next turn."""
    path = tmp_path / "idle.bin"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    came = asyncio.get_running_loop().create_future()
    try:
        waits.ask(fd, 0, 1, lambda: came.set_result(None), lambda: None)
    finally:
        os.close(fd)
    await asyncio.wait_for(came, 10)


async def read_to_end(send: ColdSend) -> tuple[int, Exception | None]:
    """What the transfer ended with, the other end read meanwhile (into ``send.got``), as a
    client does: a socket that nobody reads is full after some 200 KB."""
    send.got = b""
    send.peer.setblocking(False)
    while not send.ended.done():
        await asyncio.sleep(0.005)
        with contextlib.suppress(BlockingIOError):
            send.got += send.peer.recv(1 << 20)
    send.got += send.received()
    return await send.end()


def probed_cold(send: ColdSend) -> _bodies.Transfer:
    """The send's transfer as a first sight or a kept answer makes one: its file probed cold."""
    send.transfer.warm_to = _outlet.PROBED_COLD
    return send.transfer
