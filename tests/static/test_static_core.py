"""The IO-free static core (``aiosendfile._static``): route, resolve and respond against a fake file system.

Tables of requests and file-system states go in; the Answer (status, fields, length, body source)
comes out, with no disk, socket or loop. The plugin's answers on a real tree are pinned by
``test_static_golden.py``; here each decision is checked on its own, including the ones a real
tree makes hard to reach (a socket's ENXIO, a file swapped between stat and open, a cold page
cache). Last, a structural test: nothing in ``_static`` imports asyncio, aiohttp or socket, and
only ``_fs`` calls the file system.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aiosendfile._static
from aiosendfile import _platform
from aiosendfile._static import _core, _hot, _http, _listing
from aiosendfile._static._answer import Answer, FileRange, Multipart
from aiosendfile._static._core import Located, answer, resolve, respond, route
from aiosendfile._static._fs import NotRegular, OutsideRoot
from aiosendfile._static._policy import DirectoryPolicy
from aiosendfile._static._request import BytesHeaders, Request

ROOT = "/srv"
MTIME_NS = 1_795_490_460_123_456_789
LM = "Tue, 24 Nov 2026 03:21:00 GMT"
BIG = b"".join(bytes([i % 251]) for i in range(100_000))  # above the inline limit


def _st(mode: int, size: int, ino: int, mtime_ns: int = MTIME_NS) -> os.stat_result:
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
            return _st(stat.S_IFDIR | 0o755, 4096, self._ino(path), self.mtimes.get(path, MTIME_NS))
        if path in self.files:
            return _st(stat.S_IFREG | 0o644, len(self.files[path]), self._ino(path))
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


@pytest.fixture(autouse=True)
def _fresh_hot_files() -> Iterator[None]:
    _hot.hot_files.clear()
    _listing.listings.clear()
    yield
    _hot.hot_files.clear()
    _listing.listings.clear()


POLICY = DirectoryPolicy(ROOT)


def req(method: str = "GET", target: bytes = b"/a.txt", *headers: tuple[str, str], **kw: Any) -> Request:
    path, _, query = target.partition(b"?")
    pairs = [(k.encode(), v.encode("latin-1")) for k, v in headers]
    return Request(method, path, query, BytesHeaders(pairs), **kw)


# -- route ------------------------------------------------------------------------------------

ROUTES: list[tuple[str, bytes, dict[str, Any], str | int]] = [
    ("GET", b"/a.txt", {}, "/srv/a.txt"),
    ("HEAD", b"/sub/b.txt", {}, "/srv/sub/b.txt"),
    ("GET", b"/", {}, "/srv"),
    ("GET", b"/space%20name.txt", {}, "/srv/space name.txt"),
    ("GET", b"/100%25.txt", {}, "/srv/100%.txt"),
    ("GET", b"/caf%E9.txt", {}, "/srv/caf\udce9.txt"),  # not UTF-8: as the file system names it
    ("GET", b"/./a.txt", {}, "/srv/./a.txt"),
    ("GET", b"/.well-known/x", {}, "/srv/.well-known/x"),
    ("GET", b"/.well-known/.x", {}, 404),
    ("GET", b"/sub/.well-known/x", {}, 404),
    ("GET", b"/.env", {}, 404),
    ("GET", b"/%2eenv", {}, 404),
    ("GET", b"/a/.ssh/id", {}, 404),
    ("GET", b"/...", {}, 404),
    ("GET", b"/%2e%2e/etc/passwd", {}, 404),
    ("GET", b"/sub/..%2f..%2fetc", {}, 404),
    ("GET", b"/a.txt%00.html", {}, 404),
    ("GET", b"/sub%5c..%5ca.txt", {}, 404),
    ("GET", b"//etc/passwd", {}, 404),
    ("GET", b"*", {}, 404),
    ("POST", b"/a.txt", {}, 405),
    ("OPTIONS", b"/nope", {}, 405),
    ("GET", b"/static/a.txt", {"prefix": "/static"}, "/srv/a.txt"),
    ("GET", b"/other/a.txt", {"prefix": "/static"}, 404),
    # aiohttp hands the decoded name: used as is, unless it still holds a "%" (then raw_path decides)
    ("GET", b"/static/a.txt", {"prefix": "/static", "rel": "a.txt"}, "/srv/a.txt"),
    ("GET", b"/static/%FF", {"prefix": "/static", "rel": "%FF"}, "/srv/\udcff"),
    ("GET", b"/static/%25FF", {"prefix": "/static", "rel": "%FF"}, "/srv/%FF"),
    ("GET", b"/static/..", {"prefix": "/static", "rel": ".."}, 404),
]


@pytest.mark.parametrize(("method", "target", "kw", "expected"), ROUTES)
def test_route(method: str, target: bytes, kw: dict[str, Any], expected: str | int) -> None:
    got = route(Request(method, target, **kw), POLICY)
    if isinstance(expected, str):
        assert got == expected
        return
    assert isinstance(got, Answer)
    assert got.status == expected
    assert got.fields[0] == ("Content-Type", "text/plain; charset=utf-8")
    if expected == 405:
        assert got.fields[1:] == [("Allow", "GET,HEAD")]
        assert got.body == b"405: Method Not Allowed"
    else:
        assert got.body == b"404: Not Found"
    assert got.length == len(got.body)


def test_route_dotfiles_allowed() -> None:
    policy = DirectoryPolicy(ROOT, dotfiles=True)
    assert route(Request("GET", b"/.env"), policy) == "/srv/.env"
    assert isinstance(route(Request("GET", b"/%2e%2e/x"), policy), Answer)


def test_error_to_head_has_a_length_and_no_body() -> None:
    got = route(Request("HEAD", b"/.env"), POLICY)
    assert isinstance(got, Answer)
    assert (got.status, got.length, got.head_only, got.body) == (404, 14, True, b"404: Not Found")


# -- resolve ----------------------------------------------------------------------------------


def _fs() -> FakeFS:
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


def _resolve(fs: FakeFS, r: Request, policy: DirectoryPolicy = POLICY) -> Answer | Located:
    path = route(r, policy)
    assert isinstance(path, str)
    return resolve(r, path, policy, fs)


@pytest.mark.parametrize(
    ("target", "status", "extra"),
    [
        (b"/nope", 404, []),
        (b"/sub", 301, [("Location", "/sub/")]),
        (b"/sub?x=1&y=%20", 301, [("Location", "/sub/?x=1&y=%20")]),
        (b"/withindex", 301, [("Location", "/withindex/")]),
        (b"/sub/", 403, []),  # no index, no listing
        (b"/out/", 404, []),  # a directory whose real path is out of the root
        (b"/out", 404, []),
    ],
)
def test_resolve_errors(target: bytes, status: int, extra: list[tuple[str, str]]) -> None:
    got = _resolve(_fs(), req("GET", target))
    assert isinstance(got, Answer)
    assert (got.status, got.fields) == (status, [("Content-Type", "text/plain; charset=utf-8"), *extra])


def test_resolve_stat_refused_is_403() -> None:
    fs = _fs()
    fs.stat_errors["/srv/a.txt"] = PermissionError(errno.EACCES, "no")
    got = _resolve(fs, req())
    assert isinstance(got, Answer)
    assert got.status == 403


def test_resolve_301_keeps_the_prefix_and_the_encoded_path() -> None:
    fs = _fs()
    fs.dirs.add("/srv/a b")
    r = req("GET", b"/static/a%20b?q=%2F", prefix="/static")
    got = _resolve(fs, r)
    assert isinstance(got, Answer)
    assert ("Location", "/static/a%20b/?q=%2F") in got.fields


def test_resolve_directory_slash_may_be_encoded() -> None:
    got = _resolve(_fs(), req("GET", b"/sub%2F"))
    assert isinstance(got, Answer)
    assert got.status == 403  # no redirect: it ends with a slash once decoded


def test_resolve_directory_index_and_symlinked_dirs_when_following() -> None:
    fs = _fs()
    assert _resolve(fs, req("GET", b"/withindex/")) == Located("/srv/withindex/index.html")
    got = _resolve(fs, req("GET", b"/out/"), DirectoryPolicy(ROOT, follow_symlinks=True))
    assert isinstance(got, Answer)
    assert got.status == 403  # followed: then no index, no listing


def test_resolve_listing() -> None:
    fs = _fs()
    policy = DirectoryPolicy(ROOT, listings=True)
    got = _resolve(fs, req("GET", b"/sub/"), policy)
    assert isinstance(got, Answer)
    assert (got.status, got.fields) == (
        200,
        [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Vary", "Accept"),
            ("Content-Security-Policy", _listing.LISTING_POLICY[False]),
        ],
    )
    assert isinstance(got.body, bytes)
    assert got.length == len(got.body)
    assert b"<title>Index of /sub/</title>" in got.body
    assert b'href="../"' in got.body
    assert got.body.index(b'href="deeper/"') < got.body.index(b'href="b.txt"')  # directories first
    assert b".hidden" not in got.body
    head = _resolve(fs, req("HEAD", b"/sub/"), policy)
    assert isinstance(head, Answer)
    assert (head.head_only, head.body, head.length) == (True, got.body, got.length)
    root = _resolve(fs, req("GET", b"/"), policy)
    assert isinstance(root, Answer)
    assert isinstance(root.body, bytes)
    assert b'href="../"' not in root.body


def test_a_listing_is_built_once_then_served_while_its_directory_is_unchanged() -> None:
    """The page is kept (``_listing.listings``) and served again without a scan while the
    directory's stat is the same and it is younger than LISTING_SECONDS; a new entry (the
    directory's mtime moves) or age builds it again."""
    fs = _fs()
    policy = DirectoryPolicy(ROOT, listings=True)
    first = _resolve(fs, req("GET", b"/sub/"), policy)
    assert ("scan", f"{ROOT}/sub") in fs.calls
    fs.calls.clear()
    again = _resolve(fs, req("GET", b"/sub/"), policy)
    assert isinstance(first, Answer)
    assert isinstance(again, Answer)
    assert again.body is first.body
    assert not any(call[0] == "scan" for call in fs.calls)
    other = _resolve(fs, req("GET", b"/sub/"), DirectoryPolicy(ROOT, listings=True, dotfiles=True))
    assert isinstance(other, Answer)
    assert other.body != first.body  # (another policy: another page)
    fs.mtimes[f"{ROOT}/sub"] = MTIME_NS + 10**9  # an entry came or went
    fs.calls.clear()
    _resolve(fs, req("GET", b"/sub/"), policy)
    assert ("scan", f"{ROOT}/sub") in fs.calls


