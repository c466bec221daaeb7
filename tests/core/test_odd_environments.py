"""Odd environments and file objects, each found in review and pinned by a test.

A process-wide default socket timeout, a kernel that refuses ``sendfile`` after the headers,
a file system that refuses the page-cache probe, file objects that decode what they read
(gzip, bz2), and headers beside a zero-copy body (the shim counts only file bytes).
"""

from __future__ import annotations

import asyncio
import bz2
import errno
import gzip
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _lookup, _platform

from ..support.connections import Connector, zero_copy_expected
from ..support.files import pattern

# -- the environment ---------------------------------------------------------------------------------


async def test_default_socket_timeout_never_blocks_the_loop(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "getdefaulttimeout", lambda: 3.0)
    socket.setdefaulttimeout(3.0)
    try:
        conn = await connect(rcvbuf=4096)
        trailers = b"T" * 300_000
        with open(make_file(100_000), "rb") as f:
            task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, headers=b"H", trailers=trailers))
            # Nobody reads yet: the socket fills. A blocking send() would freeze the loop here.
            worst, last = 0.0, time.monotonic()
            for _ in range(30):
                await asyncio.sleep(0.01)
                now = time.monotonic()
                worst, last = max(worst, now - last), now
            # (a blocking send() waits out the 3 s timeout; noise on a loaded CI machine stays well under)
            assert worst < 1.5, f"the loop stalled for {worst:.2f}s"
            reader = asyncio.create_task(conn.read_all())
            assert await task == 100_000
            conn.writer.close()
            assert await reader == b"H" + pattern(100_000) + trailers
    finally:
        socket.setdefaulttimeout(None)


async def test_kernel_refusal_after_headers_continues_in_userspace(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "sendfile", refuse)
    conn = await connect()
    reader = asyncio.create_task(conn.read_all())
    with open(make_file(500_000), "rb") as f:
        assert await aiosendfile.sendfile(conn.writer, f, headers=b"HDR", trailers=b"END") == 500_000
        with pytest.raises(aiosendfile.SendfileNotAvailableError):
            await aiosendfile.sendfile(conn.writer, f, fallback=False)
    conn.writer.close()
    assert await reader == b"HDR" + pattern(500_000) + b"END"


def test_probe_refusal_is_remembered_per_file_system(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not _platform.HAS_RWF_NOWAIT or not shm.is_dir():
        pytest.skip("needs RWF_NOWAIT and /dev/shm")
    on_shm = shm / f"aiosendfile-probe-{os.getpid()}"
    on_shm.write_bytes(b"x")
    (tmp_path / "f").write_bytes(b"x")
    try:
        with open(on_shm, "rb") as a, open(tmp_path / "f", "rb") as b:
            dev_a, dev_b = os.fstat(a.fileno()).st_dev, os.fstat(b.fileno()).st_dev
            first = _platform.page_cached(a.fileno(), 0, dev_a)
            if first is not None or dev_a == dev_b:
                pytest.skip("this tmpfs answers RWF_NOWAIT; nothing to remember")
            assert _platform.page_cached(b.fileno(), 0, dev_b) is not None  # other file systems still probe
    finally:
        on_shm.unlink()


# -- file objects and what is counted ----------------------------------------------------------------


@pytest.mark.parametrize("opener", [gzip.open, bz2.open])
async def test_decoding_file_objects_are_read_not_sent_raw(
    connect: Connector, tmp_path: Path, opener: Any
) -> None:
    path = tmp_path / "data.z"
    with opener(path, "wb") as out:
        out.write(pattern(300_000))
    conn = await connect()
    reader = asyncio.create_task(conn.read_all())
    with opener(path, "rb") as f:
        assert await aiosendfile.sendfile(conn.writer, f) == 300_000
    conn.writer.close()
    assert await reader == pattern(300_000)  # the decoded bytes, not the compressed file
    assert _platform.counters.bytes == 0


async def test_headers_with_zero_copy_count_only_file_bytes(
    connect: Connector, kind: str, make_file: Any
) -> None:
    conn = await connect()
    reader = asyncio.create_task(conn.read_all())
    with open(make_file(3 * 2**20), "rb") as f:
        assert await aiosendfile.sendfile(conn.writer, f, 5, 100, headers=b"h" * 10) == 100
        assert f.tell() == 105
    conn.writer.close()
    assert await reader == b"h" * 10 + pattern(3 * 2**20)[5:105]
    assert _platform.counters.bytes == (100 if zero_copy_expected(kind) else 0)


@pytest.mark.skipif(_lookup.lookup_cached("/") is None, reason="no openat2(RESOLVE_CACHED) here")
def test_cached_lookup_says_when_a_path_would_need_the_disk(tmp_path: Path) -> None:
    """``lookup_cached``: False for a name never looked up (no dentry yet, positive or negative: the
    file system would have to be asked), True once a lookup has cached the answer, found or not."""
    missing, present = tmp_path / "never-looked-up", tmp_path / "present"
    assert _lookup.lookup_cached(str(missing)) is False
    with pytest.raises(FileNotFoundError):
        os.stat(missing)
    assert _lookup.lookup_cached(str(missing)) is True  # a negative dentry now
    present.write_bytes(b"x")
    assert _lookup.lookup_cached(str(present)) is True
    assert _lookup.lookup_cached(str(present) + "\0tail") is True  # no such path, nothing to wait for
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        _lookup.lookup_cached(str(present))
    assert len(os.listdir("/proc/self/fd")) == fds  # the O_PATH descriptor is closed each time


def test_cached_lookup_is_none_where_the_kernel_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without openat2 or RESOLVE_CACHED (ENOSYS, EINVAL) or a seccomp filter (EPERM):
    None from then on, for the lookup and for the open, so callers keep their conservative path."""
    refusing = SimpleNamespace(openat2_cached=lambda path, flags, resolve: -errno.ENOSYS)
    monkeypatch.setattr(_platform, "_syscalls", refusing)
    refused = _lookup._CachedLookup()
    assert refused.call is not None
    assert refused.open is not None
    assert refused.call("/") is None
    assert refused.call is None
    assert refused.open("/") is None  # (the open that reads: the engine's first sight)
    assert refused.open is None
