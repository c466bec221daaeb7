"""``serve --upload``'s resumable uploads (the IETF draft, interop version 8; tus 1.0): each
protocol's steps, and what resumes.

Each step byte-exact over TCP, TLS and a Unix socket, on both loops (creation, the 104 with the
upload's address, HEAD for the offset, PATCH, DELETE, OPTIONS; tus's deferred length and creation
with a body), behind a path prefix, and by tus's own Python client; what resumes: a creation cut
mid-body, a client killed mid-PATCH (another process), a server killed mid-upload and started
again, the parts of an upload reaching different workers. What a hostile client cannot do is
``test_serve_resumable_hostile``'s.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..support.processes import Server
from ..support.raw_http import read_response
from ..support.resumable import (
    TUS,
    V8,
    append_to,
    ask,
    field,
    head_of,
    http_exchange,
    partial_of,
    port_of,
    request,
    resolved,
    tus_metadata,
)
from ..support.serve import serve_site
from ..support.uploads import left

pytest.importorskip("httptools")

from aiosendfile._serve import _resumable
from aiosendfile._serve._resumable import ask_of, tus_filename, upload_fields

# -- the rules, without sockets -------------------------------------------------------------------


def _fields(*pairs: str) -> dict[bytes, bytes]:
    return upload_fields([tuple(p.encode().split(b": ", 1)) for p in pairs])  # type: ignore[misc]


TOKEN = "A" * 32


@pytest.mark.parametrize(
    ("method", "directory", "query", "fields", "ctype", "step", "bad"),
    [
        ("PUT", False, "", ["Upload-Complete: ?0"], None, "create", 0),
        ("POST", False, "", ["Upload-Complete: ?1", "Upload-Length: 5"], None, "create", 0),
        ("PUT", False, "", ["Upload-Complete: yes"], None, "create", 400),
        ("PUT", False, "", ["Upload-Complete: ?0", "Upload-Offset: 7"], None, "create", 400),
        ("PUT", False, "", [], None, None, 0),  # a plain PUT
        ("PUT", True, "", ["Upload-Complete: ?0"], None, None, 0),  # a directory: not an upload's
        ("POST", True, "", [TUS, "Upload-Length: 5"], None, "create", 0),
        ("POST", True, "", [TUS, "Upload-Defer-Length: 1"], None, "create", 0),
        ("POST", True, "", [TUS], None, "create", 400),  # (no length, none deferred)
        ("POST", True, "", [TUS, "Upload-Defer-Length: 2"], None, "create", 400),
        ("POST", True, "", ["Tus-Resumable: 0.2.2", "Upload-Length: 5"], None, "create", 412),
        ("POST", True, "", [], None, None, 0),  # a form post
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: 0", "Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            0,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: 0", "Upload-Complete: ?1"],
            b"text/plain",
            "append",
            415,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            400,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: -1", "Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            400,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            ["Upload-Offset: 1" + "0" * 15, "Upload-Complete: ?1"],
            b"application/partial-upload",
            "append",
            400,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            [TUS, "Upload-Offset: 3"],
            b"application/offset+octet-stream",
            "append",
            0,
        ),
        (
            "PATCH",
            False,
            f"upload={TOKEN}",
            [TUS, "Upload-Offset: 3"],
            b"application/partial-upload",
            "append",
            415,
        ),
        (
            "PATCH",
            False,
            "upload=short",
            [TUS, "Upload-Offset: 3"],
            b"application/offset+octet-stream",
            None,
            0,
        ),
        (
            "PATCH",
            False,
            "",
            ["Upload-Offset: 0", "Upload-Complete: ?1"],
            b"application/partial-upload",
            None,
            0,
        ),
        ("HEAD", False, f"x=1&upload={TOKEN}", [], None, "status", 0),
        ("HEAD", False, f"upload={TOKEN}x", [], None, None, 0),
        ("DELETE", False, f"upload={TOKEN}", [TUS], None, "cancel", 0),
        ("GET", False, f"upload={TOKEN}", [], None, None, 0),
        ("OPTIONS", True, "", [], None, "options", 0),
    ],
)
def test_what_a_request_asks(
    method: str,
    directory: bool,
    query: str,
    fields: list[str],
    ctype: bytes | None,
    step: str | None,
    bad: int,
) -> None:
    asked = ask_of(method.encode(), directory, query.encode(), _fields(*fields), ctype)
    assert (asked and asked.step) == step
    if asked is not None:
        assert asked.bad == bad


def test_tus_metadata_is_read_strictly() -> None:
    name = base64.b64encode("été.txt".encode()).decode()
    assert tus_filename(f"kind,filename {name}".encode()) == "été.txt"
    assert tus_filename(b"kind") is None
    for bad in (b"filename !!!", b"filename YQ==,filename Yg==", b"filename " + base64.b64encode(b"\xff")):
        with pytest.raises(ValueError, match="Upload-Metadata"):
            tus_filename(bad)


def test_tokens_are_unguessable_and_filed_by_a_hash() -> None:
    tokens = {_resumable.new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    token = next(iter(tokens))
    assert len(token) == 32
    assert _resumable.token_of(b"upload=" + token) == token
    assert token.decode() not in _resumable.id_of(token)


# -- the IETF draft -------------------------------------------------------------------------------


@pytest.fixture(params=["tcp", "tls", "unix"])
def where(
    request: pytest.FixtureRequest,
    tls_server_ctx: ssl.SSLContext,
    tls_client_ctx: ssl.SSLContext,
    tmp_path: Path,
) -> dict[str, Any]:
    """``serve_site``'s keyword arguments for a TCP, TLS or Unix socket."""
    if request.param == "unix":
        return {"unix_path": str(tmp_path / "s.sock")}
    return {"server_ctx": tls_server_ctx, "client_ctx": tls_client_ctx} if request.param == "tls" else {}