def test_listings_are_bounded_by_entries_and_bytes() -> None:
    """Keys (the request's path) and pages both count: 1,000 directories under 4 KB spellings."""
    cache = _listing.Listings(max_entries=16, max_bytes=64 * 1024)
    st = _st(stat.S_IFDIR | 0o755, 4096, 7)
    for i in range(1000):
        key = (1, 7, b"/." * 2000 + b"/%d/" % i)
        cache.put(key, st, b"<html>" * 100, len(key[2]))
        assert len(cache) <= 16
        assert cache.size <= 64 * 1024
    assert cache.get(key, st) == b"<html>" * 100
    cache.put((2,), st, b"x" * 64 * 1024, 1)  # larger than a quarter of the bound: never kept
    assert cache.get((2,), st) is None


def test_the_loops_file_system_never_lists() -> None:
    """REAL_FS (the event loop's) refuses to scan a directory: the door asks again in its pool."""
    from aiosendfile._static._fs import POOL_FS, REAL_FS, DecideInPool

    with pytest.raises(DecideInPool):
        REAL_FS.scan(ROOT, None)
    assert callable(POOL_FS.scan)


def test_resolve_a_file_is_located_with_its_stat() -> None:
    fs = _fs()
    got = _resolve(fs, req())
    assert isinstance(got, Located)
    assert (got.path, got.st.st_size if got.st else None, got.siblings) == ("/srv/a.txt", 11, None)
    assert fs.calls == [("stat", "/srv/a.txt")]


