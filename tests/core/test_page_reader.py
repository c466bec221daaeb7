"""The compiled page reader (``_syscalls.PageReader``) and the waits built on it
(``_coldread.PageWaits``, ``_outlet.Transfer``): a cold range is read in by a thread of its own that
never takes the GIL, and the loop is told through an eventfd once every page is in.

Skipped where the C module was not built (the timer path is tested in test_outlet and the serve
tests, both ways). Both loops (conftest).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import _coldread, _outlet, _platform

from ..support.fds import describe_fd, open_fds
from ..support.files import evict, pattern
from ..support.waiting import until

pytestmark = pytest.mark.skipif(not _platform.HAS_PAGE_READER, reason="no compiled page reader here")


def tokens_of(reader: Any, count: int, timeout: float = 10.0) -> list[int]:
    """The reader's done tokens until *count* came (waiting on its eventfd, as a loop does)."""
    got: list[int] = []
    while len(got) < count:
        readable, _, _ = select.select([reader.fileno()], [], [], timeout)
        assert readable, f"the reader said nothing in {timeout} s (tokens so far: {got})"
        got += reader.done()
    return got


def test_a_range_is_read_in_and_its_token_given_back_once(tmp_path: Path) -> None:
    path = tmp_path / "cold.bin"
    path.write_bytes(pattern(300_000, seed=1))
    evict(path)
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert reader.done() == []  # (nothing asked: nothing done, and no wait)
        reader.ask(fd, 0, 300_000, 7)
        reader.ask(fd, 4096, 10, 8)
        reader.start()
        assert sorted(tokens_of(reader, 2)) == [7, 8]
        assert reader.done() == []  # each token once
        assert _platform._cachestat.call is None or _platform._cachestat.call(fd, 0, 300_000) == 74
    finally:
        os.close(fd)
        del reader


def test_the_caller_may_close_its_descriptor_at_once_and_nothing_is_left(tmp_path: Path) -> None:
    """The thread reads a duplicate, and closes it once read; a range past the end, or empty,
    comes back done as well."""
    path = tmp_path / "f.bin"
    path.write_bytes(pattern(10_000, seed=2))
    before = open_fds()
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    reader.ask(fd, 0, 10_000, 1)
    reader.ask(fd, 50_000, 4096, 2)  # (past the end)
    reader.ask(fd, 0, 0, 3)
    os.close(fd)
    reader.start()
    assert sorted(tokens_of(reader, 3)) == [1, 2, 3]
    assert [fd for fd in open_fds() if describe_fd(fd) == str(path)] == []  # (the duplicates closed)
    del reader
    assert open_fds() == before  # (the eventfd closed as the reader goes)


def test_a_reader_dropped_with_ranges_asked_leaves_nothing_behind(tmp_path: Path) -> None:
    """Dropped at once after its asks: the eventfd is closed at once, the duplicates still queued
    too, and one being read once its read ends (its thread then ends)."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 4096)
    before = open_fds()
    reader = _platform.page_reader()
    evfd = reader.fileno()
    fd = os.open(path, os.O_RDONLY)
    try:
        for token in range(10):
            reader.ask(fd, 0, 4096, token)
    finally:
        os.close(fd)
    del reader
    assert describe_fd(evfd) in ("?", str(path))  # (closed: its number may be a duplicate's now)
    deadline = time.monotonic() + 10
    while open_fds() != before:
        assert time.monotonic() < deadline, {fd: describe_fd(fd) for fd in open_fds() - before}
        time.sleep(0.01)


def test_bad_arguments_are_refused_with_a_typed_error(tmp_path: Path) -> None:
    reader = _platform.page_reader()
    path = tmp_path / "f.bin"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    r, w = os.pipe()
    os.close(w)
    os.close(r)
    try:
        with pytest.raises(OSError, match="Bad file descriptor") as caught:
            reader.ask(r, 0, 1, 0)  # (a closed descriptor)
        assert caught.value.errno == errno.EBADF
        with pytest.raises(ValueError, match="negative"):
            reader.ask(fd, -1, 1, 0)
        with pytest.raises(ValueError, match="negative"):
            reader.ask(fd, 0, -1, 0)
        with pytest.raises(TypeError):
            reader.ask(fd, 0, 1)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            reader.ask("f", 0, 1, 0)
        with pytest.raises(TypeError):
            type(reader)(1)
        assert reader.done() == []
        reader.close()
        reader.close()  # (twice: nothing more)
        for call in (lambda: reader.ask(fd, 0, 1, 0), reader.start, reader.done, reader.fileno):
            with pytest.raises(ValueError, match="closed"):
                call()
    finally:
        os.close(fd)


def test_a_forked_child_is_refused_the_parents_reader(tmp_path: Path) -> None:
    """After ``fork()`` the reader's thread is not in the child: every use there raises (the
    engine's waits are made by the child's own loop), and dropping it closes the child's copies
    of its descriptors only: the parent's reader goes on."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    reader = _platform.page_reader()
    fd = os.open(path, os.O_RDONLY)
    try:
        reader.ask(fd, 0, 100, 1)
        reader.start()
        assert tokens_of(reader, 1) == [1]
        with warnings.catch_warnings():  # (3.12+: a fork with a thread running is warned about)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child
            code = 0
            for call in (lambda: reader.ask(fd, 0, 100, 2), reader.start, reader.done, reader.fileno):
                try:
                    call()
                    code = 3
                except RuntimeError:
                    pass
                except BaseException:
                    code = 4
            reader.close()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        reader.ask(fd, 0, 100, 5)  # (the parent's is as it was)
        reader.start()
        assert tokens_of(reader, 1) == [5]
    finally:
        os.close(fd)
        reader.close()


