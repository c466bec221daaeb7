"""Sends made by the compiled page reader's thread (``_syscalls.PageReader.ask`` with a socket,
``_coldread.PageWaits.ask_send``) and the bodies built on them (``_bodies.Transfer``'s cold
chunks, ``_bodies.ColdWhole``): the head and the range go from the thread once the pages are in,
and the loop is told how far; held back when cancelled before they begin; every other ending
(a full socket, the wait given up, the waits closed, a file cut short, a peer gone) goes on or
ends with an error, never a short body passed off as whole.

Skipped where the C module was not built. Both loops (conftest).
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import _coldread, _outlet, _platform

from ..support.fds import describe_fd, open_fds
from ..support.files import evict, pattern
from ..support.page_reader import (
    ColdSend,
    StuckWaits,
    drain,
    idle,
    idle_waits,
    probed_cold,
    read_to_end,
    sent_of,
)

pytestmark = pytest.mark.skipif(not _platform.HAS_PAGE_READER, reason="no compiled page reader here")


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_a_send_goes_whole_with_its_head_and_is_told_how_far(tmp_path: Path, family: str) -> None:
    """The thread sends the head, then the cold range with sendfile, to a duplicate of the socket
    it takes as it begins (the caller may close its file at once), and done() says how much of
    each went."""
    path = tmp_path / "cold.bin"
    data = pattern(200_000, seed=11)
    path.write_bytes(data)
    evict(path)
    if family == "tcp":
        listener = socket.create_server(("127.0.0.1", 0))
        ours = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        listener.close()
    else:
        ours, peer = socket.socketpair()
    ours.setblocking(False)
    before = open_fds()
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    try:
        reader.ask(fd, 1000, 150_000, 3, ours.fileno(), b"HEAD\r\n\r\n", 0)
        os.close(fd)
        fd = -1
        reader.start()
        got = drain(peer, 8 + 150_000)
        assert sent_of(reader) == (3, 8, 150_000, 0)
        assert got == b"HEAD\r\n\r\n" + data[1000:151_000]
    finally:
        if fd >= 0:
            os.close(fd)
        reader.close()
        ours.close()
        peer.close()
    deadline = time.monotonic() + 10
    while open_fds() - before:  # (its duplicates of the file and the socket closed)
        assert time.monotonic() < deadline, {fd: describe_fd(fd) for fd in open_fds() - before}
        time.sleep(0.01)


def test_a_send_to_a_full_socket_says_where_it_stopped(tmp_path: Path) -> None:
    """A socket that takes only part (nobody reads the other end): EAGAIN, with the bytes that
    went; what the peer then reads is exactly those."""
    path = tmp_path / "f.bin"
    data = pattern(4 << 20, seed=12)
    path.write_bytes(data)
    ours, peer = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    ours.setblocking(False)
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    try:
        reader.ask(fd, 0, len(data), 1, ours.fileno(), b"H", 0)
        reader.start()
        token, head_sent, file_sent, err = sent_of(reader)
        assert (token, head_sent, err) == (1, 1, errno.EAGAIN)
        assert 0 < file_sent < len(data)
        assert drain(peer, 1 + file_sent) == b"H" + data[:file_sent]
    finally:
        os.close(fd)
        reader.close()
        ours.close()
        peer.close()


def test_a_send_cancelled_before_it_began_is_not_made(tmp_path: Path) -> None:
    """cancel() holds back a send the thread has not begun (True); done() still gives it back,
    with nothing sent (ECANCELED). One already made cannot be: False."""
    path = tmp_path / "f.bin"
    path.write_bytes(pattern(10_000, seed=13))
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    try:
        idle(reader, fd)
        reader.ask(fd, 0, 10_000, 1, ours.fileno(), b"HEAD", 0)  # (queued: start() not called)
        assert reader.cancel(1) is True
        reader.start()
        assert sent_of(reader) == (1, 0, 0, errno.ECANCELED)
        reader.ask(fd, 0, 10_000, 2, ours.fileno(), b"HEAD", 0)
        reader.start()
        select.select([reader.fileno()], [], [], 10)
        assert reader.cancel(2) is False  # (made: its result waits for done())
        assert reader.done() == [(2, 4, 10_000, 0)]
        assert drain(peer, 4 + 10_000) == b"HEAD" + pattern(10_000, seed=13)
    finally:
        os.close(fd)
        reader.close()
        ours.close()
        peer.close()


def test_cancel_holds_back_only_a_send_still_waiting(tmp_path: Path) -> None:
    """cancel() of a token that is not a send still waiting (already given back by done(), a
    read, or never asked) holds nothing back: False. It leaves no mark either: a caller that
    asks it of many such tokens can still cancel the sends that wait, each once."""
    path = tmp_path / "f.bin"
    path.write_bytes(pattern(10_000, seed=15))
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    try:
        idle(reader, fd)
        reader.ask(fd, 0, 10_000, 1, ours.fileno(), b"HEAD", 0)
        reader.start()
        assert sent_of(reader) == (1, 4, 10_000, 0)
        assert drain(peer, 4 + 10_000) == b"HEAD" + pattern(10_000, seed=15)
        assert reader.cancel(1) is False  # (made, and given back)
        assert reader.cancel(99) is False  # (never asked)
        reader.ask(fd, 0, 10_000, 5, ours.fileno(), b"", 0)  # (queued: start() not called)
        for stale in range(100, 200):  # (none of them waits: no room taken from the one that does)
            assert reader.cancel(stale) is False
        assert reader.cancel(5) is True
        assert reader.cancel(5) is True  # (asked again: still held back, and given back once)
        reader.start()
        assert sent_of(reader) == (5, 0, 0, errno.ECANCELED)
        assert reader.cancel(5) is False
    finally:
        os.close(fd)
        reader.close()
        ours.close()
        peer.close()


def test_a_send_to_a_peer_gone_fails_with_its_errno(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(pattern(10_000, seed=14))
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.close()
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    try:
        reader.ask(fd, 0, 10_000, 1, ours.fileno(), b"HEAD", 0)
        reader.start()
        assert sent_of(reader) == (1, 0, 0, errno.EPIPE)
    finally:
        os.close(fd)
        reader.close()
        ours.close()


def test_bad_send_arguments_are_refused_with_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x")
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    r, w = os.pipe()
    os.close(w)
    os.close(r)
    try:
        reader.ask(fd, 0, 1, 7, r, b"", 0)  # (a closed socket: its duplicate, as it begins, fails)
        reader.start()
        assert sent_of(reader) == (7, 0, 0, errno.EBADF)
        with pytest.raises(TypeError):
            reader.ask(fd, 0, 1, 0, fd, "head", 0)  # type: ignore[call-overload]
        with pytest.raises(TypeError):
            reader.ask(fd, 0, 1, 0, fd, b"")  # type: ignore[call-overload]
        with pytest.raises(TypeError):
            reader.cancel("1")  # type: ignore[arg-type]
        assert reader.done() == []
        assert open_fds() >= {fd}
    finally:
        os.close(fd)
        reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.cancel(1)


@pytest.mark.parametrize("size", [_outlet.READ_MAX, 100_000, _outlet.READ_AHEAD_MAX])
async def test_a_cold_body_goes_with_its_head_from_the_readers_thread(tmp_path: Path, size: int) -> None:
    """A body known cold does not send its head on its own: the reader's thread sends the head
    and the body together once the pages are in (one wait, no probe of the chunk after it, no
    timer), and the transfer ends whole. Byte-exact."""
    loop = asyncio.get_running_loop()
    waits = _coldread.PageWaits(loop)
    try:
        with ColdSend(tmp_path, size, 15, waits, b"HEAD\r\n\r\n") as send:
            transfer = probed_cold(send)
            transfer.run()
            assert transfer.asked is not None
            assert transfer.head is not None  # (the head waits for the body: not sent by the loop)
            assert await send.end() == (size, None)
            assert send.received() == b"HEAD\r\n\r\n" + send.data
            assert send.released == [1]
            assert not waits.waiting
            assert not waits.sends
            assert not waits.late
    finally:
        waits.close()


async def test_a_cold_body_the_socket_takes_part_of_goes_on_from_there(tmp_path: Path) -> None:
    """The reader's send stops at a full socket: the transfer goes on from where it stopped once
    the socket has room (the rest probed again). Byte-exact."""
    loop = asyncio.get_running_loop()
    waits = _coldread.PageWaits(loop)
    try:
        with ColdSend(tmp_path, _outlet.READ_AHEAD_MAX, 16, waits, b"HEAD\r\n\r\n") as send:
            send.ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
            probed_cold(send).run()
            assert await read_to_end(send) == (_outlet.READ_AHEAD_MAX, None)
            assert send.got == b"HEAD\r\n\r\n" + send.data
    finally:
        waits.close()


async def test_a_cold_body_whose_file_shrank_is_not_passed_off_as_whole(tmp_path: Path) -> None:
    """The file is cut short before the reader's thread sends it: the transfer ends with an error
    (the connection is aborted), never as complete."""
    loop = asyncio.get_running_loop()
    waits = _coldread.PageWaits(loop)
    try:
        with ColdSend(tmp_path, 100_000, 17, waits, b"HEAD\r\n\r\n") as send:
            os.truncate(tmp_path / "cold.bin", 60_000)
            probed_cold(send).run()
            sent, exc = await read_to_end(send)
            assert isinstance(exc, EOFError)
            assert sent == 60_000
            assert send.got == b"HEAD\r\n\r\n" + send.data[:60_000]
    finally:
        waits.close()


@pytest.mark.parametrize("how", ["stuck", "closed"])
async def test_a_cold_body_the_reader_gives_up_sends_its_head_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A send the reader never began (held past its patience; or its waits closed first) is made
    another way, the head still first: from the pool, or on the timer's way. Byte-exact."""
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: None)
    waits: Any = StuckWaits() if how == "stuck" else _coldread.PageWaits(asyncio.get_running_loop())
    if how == "closed":
        await idle_waits(waits, tmp_path)
    with ColdSend(tmp_path, 100_000, 18, waits, b"HEAD\r\n\r\n") as send:
        transfer = probed_cold(send)
        transfer.run()
        assert transfer.head is not None
        if how == "closed":
            waits.close()  # (before its next turn: the thread was not woken yet)
        assert await send.end() == (100_000, None)
        assert send.received() == b"HEAD\r\n\r\n" + send.data