def test_resolve_answers_a_hot_plain_request_from_the_cache() -> None:
    fs = _fs()
    with respond(req(), Located("/srv/a.txt"), POLICY, fs):  # fills the cache
        pass
    fs.calls.clear()
    got = _resolve(fs, req())
    assert isinstance(got, Answer)
    assert got.entry is not None
    assert (got.status, got.length, got.body, got.head_only) == (200, 11, b"hello world", False)
    assert got.fields == [
        ("Etag", etag(11)),
        ("Last-Modified", LM),
        ("Accept-Ranges", "bytes"),
        ("Vary", "Accept-Encoding"),
        ("Content-Type", "text/plain"),
    ]
    assert fs.calls == [("stat", "/srv/a.txt")]  # one stat, nothing opened
    head = _resolve(fs, req("HEAD"))
    assert isinstance(head, Answer)
    assert (head.length, head.body, head.head_only, head.entry) == (11, b"hello world", True, got.entry)
    # Not plain: a range, a condition → the full path, which answers from the cache too
    for header in [("Range", "bytes=0-1"), ("If-None-Match", "*")]:
        assert isinstance(_resolve(fs, req("GET", b"/a.txt", header)), Located)


def test_resolve_hands_the_siblings_it_looked_up_to_respond() -> None:
    fs = _fs()
    r = req("GET", b"/style.css", ("Accept-Encoding", "gzip, br"))
    with respond(req("GET", b"/style.css"), Located("/srv/style.css"), POLICY, fs):
        pass
    fs.calls.clear()
    got = _resolve(fs, r)
    assert got == Located("/srv/style.css", fs.stat("/srv/style.css"), [("gzip", "/srv/style.css.gz")])
    assert isinstance(got, Located)
    fs.calls.clear()
    with respond(r, got, POLICY, fs) as a:
        assert (a.status, a.encoding, fs.read(a.body)) == (200, "gzip", b"GZ")
    assert ("is_file", "/srv/style.css.gz") not in fs.calls  # not looked up twice


# -- respond ----------------------------------------------------------------------------------


def _respond(fs: FakeFS, r: Request, policy: DirectoryPolicy = POLICY) -> Answer:
    path = route(r, policy)
    assert isinstance(path, str)
    found = resolve(r, path, policy, fs)
    assert isinstance(found, Located), found
    return respond(r, found, policy, fs)


def test_respond_small_file_comes_back_as_bytes_and_fills_the_cache() -> None:
    fs = _fs()
    with _respond(fs, req()) as a:
        assert (a.status, a.length, a.body, a.fd) == (200, 11, b"hello world", None)
        assert a.entry is not None  # the hot-file cache's entry: a door may memoise the answer
        assert a.entry.body is a.body
        assert ("Content-Type", "text/plain") in a.fields
    assert fs.open_fds == {}
    assert _hot.hot_files.get("/srv/a.txt", ROOT, fs.stat("/srv/a.txt")) == b"hello world"


