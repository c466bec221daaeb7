"""The IO-free static core (``aiosendfile._static``): route and resolve against a fake file system
(``tests/support/fake_fs.py``), and its structure.

Tables of requests and file-system states go in; the Answer or the located file comes out, with no
disk, socket or loop; ``test_static_respond.py`` holds what ``respond`` makes of a located file.
Each decision is checked on its own, including the ones a real tree makes hard to reach. Last, a
structural test: nothing in ``_static`` imports asyncio, aiohttp or socket, and only ``_fs`` calls
the file system.
"""

from __future__ import annotations

import ast
import errno
import stat
from pathlib import Path
from typing import Any

import pytest

import aiosendfile._static
from aiosendfile._static import _core, _listing
from aiosendfile._static._answer import Answer
from aiosendfile._static._core import Located, respond, route
from aiosendfile._static._policy import DirectoryPolicy
from aiosendfile._static._request import Request

from ..support.fake_fs import (
    LM,
    MTIME_NS,
    POLICY,
    ROOT,
    etag,
    req,
    route_and_resolve,
    sample_fs,
    stat_result,
)

pytestmark = pytest.mark.usefixtures("fresh_caches")


def _dotfile_rule(filename: str) -> bool:
    """The dotfile rule read plainly: a component starting with "." (not "." alone) is refused,
    but for a leading ``.well-known``."""
    parts = filename.split("/")
    if parts[0] == ".well-known":
        parts = parts[1:]
    return not any(part.startswith(".") and part != "." for part in parts)


def test_the_dotfile_check_is_the_rule_read_plainly() -> None:
    """``_paths.checked`` (a search in C) agrees with the rule read plainly on every name made of
    these pieces, up to four components."""
    import itertools

    from aiosendfile._static._paths import checked

    pieces = ["", ".", "a", ".a", "a.", ".well-known", ".well-knownx", "well-known", "x.y", "..."]
    pieces += [".upload-1", "a.upload-1", ".UPLOAD-state"]
    for n in range(1, 5):
        for parts in itertools.product(pieces, repeat=n):
            name = "/".join(parts)
            if name.startswith("/") or ".." in name.split("/"):
                continue  # (refused before the dotfile rule)
            assert checked(name, dotfiles=False) is _dotfile_rule(name), name
            # (.upload-*: serve's uploads in progress, never looked up)
            reserved = any(part.lower().startswith(".upload-") for part in parts)
            assert checked(name, dotfiles=True) is not reserved, name


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
    got = route_and_resolve(sample_fs(), req("GET", target))
    assert isinstance(got, Answer)
    assert (got.status, got.fields) == (status, [("Content-Type", "text/plain; charset=utf-8"), *extra])


def test_resolve_stat_refused_is_403() -> None:
    fs = sample_fs()
    fs.stat_errors["/srv/a.txt"] = PermissionError(errno.EACCES, "no")
    got = route_and_resolve(fs, req())
    assert isinstance(got, Answer)
    assert got.status == 403


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (FileNotFoundError(errno.ENOENT, "gone"), 404),
        (NotADirectoryError(errno.ENOTDIR, "a.txt/"), 404),
        (OSError(errno.ELOOP, "loop"), 404),
        (OSError(errno.ENAMETOOLONG, "long"), 404),
        (OSError(errno.EIO, "a damaged inode"), 500),
        (OSError(errno.ENOMEM, "memory"), 500),
        (OSError(errno.EMFILE, "descriptors"), 500),
    ],
)
def test_resolve_stat_failures_say_whose_trouble_it_is(exc: OSError, status: int) -> None:
    """Only a name that holds no file is 404 (which a cache in front may keep); the server's own
    trouble is 500, as nginx."""
    fs = sample_fs()
    fs.stat_errors["/srv/a.txt"] = exc
    got = route_and_resolve(fs, req())
    assert isinstance(got, Answer)
    assert got.status == status


def test_resolve_301_keeps_the_prefix_and_the_encoded_path() -> None:
    fs = sample_fs()
    fs.dirs.add("/srv/a b")
    r = req("GET", b"/static/a%20b?q=%2F", prefix="/static")
    got = route_and_resolve(fs, r)
    assert isinstance(got, Answer)
    assert ("Location", "/static/a%20b/?q=%2F") in got.fields


def test_resolve_directory_slash_may_be_encoded() -> None:
    got = route_and_resolve(sample_fs(), req("GET", b"/sub%2F"))
    assert isinstance(got, Answer)
    assert got.status == 403  # no redirect: it ends with a slash once decoded


def test_resolve_directory_index_and_symlinked_dirs_when_following() -> None:
    fs = sample_fs()
    assert route_and_resolve(fs, req("GET", b"/withindex/")) == Located("/srv/withindex/index.html")
    got = route_and_resolve(fs, req("GET", b"/out/"), DirectoryPolicy(ROOT, follow_symlinks=True))
    assert isinstance(got, Answer)
    assert got.status == 403  # followed: then no index, no listing