async def test_a_cold_body_stopped_before_its_send_is_not_sent(tmp_path: Path) -> None:
    """The connection goes before the reader's thread began its send: nothing is sent, and the
    transfer lets its file go at once."""
    waits = _coldread.PageWaits(asyncio.get_running_loop())
    try:
        with ColdSend(tmp_path, 100_000, 19, waits, b"HEAD\r\n\r\n") as send:
            transfer = probed_cold(send)
            transfer.run()  # (the reader's thread, new, may take it at once: stopped before this turn ends)
            transfer.stop()
            assert send.released == [1]
            assert not waits.sends
            await asyncio.sleep(0.1)
            assert send.done == []
            assert send.received() in (b"", b"HEAD\r\n\r\n" + send.data)  # (nothing, or it was begun)
    finally:
        waits.close()


# -- a whole cold file (ColdWhole) ---------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 100_000, _outlet.READ_AHEAD_MAX])
async def test_a_whole_cold_file_is_sent_by_the_readers_thread_alone(tmp_path: Path, size: int) -> None:
    """Head and file go from the reader's thread once the pages are in; no transfer is made, the
    file is closed, ``done`` is called once with every byte. Byte-exact."""
    waits = _coldread.PageWaits(asyncio.get_running_loop())
    try:
        with ColdSend(tmp_path, size, 20, waits) as send:
            whole = send.whole()
            whole.run()
            assert whole.token is not None
            assert await read_to_end(send) == (size, None)
            assert send.got == b"HEAD\r\n\r\n" + send.data
            assert whole.went_on is None
            assert send.fd_closed()
            await asyncio.sleep(0.01)
            assert len(send.done) == 1
            assert not waits.sends
    finally:
        waits.close()