def test_respond_reads_a_small_file_in_only_if_the_full_cache_admits_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the hot-file cache full, a first answer of another small file is sent from the file
    (no read, no eviction) except one in READMIT_EVERY: a set of files larger than the cache is
    not copied in and evicted again at each first sight."""
    monkeypatch.setattr(_hot, "hot_files", _hot.HotFiles(max_entries=1, max_bytes=1 << 20))
    fs = _fs()
    _respond(fs, req()).close()  # (a.txt fills the cache)
    bodies = []
    for _ in range(_hot.READMIT_EVERY - 1):
        with _respond(fs, req("GET", b"/sub/b.txt")) as a:
            bodies.append(type(a.body))
    assert bodies == [FileRange] * (_hot.READMIT_EVERY - 1)
    assert _hot.hot_files.get("/srv/a.txt", ROOT, fs.stat("/srv/a.txt")) == b"hello world"
    with _respond(fs, req("GET", b"/sub/b.txt")) as a:  # the one admitted
        assert a.body == b"b" * 1536
    assert fs.open_fds == {}


def test_respond_cold_or_big_file_is_a_file_range_closed_with_the_answer() -> None:
    fs = _fs()
    fs.cold.add("/srv/a.txt")
    for target, size in [(b"/a.txt", 11), (b"/big.bin", len(BIG))]:
        a = _respond(fs, req("GET", target))
        assert isinstance(a.body, FileRange)
        assert a.fd == a.body.fd
        assert (a.body.start, a.body.length, a.length) == (0, size, size)
        assert len(fs.open_fds) == 1
        with a:
            pass
        a.close()  # idempotent
        assert fs.open_fds == {}
    assert _hot.hot_files.get("/srv/a.txt", ROOT, fs.stat("/srv/a.txt")) is None


@pytest.mark.parametrize(
    ("method", "target", "headers", "kept"),
    [
        ("GET", b"/big.bin", [], True),  # any size
        ("GET", b"/a.txt", [], True),  # a hot file, read in at this answer
        ("HEAD", b"/a.txt", [], False),  # read in, but the answer holds no body (once hot: kept)
        ("GET", b"/big.bin", [("If-None-Match", '"other"')], True),  # a plain 200 all the same
        ("HEAD", b"/big.bin", [], False),  # no body: not kept (a GET of it will be)
        ("GET", b"/big.bin", [("Range", "bytes=0-9")], False),
        ("GET", b"/a.txt", [("Range", "bytes=0-")], False),  # the whole file, as a 206
        ("GET", b"/style.css", [("Accept-Encoding", "gzip")], False),  # the .gz sibling
        ("GET", b"/nope", [], False),
        ("GET", b"/withindex/", [], True),  # its index file
        ("GET", b"/sub/", [], False),  # a listing or a 403: no file
    ],
)
def test_the_core_gives_a_decided_for_a_plain_200_of_a_whole_file(
    method: str, target: bytes, headers: list[tuple[str, str]], kept: bool
) -> None:
    """What a door may keep in its answer cache: every plain 200 of a whole file without a coding,
    with the identity the core's stat (or fstat) gave and the path it answered from."""
    fs = _fs()
    policy = DirectoryPolicy(ROOT, precompressed=True)
    with answer(req(method, target, *headers), policy, fs) as got:
        decided = got.decided
        assert (decided is not None) == kept, got
        if decided is not None:
            assert got.status == 200
            assert got.encoding is None
            st = fs.stat(decided.path)
            assert decided.identity == _hot.identity(st)
            assert decided.size == st.st_size == got.length
            assert decided.small == (st.st_size <= policy.inline_limit)
            assert (decided.head, decided.pairs, decided.folder) == (None, None, None)
    _hot.hot_files.clear()


def test_a_head_of_a_hot_file_gives_a_decided() -> None:
    fs = _fs()
    with answer(req("GET"), POLICY, fs):  # read into the hot-file cache
        pass
    with answer(req("HEAD"), POLICY, fs) as head:
        assert head.entry is not None
        assert head.decided is not None
        assert (head.decided.path, head.decided.small) == ("/srv/a.txt", True)
    _hot.hot_files.clear()


def test_a_hot_entry_keeps_each_doors_rendering_per_precompressed_setting() -> None:
    """The core's fields for a plain 200 are memoised on the entry's rendering for the policy's
    ``precompressed`` setting only (the other setting's fields differ: no ``Vary``); each door's
    slot starts empty and is its own."""
    fs = _fs()
    with respond(req(), Located("/srv/a.txt"), POLICY, fs):  # fills the cache
        pass
    got = _resolve(fs, req())
    assert isinstance(got, Answer)
    assert got.entry is not None
    entry = got.entry
    assert entry.rendering(True) is not entry.rendering(False)
    assert entry.rendering(POLICY.precompressed).fields == got.fields
    assert entry.rendering(not POLICY.precompressed).fields is None
    plain = DirectoryPolicy(ROOT, precompressed=not POLICY.precompressed)
    other = _resolve(fs, req(), plain)
    assert isinstance(other, Answer)
    assert other.entry is entry
    assert ("Vary", "Accept-Encoding") in got.fields
    assert ("Vary", "Accept-Encoding") not in other.fields  # not the other setting's fields
    assert entry.rendering(plain.precompressed).fields == other.fields
    for rendering in (entry.rendering(True), entry.rendering(False)):
        assert rendering.headers is None


def test_respond_hot_cache_off() -> None:
    fs = _fs()
    with _respond(fs, req(), DirectoryPolicy(ROOT, hot_cache=False)) as a:
        assert isinstance(a.body, FileRange)
    assert _hot.hot_files._entries == {}


def etag_fields(size: int, *more: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        ("Etag", etag(size)),
        ("Last-Modified", LM),
        ("Accept-Ranges", "bytes"),
        ("Vary", "Accept-Encoding"),
        *more,
    ]


