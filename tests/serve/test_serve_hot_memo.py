"""The engine's hot memo and cold pool (``aiosendfile._serve``), on raw sockets, on both loops: a
changed file is never answered from a memo, first sights are decided in the cold pool then
inline, and memoised files go the straight line.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import io
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiosendfile._serve import _sending

from ..support.fake_fs import kernel_caches
from ..support.files import CHANGES, change_file, pattern
from ..support.raw_http import all_responses, read_response, read_to_eof
from ..support.serve import (
    BIG,
    PAGE_WAITS,
    ServeSite,
    close_writer,
    engine,
    get,
    reported,
    serving,
    wait_pages_by,
)
from ..support.waiting import until

pytest.importorskip("httptools")


# -- the hot memo and the cold pool -----------------------------------------------------------------


async def test_a_changed_file_is_never_answered_from_the_memo(www_site: ServeSite) -> None:
    path = www_site.public / "small.txt"
    reader, writer = await www_site.open()
    try:
        for _ in range(2):
            writer.write(get("/small.txt"))
            assert (await read_response(reader)).body == path.read_bytes()
        path.write_bytes(b"rewritten in place")  # same inode, new size and mtime
        writer.write(get("/small.txt"))
        assert (await read_response(reader)).body == b"rewritten in place"
        fresh = www_site.public / "fresh.tmp"
        fresh.write_bytes(b"renamed over it!!!")  # same size: another inode
        fresh.replace(path)
        writer.write(get("/small.txt"))
        assert (await read_response(reader)).body == b"renamed over it!!!"
        path.unlink()
        writer.write(get("/small.txt"))
        assert (await read_response(reader)).status == 404
    finally:
        await close_writer(writer)


@pytest.mark.parametrize("name", ["big.bin", "small.txt"])
@pytest.mark.parametrize("change", CHANGES)
async def test_a_changed_file_is_never_sent_from_the_answer_cache(
    www_site: ServeSite, change: str, name: str
) -> None:
    """A file's plain 200 is kept in the engine's answer cache without its body (a big file is
    opened again and checked by fstat each time; a small one's bytes are the hot-file cache's,
    checked by a stat of its path): whatever happens to the file between two requests, the answer
    is the new one."""
    path = www_site.public / name
    size = path.stat().st_size
    outside = www_site.public.parent / f"outside-{www_site.public.name}.bin"
    outside.write_bytes(pattern(size, seed=9))
    reader, writer = await www_site.open()
    try:
        for _ in range(3):  # decided, then answered from the cache
            writer.write(get("/" + name))
            first = await read_response(reader)
            assert first.body == path.read_bytes()
        assert b"/" + name.encode() in engine()._engines[www_site.server].answers
        change_file(path, change, outside)
        expected = None if change in ("chmod", "symlink out") else path.read_bytes()
        writer.write(get("/" + name))
        a = await read_response(reader)
        if change == "symlink out":
            assert a.status == 404
        elif change == "chmod" and os.geteuid() != 0:
            assert a.status == 403
        else:
            assert a.status == 200
            if expected is not None:
                assert a.body == expected
            assert a.headers["etag"] != first.headers["etag"]  # the fields describe the file as it is now
    finally:
        await close_writer(writer)
        outside.unlink()


@pytest.mark.parametrize("cached", [False, True], ids=["lookup-needs-disk", "lookup-cached"])
async def test_a_path_is_decided_in_the_cold_pool_at_first_sight_then_inline(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """At first sight a path whose lookup would read the disk is looked up in the cold pool, once;
    one the kernel's caches hold (``open_cached``, ``lookup_cached``) is decided inline at once,
    with no hop."""
    kernel_caches(monkeypatch, cached)
    engine_ = engine()._engines[www_site.server]
    pool = engine_.executor
    submitted: list[object] = []

    class Counting:
        def submit(self, fn: Any, *args: Any) -> Any:
            submitted.append(args[0].raw_path)
            return pool.submit(fn, *args)

    engine_.executor = Counting()
    reader, writer = await www_site.open()
    try:
        for target in ("/big.bin", "/big.bin", "/missing", "/missing", "/small.txt", "/small.txt"):
            writer.write(get(target))
            await read_response(reader)
    finally:
        await close_writer(writer)
    assert submitted == ([] if cached else [b"/big.bin", b"/missing", b"/small.txt"])


@pytest.mark.parametrize("size", [1000, 200_000])
async def test_a_first_sight_is_opened_by_its_lookup_alone(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A path's first sight whose lookup the kernel's caches hold is opened by that lookup
    (``open_cached``: ``openat2`` with ``RESOLVE_CACHED | RESOLVE_NO_SYMLINKS``): the core takes
    the descriptor and neither ``stat``s the path nor opens it again (nor reads where the
    descriptor leads). Byte-exact; a symlinked path still takes the checked open."""
    from aiosendfile import _lookup
    from aiosendfile._static._fs import RealFS

    probe = _lookup.open_cached("/")
    if probe is None:
        pytest.skip("no openat2(RESOLVE_CACHED) here")
    if probe >= 0:
        os.close(probe)
    body = pattern(size, seed=3)
    (www_site.public / "fresh.bin").write_bytes(body)
    (www_site.public / "linked.bin").symlink_to(www_site.public / "fresh.bin")
    for name in ("fresh.bin", "linked.bin"):
        os.stat(www_site.public / name)  # (its lookup cached, as after the pool's look)
    opened: list[str] = []
    stated: list[str] = []
    real_open, real_stat = RealFS.open_regular, RealFS.stat

    def open_regular(self: Any, path: str, *args: Any) -> Any:
        opened.append(os.path.basename(path))
        return real_open(self, path, *args)

    def stat(self: Any, path: str) -> Any:
        stated.append(os.path.basename(path))
        return real_stat(self, path)

    monkeypatch.setattr(RealFS, "open_regular", open_regular)
    monkeypatch.setattr(RealFS, "stat", stat)
    raw = await www_site.exchange(get("/fresh.bin", "Connection: close\r\n"))
    assert all_responses(raw, ["GET"])[0].body == body
    assert (opened, stated) == ([], [])
    raw = await www_site.exchange(get("/linked.bin", "Connection: close\r\n"))
    assert all_responses(raw, ["GET"])[0].body == body
    assert opened == ["linked.bin"]