async def test_a_whole_cold_file_the_socket_takes_part_of_goes_on_as_a_transfer(tmp_path: Path) -> None:
    waits = _coldread.PageWaits(asyncio.get_running_loop())
    try:
        with ColdSend(tmp_path, _outlet.READ_AHEAD_MAX, 21, waits) as send:
            send.ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
            whole = send.whole()
            whole.run()
            assert await read_to_end(send) == (_outlet.READ_AHEAD_MAX, None)
            assert send.got == b"HEAD\r\n\r\n" + send.data
            assert whole.went_on is not None  # (the rest from the loop, once the socket had room)
            assert send.fd_closed()
    finally:
        waits.close()


@pytest.mark.parametrize("how", ["stuck", "refused", "closed"])
async def test_a_whole_cold_file_the_reader_does_not_send_goes_another_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Held past the reader's patience (from the pool), a reader that cannot be asked, or waits
    closed before the thread began (the timer's way): the head first, then the file, whole."""
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: None)
    loop = asyncio.get_running_loop()
    waits: Any = StuckWaits(fails=how == "refused") if how != "closed" else _coldread.PageWaits(loop)
    if how == "closed":
        await idle_waits(waits, tmp_path)
    with ColdSend(tmp_path, 100_000, 22, waits) as send:
        whole = send.whole()
        whole.run()
        if how == "closed":
            waits.close()
        assert await read_to_end(send) == (100_000, None)
        assert send.got == b"HEAD\r\n\r\n" + send.data
        assert whole.went_on is not None
        assert send.fd_closed()


