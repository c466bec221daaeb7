"""A plain ``GET``'s first sight on the engine (``_answering.first_plain``): the core's answer, byte
for byte, made without the core's objects; anything else still goes through the core.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from aiosendfile._serve._answering import first_plain
from aiosendfile._serve._render import file_head, head_of
from aiosendfile._static import _core, _hot
from aiosendfile._static._fs import directory_policy
from aiosendfile._static._request import Request

from ..support.files import far_future_tree
from ..support.raw_http import read_response
from ..support.serve import close_writer, engine, get, reported, serve_site, serving

pytest.importorskip("httptools")

NAMES = [
    "a.txt",
    "b.html",
    "c.svg",
    "no-extension",
    "e.tar.gz",
    "f.JS",
    "sp ace.css",
    "uni-\u00e9.json",
    "100%.txt",
    "x.unknown-type",
    "d.xhtml",
]
#: mtimes (ns): before 1970, the epoch, a fraction that rounds up as a float, now, 2100.
MTIMES = [-1_500_000_000, 0, 1_700_000_000_999_999_999, 1_764_000_000_123_456_789, 4_102_444_800 * 10**9]


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
@pytest.mark.parametrize("precompressed", [True, False], ids=["siblings", "no-siblings"])
def test_a_first_sights_head_is_the_cores_byte_for_byte(
    tmp_path: Path, sandbox: bool, precompressed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file_head`` against ``head_of`` of the core's answer for the same file: every type (and a
    sandboxed one under ``--upload``), odd names, sizes either side of the inline limit, mtimes
    before 1970, at a float's rounding edge and far ahead (whose date is the answer's: one clock
    for both, or a second may pass between them)."""
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)
    policy = directory_policy(tmp_path, precompressed=precompressed, hot_cache=False)
    for i, name in enumerate(NAMES):
        path = tmp_path / name
        path.write_bytes(b"x" * (1 + 37_000 * i))
        mtime = MTIMES[i % len(MTIMES)]
        os.utime(path, ns=(mtime, mtime))
        raw = b"/" + os.fsencode(name).replace(b"%", b"%25").replace(b" ", b"%20")
        answer = _core.answer(Request("GET", raw), policy)
        try:
            assert answer.status == 200
            expected = head_of(answer, sandbox)
        finally:
            answer.close()
        real = os.path.join(policy.root or "", name)
        assert file_head(real, os.stat(real), precompressed, sandbox) == expected, name