async def test_page_waits_call_back_on_the_loop_and_let_go_at_close(tmp_path: Path) -> None:
    """A wait's callback runs on the loop once its range is in; a cancelled one never runs; a
    callback that raises is reported to the loop's handler and the others still run; ``close``
    takes the eventfd out of the loop and closes it, and asking after it raises."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    path = tmp_path / "f.bin"
    path.write_bytes(pattern(50_000, seed=3))
    before = open_fds()
    waits = _coldread.PageWaits.here(loop)
    assert waits is not None
    fd = os.open(path, os.O_RDONLY)
    called: list[str] = []

    def fails() -> None:
        called.append("fails")
        raise ValueError("boom")

    def late() -> None:
        called.append("late")

    try:
        waits.ask(fd, 0, 50_000, fails, late)
        waits.ask(fd, 0, 4096, lambda: called.append("second"), late)
        cancelled = waits.ask(fd, 0, 4096, lambda: called.append("cancelled"), late)
        waits.cancel(cancelled)
    finally:
        os.close(fd)
    await until(lambda: len(called) == 2)
    await asyncio.sleep(0.05)  # (the cancelled range's read ends too: still not called)
    assert sorted(called) == ["fails", "second"]
    assert [type(e.get("exception")) for e in errors] == [ValueError]
    assert not waits.waiting
    assert not waits.late
    waits.close()
    assert waits.timer is None
    assert open_fds() == before
    with pytest.raises(RuntimeError):
        waits.ask(0, 0, 1, lambda: None, late)


class _HungReader:
    """A page reader whose thread never gives a range back (a hung file): what the waits ask."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def ask(self, fd: int, offset: int, size: int, token: int) -> None:
        self.asked.append(token)

    def start(self) -> None:
        pass

    def done(self) -> list[int]:
        return []