N = len(BIG)
OCTETS = ("Content-Type", "application/octet-stream")
RESPONDS: list[tuple[str, list[tuple[str, str]], int, list[tuple[str, str]], int | None, bytes | None]] = [
    # method, headers, status, fields, length, body (None: headers only)
    ("HEAD", [], 200, etag_fields(N, OCTETS), N, None),
    ("GET", [("If-None-Match", etag(N))], 304, etag_fields(N), None, None),
    ("HEAD", [("If-None-Match", "*")], 304, etag_fields(N), None, None),
    ("GET", [("If-Modified-Since", "Fri, 01 Jan 2100 00:00:00 GMT")], 304, etag_fields(N), None, None),
    ("GET", [("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")], 200, etag_fields(N, OCTETS), N, BIG),
    ("GET", [("If-Match", '"x"')], 412, etag_fields(N), 0, None),
    ("GET", [("If-Unmodified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")], 412, etag_fields(N), 0, None),
    ("GET", [("Range", "bytes=999999-")], 416, etag_fields(N, ("Content-Range", f"bytes */{N}")), 0, None),
    (
        "GET",
        [("Range", "bytes=10-19")],
        206,
        etag_fields(N, OCTETS, ("Content-Range", f"bytes 10-19/{N}")),
        10,
        BIG[10:20],
    ),
    (
        "GET",
        [("Range", "bytes=-5")],
        206,
        etag_fields(N, OCTETS, ("Content-Range", f"bytes {N - 5}-{N - 1}/{N}")),
        5,
        BIG[-5:],
    ),
    ("GET", [("Range", "bytes=x")], 416, etag_fields(N, ("Content-Range", f"bytes */{N}")), 0, None),
    ("GET", [("Range", "items=0-1")], 200, etag_fields(N, OCTETS), N, BIG),  # another unit: ignored
    # If-Range that fails: the Range is ignored, however invalid
    ("GET", [("Range", "bytes=x"), ("If-Range", '"other"')], 200, etag_fields(N, OCTETS), N, BIG),
    ("HEAD", [("Range", "bytes=0-1")], 200, etag_fields(N, OCTETS), N, None),  # ranges are GET's
    ("GET", [("Range", "bytes=5-9"), ("If-Range", '"other"')], 200, etag_fields(N, OCTETS), N, BIG),
    (
        "GET",
        [("Range", "bytes=5-9"), ("If-Range", etag(N))],
        206,
        etag_fields(N, OCTETS, ("Content-Range", f"bytes 5-9/{N}")),
        5,
        BIG[5:10],
    ),
    (
        "GET",
        [("Range", "bytes=5-9"), ("If-Range", LM)],
        206,
        etag_fields(N, OCTETS, ("Content-Range", f"bytes 5-9/{N}")),
        5,
        BIG[5:10],
    ),
]


@pytest.mark.parametrize(("method", "headers", "status", "fields", "length", "body"), RESPONDS)
def test_respond_table(
    method: str,
    headers: list[tuple[str, str]],
    status: int,
    fields: list[tuple[str, str]],
    length: int | None,
    body: bytes | None,
) -> None:
    fs = _fs()
    a = _respond(fs, req(method, b"/big.bin", *headers))
    with a:
        assert (a.status, a.fields, a.length) == (status, fields, length)
        assert a.head_only == (body is None)
        if body is None:
            assert (a.body, a.fd) == (None, None)
            assert fs.open_fds == {}  # closed already
        else:
            assert fs.read(a.body) == body
    assert fs.open_fds == {}


def test_respond_multipart_from_an_fd_and_from_cached_bytes() -> None:
    fs = _fs()
    for target, data in [(b"/big.bin", BIG), (b"/a.txt", b"hello world")]:
        size = len(data)
        with _respond(fs, req("GET", target, ("Range", "bytes=0-0,5-6"))) as a:
            assert a.status == 206
            content_type = dict(a.fields)["Content-Type"]
            assert content_type.startswith("multipart/byteranges; boundary=")
            boundary = content_type.split("=")[1]
            assert len(boundary) == 32
            assert isinstance(a.body, Multipart)
            source = a.body.source
            assert source == (a.fd if size > 65536 else data)
            whole = (
                b"".join(
                    head
                    + (
                        fs.read(FileRange(source, r.start, r.length))
                        if isinstance(source, int)
                        else source[r.start : r.stop]
                    )
                    for head, r in a.body.parts
                )
                + a.body.closing
            )
            assert a.length == len(whole)
            assert whole.startswith(f"\r\n--{boundary}\r\n".encode())
            assert f"Content-Range: bytes 5-6/{size}".encode() in whole
    assert fs.open_fds == {}


def test_respond_ranges_off_and_a_caller_content_type() -> None:
    fs = _fs()
    with _respond(
        fs, req("GET", b"/big.bin", ("Range", "bytes=0-1"), ranges_ok=False, content_type="x/y")
    ) as a:
        assert (a.status, a.length, dict(a.fields)["Content-Type"]) == (200, N, "x/y")


def test_respond_empty_file_sends_headers_only() -> None:
    fs = FakeFS({"e.txt": b""})
    with _respond(fs, req("GET", b"/e.txt")) as a:
        assert (a.status, a.length, a.head_only, a.body) == (200, 0, True, None)
    with _respond(fs, req("GET", b"/e.txt", ("Range", "bytes=0-"))) as a:
        assert (a.status, a.length, dict(a.fields)["Content-Range"]) == (416, 0, "bytes */0")
    assert fs.open_fds == {}


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (PermissionError(errno.EACCES, "no"), 403),
        (OSError(errno.ENXIO, "a socket"), 403),
        (NotRegular("fifo"), 403),
        (FileNotFoundError(errno.ENOENT, "gone"), 404),
        (OSError(errno.ELOOP, "loop"), 404),
        (OutsideRoot("escaped"), 404),
    ],
)
def test_respond_open_failures_are_empty_errors(exc: Exception, status: int) -> None:
    fs = _fs()
    fs.open_errors["/srv/a.txt"] = exc
    a = _respond(fs, req())
    assert (a.status, a.fields, a.length, a.head_only, a.body) == (status, [], 0, True, None)


def test_respond_checks_containment_on_open() -> None:
    fs = _fs()
    fs.real["/srv/a.txt"] = "/elsewhere/a.txt"  # a symlink swapped in after the stat
    assert _respond(fs, req()).status == 404
    with _respond(fs, req(), DirectoryPolicy(ROOT, follow_symlinks=True)) as a:
        assert a.status == 200