async def test_the_engines_answers_are_not_tracked_by_the_garbage_collector(www_site: ServeSite) -> None:
    """What the engine keeps of an answer is a tuple of atomic values: after the collector's first
    passes (the inner identity tuple, then the entry) it is no longer tracked, so a working set of
    thousands adds nothing to its passes."""

    for name in ("small.txt", "big.bin"):
        raw = await www_site.exchange(get("/" + name, "Connection: close\r\n"))
        assert all_responses(raw, ["GET"])[0].body == (www_site.public / name).read_bytes()
    gc.collect()
    gc.collect()
    answers = engine()._engines[www_site.server].answers
    for key in (b"/small.txt", b"/big.bin"):
        known = answers.get(key)
        assert known is not None
        assert not gc.is_tracked(known), known


async def test_a_small_file_is_memoised_at_its_first_answer(www_site: ServeSite) -> None:
    """A small file read into the hot-file cache by its first request is memoised by that request
    (before: only by the next, which found it in the hot cache; a working set larger than the hot
    cache was then never memoised and every request paid the whole decision)."""
    memo = engine()._engines[www_site.server].answers
    raw = await www_site.exchange(get("/small.txt", "Connection: close\r\n"))
    assert all_responses(raw, ["GET"])[0].body == (www_site.public / "small.txt").read_bytes()
    assert b"/small.txt" in memo