@pytest.mark.parametrize("how", ["shrank", "peer-gone"])
async def test_a_whole_cold_file_that_cannot_go_whole_ends_with_an_error(tmp_path: Path, how: str) -> None:
    """Cut short under it, or no peer: ``done`` gets the error (the connection is aborted), never
    passed off as complete; the file is closed."""
    waits = _coldread.PageWaits(asyncio.get_running_loop())
    try:
        with ColdSend(tmp_path, 100_000, 23, waits) as send:
            if how == "shrank":
                os.truncate(tmp_path / "cold.bin", 60_000)
            else:
                send.peer.close()
            send.whole().run()
            sent, exc = await send.end()
            if how == "shrank":
                assert (sent, type(exc)) == (60_000, EOFError)
            else:
                assert (sent, type(exc)) == (0, BrokenPipeError)
            assert send.fd_closed()
    finally:
        waits.close()


async def test_a_whole_cold_file_stopped_before_it_went_lets_go_at_once(tmp_path: Path) -> None:
    waits = _coldread.PageWaits(asyncio.get_running_loop())
    try:
        with ColdSend(tmp_path, 100_000, 24, waits) as send:
            whole = send.whole()
            whole.run()  # (the reader's thread, new, may take it at once: stopped before this turn ends)
            whole.stop()
            assert send.fd_closed()
            assert not waits.sends
            await asyncio.sleep(0.1)
            assert send.done == []
            assert send.received() in (b"", b"HEAD\r\n\r\n" + send.data)
    finally:
        waits.close()