@pytest.mark.parametrize(
    ("accept", "encoding", "body"),
    [
        ("gzip, br", "br", b"BR"),
        ("gzip", "gzip", b"GZ"),
        ("br;q=0.5, gzip", "gzip", b"GZ"),
        ("identity", None, b"x" * 300),
        ("gzip;q=0, br;q=0", None, b"x" * 300),
        ("", None, b"x" * 300),
    ],
)
def test_respond_precompressed_siblings(accept: str, encoding: str | None, body: bytes) -> None:
    fs = FakeFS({"app.js": b"x" * 300, "app.js.gz": b"GZ", "app.js.br": b"BR"})
    headers = [("Accept-Encoding", accept)] if accept else []
    with _respond(fs, req("GET", b"/app.js", *headers)) as a:
        assert (a.status, a.encoding, fs.read(a.body), a.length) == (200, encoding, body, len(body))
        fields = dict(a.fields)
        assert fields.get("Content-Encoding") == encoding
        assert fields["Content-Type"] == "text/javascript"  # the file's type, not the sibling's
        assert fields["Etag"] == etag(len(body))
        assert fields["Vary"] == "Accept-Encoding"


@pytest.mark.parametrize(
    "failure",
    [PermissionError(errno.EACCES, "no"), OutsideRoot("escaped"), NotRegular("a directory now")],
)
def test_respond_a_sibling_that_cannot_be_opened_counts_as_absent(failure: Exception) -> None:
    fs = FakeFS({"app.js": b"x" * 300, "app.js.gz": b"GZ", "app.js.br": b"BR"})
    fs.open_errors["/srv/app.js.br"] = failure
    with _respond(fs, req("GET", b"/app.js", ("Accept-Encoding", "br"))) as a:
        assert (a.status, a.encoding, fs.read(a.body)) == (200, None, b"x" * 300)
        assert "Content-Encoding" not in dict(a.fields)


def test_respond_without_a_root_refuses_symlinked_siblings_and_without_precompressed_sends_no_vary() -> None:
    fs = FakeFS({"app.js": b"x" * 300, "app.js.gz": b"GZ"})
    lone = DirectoryPolicy(None)
    with respond(req("GET", b"", ("Accept-Encoding", "gzip")), Located("/srv/app.js"), lone, fs) as a:
        assert a.encoding == "gzip"
    assert ("open_nofollow", "/srv/app.js.gz") in fs.calls
    plain = DirectoryPolicy(ROOT, precompressed=False)
    with respond(req("GET", b"", ("Accept-Encoding", "gzip")), Located("/srv/app.js"), plain, fs) as a:
        assert a.encoding is None
        assert "Vary" not in dict(a.fields)


def test_answer_composes_the_three_steps() -> None:
    fs = _fs()
    assert answer(req("DELETE"), POLICY, fs).status == 405
    assert answer(req("GET", b"/sub"), POLICY, fs).status == 301
    with answer(req("GET", b"/big.bin", ("Range", "bytes=1-2")), POLICY, fs) as a:
        assert (a.status, fs.read(a.body)) == (206, BIG[1:3])
    assert fs.open_fds == {}


def test_bytes_headers_keep_only_what_the_core_reads() -> None:
    h = BytesHeaders(
        [(b"Range", b"bytes=0-1"), (b"If-None-Match", b'"a"'), (b"if-none-match", b'"b"'), (b"X-Other", b"1")]
    )
    assert "range" in h
    assert "RANGE" in h
    assert "X-Other" not in h
    assert h.get("Range") == "bytes=0-1"
    assert list(h.getall("If-None-Match")) == ['"a"', '"b"']
    assert h.get("Accept-Encoding") is None
    assert list(h.getall("Accept-Encoding", ())) == []
    wanted = {b"range", b"if-range", b"if-match", b"if-none-match", b"if-modified-since"}
    assert wanted | {b"if-unmodified-since", b"accept-encoding", b"accept"} == h.WANTED
    # Accept is kept only when it names JSON (a listing's only use of it): */* is no field
    assert "Accept" not in BytesHeaders([(b"Accept", b"*/*")])
    assert not BytesHeaders([(b"Accept", b"text/html,*/*;q=0.8")])
    assert BytesHeaders([(b"accept", b"Application/JSON")]).get("Accept") == "Application/JSON"
    # Both If-None-Match lines count (RFC 9110 list field)
    assert _http.evaluate_preconditions("GET", h, '"b"', 0) == 304


def test_hot_files_is_safe_across_threads() -> None:
    cache = _hot.HotFiles(max_entries=8, max_bytes=16 * 1024)
    sts = [_st(stat.S_IFREG, 10, ino) for ino in range(32)]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(2000):
                n = (i * 7 + seed) % 32
                cache.put(f"/f{n}", None, sts[n], b"x" * 10)
                cache.entry(f"/f{(n + 3) % 32}", None, sts[(n + 3) % 32])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cache._entries) <= 8
    held = cache._entries.values()
    assert cache._bytes == sum(len(e.body) + len(e.path) + _hot.ENTRY_OVERHEAD for e in held)


# -- structure --------------------------------------------------------------------------------

_PURE_OS = {"fsdecode", "fsencode", "fspath", "path", "path.join", "path.basename", "sep"}


def _modules() -> list[Path]:
    return sorted(Path(aiosendfile._static.__file__).parent.glob("*.py"))


