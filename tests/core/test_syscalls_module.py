"""``aiosendfile._syscalls``: the C module for ``cachestat(2)`` and ``openat2(2)`` (built at install
where Linux and a compiler are), what it answers, and when ``_platform`` uses it."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _lookup, _platform
from aiosendfile._static._hot import identity

from ..support.processes import cli_env

compiled = pytest.mark.skipif(
    not _platform.HAS_SYSCALLS_MODULE,
    reason="aiosendfile._syscalls was not built here (no compiler at install)",
)


@compiled
def test_cachestat_counts_cached_pages_or_answers_minus_the_errno(tmp_path: Path) -> None:
    syscalls = _platform._syscalls
    path = tmp_path / "f"
    path.write_bytes(b"x" * 3 * _platform._PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 3 * _platform._PAGE, 0)
        pages = syscalls.cachestat(fd, 0, 3 * _platform._PAGE)
        if pages == -errno.ENOSYS:
            pytest.skip("no cachestat(2) in this kernel (Linux < 6.5)")
        assert pages == 3
        assert syscalls.cachestat(fd, _platform._PAGE, 1) == 1
    finally:
        os.close(fd)
    assert syscalls.cachestat(-1, 0, 4096) == -errno.EBADF  # an answer, not an exception
    assert syscalls.cachestat(-1, True, 4096) == -errno.EBADF  # (integer-like, as os.* takes)
    with pytest.raises(OverflowError):
        syscalls.cachestat(fd, -1, 4096)
    with pytest.raises(OverflowError):
        syscalls.cachestat(2**40, 0, 4096)
    with pytest.raises(TypeError):
        syscalls.cachestat(fd, 0)
    with pytest.raises(TypeError):
        syscalls.cachestat("0", 0, 4096)


@compiled
def test_openat2_cached_opens_or_answers_minus_the_errno(tmp_path: Path) -> None:
    syscalls = _platform._syscalls
    (tmp_path / "real").write_bytes(b"data")
    (tmp_path / "link").symlink_to("real")
    os.stat(tmp_path / "link")  # every name looked up: in the kernel's caches
    reading, no_symlinks = os.O_RDONLY | os.O_CLOEXEC, _lookup._RESOLVE_NO_SYMLINKS
    fd = syscalls.openat2_cached(str(tmp_path / "real"), reading, no_symlinks)
    if fd in (-errno.ENOSYS, -errno.EINVAL):
        pytest.skip("no openat2(RESOLVE_CACHED) in this kernel (Linux < 5.12)")
    try:
        assert os.read(fd, 10) == b"data"
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
    for path in (os.fsencode(tmp_path / "real"), tmp_path / "real"):  # bytes and PathLike too
        fd = syscalls.openat2_cached(path, reading, 0)
        assert fd >= 0, os.strerror(-fd)
        os.close(fd)
    assert syscalls.openat2_cached(str(tmp_path / "link"), reading, no_symlinks) == -errno.ELOOP
    assert syscalls.openat2_cached(str(tmp_path / "never-looked-up"), reading, 0) == -errno.EAGAIN
    assert syscalls.openat2_cached(str(tmp_path / "real") + "\0tail", reading, 0) == -errno.ENOENT
    assert syscalls.openat2_cached(os.fsencode(tmp_path / "real") + b"\0", reading, 0) == -errno.ENOENT
    with pytest.raises(UnicodeEncodeError):  # (as os.fsencode: not taken for "no such path")
        syscalls.openat2_cached(str(tmp_path / "\ud800"), reading, 0)
    with pytest.raises(TypeError):
        syscalls.openat2_cached(3, reading, 0)
    with pytest.raises(TypeError):
        syscalls.openat2_cached(str(tmp_path / "real"), reading)


def _stat_identities() -> list[object]:
    """The ways ``stat_identity`` is made here: the pure one, and the compiled one where built."""
    ways: list[object] = [_lookup._stat_identity]
    if _platform.HAS_SYSCALLS_MODULE:
        ways.append(_platform._syscalls.stat_identity)
    return ways


@pytest.mark.parametrize("stat_identity", _stat_identities(), ids=lambda f: f.__module__)
def test_stat_identity_is_what_the_hot_cache_takes_of_os_stat(tmp_path: Path, stat_identity: Any) -> None:
    """Both ways give ``_hot.identity(os.stat(path))`` exactly (nanosecond times past 2262 and
    before 1970 too), minus the errno for a path that is not there, and raise as ``os.stat``
    does for what is no path."""
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    for ns in (None, 1_700_000_000_123_456_789, -5_000_000_001, 10**19 + 7):
        if ns is not None:
            os.utime(path, ns=(ns, ns))
        for spelling in (str(path), os.fsencode(path), path):
            assert stat_identity(spelling) == identity(os.stat(path))
    assert stat_identity(str(tmp_path / "missing")) == -errno.ENOENT
    assert stat_identity(str(path / "below-a-file")) == -errno.ENOTDIR
    assert stat_identity(str(path) + "\0tail") == -errno.ENOENT
    with pytest.raises(UnicodeEncodeError):  # (as os.stat: not taken for "no such path")
        stat_identity(str(tmp_path / "\ud800"))
    if stat_identity is not _lookup._stat_identity:  # (os.stat would take 3 for a descriptor)
        with pytest.raises(TypeError):
            stat_identity(3)


def _acceptors() -> list[str]:
    return ["pure", "compiled"] if _platform.HAS_SYSCALLS_MODULE else ["pure"]


@pytest.mark.parametrize("way", _acceptors())
def test_the_acceptor_answers_a_descriptor_or_minus_the_errno(
    monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """A waiting connection's descriptor (close-on-exec, the connection itself); -EAGAIN when none
    waits; -EBADF (an answer, not an exception) once the listening socket is closed."""
    if way == "pure":
        monkeypatch.setattr(_platform, "_syscalls", None)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        listening.setblocking(False)
        accept = _platform.acceptor(listening)
        assert accept() == -errno.EAGAIN
        with socket.create_connection(listening.getsockname()) as client:
            fd = -1
            for _ in range(200):
                fd = accept()
                if fd != -errno.EAGAIN:
                    break
                time.sleep(0.01)
            assert fd >= 0
            with socket.socket(fileno=fd) as accepted:
                assert not os.get_inheritable(fd)
                assert accepted.getpeername() == client.getsockname()
            assert accept() == -errno.EAGAIN
        listening.close()
        assert accept() == -errno.EBADF


def _reopen_reads() -> list[object]:
    """The ways ``reopen_read`` is made here: the pure one, and the compiled one where built."""
    ways: list[object] = [_lookup._pure_reopen_read]
    if _platform.HAS_SYSCALLS_MODULE:
        ways.append(_lookup._compiled_reopen_read)
    return ways


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc/self/fd")
@pytest.mark.parametrize("reopen_read", _reopen_reads(), ids=lambda f: f.__name__.strip("_"))
def test_reopen_read_answers_the_kept_file_or_nothing(tmp_path: Path, reopen_read: Any) -> None:
    """A small file whose pages are cached: the head and its bytes, nothing left open; a larger
    one: its descriptor, its size and its probe (its size: every page cached; 0: not probed); a
    file that is not the one kept (another identity, gone, a FIFO swapped in: never blocking on
    it): None, nothing left open. Both ways answer the same."""
    head = b"HTTP/1.1 200 OK\r\n\r\n"
    small, large, empty = tmp_path / "small", tmp_path / "large", tmp_path / "empty"
    small.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    large.write_bytes(b"L" * 100_000)
    empty.write_bytes(b"")
    for p in (small, large):
        p.read_bytes()  # (in the page cache)
    before = _open_descriptors()
    kept = identity(os.stat(small))
    assert reopen_read(str(small), kept, head, 16384, 0) == head + small.read_bytes()
    assert reopen_read(str(empty), identity(os.stat(empty)), head, 0, 0) == head
    assert _open_descriptors() == before

    got = reopen_read(str(small), kept, head, 1024, 0)  # (larger than read_max, not probed)
    assert got[1:] == (10_240, 0)
    os.close(got[0])
    fd, size, warm_to = reopen_read(str(large), identity(os.stat(large)), head, 16384, 1 << 21)
    try:
        assert os.pread(fd, 3, 99_997) == b"LLL"
        assert not os.get_inheritable(fd)
        assert (size, warm_to) in ((100_000, 100_000), (100_000, 0))  # (0: no cachestat here)
        if _platform.HAS_RWF_NOWAIT and _platform.range_cached_available():
            assert warm_to == 100_000
    finally:
        os.close(fd)

    for ns in (-5_000_000_001, 10**19 + 7, 1_700_000_000_123_456_789):  # (before 1970, past 2262)
        os.utime(small, ns=(ns, ns))
        kept = identity(os.stat(small))
        assert reopen_read(str(small), kept, head, 16384, 0) == head + small.read_bytes()
        assert reopen_read(str(small), (*kept[:3], ns + 1, kept[4]), head, 16384, 0) is None
    assert reopen_read(str(small), list(kept), head, 16384, 0) is None  # (not the tuple kept)
    other = (*kept[:3], kept[3] + 1, *kept[4:])  # (its mtime moved: rewritten since)
    assert reopen_read(str(small), other, head, 16384, 1 << 21) is None
    assert reopen_read(str(tmp_path / "gone"), kept, head, 16384, 1 << 21) is None
    assert reopen_read(str(small) + "\0tail", kept, head, 16384, 1 << 21) is None
    small.unlink()
    os.mkfifo(small)  # (swapped in: opened without blocking, and its fstat differs)
    assert reopen_read(str(small), kept, head, 16384, 1 << 21) is None
    assert _open_descriptors() == before


@pytest.mark.parametrize("reopen_read", _reopen_reads(), ids=lambda f: f.__name__.strip("_"))
def test_reopen_read_says_cold_for_pages_not_cached(tmp_path: Path, reopen_read: Any) -> None:
    """A file whose pages are not in the page cache is not read (nor waited for): its descriptor,
    with PROBED_COLD for a small one and for one probed."""
    from aiosendfile._outlet import PROBED_COLD

    from ..support.files import evict

    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"s" * 8192)
    large.write_bytes(b"L" * 200_000)
    evict(small)
    evict(large)
    if not _platform.HAS_RWF_NOWAIT:
        pytest.skip("no RWF_NOWAIT here: a read cannot say it would wait")
    for path, read_max, probe_max in ((small, 16384, 0), (large, 16384, 1 << 21)):
        got = reopen_read(str(path), identity(os.stat(path)), b"head", read_max, probe_max)
        assert type(got) is tuple
        os.close(got[0])
        if path is small or _platform.range_cached_available():
            assert got[1:] == (path.stat().st_size, PROBED_COLD)


def test_a_stale_or_foreign_build_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module left in the checkout by an older build (another ABI) is ignored, not half-used."""
    monkeypatch.delenv("AIOSENDFILE_NO_EXTENSIONS", raising=False)
    monkeypatch.setattr(aiosendfile, "_syscalls", SimpleNamespace(ABI=0), raising=False)
    monkeypatch.setitem(sys.modules, "aiosendfile._syscalls", aiosendfile._syscalls)
    assert _platform._load_syscalls() is None
    monkeypatch.setattr(aiosendfile, "_syscalls", SimpleNamespace(ABI=_platform._SYSCALLS_ABI))
    monkeypatch.setitem(sys.modules, "aiosendfile._syscalls", aiosendfile._syscalls)
    assert _platform._load_syscalls() is aiosendfile._syscalls
    monkeypatch.setenv("AIOSENDFILE_NO_EXTENSIONS", "1")
    assert _platform._load_syscalls() is None


