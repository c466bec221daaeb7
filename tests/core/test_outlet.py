"""The owner's send path (``_outlet``): a small chunk read into memory instead of sent with
``sendfile``, and ``_platform.read_nowait``, the read that is its own probe.

A :class:`~aiosendfile._bodies.Transfer` runs on an outlet whose socket records the flags of each
``send``: ``MSG_MORE`` while file bytes follow, never on the last send (nothing would push a
corked segment out). Both loops (conftest).
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import _bodies, _outlet, _platform, _reading_in
from aiosendfile._coldread import read_ahead as read_ahead_later

from ..support.fds import open_fds
from ..support.files import pattern
from ..support.waiting import until

MORE = 0x8000  # (the outlet's flag for a TCP head; its value only has to be told apart from 0)


class RecordingSocket:
    """A socket whose ``send`` calls are recorded (data length, flags), flags dropped (AF_UNIX)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sends: list[tuple[int, int]] = []

    def send(self, data: Any, flags: int = 0) -> int:
        self.sends.append((len(data), flags))
        return self.sock.send(data)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()


async def transfer(path: Path, length: int, head: bytes = b"HEAD\r\n\r\n") -> tuple[bytes, Any, list[Any]]:
    """Send *length* bytes of *path* after *head* on a fresh outlet: what the peer read, the
    recording socket, and what ``done`` was called with."""
    loop = asyncio.get_running_loop()
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    recording = RecordingSocket(ours)
    outlet = _outlet.Outlet(loop, recording, MORE)  # type: ignore[arg-type]
    ended: asyncio.Future[tuple[int, Exception | None]] = loop.create_future()
    fd = os.open(path, os.O_RDONLY)
    released: list[int] = []
    try:
        t = _bodies.Transfer(
            outlet,
            head,
            fd,
            0,
            length,
            lambda sent, exc: ended.set_result((sent, exc)),
            lambda: None,
            lambda: released.append(fd),
        )
        t.run()
        sent, exc = await asyncio.wait_for(ended, 10)
    finally:
        os.close(fd)
        ours.close()
    peer.setblocking(False)
    got = b""
    try:
        while chunk := peer.recv(1 << 20):
            got += chunk
    except BlockingIOError:
        pass
    peer.close()
    assert released == [fd]
    return got, recording, [sent, exc]