@pytest.mark.parametrize("size", [1000, 20_000])
async def test_a_full_hot_cache_sends_memoised_small_files_from_their_files(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """With the hot-file cache full, a memoised small file dropped from it is sent from its file,
    byte-exact, and read back in only one time in ``READMIT_EVERY``: up to ``READ_MAX`` bytes
    read with one ``RWF_NOWAIT`` read and written from memory (no ``sendfile``), above it sent
    with ``sendfile``."""
    from aiosendfile import _outlet, _platform
    from aiosendfile._static import _hot

    names = [f"s{i}.txt" for i in range(6)]
    for i, name in enumerate(names):
        (www_site.public / name).write_bytes(pattern(size + i, seed=i))
    hot = _hot.HotFiles(max_entries=2)
    monkeypatch.setattr(_hot, "hot_files", hot)

    puts = []
    real_put = hot.put
    monkeypatch.setattr(hot, "put", lambda path, *a: puts.append(path) or real_put(path, *a))
    with open(www_site.public / names[0], "rb") as f:
        can_tell = _platform.read_nowait(f.fileno(), 1, 0) is not None  # (not where it is refused)
    reader, writer = await www_site.open()
    try:
        for turn in range(3):
            calls = _platform.counters.calls
            for name in names:
                writer.write(get("/" + name))
                assert (await read_response(reader)).body == (www_site.public / name).read_bytes()
            if turn and can_tell:
                sendfiles = _platform.counters.calls - calls
                assert sendfiles == 0 if size <= _outlet.READ_MAX else sendfiles >= 3, (
                    sendfiles
                )  # (2 hot, 1 read back)
    finally:
        await close_writer(writer)
    assert len(hot._entries) == 2
    assert len(puts) <= len(names) + 1  # the first answers, then at most one read back in 12


async def test_a_file_truncated_while_sent_aborts_the_connection(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiosendfile import _bodies

    real = _bodies.sendfile_once

    def truncating(*args: Any, **kwargs: Any) -> int:
        (www_site.public / "big.bin").write_bytes(b"short")  # after the core's fstat: the length is promised
        return real(*args, **kwargs)

    monkeypatch.setattr(_bodies, "sendfile_once", truncating)
    with reported() as errors:
        raw = await www_site.exchange(get("/big.bin") + get("/small.txt"))
    body = raw.partition(b"\r\n\r\n")[2]
    assert len(body) < BIG  # never passed off as complete; nothing answered after it
    assert errors == []  # a file that shrank is no bug: one line in the log, no report


async def test_a_client_that_stops_reading_a_file_is_cut_off(tmp_path: Path) -> None:
    async with serving(tmp_path, send_timeout=0.2) as www_site:
        with open(www_site.public / "huge.bin", "wb") as f:
            f.truncate(256 * 1024 * 1024)  # more than any socket buffers hold
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (www_site.host, www_site.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(get("/huge.bin"))
            connections = engine()._engines[www_site.server].connections
            for _ in range(400):  # never reading: the server gives up and aborts
                if not connections:
                    break
                await asyncio.sleep(0.05)
            assert not connections
            rest = await asyncio.wait_for(read_to_eof(reader), 20)
            assert len(rest) < 256 * 1024 * 1024
        finally:
            await close_writer(writer)


# -- the straight line for memoised files ------------------------------------------------------------


def _admit_no_hot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hot-file cache that admits nothing, so the core answers a small file with its descriptor."""
    from aiosendfile._static import _hot

    class Full(_hot.HotFiles):
        def admits(self, size: int) -> bool:
            return False

    hot = Full()
    monkeypatch.setattr(_hot, "hot_files", hot)


def _count_transfers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, one item in the list returned for each transfer object the engine makes."""
    from aiosendfile import _bodies

    transfers: list[int] = []
    real_transfer = _bodies.Transfer

    def counting(*args: Any) -> Any:
        transfers.append(1)
        return real_transfer(*args)

    monkeypatch.setattr(_sending, "Transfer", counting)
    return transfers


@pytest.mark.parametrize("cut", ["whole", "part of the file", "part of the head", "nothing of the file"])
async def test_a_memoised_file_goes_straight_or_on_from_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """A memoised file of one chunk, with the socket taking it whole, is sent with no transfer
    object; when the socket takes only part of the head or the file (or nothing of the file), a
    transfer goes on from exactly there. Byte-exact, the file closed (the fd guard), and the
    access log counts every byte of the body."""
    from aiosendfile import _bodies

    log = io.StringIO()
    async with serving(tmp_path, access_log=log) as www_site:
        body = pattern(300_000, seed=8)
        (www_site.public / "mid.bin").write_bytes(body)
        reader, writer = await www_site.open()
        try:
            for _ in range(2):  # decided, then memoised (the connection's outlet made)
                writer.write(get("/mid.bin"))
                assert (await read_response(reader)).body == body
            transfers = _count_transfers(monkeypatch)
            outlet = next(iter(engine()._engines[www_site.server].connections)).outlet
            real_sock, real_send = outlet.sock, _bodies.sendfile_once
            calls: list[int] = []

            class HalfHead:  # the socket takes half the head, once
                def send(self, data: Any, flags: int = 0) -> int:
                    outlet.sock = real_sock
                    return real_sock.send(bytes(data[: len(data) // 2]), flags)

            def partly(out_fd: int, in_fd: int, offset: int, count: int) -> int:
                calls.append(offset)
                if len(calls) == 1 and cut == "part of the file":
                    return real_send(out_fd, in_fd, offset, 1000)
                if len(calls) == 1 and cut == "nothing of the file":
                    raise BlockingIOError
                return real_send(out_fd, in_fd, offset, count)

            monkeypatch.setattr(_bodies, "sendfile_once", partly)
            if cut == "part of the head":
                outlet.sock = HalfHead()
            writer.write(get("/mid.bin"))
            a = await read_response(reader)
            assert a.body == body
        finally:
            await close_writer(writer)
    assert len(transfers) == (0 if cut == "whole" else 1)
    if cut == "part of the file":
        assert calls[:2] == [0, 1000]
    assert log.getvalue().splitlines()[-1].endswith(f'200 {len(body)} "-" "-"')


@pytest.mark.parametrize("size", [1000, 300_000])
async def test_a_first_sight_goes_straight_as_a_memoised_file_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A file's first GET (the core's plain 200, from its descriptor) is sent as a memoised one
    is: a small one read and written with its head, a larger one's head and file sent straight
    where the socket takes them, with no transfer object. Byte-exact, the descriptor closed (the
    fd guard), the access log counts the body, and the answer is memoised."""
    _admit_no_hot_files(monkeypatch)
    log = io.StringIO()
    async with serving(tmp_path, access_log=log) as www_site:
        body = pattern(size, seed=9)
        (www_site.public / "first.bin").write_bytes(body)
        (www_site.public / "opener.bin").write_bytes(pattern(300_000, seed=10))
        reader, writer = await www_site.open()
        try:
            writer.write(get("/opener.bin"))  # (the connection's outlet is made at its first body)
            await read_response(reader)
            transfers = _count_transfers(monkeypatch)
            writer.write(get("/first.bin"))
            assert (await read_response(reader)).body == body
        finally:
            await close_writer(writer)
        assert b"/first.bin" in engine()._engines[www_site.server].answers
    assert transfers == []
    assert log.getvalue().splitlines()[-1].endswith(f'200 {size} "-" "-"')


async def test_a_first_sights_read_that_fails_leaves_the_file_to_the_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small file's first read failing (EIO from the read that is also its probe) is not an
    error of the connection: the file goes on to the send, which answers it whole (or aborts the
    connection if the file cannot be read); no descriptor is left open (the fd guard)."""
    from aiosendfile import _platform

    _admit_no_hot_files(monkeypatch)
    async with serving(tmp_path) as www_site:
        body = pattern(1000, seed=11)
        (www_site.public / "first.bin").write_bytes(body)
        (www_site.public / "opener.bin").write_bytes(pattern(300_000, seed=10))
        reader, writer = await www_site.open()
        try:
            writer.write(get("/opener.bin"))
            await read_response(reader)

            def failing(*args: Any, **kwargs: Any) -> Any:
                raise OSError(errno.EIO, "I/O error")

            monkeypatch.setattr(_platform, "read_nowait", failing)
            writer.write(get("/first.bin"))
            assert (await read_response(reader)).body == body
        finally:
            await close_writer(writer)


async def test_a_memoised_file_probed_warm_as_it_is_opened_is_not_probed_again(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memoised file of one chunk, opened again with its pages all cached (``reopen_read``'s
    ``cachestat`` and last-page read), is sent straight with no probe of its own; one being read
    in by this process (another connection's cold read of it) is probed page by page as before.
    Byte-exact."""
    from aiosendfile import _bodies, _platform, _reading_in

    if not (_platform.HAS_RWF_NOWAIT and _platform.range_cached_available()):
        pytest.skip("no cachestat or RWF_NOWAIT here: the reopen cannot probe")
    body = pattern(100_000, seed=5)
    path = www_site.public / "medium.bin"
    path.write_bytes(body)
    probes: list[int] = []
    real_is_cold = _bodies.is_cold
    monkeypatch.setattr(_bodies, "is_cold", lambda *a, **k: probes.append(1) or real_is_cold(*a, **k))
    reader, writer = await www_site.open()
    try:
        for _ in range(2):  # decided, then memoised (the connection's outlet made)
            writer.write(get("/medium.bin"))
            assert (await read_response(reader)).body == body
        probes.clear()
        writer.write(get("/medium.bin"))
        assert (await read_response(reader)).body == body
        assert probes == []
        with open(path, "rb") as f:
            _reading_in.started_reading(f.fileno())  # (a read of this file may be on its way)
        writer.write(get("/medium.bin"))
        assert (await read_response(reader)).body == body
        assert probes == [1]
    finally:
        await close_writer(writer)


@pytest.mark.parametrize("waits", PAGE_WAITS)
async def test_a_memoised_file_probed_cold_waits_for_its_pages_at_once(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, waits: str
) -> None:
    """A memoised file whose pages are found cold as it is opened again (``reopen_read``'s probe)
    goes on as a transfer that waits for them at once (the page reader's thread, which then sends
    it, or a read ahead and a timer, probed once after it), without probing them a second time
    first (a probe costs a cachestat and a read). Byte-exact."""
    from aiosendfile import _bodies, _lookup, _outlet

    body = pattern(100_000, seed=9)
    (www_site.public / "medium.bin").write_bytes(body)
    reader, writer = await www_site.open()
    try:
        for _ in range(2):  # decided, then memoised (the connection's outlet made)
            writer.write(get("/medium.bin"))
            assert (await read_response(reader)).body == body
        reopened: list[int] = []
        probes: list[int] = []
        real_reopen_read = _lookup.reopen_read

        def reopen_cold(*args: Any) -> Any:
            got = real_reopen_read(*args)
            assert type(got) is tuple
            reopened.append(got[2])
            return got[0], got[1], _outlet.PROBED_COLD  # (cold when it was opened again)

        def probe(*args: Any, **kwargs: Any) -> bool:
            probes.append(1)
            return False  # warm when probed again

        hints = wait_pages_by(www_site, waits, monkeypatch)
        monkeypatch.setattr(_lookup, "reopen_read", reopen_cold)
        monkeypatch.setattr(_bodies, "is_cold", probe)
        writer.write(get("/medium.bin"))
        assert (await read_response(reader)).body == body
    finally:
        await close_writer(writer)
    await until(lambda: hints)  # (asked from the read-ahead thread: it may come after the body)
    assert len(reopened) == 1
    assert hints == [(0, len(body))]  # it waited for the pages
    assert len(probes) == (0 if waits == "reader" else 1)  # (the timer's: only the one after the wait)


@contextlib.asynccontextmanager
async def waiting_body(www_site: ServeSite, data: bytes) -> AsyncIterator[tuple[socket.socket, Any]]:
    """A client with a 4 KiB receive buffer that sends *data* (a request of ``big.bin`` first) and
    reads nothing: its socket and the engine's connection, once a Transfer sends the body."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (www_site.host, www_site.port))
        await loop.sock_sendall(sock, data)
        await until(lambda: engine()._engines[www_site.server].connections)
        conn = next(iter(engine()._engines[www_site.server].connections))
        await until(lambda: type(conn.owned).__name__ == "Transfer")
        yield sock, conn
    finally:
        sock.close()


async def test_a_request_that_closes_behind_a_waiting_body_pauses_reading(tmp_path: Path) -> None:
    """Behind a file body that waits, the client's next request says ``Connection: close``: nothing
    after it is read, so reading pauses (not left on to read and drop what comes until the body
    ends); both are answered, in order, then the connection closes."""
    async with serving(tmp_path) as www_site:
        big = (www_site.public / "big.bin").read_bytes()
        small = (www_site.public / "small.txt").read_bytes()
        data = get("/big.bin") + get("/small.txt", "Connection: close\r\n")
        async with waiting_body(www_site, data) as (sock, conn):
            await until(lambda: conn.dead)
            assert conn.read_paused
            stream, writer = await asyncio.open_connection(sock=sock, limit=2**22)
            try:
                assert (await read_response(stream)).body == big
                assert (await read_response(stream)).body == small
                assert await read_to_eof(stream) == b""
            finally:
                await close_writer(writer)


async def test_reading_stays_on_while_a_file_body_waits_and_a_read_then_pauses_it(tmp_path: Path) -> None:
    """A file body that waits (the client reads nothing: the socket is full) leaves the
    connection's reading on: no pause and resume around each body that does not go at once. A
    request the client pipelines meanwhile is kept in the backlog, which pauses reading (one read
    at most is held); it is answered after the body, in order, and reading is on again."""
    loop = asyncio.get_running_loop()
    async with serving(tmp_path) as www_site:
        big = (www_site.public / "big.bin").read_bytes()
        small = (www_site.public / "small.txt").read_bytes()
        async with waiting_body(www_site, get("/big.bin")) as (sock, conn):
            await asyncio.sleep(0.1)  # (the socket full: the body waits)
            assert type(conn.owned).__name__ == "Transfer"
            assert conn.busy
            assert not conn.read_paused
            await loop.sock_sendall(sock, get("/small.txt"))
            await until(lambda: conn.read_paused)
            assert conn.reader.backlog
            assert type(conn.owned).__name__ == "Transfer"
            stream, writer = await asyncio.open_connection(sock=sock, limit=2**22)
            try:
                assert (await read_response(stream)).body == big
                assert (await read_response(stream)).body == small
                await until(lambda: not conn.read_paused and not conn.busy)
            finally:
                await close_writer(writer)
