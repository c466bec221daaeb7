"""``aiosendfile._syscalls``: the C module for ``cachestat(2)`` and ``openat2(2)`` (built at install
where Linux and a compiler are), what it answers, and when ``_platform`` uses it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import aiosendfile
from aiosendfile import _platform

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
    reading, no_symlinks = os.O_RDONLY | os.O_CLOEXEC, _platform._RESOLVE_NO_SYMLINKS
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
        "import sys, aiosendfile; from aiosendfile import _platform as p; "
        "print(p._syscalls, p.range_cached_available(), p.range_cached(0, 0, 1), "
        "p.lookup_cached('/'), p.open_cached('/'), aiosendfile.capabilities()['compiled_syscalls'], "
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