def test_static_core_imports_no_io_framework() -> None:
    for module in _modules():
        tree = ast.parse(module.read_text())
        imported = {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        for banned in ("asyncio", "aiohttp", "socket", "multidict", "yarl"):
            assert not any(name == banned or name.startswith(banned + ".") for name in imported), (
                module,
                banned,
            )


def test_only_fs_touches_the_file_system() -> None:
    for module in _modules():
        tree = ast.parse(module.read_text())
        uses = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                dotted = ast.unparse(node)
                if dotted.startswith("os."):
                    uses.add(dotted[3:])
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                uses.add("open()")
            if isinstance(node, ast.ImportFrom) and node.module in (
                "os",
                "os.path",
                "shutil",
                "pathlib",
                "io",
            ):
                uses.add(f"from {node.module} import")
        uses = {u for u in uses if not u.startswith("stat_result")}
        if module.name == "_fs.py":
            assert {"open", "fstat", "stat", "scandir", "readlink", "close"} <= uses
        else:
            assert uses <= _PURE_OS, (module.name, uses - _PURE_OS)


def test_core_module_has_the_contract_names() -> None:
    assert set(_core.__all__) >= {"route", "resolve", "respond", "answer", "Located"}


# -- the core on a real tree, against the plugin's recorded answers ----------------------------


def _request_of(raw: bytes) -> Request:
    head = raw.partition(b"\r\n\r\n")[0].split(b"\r\n")
    method, target, _ = head[0].split(b" ")
    path, _, query = target.partition(b"?")
    pairs = [(name.strip(), value.strip()) for name, _, value in (line.partition(b":") for line in head[1:])]
    return Request(method.decode(), path, query, BytesHeaders(pairs))


def _rendered(a: Answer) -> bytes:
    """The answer as a plain renderer would send it (aiohttp's field order; Connection: close)."""
    lines = [f"HTTP/1.1 {a.status} -", *(f"{k}: {v}" for k, v in a.fields)]
    if a.length is not None:
        lines.append(f"Content-Length: {a.length}")
    lines.append("Connection: close")
    body = b""
    with a:
        if not a.head_only:
            if isinstance(a.body, bytes):
                body = a.body
            elif isinstance(a.body, FileRange):
                body = os.pread(a.body.fd, a.body.length, a.body.start)
            elif isinstance(a.body, Multipart):
                source = a.body.source
                for head, r in a.body.parts:
                    data = (
                        source[r.start : r.stop]
                        if isinstance(source, bytes)
                        else os.pread(source, r.length, r.start)
                    )
                    body += head + data
                body += a.body.closing
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


def _golden_cases(tmp_path: Path) -> Iterator[tuple[str, str, DirectoryPolicy, Request, dict[str, Any]]]:
    """(policy name, case, policy, request, the golden table's answer) for every recorded case,
    on the fixture tree built in *tmp_path*."""
    import json

    from ..support.static_requests import GOLDEN_PATH, KNOWN_DIFFERENCES, POLICIES, build_tree, requests

    table = json.loads(GOLDEN_PATH.read_text())["server"]
    public = os.path.realpath(build_tree(tmp_path))
    for name, kwargs in POLICIES.items():
        policy = DirectoryPolicy(
            public,
            listings=kwargs.get("show_index", False),
            dotfiles=kwargs.get("show_dotfiles", False),
            follow_symlinks=kwargs.get("follow_symlinks", False),
        )
        for case, raw in requests(name):
            if case not in KNOWN_DIFFERENCES:
                yield name, case, policy, _request_of(raw), dict(table[name][case])


def _assert_golden(ans: Answer, expected: dict[str, Any], where: tuple[str, str]) -> None:
    from ..support.static_requests import normalise

    got = normalise(_rendered(ans))
    got["status"], expected["status"] = got["status"].split()[1], expected["status"].split()[1]
    assert got == expected, where


def test_answer_on_a_real_tree_matches_the_plugins_recorded_answers(tmp_path: Path) -> None:
    """``answer()`` with the real file system gives what the plugin on ``web.Server`` gave, byte
    for byte (status code, fields in order, length, body): the native door's starting point."""
    from aiosendfile._static._fs import POOL_FS

    for name, case, policy, request, expected in _golden_cases(tmp_path):
        _assert_golden(answer(request, policy, POOL_FS), expected, (name, case))  # (listings too)


def _opens_cached() -> bool:
    """Whether ``openat2`` with ``RESOLVE_CACHED`` works here (the probe's descriptor closed)."""
    fd = _platform.open_cached("/")
    if fd is not None and fd >= 0:
        os.close(fd)
    return fd is not None


@pytest.mark.skipif(not _opens_cached(), reason="no openat2(RESOLVE_CACHED) here")
def test_a_file_the_door_opened_at_first_sight_is_decided_as_the_golden_table_says(tmp_path: Path) -> None:
    """The engine's first sight: ``_fs.open_cached`` opens the routed path (no disk read, no
    symlink crossed) and ``decide(..., opened=)`` takes that descriptor instead of its own
    ``stat``, open and containment check. The answers are the golden table's, byte for byte, and
    no descriptor is left open whatever the answer (a HEAD, a 304, a range, a sibling chosen, a
    hot-file cache hit: used by the answer, or closed)."""
    from aiosendfile._static._fs import POOL_FS, open_cached

    fds = len(os.listdir("/proc/self/fd"))
    opened_once = 0
    for name, case, policy, request, expected in _golden_cases(tmp_path):
        path = route(request, policy)
        opened = None
        if isinstance(path, str):
            with contextlib.suppress(OSError):
                os.stat(path)  # (its dentries cached, as a door's pool lookup leaves them)
            found = open_cached(path)
            if isinstance(found, tuple):
                opened = found
                opened_once += 1
        ans = path if isinstance(path, Answer) else _core.decide(request, path, policy, POOL_FS, opened)
        _assert_golden(ans, expected, (name, case))
    assert opened_once > 50  # (most cases are files: they took the opened path)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_symlink_on_the_way_is_never_opened_at_first_sight(tmp_path: Path) -> None:
    """``open_cached`` crosses no symlink (one could lead out of the root): the door decides such
    a path as before, with the containment check."""
    from aiosendfile._static._fs import open_cached

    (tmp_path / "real.txt").write_bytes(b"x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dirlink").symlink_to(tmp_path / "dir")
    (tmp_path / "dir" / "in.txt").write_bytes(b"y")
    for name in ("real.txt", "link.txt", "dir", "dirlink/in.txt", "dir/in.txt", "missing"):
        with contextlib.suppress(OSError):
            os.stat(tmp_path / name)
    found = open_cached(str(tmp_path / "real.txt"))
    if found is None:
        pytest.skip("no openat2(RESOLVE_CACHED) here")
    assert isinstance(found, tuple)
    fd, st = found
    try:
        assert st.st_ino == os.stat(tmp_path / "real.txt").st_ino
        assert os.get_blocking(fd)
    finally:
        os.close(fd)
    assert open_cached(str(tmp_path / "link.txt")) is None
    assert open_cached(str(tmp_path / "dirlink" / "in.txt")) is None
    assert open_cached(str(tmp_path / "dir")) is True  # a directory: decided as usual
    assert open_cached(str(tmp_path / "missing")) is True  # a negative dentry: no disk to wait for
    assert open_cached(str(tmp_path / "never-looked-up")) is False
    found = open_cached(str(tmp_path / "dir" / "in.txt"))
    assert isinstance(found, tuple)
    os.close(found[0])


# -- the real file systems --------------------------------------------------------------------------


def test_pool_fs_reads_a_small_body_whether_cached_or_not(tmp_path: Path) -> None:
    """A decision in the pool reads the body itself (REAL_FS would answer None for cold pages)."""
    from aiosendfile._static._fs import POOL_FS

    path = tmp_path / "a.bin"
    path.write_bytes(BIG[:50_000])
    fd = os.open(path, os.O_RDONLY)
    try:
        assert POOL_FS.read_cached(fd, 50_000) == BIG[:50_000]
        assert POOL_FS.read_cached(fd, 60_000) == BIG[:50_000]  # shrank: a short read, seen by the caller
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "name",
    ["a.txt", "A.TXT", "x.tar.gz", "a.svgz", "a..b.htm", ".rc", "..x", "noext", "a.b.JSON", "data:x.html"],
)
def test_content_type_memo_by_extension_answers_as_mimetypes(name: str) -> None:
    from aiosendfile._static._mime import content_type_for

    assert _core._content_type(name) == content_type_for(name)


