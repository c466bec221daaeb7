"""The IO-free static core (``aiosendfile._static``) on a real tree: against the plugin's recorded
answers (``tests/data/static_golden.json``, pinned by ``test_static_golden.py``), and on the real
file systems (``_fs``: the loop's and the pool's).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import _lookup
from aiosendfile._static import _core
from aiosendfile._static._answer import Answer, FileRange, Multipart
from aiosendfile._static._core import answer, route
from aiosendfile._static._fs import OutsideRoot
from aiosendfile._static._policy import DirectoryPolicy
from aiosendfile._static._request import BytesHeaders, Request

from ..support.fake_fs import (
    BIG,
)

pytestmark = pytest.mark.usefixtures("fresh_caches")


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
    fd = _lookup.open_cached("/")
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
