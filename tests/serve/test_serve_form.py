"""``serve --upload``: a ``multipart/form-data`` POST to a directory (the listing page's form,
``curl -F``), on both loops.

Byte-exact files (0 B, 1 B, MiBs; with a length and chunked; over TCP and TLS; from this loop,
``curl -F`` and ``http.client`` in other processes or threads), the answer (303 to the listing),
and what is on disk after every failure: a file that is visible is whole; the part under way
when the body is cut, malformed, refused or the disk fills leaves nothing, and no temporary file.
Hostile bodies: 10,000 tiny parts, a part's header fields without end, names with traversal,
control characters or no UTF-8, a boundary that is never closed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import http.client
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ..support.processes import Server
from ..support.raw_http import read_response
from ..support.serve import serve_site
from ..support.uploads import left as _left
from ..support.uploads import stopped_mid_body

pytest.importorskip("httptools")
pytest.importorskip("python_multipart")

from aiosendfile._serve import _auth

BOUNDARY = "----aiosendfileFormBoundary7MA4YWxkTrZu0gW"


def _part(name: str, data: bytes, filename: str | bytes | None = None, *fields: str) -> bytes:
    """One part: a file part when *filename* is given, else a field."""
    disposition = f'Content-Disposition: form-data; name="{name}"'.encode()
    if filename is not None:
        raw = filename.encode() if isinstance(filename, str) else filename
        disposition += b'; filename="' + raw + b'"'
    head = disposition + b"\r\n" + b"".join(f.encode() + b"\r\n" for f in fields)
    if filename is not None:
        head += b"Content-Type: application/octet-stream\r\n"
    return b"--" + BOUNDARY.encode() + b"\r\n" + head + b"\r\n" + data + b"\r\n"


def _form(*parts: bytes, close: bool = True) -> bytes:
    return b"".join(parts) + (b"--" + BOUNDARY.encode() + b"--\r\n" if close else b"")


def _post(path: str, body: bytes | None, *extra: str, length: int | None = None) -> bytes:
    size = len(body or b"") if length is None else length
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {size}\r\n" + "".join(e + "\r\n" for e in extra)
    )
    return head.encode() + b"\r\n" + (body or b"")


async def test_a_form_lands_its_files_byte_exact_and_answers_303(
    public: Path, site_kwargs: dict[str, Any]
) -> None:
    files = {"empty": b"", "one": b"x", "big.bin": os.urandom(3 * 2**20 + 7)}
    body = _form(
        _part("note", b"a field, dropped"),
        *(_part("file", data, name) for name, data in files.items()),
        _part("file", b"", ""),  # (no file chosen: skipped)
    )
    async with serve_site(public, upload=True, **site_kwargs) as site:
        reader, writer = await site.open()
        try:
            writer.write(_post("/sub/", body))
            answer = await read_response(reader)
            assert answer.status == 303, answer.raw
            assert b"\r\nLocation: ./\r\n" in answer.raw
            writer.write(_post("/sub", _form(_part("f", b"second", "second.txt"))))
            answer = await read_response(reader)
            assert b"\r\nLocation: sub/\r\n" in answer.raw
            writer.write(_post("/sub/", _form(_part("f", b"other", "one"))))  # (exists: 409)
            assert (await read_response(reader)).status == 409
            writer.write(b"GET /sub/one HTTP/1.1\r\nHost: x\r\n\r\n")  # (the connection goes on)
            assert (await read_response(reader)).raw.endswith(b"\r\n\r\nx")
        finally:
            writer.close()
    for name, data in files.items():
        assert (public / "sub" / name).read_bytes() == data
    assert _left(public / "sub") == ["big.bin", "empty", "one", "second.txt"]
    async with serve_site(public, upload=True, overwrite=True, **site_kwargs) as site:
        reader, writer = await site.open()
        try:
            writer.write(_post("/", _form(_part("f", b"replaced", "a-file"))))
            assert (await read_response(reader)).status == 303
        finally:
            writer.close()
    assert (public / "a-file").read_bytes() == b"replaced"


async def test_a_chunked_form_lands_too(public: Path) -> None:
    body = _form(_part("file", os.urandom(200_000), "c.bin"))
    pieces = [body[i : i + 7000] for i in range(0, len(body), 7000)]
    head = (
        "POST /sub/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n"
    ).encode()
    async with serve_site(public, upload=True) as site:
        reader, writer = await site.open()
        try:
            writer.write(head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")
            assert (await read_response(reader)).status == 303
        finally:
            writer.close()
    assert (public / "sub" / "c.bin").read_bytes() == body.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n--", 1)[0]


@pytest.mark.parametrize(
    ("filename", "status"),
    [
        ("..", 403),
        (".env", 403),  # a dotfile (not served: not written)
        ("ctl\x07name", 403),
        ("new\nline", 403),
        (b"caf\xe9", 400),  # not UTF-8
    ],
)
async def test_a_part_name_no_file_may_have_is_refused(
    public: Path, filename: str | bytes, status: int
) -> None:
    async with serve_site(public, upload=True) as site:
        reader, writer = await site.open()
        try:
            writer.write(_post("/sub/", _form(_part("file", b"data", filename))))
            assert (await read_response(reader)).status == status
        finally:
            writer.close()
    assert _left(public / "sub") == []
    assert _left(public) == ["a-file", "sub"]


async def test_a_path_in_a_part_name_keeps_its_last_name_only(public: Path) -> None:
    """Browsers send a base name; old ones a Windows path: its last component is the name, never a
    way out of the directory."""
    async with serve_site(public, upload=True) as site:
        reader, writer = await site.open()
        try:
            parts = [_part("f", b"1", "../../escape.txt"), _part("f", b"2", "C:\\Users\\me\\win.txt")]
            writer.write(_post("/sub/", _form(*parts)))
            assert (await read_response(reader)).status == 303
        finally:
            writer.close()
    assert _left(public / "sub") == ["escape.txt", "win.txt"]
    assert not (public.parent / "escape.txt").exists()


@pytest.mark.parametrize(
    ("path", "head", "status"),
    [
        ("/nowhere/", None, 409),  # no such directory
        ("/a-file", None, 409),  # not a directory
        ("/.hidden/", None, 404),  # a dotfile
        ("/sub/%2e%2e/%2e%2e/", None, 404),  # out of the root
        ("/sub/", "Content-Type: application/x-www-form-urlencoded", 415),
        ("/sub/", "Content-Type: multipart/form-data", 415),  # no boundary
        ("/sub/", "Content-Type: multipart/form-data; boundary=" + "b" * 71, 415),
    ],
)
async def test_a_post_where_no_form_may_go_is_refused_before_its_body(
    public: Path, path: str, head: str | None, status: int
) -> None:
    body = _form(_part("file", b"data", "f"))
    request = _post(path, body)
    if head is not None:
        request = request.replace(
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}".encode(), head.encode()
        )
    async with serve_site(public, upload=True) as site:
        reader, writer = await site.open()
        try:
            writer.write(request)
            assert (await read_response(reader)).status == status
        finally:
            writer.close()
    assert _left(public) == ["a-file", "sub"]
    assert _left(public / "sub") == []


async def test_a_form_cut_short_keeps_only_whole_files(public: Path, site_kwargs: dict[str, Any]) -> None:
    """A client that leaves mid-part, and a body that ends without its closing boundary (400):
    the parts already whole are there, the one under way is not, nor any temporary file."""
    whole = _part("f", b"w" * 1000, "whole.txt")
    cut = _part("f", b"c" * 500_000, "cut.txt")[:300_000]
    async with serve_site(public, upload=True, **site_kwargs) as site:
        reader, writer = await site.open()
        writer.write(_post("/sub/", whole + cut, length=5 * 2**20))
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        await asyncio.sleep(0.3)
        reader, writer = await site.open()
        try:  # the length is right, the closing boundary never comes
            writer.write(_post("/sub/", _part("f", b"u" * 1000, "unclosed.txt")[:-2]))
            assert (await read_response(reader)).status == 400
            writer.write(_post("/sub/", _form(_part("f", b"ok", "ok.txt"))))  # (the connection goes on)
            assert (await read_response(reader)).status == 303
        finally:
            writer.close()
    assert _left(public / "sub") == ["ok.txt", "whole.txt"]
    assert (public / "sub" / "whole.txt").read_bytes() == b"w" * 1000


async def test_hostile_forms_are_refused_within_bounds(public: Path) -> None:
    """10,000 tiny parts (413 at the first over ``MAX_PARTS``), a part's header field without end
    (400: the parser's bound), and bytes that are no form at all (400): each answered, nothing left behind."""
    tiny = b"".join(_part(f"p{i}", b"v") for i in range(10_000))
    endless = b"--" + BOUNDARY.encode() + b"\r\nX-Long: " + b"a" * 10_000 + b"\r\n\r\nx\r\n"
    async with serve_site(public, upload=True) as site:
        for body, status in ((_form(tiny), 413), (_form(endless), 400), (b"\x00garbage" * 100, 400)):
            reader, writer = await site.open()
            try:
                writer.write(_post("/sub/", body))
                assert (await read_response(reader)).status == status
            finally:
                writer.close()
    assert _left(public / "sub") == []


async def test_the_size_limit_and_passwords_hold_for_forms(public: Path) -> None:
    users = (_auth.parse_entry("bob:pw"),)
    good = "Authorization: Basic " + base64.b64encode(b"bob:pw").decode()
    body = _form(_part("file", b"z" * 2000, "big"))
    async with serve_site(public, upload=True, auth=users, public_read=True, max_upload_size=1000) as site:
        reader, writer = await site.open()
        try:
            writer.write(_post("/sub/", body[:900], "Expect: 100-continue"))  # (no password: 401, no 100)
            answer = await read_response(reader)
            assert answer.status == 401
            assert b"100 Continue" not in answer.raw
        finally:
            writer.close()
        reader, writer = await site.open()
        try:
            writer.write(_post("/sub/", None, "Expect: 100-continue", good, length=len(body)))
            assert (await read_response(reader)).status == 413  # (announced: before the body)
        finally:
            writer.close()
        reader, writer = await site.open()
        try:
            small = _form(_part("file", b"s", "small"))
            writer.write(_post("/sub/", None, "Expect: 100-continue", good, length=len(small)))
            assert (
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
            )
            writer.write(small)
            assert (await read_response(reader)).status == 303
        finally:
            writer.close()
    assert _left(public / "sub") == ["small"]


async def test_a_full_disk_is_507_and_keeps_no_part(small_disk: Path) -> None:
    async with serve_site(small_disk, upload=True) as site:
        reader, writer = await site.open()
        try:
            writer.write(
                _post("/", _form(_part("f", b"fits", "first"), _part("f", os.urandom(3 * 2**20), "big")))
            )
            assert (await read_response(reader)).status == 507
        finally:
            writer.close()
    assert _left(small_disk) == ["first"]


async def test_the_listing_shows_the_form_only_with_uploads(public: Path) -> None:
    for upload in (False, True):
        async with serve_site(public, upload=upload, show_index=True) as site:
            reader, writer = await site.open()
            try:
                writer.write(b"GET /sub/ HTTP/1.1\r\nHost: x\r\n\r\n")
                page = await read_response(reader)
            finally:
                writer.close()
        assert (b'enctype="multipart/form-data"' in page.raw) is upload
        assert (b"<script>" in page.raw) is upload


# -- in other processes and threads ---------------------------------------------------------------


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_f_uploads_byte_exact_to_serve(public: Path, tmp_path: Path) -> None:
    blobs = {"a.bin": os.urandom(5 * 2**20 + 3), "b b.txt": b"hello", "empty": b""}
    for name, data in blobs.items():
        (tmp_path / name).write_bytes(data)
    server = Server(str(public), "--port", "0", "--upload")
    try:
        form = [arg for name in blobs for arg in ("-F", f"file=@{tmp_path / name}")]
        done = subprocess.run(
            [
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{redirect_url}",
                *form,
                server.url + "sub/",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stdout == f"303 {server.url}sub/", done.stderr
        for name, data in blobs.items():
            assert (public / "sub" / name).read_bytes() == data
        assert server.interrupt() == 0
    finally:
        server.close()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(2**22):
            digest.update(block)
    return digest.hexdigest()


def _curl_both_ways(public: Path, source: Path, timeout: float) -> None:
    """``curl -T`` (a PUT with its length: zero-copy) and ``curl -F`` (a form) of *source* to a
    ``serve --upload`` process: each lands byte-exact."""
    server = Server(str(public), "--port", "0", "--upload")
    try:
        for how, url in (("-T", f"{server.url}sub/put.bin"), ("-F", f"{server.url}sub/")):
            what = str(source) if how == "-T" else f"file=@{source};filename=form.bin"
            done = subprocess.run(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", how, what, url],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            assert done.stdout == ("201" if how == "-T" else "303"), done.stderr
        expected = _sha256(source)
        for name in ("put.bin", "form.bin"):
            landed = public / "sub" / name
            assert landed.stat().st_size == source.stat().st_size
            assert _sha256(landed) == expected
        assert server.interrupt() == 0
    finally:
        server.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_64_mib_by_curl_t_and_curl_f(public: Path, tmp_path: Path) -> None:
    source = tmp_path / "64m.bin"
    source.write_bytes(os.urandom(64 * 2**20))
    _curl_both_ways(public, source, 120)


@pytest.mark.stress
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_a_multi_gib_sparse_file_by_curl_t_and_curl_f(public: Path, tmp_path: Path) -> None:
    """4 GiB and a few bytes (a sparse source: zeros but for a few marks; it lands as written
    bytes, 8 GiB on disk for the two): past the 2³¹ and 2³² offsets nothing wraps."""
    free = shutil.disk_usage(public).free
    if free < 10 * 2**30:
        pytest.skip(f"needs 10 GiB free, {free} are")
    source = tmp_path / "sparse.bin"
    size = 2**32 + 5
    with open(source, "wb") as f:
        f.truncate(size)
        for at in (0, 2**31 - 3, 2**32 - 3, size - 4):
            f.seek(at)
            f.write(b"mark")
    _curl_both_ways(public, source, 600)


def test_http_client_form_from_a_thread(public: Path) -> None:
    """A blocking client (``http.client``) in its own thread, sending the body in pieces."""
    server = Server(str(public), "--port", "0", "--upload")
    try:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        data = os.urandom(2 * 2**20 + 1)
        body = _form(_part("file", data, "threaded.bin"))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.putrequest("POST", "/sub/")
        conn.putheader("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        for i in range(0, len(body), 100_000):
            conn.send(body[i : i + 100_000])
        answer = conn.getresponse()
        assert answer.status == 303
        answer.read()
        conn.close()
        assert (public / "sub" / "threaded.bin").read_bytes() == data
    finally:
        server.close()


def test_a_server_stopped_mid_form_leaves_nothing(public: Path) -> None:
    stopped_mid_body(public, _post("/sub/", _part("f", b"x" * 500_000, "half"), length=10 * 2**20))