def test_real_fs_remembers_a_checked_file_but_not_a_swapped_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second open of a file by the same path skips the /proc readlink; a symlink swapped in
    at that path (another inode) is checked again and refused."""
    from aiosendfile._static import _fs

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "a.txt").write_bytes(b"in")
    (outside / "secret").write_bytes(b"out")
    links: list[str] = []
    readlink = os.readlink
    monkeypatch.setattr(os, "readlink", lambda p: links.append(p) or readlink(p))
    fs = _fs.RealFS()
    for _ in range(3):
        fd, _st = fs.open_regular(str(root / "a.txt"), str(root), False)
        os.close(fd)
    assert len(links) == 1
    (root / "a.txt").unlink()
    (root / "a.txt").symlink_to(outside / "secret")
    with pytest.raises(OutsideRoot):
        fs.open_regular(str(root / "a.txt"), str(root), False)
    assert len(links) == 2


def test_a_file_found_inside_by_the_pool_is_not_checked_again_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's file system (first sights) and the loop's share what they found inside the root."""
    from aiosendfile._static import _fs

    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_bytes(b"in")
    links: list[str] = []
    readlink = os.readlink
    monkeypatch.setattr(os, "readlink", lambda p: links.append(p) or readlink(p))
    for fs in (_fs.POOL_FS, _fs.REAL_FS):
        fd, _st = fs.open_regular(str(root / "a.txt"), str(root), False)
        os.close(fd)
    assert len(links) == 1


def test_a_policy_reads_the_type_tables_when_made_not_at_the_first_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mimetypes`` reads ``/etc/mime.types`` at its first guess (2.5 ms with the loop held): a door
    pays it when its policy is made, so the first answer of a served directory does not."""
    import mimetypes

    from aiosendfile._static import _mime

    (tmp_path / "a.css").write_text("a {}")
    monkeypatch.setattr(mimetypes, "inited", False)
    _mime.content_type_for.cache_clear()
    reads: list[str] = []
    real_init = mimetypes.init

    def init(files: Any = None) -> None:
        reads.append("init")
        real_init(files)

    monkeypatch.setattr(mimetypes, "init", init)
    policy = DirectoryPolicy(str(tmp_path))
    made = len(reads)
    ans = answer(Request("GET", b"/a.css", b"", BytesHeaders([])), policy)
    ans.close()
    assert made == 1
    assert len(reads) == 1  # none at the answer
    assert ("content-type", "text/css") in [(k.lower(), v.split(";")[0]) for k, v in ans.fields]
