"""A browser's request (``Accept-Encoding`` its only field the core reads) on the engine, on raw
sockets, on both loops: kept in the answer cache and the heads memo as a plain one is, and never
answered from them once a pre-compressed sibling could answer it instead.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

from ..support.raw_http import all_responses, read_response
from ..support.serve import ServeSite, close_writer, engine, get, serving, watch_feeds

pytest.importorskip("httptools")

#: What Firefox sends (Chrome: ``gzip, deflate, br, zstd`` too).
BROWSER = "Accept-Encoding: gzip, deflate, br, zstd\r\n"
GZIP = b"\x1f\x8b pre-compressed"


def decisions(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The targets the core decides from now on (a request answered from the answer cache is not)."""
    from aiosendfile._serve import _answering

    decided: list[bytes] = []
    real = _answering.decide

    def decide(conn: Any, exchange: Any) -> None:
        decided.append(exchange.url)
        real(conn, exchange)

    monkeypatch.setattr(_answering, "decide", decide)
    return decided


async def ask(site: ServeSite, data: bytes, times: int = 1) -> list[Any]:
    reader, writer = await site.open()
    try:
        answers = []
        for _ in range(times):
            writer.write(data)
            answers.append(await read_response(reader))
        return answers
    finally:
        await close_writer(writer)