@pytest.mark.parametrize("sender", ["whole", "transfer"])
async def test_a_body_stopped_after_its_waits_closed_is_not_woken(tmp_path: Path, sender: str) -> None:
    """The waits close with a send held back (its callback queued for the loop's next turn), then
    the connection goes before that turn: the callback finds the body stopped and does nothing
    (no second close of its file, no send on a closed socket, ``done`` not called)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    waits = _coldread.PageWaits(loop)
    await idle_waits(waits, tmp_path)
    with ColdSend(tmp_path, 100_000, 25, waits, b"HEAD\r\n\r\n") as send:
        if sender == "whole":
            body: Any = send.whole()
        else:
            body = probed_cold(send)
        body.run()
        waits.close()  # (held back: its callback waits for the next turn)
        body.stop()
        closed_once = os.dup(send.fd)  # (takes the number the stop freed, if it freed one)
        try:
            await asyncio.sleep(0.05)
            assert describe_fd(closed_once) == describe_fd(send.fd)  # (not closed a second time)
        finally:
            os.close(closed_once)
        assert send.done == []
        assert send.received() == b""
        assert errors == []


def test_a_socket_closed_once_its_send_was_held_back_is_never_written_to(tmp_path: Path) -> None:
    """The reader takes its duplicate of the socket only as it begins a send: once cancel() held
    one back, the caller closes its socket, and another socket given the same number gets
    nothing from the thread."""
    path = tmp_path / "f.bin"
    path.write_bytes(pattern(10_000, seed=26))
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    try:
        idle(reader, fd)
        number = ours.fileno()
        reader.ask(fd, 0, 10_000, 1, number, b"HEAD", 0)
        assert reader.cancel(1) is True
        ours.close()
        peer.close()
        other, other_peer = socket.socketpair()
        with other, other_peer:
            if other.fileno() != number:
                os.dup2(other.fileno(), number)  # (the number, taken by another socket)
            try:
                reader.start()
                assert sent_of(reader) == (1, 0, 0, errno.ECANCELED)
                other_peer.setblocking(False)
                with pytest.raises(BlockingIOError):
                    other_peer.recv(100)
            finally:
                if other.fileno() != number:
                    os.close(number)
    finally:
        os.close(fd)
        reader.close()


class _SendingReader:
    """A page reader whose thread has begun every send asked (``cancel`` says False) and gives
    back what ``finished`` holds: what the waits do with sends under way."""

    def __init__(self) -> None:
        self.finished: list[Any] = []
        self.cancelled: list[int] = []

    def ask(self, *args: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def cancel(self, token: int) -> bool:
        self.cancelled.append(token)
        return False

    def done(self) -> list[Any]:
        out, self.finished = self.finished, []
        return out


async def test_a_send_under_way_is_not_late_and_its_end_is_told() -> None:
    """Past the patience, a send the thread has begun is not given up (it may be writing): it is
    waited for, and what went is told when it ends. At close, a send ended but not yet taken
    is told what went; one still under way is told it cannot be known."""
    loop = asyncio.get_running_loop()
    waits = _coldread.PageWaits(loop, patience=3600.0)
    reader = _SendingReader()
    waits.reader = reader  # type: ignore[assignment]
    got: list[Any] = []
    try:
        first = waits.ask_send(0, 0, 10, 0, b"H", 0, got.append, lambda: got.append("late"))
        waits.horizon = waits.next  # (asked before the timer's last run: late at this one)
        waits._check()
        assert got == []
        assert reader.cancelled == [first]
        assert first in waits.sends
        reader.finished = [(first, 1, 10, 0)]
        waits._arrived()
        assert got == [(first, 1, 10, 0)]
        ended = waits.ask_send(0, 0, 10, 0, b"H", 0, got.append, lambda: got.append("late"))
        waits.ask_send(0, 0, 10, 0, b"H", 0, got.append, lambda: got.append("late"))  # (under way)
        reader.finished = [(ended, 1, 10, 0)]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(loop, "remove_reader", lambda fd: True)
            reader.fileno = lambda: 0  # type: ignore[attr-defined]
            reader.close = lambda: None  # type: ignore[attr-defined]
            waits.close()
        await asyncio.sleep(0)
        assert got[1:] == [(ended, 1, 10, 0), _coldread.UNKNOWN_SEND]
        assert "late" not in got
    finally:
        if not waits.closed:
            waits.reader = None
            waits.close()
