"""The IO-free static core's ``respond`` (``aiosendfile._static``) against a fake file system
(``tests/support/fake_fs.py``): the Answer (status, fields, length, body source) for each request
and file-system state, including the states a real tree makes hard to reach (a socket's ENXIO, a
file swapped between stat and open, a cold page cache).
"""

from __future__ import annotations

import errno
import stat
import threading

import pytest

from aiosendfile._static import _hot, _http
from aiosendfile._static._answer import Answer, FileRange, Multipart
from aiosendfile._static._core import Located, answer, resolve, respond, route
from aiosendfile._static._fs import NotRegular, OutsideRoot
from aiosendfile._static._policy import DirectoryPolicy
from aiosendfile._static._request import BytesHeaders, Request

from ..support.fake_fs import (
    BIG,
    LM,
    POLICY,
    ROOT,
    FakeFS,
    etag,
    req,
    route_and_resolve,
    sample_fs,
    stat_result,
)

pytestmark = pytest.mark.usefixtures("fresh_caches")


# -- respond ----------------------------------------------------------------------------------


def _respond(fs: FakeFS, r: Request, policy: DirectoryPolicy = POLICY) -> Answer:
    path = route(r, policy)
    assert isinstance(path, str)
    found = resolve(r, path, policy, fs)
    assert isinstance(found, Located), found
    return respond(r, found, policy, fs)


def test_respond_small_file_comes_back_as_bytes_and_fills_the_cache() -> None:
    fs = sample_fs()
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
    fs = sample_fs()
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
    fs = sample_fs()
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
    fs = sample_fs()
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
    fs = sample_fs()
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
    fs = sample_fs()
    with respond(req(), Located("/srv/a.txt"), POLICY, fs):  # fills the cache
        pass
    got = route_and_resolve(fs, req())
    assert isinstance(got, Answer)
    assert got.entry is not None
    entry = got.entry
    assert entry.rendering(True) is not entry.rendering(False)
    assert entry.rendering(POLICY.precompressed).fields == got.fields
    assert entry.rendering(not POLICY.precompressed).fields is None
    plain = DirectoryPolicy(ROOT, precompressed=not POLICY.precompressed)
    other = route_and_resolve(fs, req(), plain)
    assert isinstance(other, Answer)
    assert other.entry is entry
    assert ("Vary", "Accept-Encoding") in got.fields
    assert ("Vary", "Accept-Encoding") not in other.fields  # not the other setting's fields
    assert entry.rendering(plain.precompressed).fields == other.fields
    for rendering in (entry.rendering(True), entry.rendering(False)):
        assert rendering.headers is None


def test_respond_hot_cache_off() -> None:
    fs = sample_fs()
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
    fs = sample_fs()
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
    fs = sample_fs()
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
    fs = sample_fs()
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
        (OSError(errno.ENOTDIR, "not a folder"), 404),
        (OSError(errno.ENAMETOOLONG, "long"), 404),
        (OSError(errno.EXDEV, "beneath"), 404),
        (OutsideRoot("escaped"), 404),
        # The server's trouble, not a missing file (nginx: 500): a 404 would tell a cache in
        # front that an existing file is gone.
        (OSError(errno.EMFILE, "out of descriptors"), 500),
        (OSError(errno.ENFILE, "the system's out"), 500),
        (OSError(errno.EIO, "the disk"), 500),
        (OSError(errno.ENOMEM, "memory"), 500),
    ],
)
def test_respond_open_failures_are_empty_errors(exc: Exception, status: int) -> None:
    fs = sample_fs()
    fs.open_errors["/srv/a.txt"] = exc
    a = _respond(fs, req())
    assert (a.status, a.fields, a.length, a.head_only, a.body) == (status, [], 0, True, None)


def test_respond_checks_containment_on_open() -> None:
    fs = sample_fs()
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
    fs = sample_fs()
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
    sts = [stat_result(stat.S_IFREG, 10, ino) for ino in range(32)]
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
