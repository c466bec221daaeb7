"""The compiled page reader (``_syscalls.PageReader``) and the waits built on it
(``_coldread.PageWaits``, ``_bodies.Transfer``): a cold range is read in by a thread of its own that
never takes the GIL, and the loop is told through an eventfd once every page is in.

Skipped where the C module was not built (the timer path is tested in test_outlet and the serve
tests, both ways). Both loops (conftest).
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import _coldread, _outlet, _platform

from ..support.fds import describe_fd, open_fds
from ..support.files import evict, pattern
from ..support.page_reader import ColdSend, StuckWaits, tokens_of
from ..support.waiting import until

pytestmark = pytest.mark.skipif(not _platform.HAS_PAGE_READER, reason="no compiled page reader here")


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
    # (half a second: a loaded machine's late timers, CI runs three sessions at once, stay well
    # inside a patience, so that what is timed is the patience, not the machine)
    patience = 0.5
    waits = _coldread.PageWaits(loop, patience=patience)
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
        assert timers == [patience]  # (one timer for the three)
        waits.waiting.pop(1)()  # ("b" came in: as _arrived does)
        del waits.late[1]
        started = loop.time()
        await until(lambda: len(calls) == 3)
        assert patience <= loop.time() - started + 0.01 < 4 * patience
        assert calls == ["then b", "late a", "late c"]
        assert not waits.waiting
        assert not waits.late
        await until(lambda: waits.timer is None)
        waits.ask(0, 0, 1, lambda: calls.append("then d"), lambda: calls.append("late d"))
        await asyncio.sleep(patience * 1.2)
        assert calls[3:] == []  # (asked after the last run: not late at the next)
        await until(lambda: len(calls) == 4)
        assert calls[3:] == ["late d"]
    finally:
        waits.reader = None
        waits.close()


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
    to its end (never a hang). (Where the reader's thread had already begun sending it, on a
    loaded machine, how far it went is not known: the body ends, aborted, as promptly.)"""
    waits = _coldread.PageWaits(asyncio.get_running_loop(), patience=3600.0)
    with ColdSend(tmp_path, 100_000, 8, waits) as send:
        send.transfer.run()
        assert send.transfer.asked is not None
        waits.close()
        sent, exc = await send.end()
        if exc is not None:
            assert isinstance(exc, ConnectionAbortedError), exc
            assert "page reader closed" in str(exc)
            return
        assert sent == len(send.data)
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