def cached(path: Path) -> bool:
    """Whether ``read_nowait`` can tell here (not on a file system that refuses RWF_NOWAIT)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _platform.read_nowait(fd, 1, 0) is not None
    finally:
        os.close(fd)


async def test_a_small_chunk_is_read_and_sent_from_memory_its_last_send_uncorked(tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    data = pattern(10_000, seed=1)
    path.write_bytes(data)
    path.read_bytes()  # (its pages cached)
    if not cached(path):
        pytest.skip("RWF_NOWAIT is refused on this file system")
    calls = _platform.counters.calls
    got, sock, (sent, exc) = await transfer(path, len(data))
    assert got == b"HEAD\r\n\r\n" + data
    assert (sent, exc) == (len(data), None)
    assert _platform.counters.calls == calls  # no sendfile
    assert sock.sends == [(8, MORE), (len(data), 0)]  # the head corked, the body pushes it out


async def test_a_cold_small_chunk_waits_for_its_pages_then_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cold.bin"
    data = pattern(_outlet.READ_MAX, seed=2)
    path.write_bytes(data)
    real = _platform.read_nowait
    reads: list[int] = []

    def cold_once(fd: int, size: int, offset: int, device: int | None = None) -> Any:
        reads.append(size)
        return False if len(reads) == 1 else real(fd, size, offset, device)

    hints: list[tuple[int, int, bool]] = []
    loop_thread = threading.get_ident()

    def read_ahead(fd: int, offset: int, size: int) -> None:
        hints.append((offset, size, threading.get_ident() == loop_thread))

    monkeypatch.setattr(_platform, "read_nowait", cold_once)
    monkeypatch.setattr(_platform, "read_ahead", read_ahead)
    got, _, (sent, exc) = await transfer(path, len(data))
    assert got == b"HEAD\r\n\r\n" + data
    assert (sent, exc) == (len(data), None)
    await until(lambda: hints)  # (asked from the read-ahead thread: it may come after the end)
    # Never from the loop's thread: submitting a read may wait in the block layer.
    assert hints == [(0, len(data), False)]
    assert reads == [len(data), len(data)]


async def test_a_small_file_that_ends_early_ends_the_transfer_with_an_error(tmp_path: Path) -> None:
    path = tmp_path / "short.bin"
    path.write_bytes(pattern(5_000, seed=3))
    path.read_bytes()
    if not cached(path):
        pytest.skip("RWF_NOWAIT is refused on this file system")
    got, _, (sent, exc) = await transfer(path, 8_000)
    assert isinstance(exc, EOFError)
    assert sent == 0
    assert got == b"HEAD\r\n\r\n"  # never the short body passed off as the whole


async def test_where_the_read_cannot_tell_the_chunk_is_probed_and_sent_with_sendfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "unknown.bin"
    data = pattern(3_000, seed=4)
    path.write_bytes(data)
    monkeypatch.setattr(_platform, "read_nowait", lambda *args: None)
    monkeypatch.setattr(_bodies, "is_cold", lambda *args, **kwargs: False)
    calls = _platform.counters.calls
    got, sock, (sent, exc) = await transfer(path, len(data))
    assert got == b"HEAD\r\n\r\n" + data
    assert (sent, exc) == (len(data), None)
    assert _platform.counters.calls == calls + 1
    assert sock.sends == [(8, MORE)]


async def test_read_ahead_is_asked_from_its_own_thread_on_a_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges asked from the loop go to the read-ahead thread together at the loop's next turn,
    each on a duplicate of its fd, which the thread closes: the caller closes its own at once."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10_000)
    asked: list[tuple[int, int, int, bool]] = []
    loop_thread = threading.get_ident()

    def read_ahead(fd: int, offset: int, size: int) -> None:
        asked.append((os.fstat(fd).st_ino, offset, size, threading.get_ident() == loop_thread))

    monkeypatch.setattr(_platform, "read_ahead", read_ahead)
    loop = asyncio.get_running_loop()
    before = open_fds()
    fds = [os.open(path, os.O_RDONLY) for _ in range(3)]
    for i, fd in enumerate(fds):
        read_ahead_later(fd, i * 4096, 4096, loop)
        os.close(fd)
    await until(lambda: len(asked) == 3)
    inode = path.stat().st_ino
    assert asked == [(inode, i * 4096, 4096, False) for i in range(3)]
    await until(lambda: open_fds() == before)  # each duplicate closed by the thread once asked
    assert open_fds() == before


def test_a_read_ahead_batch_whose_loop_closed_goes_with_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop closed before the turn that was to send its batch does not keep it (nor its
    duplicate fds) for ever: the next range asked, from another loop, sends both."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10_000)
    asked: list[int] = []
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: asked.append(offset))
    before = open_fds()
    fd = os.open(path, os.O_RDONLY)
    try:
        first = asyncio.new_event_loop()
        read_ahead_later(fd, 0, 4096, first)
        first.close()  # (its turn never comes)
        second = asyncio.new_event_loop()
        try:
            read_ahead_later(fd, 4096, 4096, second)
            second.run_until_complete(asyncio.sleep(0))
        finally:
            second.close()
    finally:
        os.close(fd)
    deadline = time.monotonic() + 10  # (no loop of its own here: its fds would count)
    while not (len(asked) == 2 and open_fds() == before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(asked) == [0, 4096]
    assert open_fds() == before


def test_a_refused_read_starts_no_read_of_the_disk(tmp_path: Path) -> None:
    """A range not all cached is refused without touching its pages: a refused ``RWF_NOWAIT``
    read would start their read-ahead from the caller's thread (the loop's), and submitting it
    may wait in the block layer. ``cachestat`` counts pages being read in as cached, so pages
    still absent after the refusal show that nothing was started."""
    if not _platform.HAS_RWF_NOWAIT or not _platform.range_cached_available():
        pytest.skip("no RWF_NOWAIT or no cachestat(2)")
    data = pattern(64 * 1024, seed=6)
    path = tmp_path / "cold.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if _platform.range_cached(fd, 0, len(data)) is not False:
            pytest.skip("the pages could not be dropped here")
        read = _platform.read_nowait(fd, len(data), 0)
        if read is None:
            pytest.skip("RWF_NOWAIT is refused on this file system")
        assert read is False
        assert _platform.range_cached(fd, 0, len(data)) is False  # (still absent: nothing started)
        # Only the last page cached: a range over the end of the file is read (its pages past
        # the end are none), a range over absent pages is still refused.
        os.pread(fd, 1, len(data) - 1)
        assert _platform.read_nowait(fd, 100, len(data) - 10) == data[-10:]
        if _platform.range_cached(fd, 0, 4096) is False:
            assert _platform.read_nowait(fd, len(data), 0) is False
    finally:
        os.close(fd)


def test_read_nowait_says_read_cold_or_cannot_tell(tmp_path: Path) -> None:
    """The bytes when every page is cached (fewer at the end of the file); False when some would
    wait for the disk; None where the file system cannot tell, remembered for its device."""
    if not _platform.HAS_RWF_NOWAIT:
        pytest.skip("no RWF_NOWAIT")
    data = pattern(64 * 1024, seed=5)
    paths = [tmp_path / "f.bin", tmp_path / "g.bin"]
    for path in paths:
        path.write_bytes(data)
    fd, other = (os.open(path, os.O_RDONLY) for path in paths)
    try:
        device = os.fstat(fd).st_dev
        first = _platform.read_nowait(fd, len(data), 0, device)
        if first is None:
            assert device in _platform._no_probe_devices
            assert _platform.read_nowait(fd, len(data), 0, device) is None
            return
        assert first == data
        assert _platform.read_nowait(fd, 100, len(data) - 10) == data[-10:]  # up to the end

        # Each file asked with its pages just dropped. A refused read starts their read-ahead, and
        # where the disk is the VM host's cache that read can be done before the call looks at the
        # pages (the read then succeeds, whole): dropped and asked again, a few times at most.
        def dropped(f: int) -> None:
            os.fsync(f)
            os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)
            if _platform.range_cached(f, 0, len(data)) is not False:
                pytest.skip("the pages could not be dropped here")

        reads: list[object] = []
        for _ in range(5):
            dropped(fd)
            reads.append(_platform.read_nowait(fd, len(data), 0, device))
            if reads[-1] is False:
                break
            assert reads[-1] == data, "a read that did not wait must be whole"
        assert reads[-1] is False, reads
        for _ in range(5):
            dropped(other)
            read = _platform.pread_cached(other, len(data), 0)
            if read is None:
                break
            assert read == data
        assert read is None
    finally:
        os.close(fd)
        os.close(other)


async def test_a_chunk_read_ahead_is_sent_only_once_every_page_is_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a wait for its pages, a chunk's every page is checked, not only its last: on a slow
    or busy device a read's pages come in out of order, ``cachestat`` counts the ones on the way
    as cached, and one of them makes ``sendfile`` wait for the disk on the loop's thread (seen as
    loop stalls of 70-300 ms with the reads throttled to 200 a second). Here the kernel's answers
    are played: absent, then present with the last page in but one before it still on the way,
    then all in."""
    path = tmp_path / "chunk.bin"
    data = pattern(4 * _outlet.READ_MAX, seed=7)
    path.write_bytes(data)
    events: list[str] = []
    present = iter([False])
    readable = iter([False])

    def range_cached(fd: int, offset: int, size: int) -> bool:
        events.append("present?")
        return next(present, True)

    def range_readable(fd: int, offset: int, size: int) -> bool:
        assert (offset, size) == (0, len(data))
        events.append(f"readable {(answer := next(readable, True))}")
        return answer

    real_send = _bodies.sendfile_once

    def sendfile_once(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        events.append("sendfile")
        return real_send(out_fd, in_fd, offset, count)

    monkeypatch.setattr(_platform, "range_cached", range_cached)
    monkeypatch.setattr(_platform, "page_cached", lambda fd, offset, device=None: True)
    monkeypatch.setattr(_platform, "range_readable", range_readable, raising=False)
    monkeypatch.setattr(_platform, "read_ahead", lambda fd, offset, size: None)
    monkeypatch.setattr(_bodies, "sendfile_once", sendfile_once)
    got, _, (sent, exc) = await transfer(path, len(data))
    assert got == b"HEAD\r\n\r\n" + data
    assert (sent, exc) == (len(data), None)
    first_send = events.index("sendfile")
    assert "readable False" in events[:first_send]
    assert events[first_send - 1] == "readable True", events


def test_range_readable_sees_a_page_the_last_page_probe_misses(tmp_path: Path) -> None:
    """``range_readable`` reads the whole range (several scratch buffers' worth here) without
    waiting: True when every page is in, False when one before the last is not, or when the range
    runs past the end; the last page's probe, for the same range, says yes."""
    if not _platform.HAS_RWF_NOWAIT:
        pytest.skip("no RWF_NOWAIT")
    data = pattern(200 * 1024 + 123, seed=8)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        ready = _platform.range_readable(fd, 0, len(data))
        if ready is None:
            pytest.skip("RWF_NOWAIT is refused on this file system")
        assert ready is True
        assert _platform.range_readable(fd, 4096, len(data) - 4096) is True
        assert _platform.range_readable(fd, 0, len(data) + 1) is False  # (past the end)
        os.fsync(fd)
        # The pages dropped and the last one read back in, not the first. A refused read starts
        # the read of the missing pages, and where the disk is the VM host's cache that read can
        # be done before the call looks at them (then the range is readable): tries enough for a
        # loaded machine (5 were not, once in CI).
        answers = []
        for _ in range(25):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.pread(fd, 1, len(data) - 1)
            if _platform.range_cached(fd, 0, 4096) is not False:
                pytest.skip("the pages could not be dropped here")
            assert _platform.page_cached(fd, len(data) - 1) is True
            answers.append(_platform.range_readable(fd, 0, len(data)))
            if answers[-1] is False:
                break
        assert answers[-1] is False, answers
    finally:
        os.close(fd)


def test_while_a_read_of_ours_may_bring_pages_in_every_page_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first look at a file whose pages another connection's read is bringing in (the answer
    cache's replay of a file just evicted) sees them all present and the last one in, while one
    in the middle is still on the way. So for a while after this process starts a read (a read
    ahead asked, a chunk sent or read in the pool), every page of a chunk is checked; otherwise
    only the last (nothing copied: a server whose files are all cached pays nothing for it)."""
    from aiosendfile._options import DEFAULT_OPTIONS
    from aiosendfile._writer import is_cold

    path = tmp_path / "f.bin"
    path.write_bytes(pattern(64 * 1024, seed=9))
    checked: list[int] = []

    def range_readable(fd: int, offset: int, size: int) -> bool:
        checked.append(size)
        return False  # (a page in the middle still on the way)

    monkeypatch.setattr(_platform, "range_cached", lambda fd, offset, size: True)
    monkeypatch.setattr(_platform, "page_cached", lambda fd, offset, device=None: True)
    monkeypatch.setattr(_platform, "range_readable", range_readable, raising=False)
    monkeypatch.setattr(_reading_in, "_reading_in_until", 0.0, raising=False)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert is_cold(fd, 0, 64 * 1024, DEFAULT_OPTIONS) is False
        assert checked == []
        read_ahead_later(fd, 0, 4096)  # (a read of ours started: from the read-ahead thread)
        assert is_cold(fd, 0, 64 * 1024, DEFAULT_OPTIONS) is True
        assert checked == [64 * 1024]
        assert _reading_in.reading_in()
        monkeypatch.setattr(_reading_in, "_reading_in_until", time.monotonic() - 0.001)  # (long after)
        assert is_cold(fd, 0, 64 * 1024, DEFAULT_OPTIONS) is False
        assert checked == [64 * 1024]
    finally:
        os.close(fd)


def test_a_read_of_one_file_checks_every_page_of_that_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window is kept by file (device and inode): another file's chunks are checked as usual
    (its last page), and a door probing a kept file as it opens it again asks by its identity.
    Past READING_IN_FILES files being read in at once, every file is checked, to be safe."""
    from aiosendfile._options import DEFAULT_OPTIONS
    from aiosendfile._outlet import PROBE_MAX, probe_max
    from aiosendfile._static._hot import identity
    from aiosendfile._writer import is_cold

    checked: list[int] = []

    def range_readable(fd: int, offset: int, size: int) -> bool:
        checked.append(fd)
        return True

    monkeypatch.setattr(_platform, "range_cached", lambda fd, offset, size: True)
    monkeypatch.setattr(_platform, "page_cached", lambda fd, offset, device=None: True)
    monkeypatch.setattr(_platform, "range_readable", range_readable)
    monkeypatch.setattr(_reading_in, "_reading_in_until", 0.0)
    monkeypatch.setattr(_reading_in, "_every_file_until", 0.0)
    monkeypatch.setattr(_reading_in, "_files_reading_in", collections.OrderedDict())
    monkeypatch.setattr(_reading_in, "READING_IN_FILES", 2)
    paths = [tmp_path / f"f{i}" for i in range(4)]
    for p in paths:
        p.write_bytes(b"x" * 8192)
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        _reading_in.started_reading(fds[0])
        assert is_cold(fds[1], 0, 8192, DEFAULT_OPTIONS) is False
        assert checked == []
        assert is_cold(fds[0], 0, 8192, DEFAULT_OPTIONS) is False
        assert checked == [fds[0]]
        assert probe_max(identity(os.stat(paths[0]))) == 0
        assert probe_max(identity(os.stat(paths[1]))) == PROBE_MAX
        assert _reading_in.reading_in()
        assert not _reading_in.reading_in(fds[1])
        _reading_in.started_reading(fds[1])
        _reading_in.started_reading(fds[2])  # (a third while two are open: every file, for the window)
        assert len(_reading_in._files_reading_in) == 2
        assert _reading_in.reading_in(fds[3])
        assert probe_max(identity(os.stat(paths[3]))) == 0
        late = time.monotonic() - 0.001
        monkeypatch.setattr(_reading_in, "_reading_in_until", late)  # (long after)
        monkeypatch.setattr(_reading_in, "_every_file_until", late)
        assert not _reading_in.reading_in(fds[0])
        assert not _reading_in.reading_in()
    finally:
        for fd in fds:
            os.close(fd)


def test_a_cold_burst_of_one_worker_still_tells_the_files_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker on a 20,000-file cold set reads about 2,500 files a second in, some 5,000 within
    a window (docs/performance.md, 2026-12-01): that many files read in still leave every other
    file out of the window, and the bookkeeping stays within its bound. With room for 4,096, the
    bound was passed all the time and every page of every file was checked by a copy."""
    monkeypatch.setattr(_reading_in, "_reading_in_until", 0.0)
    monkeypatch.setattr(_reading_in, "_every_file_until", 0.0)
    monkeypatch.setattr(_reading_in, "_files_reading_in", collections.OrderedDict())
    burst = 2 * 2_500 * int(_reading_in.READING_IN_S)  # (twice one worker's window, to spare)
    for inode in range(burst):
        _reading_in.started_reading(key=(1, inode))
    assert len(_reading_in._files_reading_in) <= _reading_in.READING_IN_FILES
    assert _reading_in.reading_in(None, (1, 0))
    assert _reading_in.reading_in(None, (1, burst - 1))
    assert not _reading_in.reading_in(None, (1, burst))  # (not read in: its last page probed only)


def test_a_read_told_by_its_file_key_needs_no_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    """An owner that knows the file's device and inode (a kept answer's identity, a first sight's
    ``fstat``) tells a read and asks about one by them: no ``fstat`` (a closed descriptor here would
    make every file count as read in), and is_cold asks by the key too."""
    from aiosendfile._options import DEFAULT_OPTIONS
    from aiosendfile._writer import is_cold

    monkeypatch.setattr(_reading_in, "_reading_in_until", 0.0)
    monkeypatch.setattr(_reading_in, "_every_file_until", 0.0)
    monkeypatch.setattr(_reading_in, "_files_reading_in", collections.OrderedDict())
    monkeypatch.setattr(_platform, "range_cached", lambda fd, offset, size: True)
    monkeypatch.setattr(_platform, "page_cached", lambda fd, offset, device=None: True)
    checked: list[int] = []
    monkeypatch.setattr(_platform, "range_readable", lambda fd, offset, size: checked.append(fd) or True)
    _reading_in.started_reading(-1, (7, 42))
    assert _reading_in.reading_in(None, (7, 42))
    assert not _reading_in.reading_in(None, (7, 43))  # (not every file: the key was enough)
    assert is_cold(-1, 0, 8192, DEFAULT_OPTIONS, key=(7, 42)) is False
    assert checked == [-1]  # (every page checked: a read of that file may be on its way)
    assert is_cold(-2, 0, 8192, DEFAULT_OPTIONS, key=(7, 43)) is False
    assert checked == [-1]
    _platform.went_to_pool(-1, (7, 44))
    assert _reading_in.reading_in(None, (7, 44))
    assert not _reading_in.reading_in(None, (7, 45))