async def test_page_waits_call_late_what_is_not_in_after_their_patience() -> None:
    """One timer for all the waits (none a wait): a range still not in after the patience (within
    twice it) is forgotten and its *late* called instead, once, oldest first; one asked later
    waits on; one that came in is not late. The timer stops when nothing waits."""
    loop = asyncio.get_running_loop()
    waits = _coldread.PageWaits(loop, patience=0.1)
    waits.reader = _HungReader()  # type: ignore[assignment]
    calls: list[str] = []
    try:
        timers = []
        real_call_later = loop.call_later

        def counted(delay: float, *args: Any) -> Any:
            timers.append(delay)
            return real_call_later(delay, *args)

        loop_calls = pytest.MonkeyPatch()
        loop_calls.setattr(loop, "call_later", counted)
        try:
            for name in ("a", "b", "c"):
                waits.ask(
                    0,
                    0,
                    1,
                    lambda name=name: calls.append("then " + name),
                    lambda name=name: calls.append("late " + name),
                )
        finally:
            loop_calls.undo()
        assert timers == [0.1]  # (one timer for the three)
        waits.waiting.pop(1)()  # ("b" came in: as _arrived does)
        del waits.late[1]
        started = loop.time()
        await until(lambda: len(calls) == 3)
        assert 0.1 <= loop.time() - started + 0.01 < 0.5
        assert calls == ["then b", "late a", "late c"]
        assert not waits.waiting
        assert not waits.late
        await until(lambda: waits.timer is None)
        waits.ask(0, 0, 1, lambda: calls.append("then d"), lambda: calls.append("late d"))
        await asyncio.sleep(0.12)
        assert calls[3:] == []  # (asked after the last run: not late at the next)
        await until(lambda: len(calls) == 4)
        assert calls[3:] == ["late d"]
    finally:
        waits.reader = None
        waits.close()


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
        self.transfer = _outlet.Transfer(
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

    def whole(self) -> _outlet.ColdWhole:
        """A ``ColdWhole`` of the file instead (the transfer is dropped): it closes the file
        itself, so this one's descriptor is a duplicate (``fd_closed`` tells when it went)."""
        fd = os.dup(self.fd)
        self.whole_fd = fd
        transfer = self.transfer
        return _outlet.ColdWhole(
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


@pytest.mark.parametrize("size", [_outlet.READ_MAX, 100_000])
async def test_a_transfer_waits_for_the_reader_not_a_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A cold chunk (a small one read into memory, a medium one sent with sendfile) is read in by
    the owner's page reader and sent once it is in: no read ahead, no timer. Byte-exact."""
    loop = asyncio.get_running_loop()
    waits = _coldread.PageWaits(loop)
    try:
        with ColdSend(tmp_path, size, 4, waits, b"HEAD\r\n\r\n") as send:
            monkeypatch.setattr(_platform, "read_ahead", lambda *args: pytest.fail("read ahead asked"))
            timers: list[float] = []
            real_call_later = loop.call_later
            monkeypatch.setattr(
                loop,
                "call_later",
                lambda delay, *a, **kw: timers.append(delay) or real_call_later(delay, *a, **kw),
            )
            send.transfer.run()
            assert send.transfer.asked is not None  # (cold: asked of the reader)
            assert await send.end() == (size, None)
            assert send.received() == b"HEAD\r\n\r\n" + send.data
            # (the reader's patience, and wait_for's own 10 s: no timer that polls for the pages)
            assert [delay for delay in timers if delay < _coldread.READER_PATIENCE] == []
    finally:
        waits.close()


async def test_a_transfer_stopped_while_its_pages_are_read_in_is_not_woken(tmp_path: Path) -> None:
    """The connection goes while the reader reads its chunk in: the transfer lets its file go at
    once (the reader reads a duplicate), is never run again, and ``done`` is not called."""
    waits = _coldread.PageWaits(asyncio.get_running_loop())
    try:
        with ColdSend(tmp_path, 100_000, 5, waits, b"HEAD\r\n\r\n") as send:
            t = send.transfer
            t.run()
            assert t.asked is not None
            t.stop()
            assert send.released == [1]
            assert t.asked is None
            assert not waits.waiting
            await asyncio.sleep(0.1)  # (its read ends meanwhile: nothing is called)
            assert send.done == []
            assert send.received() == b"HEAD\r\n\r\n"  # (the head went before the chunk was probed)
    finally:
        waits.close()


async def test_a_transfer_asked_after_its_waits_closed_waits_on_a_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine closes its waits at its end; a body still going then waits as without them."""
    hints: list[int] = []
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: hints.append(size))
    waits = _coldread.PageWaits(asyncio.get_running_loop())
    waits.close()
    with ColdSend(tmp_path, 100_000, 6, waits) as send:
        send.transfer.run()
        assert await send.end() == (len(send.data), None)
        assert send.received() == send.data
        await until(lambda: hints)
        assert hints == [len(send.data)]


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


@pytest.mark.parametrize("how", ["stuck", "refused"])
async def test_a_chunk_the_reader_does_not_give_back_goes_on_another_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A chunk the waits call late (the reader held it past their patience) is sent from the pool;
    a reader that cannot be asked (no descriptor for its duplicate) leaves the chunk to the read
    ahead and the timer. Byte-exact, never a hang."""
    hints: list[int] = []
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: hints.append(size))
    waits = StuckWaits(fails=how == "refused")
    before = _platform.counters.cold
    with ColdSend(tmp_path, 100_000, 7, waits) as send:
        send.transfer.run()
        assert await send.end() == (len(send.data), None)
        assert send.received() == send.data
        if how == "stuck":
            assert waits.asked == [(0, len(send.data))]
            assert waits.cancelled == []  # (the waits forgot it themselves)
            assert _platform.counters.cold == before + 1  # (sent from the pool)
        else:
            await until(lambda: hints)
            assert hints == [len(send.data)]


async def test_waits_closed_under_a_waiting_transfer_let_it_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine closes its waits while a body still waits for its pages: the body is called back
    at once (not after the reader's patience), finds its chunk cold, and goes on the timer's way
    to its end (never a hang)."""
    waits = _coldread.PageWaits(asyncio.get_running_loop(), patience=3600.0)
    with ColdSend(tmp_path, 100_000, 8, waits) as send:
        send.transfer.run()
        assert send.transfer.asked is not None
        waits.close()
        assert await send.end() == (len(send.data), None)
        assert send.received() == send.data


async def test_a_late_wait_that_interrupts_leaves_the_others_for_the_next_turn() -> None:
    """A late callback that raises KeyboardInterrupt (or SystemExit) goes up; the waits after it,
    already forgotten, are called at the loop's next turn, not lost."""
    loop = asyncio.get_running_loop()
    waits = _coldread.PageWaits(loop, patience=3600.0)
    waits.reader = _HungReader()  # type: ignore[assignment]
    calls: list[str] = []

    def interrupts() -> None:
        raise KeyboardInterrupt

    try:
        waits.ask(0, 0, 1, lambda: None, interrupts)
        waits.ask(0, 0, 1, lambda: None, lambda: calls.append("second"))
        waits.horizon = waits.next  # (both asked before the last run: late at this one)
        with pytest.raises(KeyboardInterrupt):
            waits._check()
        assert calls == []
        await asyncio.sleep(0)
        assert calls == ["second"]
    finally:
        waits.reader = None
        waits.close()


# -- sends made by the reader's thread ----------------------------------------------------------


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


def probed_cold(send: ColdSend) -> _outlet.Transfer:
    """The send's transfer as a first sight or a kept answer makes one: its file probed cold."""
    send.transfer.warm_to = _outlet.PROBED_COLD
    return send.transfer


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
