"""The static core's fake file system (``FakeFS``: files, directories, errors, real paths, cold
files in dicts; descriptors counted) and what the core's table tests build on it: the tree
``sample_fs``, requests (``req``), a policy, and ``route_and_resolve``; and ``kernel_caches``, the
real file system's lookup probes made to say cached or not."""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import pytest

from aiosendfile._static import _http
from aiosendfile._static._answer import Answer, FileRange
from aiosendfile._static._core import Located, resolve, route
from aiosendfile._static._fs import NotRegular, OutsideRoot
from aiosendfile._static._policy import DirectoryPolicy
from aiosendfile._static._request import BytesHeaders, Request

ROOT = "/srv"
MTIME_NS = 1_795_490_460_123_456_789
LM = "Tue, 24 Nov 2026 03:21:00 GMT"
BIG = b"".join(bytes([i % 251]) for i in range(100_000))  # above the inline limit


def stat_result(mode: int, size: int, ino: int, mtime_ns: int = MTIME_NS) -> os.stat_result:
    seconds = mtime_ns // 10**9
    return os.stat_result(
        (
            mode,
            ino,
            1,
            1,
            0,
            0,
            size,
            seconds,
            seconds,
            seconds,
            seconds,
            mtime_ns / 1e9,
            seconds,
            mtime_ns,
            mtime_ns,
            mtime_ns,
        )
    )


def etag(size: int) -> str:
    return _http.make_etag(MTIME_NS, size)


class FakeFS:
    """A file system in dicts: files, directories, errors, real paths, cold files; fds counted."""

    def __init__(self, files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> None:
        self.files = {f"{ROOT}/{k}": v for k, v in files.items()}
        self.dirs = {ROOT, *(f"{ROOT}/{d}" for d in dirs)}
        self.stat_errors: dict[str, OSError] = {}
        self.open_errors: dict[str, Exception] = {}
        self.real: dict[str, str] = {}
        self.mtimes: dict[str, int] = {}  # a path's mtime (and ctime), if not MTIME_NS
        self.cold: set[str] = set()
        self.open_fds: dict[int, str] = {}
        self.calls: list[tuple[str, str]] = []
        self._next_fd = 100

    def _ino(self, path: str) -> int:
        return 1 + sorted([*self.files, *self.dirs]).index(path)

    def stat(self, path: str) -> os.stat_result:
        self.calls.append(("stat", path))
        if path.endswith("/") and path.rstrip("/") in self.files:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        path = os.path.normpath(path)
        if path in self.stat_errors:
            raise self.stat_errors[path]
        if path in self.dirs:
            return stat_result(stat.S_IFDIR | 0o755, 4096, self._ino(path), self.mtimes.get(path, MTIME_NS))
        if path in self.files:
            return stat_result(stat.S_IFREG | 0o644, len(self.files[path]), self._ino(path))
        raise FileNotFoundError(errno.ENOENT, "missing", path)

    def is_file(self, path: str) -> bool:
        self.calls.append(("is_file", path))
        return path in self.files and path not in self.stat_errors

    def realpath(self, path: str) -> str:
        path = os.path.normpath(path)
        return self.real.get(path, path)

    def open_regular(self, path: str, root: str | None, nofollow: bool) -> tuple[int, os.stat_result]:
        self.calls.append(("open_nofollow" if nofollow else "open", path))
        if path in self.open_errors:
            raise self.open_errors[path]
        st = self.stat(path)
        if root is not None and not self.realpath(path).startswith(root + "/"):
            raise OutsideRoot(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(path)
        self._next_fd += 1
        self.open_fds[self._next_fd] = path
        return self._next_fd, st

    def read_cached(self, fd: int, size: int) -> bytes | None:
        path = self.open_fds[fd]
        return None if path in self.cold else self.files[path][:size]

    def scan(self, path: str, root: str | None) -> tuple[list[tuple[str, os.stat_result]], str]:
        path = os.path.normpath(path)
        self.calls.append(("scan", path))
        names = {
            p[len(path) + 1 :].split("/")[0] for p in [*self.files, *self.dirs] if p.startswith(path + "/")
        }
        return [(name, self.stat(f"{path}/{name}")) for name in sorted(names)], self.realpath(path)

    def close(self, fd: int) -> None:
        del self.open_fds[fd]

    def read(self, body: Any) -> bytes:
        """The bytes an answer's body stands for."""
        if isinstance(body, FileRange):
            return self.files[self.open_fds[body.fd]][body.start : body.start + body.length]
        assert isinstance(body, bytes | None)
        return body or b""


POLICY = DirectoryPolicy(ROOT)


def req(method: str = "GET", target: bytes = b"/a.txt", *headers: tuple[str, str], **kw: Any) -> Request:
    path, _, query = target.partition(b"?")
    pairs = [(k.encode(), v.encode("latin-1")) for k, v in headers]
    return Request(method, path, query, BytesHeaders(pairs), **kw)


def sample_fs() -> FakeFS:
    """Files, a pre-compressed sibling, an index, a dotfile, and ``out`` really elsewhere."""
    fs = FakeFS(
        {
            "a.txt": b"hello world",
            "big.bin": BIG,
            "style.css": b"body{}" * 10,
            "style.css.gz": b"GZ",
            "withindex/index.html": b"<h1>i</h1>",
            "sub/b.txt": b"b" * 1536,
            "sub/.hidden": b"h",
        },
        dirs=("withindex", "sub", "sub/deeper", "out"),
    )
    fs.real[f"{ROOT}/out"] = "/elsewhere"
    return fs


def route_and_resolve(fs: FakeFS, r: Request, policy: DirectoryPolicy = POLICY) -> Answer | Located:
    path = route(r, policy)
    assert isinstance(path, str)
    return resolve(r, path, policy, fs)


def kernel_caches(monkeypatch: pytest.MonkeyPatch, cached: bool) -> None:
    """The first sight's probes (``_lookup.lookup_cached``, ``open_cached``) say every lookup is
    in the kernel's caches (*cached*: the real open, ENOENT for a name that does not exist) or
    that none is (EAGAIN: it would read the disk)."""
    from aiosendfile import _lookup

    monkeypatch.setattr(_lookup, "lookup_cached", lambda path: cached)
    real_open = _lookup.open_cached
    if cached:  # (a name never looked up has no dentry yet: EAGAIN from the real call)
        monkeypatch.setattr(
            _lookup, "open_cached", lambda path: real_open(path) if os.path.exists(path) else -errno.ENOENT
        )
    else:
        monkeypatch.setattr(_lookup, "open_cached", lambda path: -errno.EAGAIN)