@pytest.mark.parametrize("name", ["small.txt", "big.bin", "sub/"])
async def test_a_browsers_request_is_decided_once_parsed_once_then_replayed(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Every browser sends ``Accept-Encoding``: with no sibling of the file's to choose, its request
    is answered from the answer cache after its first (and its head recognised by the heads memo),
    as a plain one is; before, each was decided and parsed afresh, at five times the CPU."""
    decided, fed = decisions(monkeypatch), watch_feeds(monkeypatch)
    request = get("/" + name, BROWSER)
    answers = await ask(www_site, request, times=3)
    file = www_site.public / (name + "index.html" if name.endswith("/") else name)
    for answer in answers:
        assert (answer.status, answer.body) == (200, file.read_bytes())
        assert answer.header("content-encoding") is None
        assert answer.header("vary") == "Accept-Encoding"
    assert decided == [b"/" + name.encode()]
    assert fed == [request]


def sibling_of(path: Path) -> Path:
    return path.with_name(path.name + ".gz")


def add_sibling(path: Path, how: str) -> None:
    """A ``.gz`` of *path* comes to be, *how*; one out of the root is named ``elsewhere.gz``."""
    sibling, elsewhere = sibling_of(path), path.parent.parent / "elsewhere.gz"
    if how == "written":
        sibling.write_bytes(GZIP)
    elif how == "renamed in":
        staged = path.parent.parent / "staged.gz"
        staged.write_bytes(GZIP)
        staged.replace(sibling)
    elif how == "linked":
        elsewhere.write_bytes(GZIP)
        sibling.symlink_to(elsewhere)
    else:  # "dangling link comes to life": the link was there before
        elsewhere.write_bytes(GZIP)


@pytest.mark.parametrize("name", ["small.txt", "big.bin"])
@pytest.mark.parametrize("how", ["written", "renamed in", "linked", "dangling link comes to life"])
async def test_a_sibling_that_appears_is_what_browsers_get_next(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, name: str, how: str
) -> None:
    """A ``.gz`` appearing beside a file kept for browsers is what the next browser gets (its
    directory changed); a plain request still gets the file, from the answer cache. A name a
    sibling could have, present in any form (a dangling symlink, which can come to life without
    its directory changing), keeps the file's answer out of the cache for browsers."""
    decided = decisions(monkeypatch)
    path = www_site.public / name
    dangling = how == "dangling link comes to life"
    if dangling:
        os.symlink(www_site.public.parent / "elsewhere.gz", sibling_of(path))
    browser, plain = get("/" + name, BROWSER), get("/" + name)
    for answer in await ask(www_site, browser, times=2):
        assert (answer.status, answer.body) == (200, path.read_bytes())
    assert decided == [b"/" + name.encode()] * (2 if dangling else 1)  # (never kept, if dangling)
    add_sibling(path, how)
    # (a symlink out of the root is not followed: no sibling then, the file itself)
    expected = path.read_bytes() if how in ("linked", "dangling link comes to life") else GZIP
    answer = (await ask(www_site, browser))[0]
    assert (answer.status, answer.body) == (200, expected)
    assert answer.header("content-encoding") == (None if expected != GZIP else "gzip")
    before = len(decided)
    answer = (await ask(www_site, plain))[0]
    assert (answer.status, answer.body) == (200, path.read_bytes())
    if not dangling:
        assert len(decided) == before  # (the plain request: from the cache still)


async def test_an_answer_kept_for_a_plain_request_is_not_a_browsers(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain request's answer is kept without a look at the siblings: a browser asking next is
    decided (and gets the sibling that appeared meanwhile); what it keeps serves both."""
    decided = decisions(monkeypatch)
    path = www_site.public / "small.txt"
    await ask(www_site, get("/small.txt"), times=2)
    assert decided == [b"/small.txt"]
    add_sibling(path, "written")
    answer = (await ask(www_site, get("/small.txt", BROWSER)))[0]
    assert (answer.body, answer.header("content-encoding")) == (GZIP, "gzip")
    os.unlink(sibling_of(path))
    for answer in await ask(www_site, get("/small.txt", BROWSER), times=2):
        assert (answer.body, answer.header("content-encoding")) == (path.read_bytes(), None)
    for answer in await ask(www_site, get("/small.txt"), times=2):
        assert answer.body == path.read_bytes()
    assert decided == [b"/small.txt"] * 3  # (the browser's last two and the plain ones: kept)


@pytest.mark.parametrize(
    "extra",
    [
        "Accept-Encoding: " + "gzip;q=0.5, " * 30 + "br\r\n",  # (over 256 bytes: no browser's)
        BROWSER + "Range: bytes=0-1\r\n",
        BROWSER + "Accept-Encoding: br\r\n",  # (twice)
        BROWSER + "If-None-Match: *\r\n",
    ],
    ids=["long", "range", "twice", "condition"],
)
async def test_what_is_not_a_browsers_plain_request_is_decided_each_time(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, extra: str
) -> None:
    decided, fed = decisions(monkeypatch), watch_feeds(monkeypatch)
    request = get("/small.txt", extra)
    await ask(www_site, request, times=2)
    assert decided == [b"/small.txt"] * 2
    assert fed == [request] * 2


async def test_what_a_browsers_answer_keeps_is_bounded_and_untracked(www_site: ServeSite) -> None:
    """The kept answer charges its folder's path, the memoised head its field; both stay tuples of
    atomic values, which the garbage collector stops tracking."""
    request = get("/small.txt", BROWSER)
    raw = await www_site.exchange(request[:-2] + b"Connection: close\r\n\r\n")
    assert all_responses(raw, ["GET"])[0].status == 200
    await ask(www_site, request)
    gc.collect()
    gc.collect()
    eng = engine()._engines[www_site.server]
    known = eng.answers.get(b"/small.txt")
    head = eng.heads.get(request)
    assert known is not None
    assert head is not None
    assert not gc.is_tracked(known)
    assert not gc.is_tracked(head)
    folder = str(www_site.public.resolve())
    assert known[4] == folder
    path = str(www_site.public.resolve() / "small.txt")
    assert eng.answers.size >= len(b"/small.txt") + len(path) + len(known[2]) + len(folder)


async def test_without_siblings_on_a_browsers_request_is_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine whose policy serves no pre-compressed siblings reads nothing of ``Accept-Encoding``:
    a browser's request is kept as a plain one, with no look at the directory."""
    from aiosendfile._serve import _server

    real = _server.directory_policy
    monkeypatch.setattr(_server, "directory_policy", lambda d, **kw: real(d, precompressed=False, **kw))
    decided = decisions(monkeypatch)
    async with serving(tmp_path) as site:
        add_sibling(site.public / "small.txt", "written")
        for answer in await ask(site, get("/small.txt", BROWSER), times=3):
            assert (answer.status, answer.header("content-encoding")) == (200, None)
            assert answer.header("vary") is None
        assert engine()._engines[site.server].answers.get(b"/small.txt")[4] is None
    assert decided == [b"/small.txt"]


@pytest.mark.parametrize("target", ["/", "/sub/"])
async def test_a_sibling_of_an_index_is_what_browsers_get_next(
    www_site: ServeSite, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    """The root's index too (``/`` routes to the root itself, not below it: the folder looked at
    was the root's parent, which a sibling appearing in the root does not change, and browsers
    kept the plain page)."""
    folder = www_site.public / target.strip("/")
    index = folder / "index.html"
    index.write_bytes(b"<p>index</p>")
    request = get(target, BROWSER)
    for answer in await ask(www_site, request, times=2):
        assert (answer.status, answer.body) == (200, index.read_bytes())
    add_sibling(index, "written")
    answer = (await ask(www_site, request))[0]
    assert (answer.status, answer.body, answer.header("content-encoding")) == (200, GZIP, "gzip")