def test_resolve_listing() -> None:
    fs = sample_fs()
    policy = DirectoryPolicy(ROOT, listings=True)
    got = route_and_resolve(fs, req("GET", b"/sub/"), policy)
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
    head = route_and_resolve(fs, req("HEAD", b"/sub/"), policy)
    assert isinstance(head, Answer)
    assert (head.head_only, head.body, head.length) == (True, got.body, got.length)
    root = route_and_resolve(fs, req("GET", b"/"), policy)
    assert isinstance(root, Answer)
    assert isinstance(root.body, bytes)
    assert b'href="../"' not in root.body


def test_a_listing_is_built_once_then_served_while_its_directory_is_unchanged() -> None:
    """The page is kept (``_listing.listings``) and served again without a scan while the
    directory's stat is the same and it is younger than LISTING_SECONDS; a new entry (the
    directory's mtime moves) or age builds it again."""
    fs = sample_fs()
    policy = DirectoryPolicy(ROOT, listings=True)
    first = route_and_resolve(fs, req("GET", b"/sub/"), policy)
    assert ("scan", f"{ROOT}/sub") in fs.calls
    fs.calls.clear()
    again = route_and_resolve(fs, req("GET", b"/sub/"), policy)
    assert isinstance(first, Answer)
    assert isinstance(again, Answer)
    assert again.body is first.body
    assert not any(call[0] == "scan" for call in fs.calls)
    other = route_and_resolve(fs, req("GET", b"/sub/"), DirectoryPolicy(ROOT, listings=True, dotfiles=True))
    assert isinstance(other, Answer)
    assert other.body != first.body  # (another policy: another page)
    fs.mtimes[f"{ROOT}/sub"] = MTIME_NS + 10**9  # an entry came or went
    fs.calls.clear()
    route_and_resolve(fs, req("GET", b"/sub/"), policy)
    assert ("scan", f"{ROOT}/sub") in fs.calls


def test_listings_are_bounded_by_entries_and_bytes() -> None:
    """Keys (the request's path) and pages both count: 1,000 directories under 4 KB spellings."""
    cache = _listing.Listings(max_entries=16, max_bytes=64 * 1024)
    st = stat_result(stat.S_IFDIR | 0o755, 4096, 7)
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
    fs = sample_fs()
    got = route_and_resolve(fs, req())
    assert isinstance(got, Located)
    assert (got.path, got.st.st_size if got.st else None, got.siblings) == ("/srv/a.txt", 11, None)
    assert fs.calls == [("stat", "/srv/a.txt")]


def test_resolve_answers_a_hot_plain_request_from_the_cache() -> None:
    fs = sample_fs()
    with respond(req(), Located("/srv/a.txt"), POLICY, fs):  # fills the cache
        pass
    fs.calls.clear()
    got = route_and_resolve(fs, req())
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
    head = route_and_resolve(fs, req("HEAD"))
    assert isinstance(head, Answer)
    assert (head.length, head.body, head.head_only, head.entry) == (11, b"hello world", True, got.entry)
    # Not plain: a range, a condition → the full path, which answers from the cache too
    for header in [("Range", "bytes=0-1"), ("If-None-Match", "*")]:
        assert isinstance(route_and_resolve(fs, req("GET", b"/a.txt", header)), Located)


def test_resolve_hands_the_siblings_it_looked_up_to_respond() -> None:
    fs = sample_fs()
    r = req("GET", b"/style.css", ("Accept-Encoding", "gzip, br"))
    with respond(req("GET", b"/style.css"), Located("/srv/style.css"), POLICY, fs):
        pass
    fs.calls.clear()
    got = route_and_resolve(fs, r)
    assert got == Located("/srv/style.css", fs.stat("/srv/style.css"), [("gzip", "/srv/style.css.gz")])
    assert isinstance(got, Located)
    fs.calls.clear()
    with respond(r, got, POLICY, fs) as a:
        assert (a.status, a.encoding, fs.read(a.body)) == (200, "gzip", b"GZ")
    assert ("is_file", "/srv/style.css.gz") not in fs.calls  # not looked up twice


# -- structure --------------------------------------------------------------------------------

_PURE_OS = {
    "fsdecode",
    "fsencode",
    "fspath",
    "path",
    "path.join",
    "path.basename",
    "path.dirname",
    "path.normpath",
    "sep",
}


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
        elif module.name == "_tree.py":  # (a folder's tree for an archive: the other door)
            assert {"open", "fstat", "scandir", "close"} <= uses  # (readlink: _fs._real_path_of)
        else:
            assert uses <= _PURE_OS, (module.name, uses - _PURE_OS)


def test_core_module_has_the_contract_names() -> None:
    assert set(_core.__all__) >= {"route", "resolve", "respond", "answer", "Located"}