def test_without_the_module_the_probes_say_they_cannot_tell() -> None:
    """``AIOSENDFILE_NO_EXTENSIONS`` (or no build): cachestat and openat2 are missing, as on an old
    kernel, and the callers take their other paths; ``capabilities()`` says so."""
    code = (
        "import sys, aiosendfile; from aiosendfile import _lookup as l, _platform as p; "
        "print(p._syscalls, p.range_cached_available(), p.range_cached(0, 0, 1), "
        "l.lookup_cached('/'), l.open_cached('/'), aiosendfile.capabilities()['compiled_syscalls'], "
        "'ctypes' in sys.modules)"
    )
    env = {**cli_env(), "AIOSENDFILE_NO_EXTENSIONS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["None", "False", "None", "None", "None", "False", "False"]


def test_a_cachestat_refused_by_the_kernel_turns_the_probe_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSYS (a kernel before 6.5) or EPERM (a seccomp filter): None from then on, so the probe
    falls back to its two-page check; EBADF is the caller's error and raises; any other refusal
    says only "cannot tell" for that call."""
    answers = [-errno.EINVAL, -errno.EBADF, -errno.ENOSYS]
    monkeypatch.setattr(
        _platform, "_syscalls", SimpleNamespace(cachestat=lambda fd, off, size: answers.pop(0))
    )
    probe = _platform._Cachestat()
    assert probe.call is not None
    assert probe.call(0, 0, 4096) is None
    assert probe.call is not None  # (EINVAL: this call only)
    with pytest.raises(OSError, match="Bad file descriptor"):
        probe.call(0, 0, 4096)
    assert probe.call(0, 0, 4096) is None
    assert probe.call is None
