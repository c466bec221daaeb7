"""``serve``'s folder archives (``GET /folder/?tar``), on both loops, over TCP, Unix sockets and
TLS: read back by ``tarfile`` (and by ``tar`` and ``bsdtar`` where installed) equal to the tree; a
cut download resumed with ``Range``/``If-Range`` is byte-identical to a whole one; a file that
shrinks while it is sent aborts the connection, one that grows is sent at its announced size; the
bounds answer 413; and the archive is there only where listings are. Clients in another process
too (``serve`` itself, fetched with ``urllib`` and ``curl``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..support.archives import tar_members, zip_members
from ..support.files import pattern
from ..support.raw_http import read_response, read_to_eof
from ..support.serve import ServeSite, close_writer, engine, serve_process, serve_site
from ..support.waiting import until, until_set

pytest.importorskip("httptools")

MiB = 1024 * 1024


@pytest.fixture(params=["tcp", "unix", "tls"])
def where(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
) -> dict[str, Any]:
    """``serve_site``'s keyword arguments for a TCP, Unix socket or TLS site."""
    if request.param == "tls":
        return {"server_ctx": tls_server_ctx, "client_ctx": tls_client_ctx}
    if request.param == "unix":
        return {"unix_path": str(tmp_path / "s.sock")}
    return {}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "public"
    top = root / "photos"
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "big.bin").write_bytes(pattern(3 * MiB + 17, seed=5))
    (top / "sub" / "b.bin").write_bytes(pattern(70_001, seed=6))
    (top / "sub" / "deeper" / "empty").write_bytes(b"")
    for i in range(40):
        (top / "sub" / f"small-{i:02}.txt").write_bytes(b"x" * i)
    (top / ("n" * 150 + ".txt")).write_bytes(b"long name")
    os.close(os.open(os.fsencode(top) + b"/latin-\xe9.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    (top / ".env").write_bytes(b"secret")
    (root / "index.html").write_bytes(b"<p>home</p>")
    return root


def tree_files(top: Path, name: str) -> dict[str, Any]:
    """What the archive of *top* holds, read from the tree: every file and folder but dotfiles."""
    out: dict[str, Any] = {name: None}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(top)):
        dirnames[:] = [d for d in dirnames if not d.startswith(b".")]
        rel = os.path.relpath(dirpath, os.fsencode(top))
        prefix = name if rel == b"." else f"{name}/{os.fsdecode(rel)}"
        for d in dirnames:
            out[f"{prefix}/{os.fsdecode(d)}"] = None
        for f in filenames:
            if not f.startswith(b"."):
                with open(os.path.join(dirpath, f), "rb") as fh:
                    out[f"{prefix}/{os.fsdecode(f)}"] = fh.read()
    return out


def append_to(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"appended meanwhile" * 1000)


def open_under(path: Path) -> int:
    """How many descriptors of this process (the in-process server's) name *path* or lie under it."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
    return found


async def get(site: ServeSite, target: str, extra: str = "", method: str = "GET") -> Any:
    reader, writer = await site.open()
    try:
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n".encode())
        return await read_response(reader, method)
    finally:
        await close_writer(writer)


async def test_a_folder_downloads_as_a_tar_archive_equal_to_the_tree(
    tree: Path, where: dict[str, Any]
) -> None:
    async with serve_site(tree, show_index=True, archives=True, **where) as site:
        r = await get(site, "/photos/?tar")
        assert r.status == 200
        assert r.headers["content-type"] == "application/x-tar"
        assert r.headers["content-disposition"] == 'attachment; filename="photos.tar"'
        assert int(r.headers["content-length"]) == len(r.body)
        assert tar_members(r.body) == tree_files(tree / "photos", "photos")
        # HEAD: the same head, no body; the root's archive holds the whole tree, named after it.
        h = await get(site, "/photos/?tar", method="HEAD")
        assert (h.status, h.headers["content-length"], h.headers["etag"]) == (
            200,
            str(len(r.body)),
            r.headers["etag"],
        )
        whole = await get(site, "/?tar")
        assert tar_members(whole.body) == tree_files(tree, "public")  # (index.html does not hide it)
        listing = await get(site, "/photos/")
        assert b'href="?tar"' in listing.body


@pytest.mark.parametrize("kind", ["tar", "zip"])
async def test_a_folders_kept_index_page_does_not_stand_for_its_archive(tree: Path, kind: str) -> None:
    """The folder's index.html, once kept in the answer cache (asked twice, by a plain request
    and by a browser's), does not answer the folder's archive, which names its query."""
    async with serve_site(tree, show_index=True, archives=True) as site:
        for extra in ("", "", "Accept-Encoding: gzip, br\r\n", "Accept-Encoding: gzip, br\r\n"):
            page = await get(site, "/", extra)
            assert page.body == b"<p>home</p>"
        for extra in ("", "Accept-Encoding: gzip, br\r\n"):
            r = await get(site, f"/?{kind}", extra)
            assert r.status == 200
            assert r.headers["content-disposition"] == f'attachment; filename="public.{kind}"'
            assert len(r.body) > 3 * MiB
        assert (await get(site, "/?v=2")).body == b"<p>home</p>"  # (any other query: the page)


async def test_a_folder_downloads_as_a_zip_equal_to_the_tree(tree: Path, where: dict[str, Any]) -> None:
    async with serve_site(tree, show_index=True, archives=True, **where) as site:
        r = await get(site, "/photos/?zip")
        assert r.status == 200
        assert r.headers["content-type"] == "application/zip"
        assert r.headers["content-disposition"] == 'attachment; filename="photos.zip"'
        assert zip_members(r.body) == tree_files(tree / "photos", "photos")
        again = await get(site, "/photos/?zip")  # (the CRCs kept: the same bytes, no read first)
        assert again.body == r.body
        size = len(r.body)
        cut = size // 2
        rest = await get(site, "/photos/?zip", f"Range: bytes={cut}-\r\nIf-Range: {r.headers['etag']}\r\n")
        assert rest.status == 206
        assert r.body[:cut] + rest.body == r.body
        listing = await get(site, "/photos/")
        assert b'href="?zip"' in listing.body


async def test_a_cut_download_resumes_byte_identical(tree: Path, where: dict[str, Any]) -> None:
    async with serve_site(tree, show_index=True, archives=True, **where) as site:
        whole = await get(site, "/photos/?tar")
        etag = whole.headers["etag"]
        size = len(whole.body)
        for cut in (1, 511, 512, 1536, MiB + 3, size - 1025, size - 1):
            rest = await get(site, "/photos/?tar", f"Range: bytes={cut}-\r\nIf-Range: {etag}\r\n")
            assert rest.status == 206
            assert rest.headers["content-range"] == f"bytes {cut}-{size - 1}/{size}"
            assert whole.body[:cut] + rest.body == whole.body, cut
        middle = await get(site, "/photos/?tar", "Range: bytes=1000-1999\r\n")
        assert middle.body == whole.body[1000:2000]
        by_date = await get(
            site, "/photos/?tar", f"Range: bytes=10-\r\nIf-Range: {whole.headers['last-modified']}\r\n"
        )
        assert by_date.status == 200  # (a date does not say the archive is the same: whole)
        (tree / "photos" / "sub" / "new.txt").write_bytes(b"new")  # the folder changed: a whole answer
        stale = await get(site, "/photos/?tar", f"Range: bytes=10-\r\nIf-Range: {etag}\r\n")
        assert stale.status == 200
        assert stale.headers["etag"] != etag
        assert "photos/sub/new.txt" in tar_members(stale.body)
        past = await get(site, "/photos/?tar", f"Range: bytes={10 * size}-\r\n")
        assert (past.status, past.headers["content-range"]) == (416, f"bytes */{len(stale.body)}")
        fresh = await get(site, "/photos/?tar", f"If-None-Match: {stale.headers['etag']}\r\n")
        assert fresh.status == 304


async def changed_midway(
    site: ServeSite, kind: str, change: Callable[[], None], *, whole: bool
) -> tuple[int, bytes]:
    """``GET /photos/?<kind>``, *change* the tree once its first MiB came (the server well short of
    the 24 MiB ``big.bin``), then read the rest: its ``Content-Length`` if *whole* (it must come
    whole), else to the connection's end. Returns (the announced length, the body read)."""
    reader, writer = await site.open()
    try:
        writer.write(f"GET /photos/?{kind} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        got = await asyncio.wait_for(reader.readexactly(MiB), 10)
        change()
        rest = reader.readexactly(length - MiB) if whole else read_to_eof(reader)
        return length, got + await asyncio.wait_for(rest, 20)
    finally:
        await close_writer(writer)


@pytest.mark.parametrize("kind", ["tar", "zip"])
async def test_a_file_that_shrinks_while_it_is_sent_aborts_the_connection(
    tree: Path, where: dict[str, Any], kind: str
) -> None:
    big = tree / "photos" / "big.bin"
    big.write_bytes(pattern(24 * MiB, seed=7))
    async with serve_site(tree, show_index=True, archives=True, limit=64 * 1024, **where) as site:
        length, got = await changed_midway(site, kind, lambda: os.truncate(big, 2 * MiB), whole=False)
        assert len(got) < length  # cut: never an archive passed off as whole
        assert (await get(site, f"/photos/?{kind}")).status == 200  # (the server goes on)


async def test_a_file_that_grows_is_sent_at_its_announced_size(tree: Path, where: dict[str, Any]) -> None:
    big = tree / "photos" / "big.bin"
    big.write_bytes(pattern(24 * MiB, seed=7))
    log = tree / "photos" / "sub" / "b.bin"  # sent after big.bin
    before = log.read_bytes()
    async with serve_site(tree, show_index=True, archives=True, limit=64 * 1024, **where) as site:
        _, got = await changed_midway(site, "tar", functools.partial(append_to, log), whole=True)
        assert tar_members(got)["photos/sub/b.bin"] == before


async def test_a_zip_member_rewritten_in_place_while_it_is_sent_aborts_the_connection(
    tree: Path, where: dict[str, Any]
) -> None:
    """Its CRC-32 was read before its bytes go: a file rewritten in place meanwhile (same size,
    new bytes, new dates) made a zip of the announced length whose CRC did not match, passed off
    as whole. Now the connection is cut; a file that only grew is still sent whole (below)."""
    big = tree / "photos" / "big.bin"
    big.write_bytes(pattern(24 * MiB, seed=7))

    def rewrite() -> None:
        with open(big, "r+b") as f:
            f.seek(20 * MiB)
            f.write(b"rewritten" * 1000)  # the server is well short of it

    async with serve_site(tree, show_index=True, archives=True, limit=64 * 1024, **where) as site:
        length, got = await changed_midway(site, "zip", rewrite, whole=False)
        assert len(got) < length  # cut: never a zip whose CRC does not match, passed off as whole
        whole = await get(site, "/photos/?zip")  # (the server goes on; the new bytes, a new CRC)
        assert zip_members(whole.body)["photos/big.bin"] == big.read_bytes()


async def test_a_zip_member_that_grows_is_sent_at_its_announced_size(tree: Path) -> None:
    big = tree / "photos" / "big.bin"
    big.write_bytes(pattern(24 * MiB, seed=7))
    before = big.read_bytes()
    async with serve_site(tree, show_index=True, archives=True, limit=64 * 1024) as site:
        _, got = await changed_midway(site, "zip", functools.partial(append_to, big), whole=True)
        assert zip_members(got)["photos/big.bin"] == before


async def test_an_archive_waits_for_a_walk_to_end_rather_than_refuse(tree: Path) -> None:
    """Two folders are walked at a time (``_fs.MAX_WALKS``): a third download waits for one of
    them to end, on the loop (no pool thread held), for a few seconds, and only then is 503. It
    was 503 at once: ten downloads at a time saw three or four errors."""
    from aiosendfile._static import _fs

    held = [_fs._walks.acquire(blocking=False) for _ in range(_fs.MAX_WALKS)]
    assert all(held)
    released = False

    def release() -> None:
        nonlocal released
        released = True
        for _ in held:
            _fs._walks.release()

    try:
        async with serve_site(tree, show_index=True, archives=True) as site:
            asyncio.get_running_loop().call_later(0.5, release)
            answer = await asyncio.wait_for(get(site, "/photos/?tar"), 10)
            assert released
            assert answer.status == 200
            assert (
                tar_members(answer.body)["photos/sub/b.bin"]
                == (tree / "photos" / "sub" / "b.bin").read_bytes()
            )
    finally:
        if not released:
            release()


async def test_a_zips_head_is_sent_before_a_large_members_crc_is_read(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zip's first large member needs its CRC-32 read (the whole file) before its header: the
    answer's head went with that header, so a client waited seconds for a status line (a 3 GiB
    cold file: 5.4 s; past a proxy's read timeout for a larger one). It goes first now."""
    from aiosendfile._static import _tree

    gate, entered = threading.Event(), threading.Event()
    real = _tree.crc_read

    def slow_crc(*args: Any, **kwargs: Any) -> tuple[int, int]:
        entered.set()
        gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(_tree, "crc_read", slow_crc)
    _tree._crcs.clear()
    try:
        async with serve_site(tree, show_index=True, archives=True) as site:
            reader, writer = await site.open()
            try:
                writer.write(b"GET /photos/?zip HTTP/1.1\r\nHost: localhost\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200 ")
                assert await asyncio.to_thread(entered.wait, 10)  # (the CRC read is under way...)
                assert not gate.is_set()  # (...and still waits)
                gate.set()
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                body = await asyncio.wait_for(reader.readexactly(length), 20)
            finally:
                gate.set()
                await close_writer(writer)
        assert zip_members(body)["photos/big.bin"] == (tree / "photos" / "big.bin").read_bytes()
    finally:
        gate.set()


async def test_an_archive_whose_client_left_while_it_waited_is_not_walked(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download waiting for a walk (both taken) whose client closes meanwhile is dropped before
    it asks again: reading is paused while it waits, so the end of stream was not seen, and a
    client sending and closing at once could keep both walks busy with abandoned folders."""
    from aiosendfile._static import _fs, _tree

    walked: list[str] = []
    real = _tree.walk

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        walked.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_tree, "walk", counted)
    held = [_fs._walks.acquire(blocking=False) for _ in range(_fs.MAX_WALKS)]
    assert all(held)
    try:
        async with serve_site(tree, show_index=True, archives=True) as site:
            _, writer = await site.open()
            writer.write(b"GET /photos/?tar HTTP/1.1\r\nHost: localhost\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)  # (it waits for a walk)
            await close_writer(writer)
            await asyncio.sleep(0.2)
            for _ in held:
                _fs._walks.release()
            held = []
            await asyncio.sleep(2.0)  # (past its next asks)
            assert walked == []
            assert (await get(site, "/photos/?tar")).status == 200  # (the walks are free)
            assert len(walked) == 1
    finally:
        for _ in held:
            _fs._walks.release()


async def test_the_bounds_answer_413(tree: Path) -> None:
    async with serve_site(tree, show_index=True, archives=True, max_archive_entries=10) as site:
        assert (await get(site, "/photos/?tar")).status == 413
        assert (await get(site, "/photos/sub/deeper/?tar")).status == 200
    async with serve_site(tree, show_index=True, archives=True, max_archive_size=3 * MiB) as site:
        assert (await get(site, "/photos/?tar")).status == 413
        assert (await get(site, "/photos/sub/?tar")).status == 200


async def test_no_archive_where_archives_or_listings_are_off(tree: Path) -> None:
    async with serve_site(tree, show_index=True) as site:  # (the engine's own default)
        r = await get(site, "/photos/?tar")
        assert (r.status, r.headers["content-type"]) == (200, "text/html; charset=utf-8")
        assert b"?tar" not in r.body
    async with serve_site(tree, archives=True) as site:  # no listing: no archive either
        assert (await get(site, "/photos/?tar")).status == 403
        assert (await get(site, "/?tar")).body == b"<p>home</p>"
    async with serve_site(tree, show_index=True, archives=True) as site:
        assert (await get(site, "/photos/big.bin?tar")).body == (tree / "photos" / "big.bin").read_bytes()
        assert (await get(site, "/photos/.env/?tar")).status == 404  # a dotfile stays hidden
        assert (await get(site, "/photos?tar")).headers["location"] == "./photos/?tar"  # (relative)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_stop_while_a_zips_crc_is_read_is_quiet_and_prompt(tmp_path: Path, loop: str) -> None:
    """SIGTERM while a large member's CRC-32 is being read (a 6 GiB sparse file: seconds): the stop
    does not wait for the read, and says nothing (the archive's task, waiting for its pool job,
    was left pending: "Task was destroyed but it is pending!" on stderr)."""
    top = tmp_path / "public" / "big"
    top.mkdir(parents=True)
    with open(top / "sparse.bin", "wb") as f:
        f.truncate(6 << 30)
    with serve_process(tmp_path / "public", cli=True, loop=loop) as server:  # (exit 0, stderr empty)
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        with sock:
            sock.sendall(b"GET /big/?zip HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 200 ")  # (the head goes before the read)
            began = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(timeout=20)
            assert time.monotonic() - began < 5


def _tools() -> list[list[str]]:
    return [[tool, "-tvf", "-"] for tool in ("tar", "bsdtar") if shutil.which(tool)]


def test_serve_in_its_own_process_sends_what_the_archive_tools_read(tree: Path) -> None:
    with serve_process(tree, cli=True) as server:
        with urllib.request.urlopen(server.url("/photos/?tar"), timeout=20) as response:
            data = response.read()
        assert tar_members(data) == tree_files(tree / "photos", "photos")
        for argv in _tools():
            listed = subprocess.run(argv, input=data, capture_output=True, check=True, timeout=60).stdout
            assert b"photos/sub/deeper/empty" in listed
            assert b"n" * 150 in listed
        with urllib.request.urlopen(server.url("/photos/?zip"), timeout=20) as response:
            zipped = response.read()
        assert zip_members(zipped) == tree_files(tree / "photos", "photos")
        if shutil.which("unzip"):
            kept = tree.parent / "t.zip"
            kept.write_bytes(zipped)
            tested = subprocess.run(["unzip", "-t", str(kept)], capture_output=True, check=True)
            assert b"No errors detected" in tested.stdout
        if shutil.which("curl"):
            out = tree.parent / "cut.tar"
            out.write_bytes(data[: len(data) // 2])
            subprocess.run(
                ["curl", "-sS", "-C", "-", "-o", str(out), server.url("/photos/?tar")], check=True, timeout=60
            )
            assert out.read_bytes() == data  # curl -C -: resumed where the cut one stopped


async def test_a_client_that_does_not_read_holds_a_bounded_buffer(
    tmp_path: Path, where: dict[str, Any]
) -> None:
    """Small files are gathered and written between the larger ones: while the client reads
    nothing, what waits in the transport stays within the gather size and the high-water mark,
    and the rest arrives whole once it reads."""
    top = tmp_path / "public" / "many"
    top.mkdir(parents=True)
    for i in range(600):
        (top / f"f{i:03}").write_bytes(pattern(16 * 1024, seed=i))
    async with serve_site(top.parent, show_index=True, archives=True, limit=64 * 1024, **where) as site:
        reader, writer = await site.open()
        try:
            writer.write(b"GET /many/?tar HTTP/1.1\r\nHost: localhost\r\n\r\n")
            await asyncio.sleep(1.0)  # (the server writes until the transport pauses it)
            (conn,) = engine()._engines[site.server].connections
            assert conn.transport.get_write_buffer_size() <= 2 * 1024 * 1024
            response = await read_response(reader)
        finally:
            await close_writer(writer)
        assert tar_members(response.body) == tree_files(top, "many")


def test_ten_thousand_small_files_extract_byte_identical(tmp_path: Path) -> None:
    """A folder of 10,000 small files, from ``serve`` in its own process, unpacked by GNU ``tar``
    and ``unzip`` into trees equal to it."""
    root = tmp_path / "public"
    many = root / "many"
    for d in range(10):
        (many / f"d{d}").mkdir(parents=True)
        for i in range(1000):
            (many / f"d{d}" / f"f{i:04}.txt").write_bytes(b"%d/%d\n" % (d, i) * (i % 7))
    with serve_process(root, cli=True) as server:
        for kind, unpack in (("tar", ["tar", "-xf"]), ("zip", ["unzip", "-q"])):
            if not shutil.which(unpack[0]):
                continue
            with urllib.request.urlopen(server.url(f"/many/?{kind}"), timeout=60) as response:
                data = response.read()
            out = tmp_path / kind
            out.mkdir()
            (out / f"a.{kind}").write_bytes(data)
            subprocess.run([*unpack, f"a.{kind}"], cwd=out, check=True, timeout=120)
            assert tree_files(out / "many", "many") == tree_files(many, "many"), kind


async def test_a_connection_lost_while_files_are_opened_leaves_none_open(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is lost while the pool opens a batch of files (the task awaiting it is
    cancelled, the pool's call runs on): the files it opened are closed once it is done."""
    from aiosendfile._serve import _archive_body

    many = tree / "photos" / "many"
    many.mkdir()
    for i in range(40):
        (many / f"f{i:02}.bin").write_bytes(pattern(100_000, seed=i))  # (> SMALL: kept open to send)
    real_piece = _archive_body.piece
    started = threading.Event()

    def slow_piece(*args: Any) -> Any:
        started.set()
        time.sleep(0.02)
        return real_piece(*args)

    monkeypatch.setattr(_archive_body, "piece", slow_piece)

    async with serve_site(tree, show_index=True, archives=True) as site:
        _, writer = await site.open()
        writer.write(b"GET /photos/many/?tar HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await until_set(started)  # (the pool is opening the first batch)
        await asyncio.sleep(0.1)
        # The server drops the connection meanwhile (its send timeout, a stop: while a body is in
        # flight reading is paused, so a client's own reset is seen only at the next write).
        (conn,) = engine()._engines[site.server].connections
        conn.transport.abort()
        writer.transport.abort()
        await until(lambda: not open_under(many), timeout=10)
        assert (await get(site, "/photos/many/?tar")).status == 200


@pytest.mark.parametrize("over", ["tcp", "unix"])
async def test_a_client_gone_while_a_zips_crcs_are_read_frees_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: str
) -> None:
    """A zip's last bytes need every member's CRC-32, read before anything is written; reading is
    paused meanwhile, so a client that left was seen only at the next write. Two such requests,
    dropped, kept the archive pool (two threads) reading two large files to their ends while every
    other archive waited (a review: two 8 GiB files, another folder's tar took 18 s). The read
    looks for its client at each tick and stops once the connection is reset: a client gone with
    the answer's head unread (killed, say). (One that read the head and closed cleanly cannot be
    told from one that half-closed and still reads: it is seen at the next write, as before.)"""
    from aiosendfile._static import _tree

    monkeypatch.setattr(_tree, "TICK_BYTES", 4 * MiB)  # (a tick per 4 MiB read: seen soon)
    top = tmp_path / "public" / "big"
    top.mkdir(parents=True)
    with open(top / "sparse.bin", "wb") as f:
        f.truncate(64 << 30)  # (read whole: a minute or more)
    _tree._crcs.clear()

    def reading() -> bool:
        return open_under(top / "sparse.bin") > 0

    where = {"unix_path": str(tmp_path / "s.sock")} if over == "unix" else {}
    async with serve_site(tmp_path / "public", show_index=True, archives=True, **where) as site:
        if over == "unix":
            client = socket.socket(socket.AF_UNIX)
            client.connect(where["unix_path"])
        else:
            client = socket.create_connection(("127.0.0.1", site.port))
        with client:  # (a plain socket: the head that comes is left unread)
            client.sendall(b"GET /big/?zip HTTP/1.1\r\nHost: localhost\r\nRange: bytes=-100\r\n\r\n")
            await until(reading, timeout=10)
            await asyncio.sleep(0.1)  # (the head has come)
        await until(lambda: not reading(), timeout=10)


async def test_a_folder_asked_by_another_spelling_is_the_same_archive(tree: Path) -> None:
    """``/photos/./`` named its archive ``..tar``, with another ETag, and each spelling of a folder
    (``/./photos/``, ``/photos//``) held a layout of its own: a few connections filled the budget of
    layouts being sent, and other folders' archives waited, then got 503 (a review)."""
    from aiosendfile._static import _fs

    spellings = ["/photos/", "/./photos/", "/photos//", "/photos/./", "/photos/.//"]
    async with serve_site(tree, show_index=True, archives=True) as site:
        heads = [await get(site, f"{s}?tar", method="HEAD") for s in spellings]
        assert {h.headers.get("Content-Disposition") for h in heads} == {'attachment; filename="photos.tar"'}
        assert len({h.headers.get("ETag") for h in heads}) == 1
        held = []
        try:
            for s in spellings:  # (downloads not read: each holds its layout)
                reader, writer = await site.open()
                writer.write(f"GET {s}?tar HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
                await reader.readuntil(b"\r\n\r\n")
                held.append(writer)
            assert len([key for key in list(_fs._live) if key[0].startswith(str(tree))]) == 1
        finally:
            for writer in held:
                writer.transport.abort()


async def test_a_download_not_read_holds_few_files_open(tree: Path) -> None:
    """A client that asks for a folder's archive and reads nothing holds the files of one batch
    open until its send timeout: 32 of them (a review: 16 such clients took a 512-descriptor
    server's every descriptor). At most ``BATCH_OPEN`` now, and the one being sent."""
    from aiosendfile._serve import _archive_body

    many = tree / "photos" / "many"
    many.mkdir()
    for i in range(40):  # (> SMALL: kept open to send; 40 MB, more than loopback's buffers hold)
        with open(many / f"f{i:02}.bin", "wb") as f:
            f.truncate(1_000_000)

    async with serve_site(tree, show_index=True, archives=True) as site:
        _, writer = await site.open()
        try:
            writer.transport.pause_reading()
            writer.write(b"GET /photos/many/?tar HTTP/1.1\r\nHost: localhost\r\n\r\n")
            await until(lambda: open_under(many) > 0, timeout=10)
            await asyncio.sleep(0.5)  # (the socket's buffers full: the body waits for the client)
            assert 0 < open_under(many) <= _archive_body.BATCH_OPEN
        finally:
            writer.transport.abort()


async def test_a_client_that_half_closes_still_gets_its_zip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client may end its side after its request and read the answer (``nc -N``, scripts; nginx
    answers it): looking for a gone client during a zip's CRC reads must not take its end of
    stream for a departure (a review of the change that looks: its zips came with no body)."""
    from aiosendfile._static import _tree

    monkeypatch.setattr(_tree, "TICK_BYTES", 4 * MiB)
    top = tmp_path / "public" / "big"
    top.mkdir(parents=True)
    with open(top / "sparse.bin", "wb") as f:
        f.truncate(64 * MiB)
    _tree._crcs.clear()
    async with serve_site(tmp_path / "public", show_index=True, archives=True) as site:
        reader, writer = await site.open()
        writer.write(b"GET /big/?zip HTTP/1.1\r\nHost: localhost\r\nRange: bytes=-100\r\n\r\n")
        writer.write_eof()
        answer = await asyncio.wait_for(read_response(reader), 30)
        assert answer.status == 206
        assert len(answer.body) == 100
        writer.close()
