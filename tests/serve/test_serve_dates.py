"""A file's time as ``serve`` tells it: ``Last-Modified`` never later than the answer's ``Date``
(RFC 9110 8.8.2.1: a file dated in the future is sent with the time of the answer), and a time no
HTTP date can name (past the year 9999, as tmpfs keeps them) answered, not a 500. On both loops,
at first sight, from the caches, for ``HEAD``, a range, a conditional request and an archive."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest

from ..support.files import far_future_tree
from ..support.raw_http import read_response
from ..support.serve import close_writer, get, serve_site

pytest.importorskip("httptools")

DAY = 86400
PAST_9999 = 4 * 10**11  # (the year 14645)


def _seconds(value: str | None) -> float:
    assert value is not None
    return parsedate_to_datetime(value).timestamp()


async def _answers(root: Path, requests: list[bytes]) -> list[tuple[int, dict[str, str], bytes]]:
    async with serve_site(root, show_index=True, archives=True) as site:
        reader, writer = await site.open()
        try:
            out = []
            for request in requests:
                writer.write(request)
                method = request.split(b" ", 1)[0]
                r = await read_response(reader, method)
                out.append((r.status, {k: r.header(k) or "" for k in ("Date", "Last-Modified")}, r.body))
            return out
        finally:
            await close_writer(writer)


async def test_a_file_dated_in_the_future_is_never_said_modified_after_the_answer(tmp_path: Path) -> None:
    root = tmp_path / "www"
    root.mkdir()
    (root / "ahead.txt").write_bytes(b"from tomorrow")
    (root / "ahead.bin").write_bytes(os.urandom(100_000))  # (sent from its descriptor)
    for name in ("ahead.txt", "ahead.bin"):
        os.utime(root / name, (time.time(), time.time() + 30 * DAY))
    requests = [
        get("/ahead.txt"),  # first sight
        get("/ahead.txt"),  # from the caches
        get("/ahead.bin"),
        get("/ahead.bin"),
        get("/ahead.bin", method="HEAD"),
        get("/ahead.bin", "Range: bytes=10-19\r\n"),
    ]
    answers = await _answers(root, requests)
    assert [status for status, _, _ in answers] == [200, 200, 200, 200, 200, 206]
    for _, fields, _ in answers:
        assert _seconds(fields["Last-Modified"]) <= _seconds(fields["Date"])
    # The date sent says nothing of a file newer than it: asked with it, the file comes again.
    sent = answers[0][1]["Last-Modified"]
    (again,) = await _answers(root, [get("/ahead.txt", f"If-Modified-Since: {sent}\r\n")])
    assert again[0] == 200
    assert again[2] == b"from tomorrow"


def test_last_modified_is_the_file_time_or_the_second_before_now() -> None:
    """Truncated as the validators compare it; for a file dated later than *now*, the second
    before now (the doors' ``Date`` is a clock read once a second), and not kept (``settled``)."""
    from aiosendfile._static._http import last_modified, settled

    assert last_modified(1_000.7, 2_000.0) == 1_000
    assert settled(1_000.7, 2_000.0)
    assert last_modified(1_998.9, 2_000.0) == 1_998
    assert settled(1_998.9, 2_000.0)
    assert last_modified(1_999.5, 2_000.2) == 1_999
    assert settled(1_999.5, 2_000.2)
    assert last_modified(2_000.0, 2_000.0) == 2_000
    assert last_modified(2_000.5, 2_000.2) == 1_999
    assert not settled(2_000.5, 2_000.2)
    assert last_modified(5_000.2, 2_000.9) == 1_999
    assert not settled(5_000.2, 2_000.9)
    assert last_modified(-86_400.5, 2_000.0) == -86_400  # (before 1970: truncated, as int())
    assert last_modified(PAST_9999, 2_000.0) == 1_999


async def test_a_file_dated_ahead_is_not_kept_with_a_date_that_is_not_its_own(tmp_path: Path) -> None:
    """The answer of a file dated later than now carries the answer's time, which no cache keeps:
    once the clock has passed the file's time, the file's own date is sent (a kept head would
    have sent the old one for as long as it was kept)."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "soon.txt").write_bytes(b"soon")
    (root / "soon.bin").write_bytes(os.urandom(50_000))
    soon = time.time() + 1.2  # (in a later second than the first answers)
    for name in ("soon.txt", "soon.bin"):
        os.utime(root / name, (soon, soon))
    async with serve_site(root) as site:
        reader, writer = await site.open()
        try:
            dates = []
            for pause in (0, 0, 1.7, 0):
                await asyncio.sleep(pause)
                for name in ("soon.txt", "soon.bin"):
                    writer.write(get(f"/{name}"))
                    r = await read_response(reader)
                    assert r.status == 200
                    dates.append(_seconds(r.header("Last-Modified")))
        finally:
            await close_writer(writer)
    assert all(d < soon for d in dates[:4])  # (the second before the answer)
    assert dates[4:] == [float(int(soon))] * 4  # the file's own, replayed or not


async def test_a_file_dated_past_the_year_9999_is_answered() -> None:
    root = far_future_tree()  # (far.txt, dated in the year 11476)
    try:
        answers = await _answers(
            root,
            [get("/far.txt"), get("/far.txt"), get("/far.txt", method="HEAD"), get("/"), get("/?tar")],
        )
        assert [status for status, _, _ in answers] == [200] * 5
        assert answers[0][2] == answers[1][2] == b"x" * 100
        assert b"far.txt" in answers[3][2]
        for _, fields, _ in (*answers[:3], answers[4]):
            assert _seconds(fields["Last-Modified"]) <= _seconds(fields["Date"])
    finally:
        shutil.rmtree(root.parent)