async def test_an_upload_made_then_appended_lands_byte_exact(public: Path, where: dict[str, Any]) -> None:
    data = os.urandom(3 * 2**20 + 11)
    async with serve_site(public, upload=True, **where) as site:
        made = await ask(
            site,
            request(
                "PUT", "/sub/big.bin", "Upload-Complete: ?0", f"Upload-Length: {len(data)}", body=data[:1000]
            ),
        )
        assert made.status == 201
        assert field(made, "Upload-Complete") == "?0"
        assert field(made, "Upload-Offset") == "1000"
        where_to = field(made, "Location")
        assert where_to.startswith("/sub/big.bin?upload=")
        assert left(public / "sub") == [f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"]

        status = await ask(site, head_of(where_to, V8), "HEAD")
        assert status.status == 204
        assert (field(status, "Upload-Offset"), field(status, "Upload-Complete")) == ("1000", "?0")
        assert field(status, "Upload-Length") == str(len(data))
        assert field(status, "Cache-Control") == "no-store"
        assert field(status, "Upload-Limit").startswith("max-age=")

        middle = append_to(where_to, "1000", "?0", body=data[1000 : 2**20])
        answer = await ask(site, middle)
        assert answer.status == 204
        assert field(answer, "Upload-Offset") == str(2**20)
        assert not (public / "sub" / "big.bin").exists()  # (whole, or not at all)

        last = append_to(where_to, f"{2**20}", "?1", body=data[2**20 :])
        answer = await ask(site, last)
        assert answer.status == 201
        assert field(answer, "Upload-Complete") == "?1"
        assert (public / "sub" / "big.bin").read_bytes() == data
        assert left(public / "sub") == ["big.bin"]

        status = await ask(site, head_of(where_to, V8), "HEAD")  # (a client that lost that answer)
        assert (field(status, "Upload-Complete"), field(status, "Upload-Offset")) == ("?1", str(len(data)))
        again = request(
            "PATCH",
            where_to,
            "Content-Type: application/partial-upload",
            f"Upload-Offset: {len(data)}",
            "Upload-Complete: ?1",
        )
        # The draft (interop 8): an upload complete takes no append; with no content 410 and where
        # it landed, with content an inconsistent length (400). Nothing changes.
        gone = await ask(site, again)
        assert (gone.status, field(gone, "Location")) == (410, "/sub/big.bin")
        assert field(gone, "Upload-Complete") == "?1"
        more = await ask(site, append_to(where_to, str(len(data)), "?1", body=b"x"))
        assert (more.status, field(more, "Upload-Complete")) == (400, "?1")
        assert (public / "sub" / "big.bin").read_bytes() == data


async def test_a_creation_with_all_of_it_is_a_put_and_an_empty_one_an_empty_file(public: Path) -> None:
    async with serve_site(public, upload=True) as site:
        answer = await ask(site, request("PUT", "/sub/whole", "Upload-Complete: ?1", body=b"all of it"))
        assert answer.status == 201
        assert "Upload-Complete" not in answer.headers  # (no 104 could place it: a plain PUT)
        answer = await ask(site, request("PUT", "/sub/also", "Upload-Complete: ?1", V8, body=b"all"))
        assert answer.status == 201
        assert field(answer, "Upload-Complete") == "?1"
        answer = await ask(site, request("PUT", "/sub/empty", "Upload-Complete: ?1", V8))
        assert answer.status == 201
        answer = await ask(site, request("PUT", "/sub/whole", "Upload-Complete: ?1", body=b"x"))
        assert answer.status == 409  # (a file has that name: as a PUT)
    assert (public / "sub" / "whole").read_bytes() == b"all of it"
    assert (public / "sub" / "empty").read_bytes() == b""
    assert left(public / "sub") == ["also", "empty", "whole"]


async def test_a_creation_cut_mid_body_resumes_from_the_104s_address(
    public: Path, where: dict[str, Any]
) -> None:
    data = os.urandom(2**20)
    async with serve_site(public, upload=True, **where) as site:
        reader, writer = await site.open()
        writer.write(request("PUT", "/sub/cut.bin", "Upload-Complete: ?1", V8, length=len(data)))
        early = resolved(await read_response(reader), b"PUT /sub/cut.bin")
        assert early.status == 104
        assert field(early, "Upload-Draft-Interop-Version") == "8"
        where_to = field(early, "Location")
        partial = public / "sub" / f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"
        writer.write(data[:300_000])
        await writer.drain()
        for _ in range(200):  # (until the server has it all on disk)
            if partial.stat().st_size == 300_000:
                break
            await asyncio.sleep(0.05)
        writer.transport.abort()  # the connection drops

        status = await ask(site, head_of(where_to, V8), "HEAD")
        assert field(status, "Upload-Offset") == "300000"
        rest = append_to(where_to, "300000", "?1", V8, body=data[300_000:])
        assert (await ask(site, rest)).status == 201
    assert (public / "sub" / "cut.bin").read_bytes() == data
    assert left(public / "sub") == ["cut.bin"]


async def test_behind_a_path_prefix_the_address_keeps_it(public: Path) -> None:
    async with serve_site(public, upload=True, path_prefix="/files") as site:
        made = await ask(site, request("PUT", "/files/sub/f", "Upload-Complete: ?0", body=b"ab"))
        where_to = field(made, "Location")
        assert where_to.startswith("/files/sub/f?upload=")
        rest = append_to(where_to, "2", "?1", body=b"c")
        assert (await ask(site, rest)).status == 201
    assert (public / "sub" / "f").read_bytes() == b"abc"


# -- tus 1.0 ---------------------------------------------------------------------------------------


async def test_tus_creation_appends_deferred_length_and_termination(
    public: Path, where: dict[str, Any]
) -> None:
    data = os.urandom(700_000)
    async with serve_site(public, upload=True, max_upload_size=10**6, **where) as site:
        options = await ask(site, b"OPTIONS /sub/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert options.status == 204
        assert field(options, "Tus-Version") == "1.0.0"
        assert field(options, "Tus-Max-Size") == "1000000"
        assert "creation-defer-length" in field(options, "Tus-Extension")
        # (RFC 5789's list of what PATCH takes: the IETF draft's media type, and tus's)
        assert "application/partial-upload" in field(options, "Accept-Patch")
        assert "application/offset+octet-stream" in field(options, "Accept-Patch")

        made = await ask(
            site, request("POST", "/sub/", TUS, f"Upload-Length: {len(data)}", tus_metadata("été.bin"))
        )
        assert made.status == 201
        assert field(made, "Tus-Resumable") == "1.0.0"
        where_to = field(made, "Location")
        assert where_to.startswith("/sub/%C3%A9t%C3%A9.bin?upload=")
        assert field(made, "Upload-Expires").endswith(" GMT")
        patch = ("PATCH", where_to, TUS, "Content-Type: application/offset+octet-stream")
        first = await ask(site, request(*patch, "Upload-Offset: 0", body=data[:300_000]))
        assert first.status == 204
        assert field(first, "Upload-Offset") == "300000"
        status = await ask(site, head_of(where_to, TUS), "HEAD")
        assert status.status == 200
        assert (field(status, "Upload-Offset"), field(status, "Upload-Length")) == (
            "300000",
            str(len(data)),
        )
        assert field(status, "Upload-Metadata").startswith("filename ")
        assert (await ask(site, request(*patch, "Upload-Offset: 1", body=b"x"))).status == 409
        last = await ask(site, request(*patch, "Upload-Offset: 300000", body=data[300_000:]))
        assert last.status == 204
        assert field(last, "Upload-Offset") == str(len(data))
        assert (public / "sub" / "été.bin").read_bytes() == data
        again = await ask(site, request(*patch, f"Upload-Offset: {len(data)}"))  # (its answer lost: as tusd)
        assert (again.status, field(again, "Upload-Offset")) == (204, str(len(data)))
        more = await ask(site, request(*patch, f"Upload-Offset: {len(data)}", body=b"x"))
        assert (more.status, field(more, "Upload-Offset")) == (409, str(len(data)))
        assert (public / "sub" / "été.bin").read_bytes() == data

        deferred = await ask(
            site, request("POST", "/sub/", TUS, "Upload-Defer-Length: 1", tus_metadata("later"))
        )
        later = field(deferred, "Location")
        status = await ask(site, head_of(later, TUS), "HEAD")
        assert field(status, "Upload-Defer-Length") == "1"
        patch = ("PATCH", later, TUS, "Content-Type: application/offset+octet-stream")
        assert (await ask(site, request(*patch, "Upload-Offset: 0", body=b"abc"))).status == 204
        assert not (public / "sub" / "later").exists()
        assert (
            await ask(site, request(*patch, "Upload-Offset: 3", "Upload-Length: 5", body=b"de"))
        ).status == 204
        assert (public / "sub" / "later").read_bytes() == b"abcde"

        with_body = await ask(
            site,
            request(
                "POST",
                "/sub/",
                TUS,
                "Upload-Length: 6",
                tus_metadata("gone"),
                "Content-Type: application/offset+octet-stream",
                body=b"abc",
            ),
        )
        assert with_body.status == 201
        assert field(with_body, "Upload-Offset") == "3"
        gone = field(with_body, "Location")
        cancel = f"DELETE {gone} HTTP/1.1\r\nHost: localhost\r\n{TUS}\r\n\r\n".encode()
        assert (await ask(site, cancel)).status == 204
        assert (await ask(site, head_of(gone, TUS), "HEAD")).status == 404

        assert (
            await ask(
                site,
                request("POST", "/sub/", "Tus-Resumable: 0.2", "Upload-Length: 1", tus_metadata("a")),
            )
        ).status == 412
        assert (await ask(site, request("POST", "/sub/", TUS, "Upload-Length: 1"))).status == 400  # (no name)
        assert (
            await ask(site, request("POST", "/sub/", TUS, "Upload-Length: 1", tus_metadata("a/b")))
        ).status == 403
        too_big = request("POST", "/sub/", TUS, "Upload-Length: 1000001", tus_metadata("big"))
        assert (await ask(site, too_big)).status == 413
    assert left(public / "sub") == ["later", "été.bin"]


async def test_a_tus_creation_with_no_body_needs_no_length_field(public: Path) -> None:
    """``curl -X POST`` sends neither ``Content-Length`` nor ``Transfer-Encoding``: no body."""
    async with serve_site(public, upload=True) as site:
        fields = f"{TUS}\r\nUpload-Length: 2\r\n{tus_metadata('n')}\r\n"
        bare = f"POST /sub/ HTTP/1.1\r\nHost: localhost\r\n{fields}\r\n"
        made = await ask(site, bare.encode())
        assert made.status == 201


# -- a real tus client --------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tuspy_uploads_and_resumes_into_serve(public: Path, tmp_path: Path, loop: str) -> None:
    """tus's own Python client (tuspy): an upload in 256 KiB chunks, and one stopped after a chunk
    and resumed by a new uploader from its address, each byte-exact."""
    client_module = pytest.importorskip("tusclient.client")
    data = os.urandom(1_000_003)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    server = Server(str(public), "--port", "0", "--upload", "--loop", loop)
    try:
        client = client_module.TusClient(server.url + "sub/")
        chunk = 256 * 1024
        with source.open("rb") as stream:  # (given a path, tuspy leaves the file open)
            whole = client.uploader(file_stream=stream, chunk_size=chunk, metadata={"filename": "whole.bin"})
            whole.upload()
        with source.open("rb") as stream:
            named = {"filename": "resumed.bin"}
            first = client.uploader(file_stream=stream, chunk_size=chunk, metadata=named)
            first.upload_chunk()
            assert first.offset == chunk
        assert not (public / "sub" / "resumed.bin").exists()
        with source.open("rb") as stream:
            again = client.uploader(file_stream=stream, chunk_size=chunk, url=first.url)
            assert again.offset == chunk  # (asked of the server)
            again.upload()
    finally:
        server.close()
    assert (public / "sub" / "whole.bin").read_bytes() == data
    assert (public / "sub" / "resumed.bin").read_bytes() == data
    assert left(public / "sub") == ["resumed.bin", "whole.bin"]


# -- other processes: a killed client, a killed server ----------------------------------------------

_CLIENT = """
import socket, sys, time
port, path, total = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(("PATCH %s HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Length: %d\\r\\n"
           "Content-Type: application/partial-upload\\r\\nUpload-Offset: 0\\r\\n"
           "Upload-Complete: ?1\\r\\n\\r\\n" % (path, total)).encode())
s.sendall(b"k" * 400000)
print("sent", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_upload_survives_a_killed_client_and_a_killed_server(public: Path, loop: str) -> None:
    total = 1_000_000
    server = Server(str(public), "--port", "0", "--upload", "--loop", loop)
    try:
        port = port_of(server)
        made = http_exchange(port, request("PUT", "/sub/f", "Upload-Complete: ?0", f"Upload-Length: {total}"))
        assert made.status == 201
        where_to = field(made, "Location")
        client = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, str(port), where_to, str(total)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None
        assert client.stdout.readline() == "sent\n"
        partial = partial_of(public, where_to)
        deadline = time.monotonic() + 20
        while partial.stat().st_size < 400_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partial.stat().st_size == 400_000
        client.kill()  # the client dies mid-PATCH
        client.wait()
        client.stdout.close()
        status = http_exchange(port, head_of(where_to), "HEAD")
        assert (status.status, field(status, "Upload-Offset")) == (204, "400000")
        server.proc.send_signal(signal.SIGKILL)  # then the server
        server.proc.wait()
    finally:
        server.close()
    server = Server(str(public), "--port", "0", "--upload", "--loop", loop)
    try:
        port = port_of(server)
        status = http_exchange(port, head_of(where_to), "HEAD")
        assert (status.status, field(status, "Upload-Offset")) == (204, "400000")
        rest = append_to(where_to, "400000", "?1", body=b"r" * (total - 400_000))
        assert http_exchange(port, rest).status == 201
    finally:
        server.close()
    assert (public / "sub" / "f").read_bytes() == b"k" * 400_000 + b"r" * (total - 400_000)
    with contextlib.suppress(FileNotFoundError):
        assert [n for n in left(public / "sub") if n.endswith(".partial")] == []


def test_a_killed_servers_creation_under_way_holds_no_room_after(public: Path) -> None:
    """A creation of no announced length holds its owner's room while its body comes; the server
    killed meanwhile (an OOM kill, a crash), the next server does not count that share against
    the owner (it counted the whole --max-partial-size for the upload's expiry)."""
    args = ("--port", "0", "--upload", "--max-partial-size", "1M")
    server = Server(str(public), *args)
    sock = None
    try:
        port = port_of(server)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            b"PUT /sub/k.bin HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            b"Upload-Complete: ?0\r\n\r\n3e8\r\n" + b"k" * 1000 + b"\r\n"
        )
        deadline = time.monotonic() + 20
        while not any(p.stat().st_size == 1000 for p in (public / "sub").glob(".upload-*.partial")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
    finally:
        if sock is not None:
            sock.close()
        server.close()
    server = Server(str(public), *args)
    try:
        creation = request("PUT", "/sub/new.bin", "Upload-Complete: ?0", body=b"n" * 10)
        made = http_exchange(port_of(server), creation)
        assert made.status == 201
    finally:
        server.close()


def test_the_parts_of_an_upload_may_reach_different_workers(public: Path) -> None:
    """With ``--workers 2`` each part goes on a new connection, which either worker may accept:
    the store is on disk, shared."""
    server = Server(str(public), "--port", "0", "--upload", "--workers", "2")
    try:
        port = port_of(server)
        made = http_exchange(port, request("PUT", "/sub/w", "Upload-Complete: ?0", "Upload-Length: 20000"))
        assert made.status == 201
        where_to = field(made, "Location")
        for n in range(20):
            complete = "?1" if n == 19 else "?0"
            part = append_to(where_to, str(n * 1000), complete, body=bytes([65 + n]) * 1000)
            assert http_exchange(port, part).status == (201 if n == 19 else 204)
    finally:
        server.close()
    assert (public / "sub" / "w").read_bytes() == b"".join(bytes([65 + n]) * 1000 for n in range(20))


async def test_a_spliced_append_and_creation_are_logged_with_their_method(public: Path) -> None:
    """A body big enough to go from the socket to its file (``splice``) was logged as a ``PUT``
    whatever its method: a tus ``PATCH`` and a tus creation with its body (``POST``) keep theirs."""
    import io

    log = io.StringIO()
    data = os.urandom(400_000)
    async with serve_site(public, upload=True, access_log=log) as site:
        made = await ask(
            site,
            request(
                "POST",
                "/sub/",
                TUS,
                f"Upload-Length: {2 * len(data)}",
                tus_metadata("big.bin"),
                "Content-Type: application/offset+octet-stream",
                body=data,
            ),
        )
        assert made.status == 201, made
        where_to = field(made, "Location")
        rest = request(
            "PATCH",
            where_to,
            TUS,
            "Content-Type: application/offset+octet-stream",
            f"Upload-Offset: {len(data)}",
            body=data,
        )
        assert (await ask(site, rest)).status == 204
    assert (public / "sub" / "big.bin").read_bytes() == data + data
    methods = [line.split('"')[1].split(" ")[0] for line in log.getvalue().splitlines()]
    assert methods == ["POST", "PATCH"], log.getvalue()


async def test_an_upload_nothing_was_sent_to_says_the_time_it_is_kept(public: Path) -> None:
    """An upload with no bytes yet is kept ten minutes (``KEEP_EMPTY``), not the whole expiry: its
    ``Upload-Limit: max-age`` and tus's ``Upload-Expires`` say so, in the creation's answer and in
    a ``HEAD`` (they said a day, and the upload was gone ten minutes later). Once bytes came, they
    say the whole expiry."""
    import email.utils
    import time

    from aiosendfile._serve._partial import KEEP_EMPTY

    def max_age(answer: Any) -> int:
        return int(field(answer, "Upload-Limit").split("max-age=")[1].split(",")[0])

    def expires_in(answer: Any) -> float:
        return email.utils.parsedate_to_datetime(field(answer, "Upload-Expires")).timestamp() - time.time()

    async with serve_site(public, upload=True, upload_expiry=86400) as site:
        made = await ask(site, request("PUT", "/sub/e", "Upload-Complete: ?0", "Upload-Length: 4"))
        assert made.status == 201
        assert KEEP_EMPTY - 5 <= max_age(made) <= KEEP_EMPTY
        where_to = field(made, "Location")
        assert KEEP_EMPTY - 5 <= max_age(await ask(site, head_of(where_to, V8), "HEAD")) <= KEEP_EMPTY
        tus = await ask(site, request("POST", "/sub/", TUS, "Upload-Length: 4", tus_metadata("t")))
        assert tus.status == 201
        assert KEEP_EMPTY - 5 <= expires_in(tus) <= KEEP_EMPTY + 1
        tus_at = field(tus, "Location")
        assert KEEP_EMPTY - 5 <= expires_in(await ask(site, head_of(tus_at, TUS), "HEAD")) <= KEEP_EMPTY + 1
        sent = await ask(site, append_to(where_to, "0", "?0", V8, body=b"ab"))
        assert sent.status == 204, sent
        assert 86400 - 5 <= max_age(sent) <= 86400
        patch = ("PATCH", tus_at, TUS, "Content-Type: application/offset+octet-stream", "Upload-Offset: 0")
        sent = await ask(site, request(*patch, body=b"ab"))
        assert sent.status == 204, sent
        assert 86400 - 5 <= expires_in(sent) <= 86401


async def test_tus_creation_at_a_folder_without_its_slash(public: Path) -> None:
    """tus clients are often given the folder without its trailing slash (tus-js-client's
    ``endpoint: ".../inbox"``): the creation goes into it, as with the slash (it was 415)."""
    async with serve_site(public, upload=True) as site:
        made = await ask(site, request("POST", "/sub", TUS, "Upload-Length: 3", tus_metadata("t.txt")))
        assert made.status == 201, made
        where_to = field(made, "Location")
        assert where_to.startswith("/sub/t.txt?upload="), where_to
        patch = ("PATCH", where_to, TUS, "Content-Type: application/offset+octet-stream", "Upload-Offset: 0")
        assert (await ask(site, request(*patch, body=b"abc"))).status == 204
        (public / "plain.txt").write_bytes(b"p")
        on_a_file = await ask(site, request("POST", "/plain.txt", TUS, "Upload-Length: 3", tus_metadata("x")))
        assert on_a_file.status in (404, 409), on_a_file
    assert (public / "sub" / "t.txt").read_bytes() == b"abc"
    assert (public / "plain.txt").read_bytes() == b"p"


async def test_a_body_over_the_upload_size_is_refused_with_each_protocols_fields(public: Path) -> None:
    """A 413 decided from the head (``Content-Length`` over ``--max-upload-size``), or as a
    chunked body grows past it, carries ``Upload-Limit`` for the IETF draft (its 413 MUST) and
    ``Tus-Resumable`` for tus (every tus answer): it had neither."""
    async with serve_site(public, upload=True, max_upload_size=1000) as site:
        ietf = await ask(site, request("PUT", "/sub/a", "Upload-Complete: ?1", V8, length=2000))
        assert ietf.status == 413
        assert "max-size=1000" in field(ietf, "Upload-Limit")
        made = await ask(site, request("POST", "/sub/", TUS, "Upload-Length: 900", tus_metadata("t")))
        where_to = field(made, "Location")
        patch = ("PATCH", where_to, TUS, "Content-Type: application/offset+octet-stream", "Upload-Offset: 0")
        tus = await ask(site, request(*patch, length=2000))
        assert tus.status == 413
        assert field(tus, "Tus-Resumable") == "1.0.0"
        head = (
            "PUT /sub/c HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nUpload-Complete: ?1\r\n"
        )
        chunked = (head + V8 + "\r\n\r\n").encode() + b"%x\r\n%s\r\n" % (1500, b"c" * 1500)
        grown = await ask(site, chunked)
        assert grown.status == 413
        assert "max-size=1000" in field(grown, "Upload-Limit")


@pytest.mark.parametrize("case", ["no body", "through a trusted proxy"])
async def test_no_104_where_it_cannot_serve_or_reach_its_client(public: Path, case: str) -> None:
    """A creation with no body has its final answer at once: a 104 before it tells nothing (the
    listing page's script creates so). Through a trusted proxy it may not reach the client at
    all: nginx (1.22 at least) takes an upstream's 1xx for its final answer and then waits for
    the real one until its timeout, so every upload of the listing page failed behind it (a
    review). Neither gets one; the final answer carries the address."""
    proxy = ("127.0.0.1",) if case == "through a trusted proxy" else ()
    body = b"abc" if proxy else b""
    async with serve_site(public, upload=True, trusted_proxies=proxy) as site:
        reader, writer = await site.open()
        try:
            writer.write(request("PUT", "/sub/f", "Upload-Complete: ?0", V8, body=body))
            first = await read_response(reader)
        finally:
            writer.close()
        assert first.status == 201
        assert field(first, "Location")