def decided_by_core(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    from aiosendfile._serve import _answering

    seen: list[bytes] = []
    real = _answering.decide_looked

    def decide_looked(request: Any, looked: Any, policy: Any) -> Any:
        seen.append(request.raw_path)
        return real(request, looked, policy)

    monkeypatch.setattr(_answering, "decide_looked", decide_looked)
    return seen


async def test_which_first_sights_are_made_without_the_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain GET of a regular file of a byte or more, looked up and opened at once: without the
    core (small, big, hot already); a HEAD, an empty file, a range, a directory: through it. The
    answers are the same either way (a second request, from the answer cache, is alike)."""
    core = decided_by_core(monkeypatch)
    async with serving(tmp_path) as site:
        (site.public / "empty").write_bytes(b"")
        reader, writer = await site.open()
        try:
            for target, extra, method in [
                ("/small.txt", "", "GET"),
                ("/big.bin", "", "GET"),
                ("/empty", "", "GET"),
                ("/sp%20ace.txt", "", "HEAD"),
                ("/a%2520b.txt", "Range: bytes=0-1\r\n", "GET"),
                ("/sub/", "", "GET"),
            ]:
                writer.write(get(target, extra, method))
                first = await read_response(reader, method)
                writer.write(get(target, extra, method))
                again = await read_response(reader, method)
                assert first.status == again.status
                assert first.body == again.body
                assert [f for f in first.headers.pairs if f[0] != "date"] == [
                    f for f in again.headers.pairs if f[0] != "date"
                ]
        finally:
            await close_writer(writer)
    assert set(core) == {b"/empty", b"/sp%20ace.txt", b"/a%2520b.txt", b"/sub/"}


@pytest.mark.parametrize("hot", ["in the hot cache", "admitted", "not admitted"])
async def test_a_small_files_first_sight_uses_the_hot_cache_as_the_core_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hot: str
) -> None:
    """Its bytes from the hot-file cache if there; else read in if the cache admits them (then
    kept there), else sent from the file; answered from the answer cache the next time."""
    if hot == "not admitted":
        monkeypatch.setattr(_hot.hot_files, "admits", lambda size: False)
    async with serving(tmp_path) as site:
        path = site.public / "small.txt"
        root = str(site.public.resolve())
        real = os.path.join(root, "small.txt")
        _hot.hot_files.clear()
        if hot == "in the hot cache":
            _hot.hot_files.put(real, root, _hot.identity(os.stat(real)), path.read_bytes())
        for _ in range(2):
            answer = await site.fetch(get("/small.txt", "Connection: close\r\n"))
            assert (answer.status, answer.body) == (200, path.read_bytes())
        kept = _hot.hot_files.body(real, root, _hot.identity(os.stat(real)))
        assert (kept is not None) == (hot != "not admitted")


def test_first_plain_is_what_decide_calls() -> None:
    """(The lean path is the engine's: ``decide`` reaches it by name.)"""
    from aiosendfile._serve import _answering

    assert _answering.first_plain is first_plain


async def test_a_browsers_first_sight_is_plain_where_no_sibling_could_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Accept-Encoding`` alone, and no name a ``.br``/``.gz`` sibling could have beside the file:
    made without the core and kept for browsers (with its folder); a sibling's name there (here a
    dangling symlink): through the core, its answer not kept."""
    core = decided_by_core(monkeypatch)
    browser = "Accept-Encoding: gzip, deflate, br, zstd\r\n"
    async with serving(tmp_path) as site:
        os.symlink(tmp_path / "nowhere.gz", site.public / "big.bin.gz")
        answers = engine_answers(site)
        for name in ("small.txt", "big.bin"):
            answer = await site.fetch(get("/" + name, browser + "Connection: close\r\n"))
            assert (answer.status, answer.body) == (200, (site.public / name).read_bytes())
        assert core == [b"/big.bin"]
        assert answers.get(b"/small.txt")[4] == str(site.public.resolve())
        assert b"/big.bin" not in answers


def engine_answers(site: Any) -> Any:
    from ..support.serve import engine

    return engine()._engines[site.server].answers


@pytest.mark.parametrize("size", [4_000, 40_000], ids=["read-max", "inline"])
async def test_a_cold_small_files_first_sight_probes_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A small file the hot-file cache admits, cold at its first sight: one ``RWF_NOWAIT`` read
    finds it so (the core's admission read, then a second probe, made two; and an ``fstat`` to
    learn the file's size, known a moment ago), and its sender waits for its pages with no probe
    of its own, and (with the page reader) none after them either: the reader's thread sends it;
    the answer is whole."""
    from aiosendfile import _platform

    from ..support.files import evict, pattern

    async with serving(tmp_path) as site:
        path = site.public / "cold.bin"
        path.write_bytes(pattern(size, seed=3))
        evict(path)
        _hot.hot_files.clear()
        reads: list[int] = []
        real = _platform.read_into_nowait

        def read_into_nowait(fd: int, buf: Any, offset: int, *rest: Any) -> Any:
            reads.append(offset)
            return real(fd, buf, offset, *rest)

        monkeypatch.setattr(_platform, "read_into_nowait", read_into_nowait)
        probes: list[int] = []
        real_range = _platform.range_cached

        def range_cached(fd: int, offset: int, size: int) -> Any:
            probes.append(offset)
            return real_range(fd, offset, size)

        monkeypatch.setattr(_platform, "range_cached", range_cached)
        fstats: list[int] = []
        real_fstat = os.fstat

        def fstat(fd: int) -> os.stat_result:
            fstats.append(fd)
            return real_fstat(fd)

        monkeypatch.setattr(os, "fstat", fstat)
        answer = await site.fetch(get("/cold.bin", "Connection: close\r\n"))
        assert (answer.status, answer.body) == (200, path.read_bytes())
        # one RWF_NOWAIT read at the first sight; without the reader, one look once the pages are
        # in (a read of the bytes, or the check of every page before the send); the admission
        # read made it one more
        after = 0 if engine()._engines[site.server].pages is not None else 1
        assert len(reads) + len(probes) == 1 + after, (reads, probes)
        # its own fstat as it is opened; none more to learn that its cold range is in the file
        assert len(fstats) == 1, fstats


async def test_a_file_whose_head_cannot_be_made_leaves_no_descriptor_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A head that cannot be made (a bug; once a modification time past the year 9999, which no
    HTTP date names, see test_serve_dates) is a 500, as the core's, and the descriptor its first
    sight opened is closed each time (it was left open: a client asking again and again ran the
    server out of descriptors)."""
    from aiosendfile._serve import _answering

    def broken(*args: Any, **kwargs: Any) -> bytes:
        raise ValueError("year 11476 is out of range")

    monkeypatch.setattr(_answering, "file_head", broken)
    root = far_future_tree()
    try:
        async with serve_site(root) as site:
            before = len(os.listdir("/proc/self/fd"))
            with reported() as reports:
                for _ in range(5):
                    answer = await site.fetch(get("/far.txt", "Connection: close\r\n"))
                    assert answer.status == 500
            assert len(os.listdir("/proc/self/fd")) <= before + 1
        assert {type(r.get("exception")) for r in reports} == {ValueError}
    finally:
        shutil.rmtree(root.parent)
