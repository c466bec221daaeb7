"""``aiosendfile.asgi`` in process: descriptor lifetime, ``FileResponse``, ``StaticFiles``' Starlette
arguments, and Starlette/FastAPI apps through httpx (the fake ASGI server of
``tests/support/asgi_fake_server.py`` where a server is needed).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from aiosendfile import asgi
from aiosendfile._asgi import _app
from aiosendfile._static._recent import RecentPaths

from ..support.asgi_fake_server import (
    BODY,
    EXTENSIONS,
    GET_LARGE,
    MULTI_LARGE,
    RANGE_LARGE,
    START,
    FakeServer,
    app_for,
    call,
    comparable,
    no_core,
    scope_of,
)
from ..support.fake_fs import kernel_caches
from ..support.static_requests import (
    GOLDEN_PATH,
    KNOWN_DIFFERENCES,
    LARGE_SIZE,
    SMALL,
    large_bytes,
    normalise,
    requests,
)

GOLDEN = json.loads(GOLDEN_PATH.read_text())


# -- descriptor lifetime ---------------------------------------------------------------------


@pytest.mark.parametrize("extensions", sorted(EXTENSIONS))
@pytest.mark.parametrize("request_", [GET_LARGE, RANGE_LARGE, MULTI_LARGE], ids=["full", "range", "multi"])
async def test_a_send_that_raises_closes_the_descriptor(
    public: Path, extensions: str, request_: bytes
) -> None:
    """The client is gone: send raises (ASGI 2.4 servers raise OSError); the descriptor is closed."""
    app = asgi.StaticFiles(directory=public)
    scope = scope_of(request_, extensions)
    handed: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if "aiosendfile.fd" in message:
            handed.append(message["aiosendfile.fd"])
        if "file" in message:
            handed.append(message["file"].fileno())
        if message["type"] != START:
            raise OSError("client gone")

    with pytest.raises(OSError, match="client gone"):
        await app(scope, FakeServer(scope).receive, send)
    for fd in handed:
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)


@pytest.fixture(scope="module")
def closed_transport_error() -> str:
    """What uvloop says when written to on a transport it has closed (the real words: the apps
    recognise the error by them)."""
    import uvloop

    loop = uvloop.new_event_loop()
    ours, theirs = socket.socketpair()

    async def write_after_close() -> str:
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        transport.close()
        await asyncio.sleep(0.01)  # connection_lost ran: the handle is closed
        with pytest.raises(RuntimeError) as info:
            transport.write(b"x")
        return str(info.value)

    try:
        return loop.run_until_complete(write_after_close())
    finally:
        loop.close()
        ours.close()
        theirs.close()


@pytest.mark.parametrize("fails", [START, BODY], ids=["at-start", "at-body"])
async def test_a_send_on_a_closed_transport_ends_the_answer_quietly(
    public: Path, closed_transport_error: str, fails: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock uvicorn's httptools protocol, when a client that pipelines goes away, lets the request
    being answered write on the closed transport: under uvloop ``send`` raises RuntimeError (#23
    item 7; it was logged as "Exception in ASGI application"). The apps return quietly then, from the
    memo's fast path, the core's path and FileResponse alike, the descriptor closed; any other
    RuntimeError from ``send`` is raised as it was."""
    app = asgi.StaticFiles(directory=public)
    get_small = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    handed: list[int] = []

    def failing(words: str) -> Any:
        async def send(message: dict[str, Any]) -> None:
            if "aiosendfile.fd" in message:
                handed.append(message["aiosendfile.fd"])
            if message["type"] == fails or (fails == BODY and message["type"] != START):
                raise RuntimeError(words)

        return send

    cases = [
        (app, get_small),
        (app, get_small),
        (app, GET_LARGE),
        (asgi.FileResponse(public / "large.bin"), GET_LARGE),
    ]
    for extensions in ("none", "ours"):
        for i, (target, raw) in enumerate(cases):
            scope = scope_of(raw, extensions)
            if i == 1:  # answered from the memo (the first call memoised it), not by the core
                no_core(monkeypatch)
            await target(scope, FakeServer(scope).receive, failing(closed_transport_error))
            with pytest.raises(RuntimeError, match="Unexpected ASGI message"):
                await target(scope, FakeServer(scope).receive, failing("Unexpected ASGI message"))
            monkeypatch.undo()
    assert handed or fails == START
    for fd in handed:
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)


@pytest.mark.parametrize("extensions", sorted(EXTENSIONS))
async def test_cancelled_during_send_closes_the_descriptor(public: Path, extensions: str) -> None:
    app = asgi.StaticFiles(directory=public)
    scope = scope_of(GET_LARGE, extensions)
    in_send = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] != START:
            in_send.set()
            await asyncio.Event().wait()  # a server stuck on a slow client

    task = asyncio.ensure_future(app(scope, FakeServer(scope).receive, send))
    await in_send.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # (the fd guard of the conftest fails the test if the descriptor stayed open)


async def test_cancelled_during_a_cold_decision_closes_what_comes_back(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FileResponse's first sight is decided in the pool, which opens the file; cancelled
    meanwhile, its answer is closed."""
    import threading

    from aiosendfile._static import _core

    release = threading.Event()
    started = threading.Event()

    def slow_respond(*args: Any) -> Any:
        started.set()
        release.wait(10)
        return _core.respond(*args)

    monkeypatch.setattr(_app, "respond", slow_respond)
    monkeypatch.setattr(_app, "_RECENT_FILES", RecentPaths())
    app = asgi.FileResponse(public / "large.bin")
    scope = scope_of(GET_LARGE)
    task = asyncio.ensure_future(app(scope, FakeServer(scope).receive, FakeServer(scope).send))
    while not started.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("cached", [False, True], ids=["lookup-needs-disk", "lookup-cached"])
async def test_a_path_is_looked_up_in_the_cold_pool_at_first_sight_then_decided_inline(
    public: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """The first sight serve's engine has (``_inline.first_look``): a path whose lookup would read
    the disk is looked up in the cold pool, once, then decided on the loop; one the kernel's
    caches hold is decided inline at once, with no hop. The answers are the same either way."""
    kernel_caches(monkeypatch, cached)
    real_off_loop = _app._off_loop
    hops: list[tuple[str, bytes]] = []

    async def counting(fn: Any, *args: Any) -> Any:
        hops.append((fn.__name__, args[0].raw_path))
        return await real_off_loop(fn, *args)

    monkeypatch.setattr(_app, "_off_loop", counting)
    app = asgi.StaticFiles(directory=public)
    statuses = []
    for target in (b"/large.bin", b"/large.bin", b"/missing", b"/missing", b"/a.txt", b"/a.txt"):
        # (a Range: never kept in the answer cache, so every request meets the first sight's rule)
        reply = await call(app, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\n\r\n")
        statuses.append(reply.status)
    assert statuses == [206, 206, 404, 404, 206, 206]
    assert hops == (
        [] if cached else [("look_up", b"/large.bin"), ("look_up", b"/missing"), ("look_up", b"/a.txt")]
    )


# -- FileResponse ----------------------------------------------------------------------------


@pytest.mark.parametrize("extensions", sorted(EXTENSIONS))
async def test_file_response_answers_as_the_static_files(public: Path, extensions: str) -> None:
    """FileResponse(path) answers a file's requests as StaticFiles does (same fields and body)."""
    static = asgi.StaticFiles(directory=public)
    for name, raw in requests("default"):
        if not name.startswith(("get-large", "range-", "inm-", "ims-", "if-range", "ae-", "head-")):
            continue
        target = raw.split(b" ")[1].partition(b"?")[0]
        path = public / unquote(target.decode())[1:]
        ours = await call(asgi.FileResponse(path), raw, extensions)
        theirs = await call(static, raw, extensions)
        assert comparable(normalise(ours.raw())) == comparable(normalise(theirs.raw())), name


async def test_file_response_starlette_arguments(public: Path) -> None:
    ran: list[bool] = []

    async def background() -> None:
        ran.append(True)

    response = asgi.FileResponse(
        public / "a.txt",
        status_code=203,
        headers={"X-Extra": "1", "Vary": "Origin"},
        media_type="text/x-mine",
        filename="naïve.txt",
        background=background,
    )
    server = await call(response, b"GET / HTTP/1.1\r\nRange: bytes=0-1\r\n\r\n")
    fields = dict(server.headers)
    assert server.status == 203
    assert bytes(server.body) == SMALL
    assert fields[b"content-type"] == b"text/x-mine"
    assert fields[b"x-extra"] == b"1"
    assert fields[b"content-disposition"] == b"attachment; filename*=utf-8''na%C3%AFve.txt"
    assert [v for n, v in server.headers if n == b"vary"] == [b"Origin", b"Accept-Encoding"]
    assert ran == [True]


async def test_file_response_is_a_starlette_response(public: Path) -> None:
    """FastAPI sends a returned Starlette Response as it is; its headers and cookies are the caller's."""
    from starlette.responses import Response

    response = asgi.FileResponse(public / "a.txt", headers={"Content-Length": "1"})
    assert isinstance(response, Response)
    response.set_cookie("seen", "1")
    response.headers["x-later"] = "2"
    server = await call(response, b"GET / HTTP/1.1\r\n\r\n")
    fields = dict(server.headers)
    assert fields[b"set-cookie"].startswith(b"seen=1;")
    assert fields[b"x-later"] == b"2"
    assert fields[b"content-length"] == b"440"  # the caller's is dropped
    assert [n for n, _ in server.headers].count(b"content-length") == 1


async def test_file_response_fields_the_caller_sets_stay_the_callers(public: Path) -> None:
    """As Starlette's: the type is guessed from ``filename`` (a file stored under another name);
    a type, validators, disposition or caching the caller sets, at construction or after, are sent
    in place of the core's, once; with its own validators the core judges no precondition by its
    own (``If-None-Match`` with the core's tag was a 304 for a response that did not send it)."""
    stored = public / "a.txt"
    server = await call(asgi.FileResponse(stored, filename="report.pdf"), b"GET / HTTP/1.1\r\n\r\n")
    assert dict(server.headers)[b"content-type"] == b"application/pdf"

    response = asgi.FileResponse(stored, filename="x.txt", headers={"Content-Disposition": "inline"})
    response.headers["Content-Type"] = "application/x-mine"
    response.headers["ETag"] = '"v7"'
    response.headers["Cache-Control"] = "no-store"
    core_tag = dict((await call(asgi.FileResponse(stored), b"GET / HTTP/1.1\r\n\r\n")).headers)[b"etag"]
    for asked in (b"If-None-Match: " + core_tag, b'If-None-Match: "v7"', b"If-Match: " + core_tag):
        server = await call(response, b"GET / HTTP/1.1\r\n" + asked + b"\r\n\r\n")
        assert (server.status, bytes(server.body)) == (200, SMALL), asked
        for name, value in [
            (b"content-type", b"application/x-mine"),
            (b"etag", b'"v7"'),
            (b"cache-control", b"no-store"),
            (b"content-disposition", b"inline"),
        ]:
            assert [v for n, v in server.headers if n == name] == [value], name
    # (several ranges: the parts' boundary is in the core's type, which stays)
    server = await call(response, b"GET / HTTP/1.1\r\nRange: bytes=0-1,4-5\r\n\r\n")
    assert server.status == 206
    assert dict(server.headers)[b"content-type"].startswith(b"multipart/byteranges; boundary=")
    # (a range with an If-Range: judged against the caller's tag, as Starlette judges it)
    server = await call(response, b'GET / HTTP/1.1\r\nRange: bytes=0-1\r\nIf-Range: "v7"\r\n\r\n')
    assert (server.status, bytes(server.body)) == (206, SMALL[:2])
    for other in (b'"v6"', b'W/"v7"', core_tag, b"Mon, 01 Jan 2024 00:00:00 GMT"):
        server = await call(
            response, b"GET / HTTP/1.1\r\nRange: bytes=0-1\r\nIf-Range: " + other + b"\r\n\r\n"
        )
        assert (server.status, bytes(server.body)) == (200, SMALL), other
    dated = asgi.FileResponse(stored, headers={"Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"})
    asked = b"GET / HTTP/1.1\r\nRange: bytes=0-1\r\nIf-Range: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n"
    server = await call(dated, asked)
    assert (server.status, bytes(server.body)) == (206, SMALL[:2])
    server = await call(response, b"GET / HTTP/1.1\r\nRange: bytes=0-1\r\n\r\n")
    assert (server.status, bytes(server.body)) == (206, SMALL[:2])


@pytest.mark.parametrize("method", ["PUT", "POST", "DELETE", "PATCH"])
async def test_file_response_to_another_method_judges_no_precondition(public: Path, method: str) -> None:
    """A handler that acted (a ``PUT`` with ``If-None-Match: *`` that wrote the file) and returns
    the file: the preconditions were its own to judge, before it acted; the answer is the file,
    whole (it was 412 after the write had landed)."""
    response = asgi.FileResponse(public / "a.txt")
    for asked in (b"If-None-Match: *", b'If-Match: "other"', b"Range: bytes=0-1"):
        raw = f"{method} / HTTP/1.1\r\n".encode() + asked + b"\r\n\r\n"
        server = await call(response, raw)
        assert (server.status, bytes(server.body)) == (200, SMALL), asked
    # (a HEAD of a file sent as another status stays a HEAD: no body read or sent)
    page = asgi.FileResponse(public / "a.txt", status_code=404)
    server = await call(page, b"HEAD / HTTP/1.1\r\nRange: bytes=0-1\r\n\r\n")
    assert (server.status, bytes(server.body)) == (404, b"")


async def test_file_response_missing_file_is_an_empty_404(tmp_path: Path) -> None:
    server = await call(asgi.FileResponse(tmp_path / "nope"), b"GET / HTTP/1.1\r\n\r\n")
    assert (server.status, server.headers, bytes(server.body)) == (404, [(b"content-length", b"0")], b"")


async def test_file_response_root_confines_the_file(public: Path) -> None:
    response = asgi.FileResponse(public / "out-link.txt", root=public)
    server = await call(response, b"GET / HTTP/1.1\r\n\r\n")
    assert server.status == 404
    assert not server.body


# -- StaticFiles' Starlette arguments --------------------------------------------------------


def test_check_dir_refuses_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="does not exist"):
        asgi.StaticFiles(directory=tmp_path / "nope")
    asgi.StaticFiles(directory=tmp_path / "nope", check_dir=False)


async def test_html_serves_the_404_page(public: Path) -> None:
    (public / "404.html").write_bytes(b"<h1>lost</h1>")
    app = asgi.StaticFiles(directory=public, html=True)
    server = await call(app, b"GET /nope.txt HTTP/1.1\r\n\r\n")
    assert server.status == 404
    assert bytes(server.body) == b"<h1>lost</h1>"
    assert dict(server.headers)[b"content-type"] == b"text/html"
    head = await call(app, b"HEAD /nope.txt HTTP/1.1\r\n\r\n")
    assert head.status == 404
    assert not head.body
    for _ in range(2):  # the 404 page is in the hot-file cache now: never memoised as this path's 200
        again = await call(app, b"GET /nope.txt HTTP/1.1\r\n\r\n")
        assert (again.status, bytes(again.body)) == (404, b"<h1>lost</h1>")
    plain = await call(asgi.StaticFiles(directory=public), b"GET /nope.txt HTTP/1.1\r\n\r\n")
    assert bytes(plain.body) == b"404: Not Found"
    # A 404 found only as the file is opened (a symlink out of the root) gets the page too.
    out = await call(app, b"GET /out-link.txt HTTP/1.1\r\n\r\n")
    assert (out.status, bytes(out.body)) == (404, b"<h1>lost</h1>")


async def test_follow_symlink_is_starlettes_spelling(public: Path) -> None:
    app = asgi.StaticFiles(directory=public, follow_symlink=True)
    server = await call(app, b"GET /out-link.txt HTTP/1.1\r\n\r\n")
    assert server.status == 200
    assert bytes(server.body) == b"SECRET outside\n"


# -- Starlette and FastAPI, in process through httpx ------------------------------------------


def _starlette_app(public: Path) -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Mount, Route

    async def report(request: Any) -> Any:
        return asgi.FileResponse(public / "large.bin", filename="large.bin")

    return Starlette(
        routes=[
            Route("/report", report),
            Mount("/static", app=asgi.StaticFiles(directory=public), name="static"),
        ]
    )


def _fastapi_app(public: Path) -> Any:
    from fastapi import FastAPI

    app = FastAPI()
    app.mount("/static", asgi.StaticFiles(directory=public), name="static")

    @app.get("/report")
    async def report() -> Any:
        return asgi.FileResponse(public / "large.bin", filename="large.bin")

    return app


@pytest.mark.parametrize("framework", ["starlette", "fastapi"])
@pytest.mark.parametrize("extensions", sorted(EXTENSIONS))
async def test_mounted_in_a_framework(public: Path, framework: str, extensions: str) -> None:
    """Through Starlette's router (``Mount`` sets ``root_path``) and FastAPI's ``app.mount``."""
    app = _starlette_app(public) if framework == "starlette" else _fastapi_app(public)

    async def get(target: bytes, *fields: bytes) -> FakeServer:
        raw = b"GET " + target + b" HTTP/1.1\r\nHost: test\r\n" + b"".join(f + b"\r\n" for f in fields)
        return await call(app, raw + b"\r\n", extensions)

    for _ in range(3):
        r = await get(b"/static/a.txt")
        assert (r.status, bytes(r.body)) == (200, SMALL)
    r = await get(b"/static/large.bin", b"Range: bytes=0-0,100-199")
    assert r.status == 206
    assert dict(r.headers)[b"content-type"].startswith(b"multipart/byteranges; boundary=")
    r = await get(b"/static/large.bin", b"Range: bytes=10-19")
    assert (r.status, bytes(r.body)) == (206, large_bytes()[10:20])
    r = await get(b"/static/sub")
    assert (r.status, dict(r.headers)[b"location"]) == (301, b"/static/sub/")
    r = await get(b"/static/%2e%2e/outside/secret.txt")
    assert r.status == 404
    r = await get(b"/report")
    assert bytes(r.body) == large_bytes()
    assert dict(r.headers)[b"content-disposition"] == b'attachment; filename="large.bin"'
    assert app.url_path_for("static", path="/a.txt") == "/static/a.txt"


def test_starlette_test_client(public: Path) -> None:
    pytest.importorskip("httpx2")  # Starlette 1.x's TestClient (in the test extra)
    from starlette.testclient import TestClient

    with TestClient(_starlette_app(public)) as client:
        assert client.get("/static/a.txt").content == SMALL
        r = client.head("/static/large.bin")
        assert r.status_code == 200
        assert r.headers["content-length"] == str(LARGE_SIZE)
        assert not r.content
        etag = client.get("/static/large.bin").headers["etag"]
        assert client.get("/static/large.bin", headers={"If-None-Match": etag}).status_code == 304


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_a_long_body_stops_when_the_client_leaves(public: Path, spec_version: str) -> None:
    """Before ASGI 2.4 a server's send returns quietly once the client is gone (uvicorn does):
    a long body listens for http.disconnect and stops reading; a 2.4 server raises instead."""
    app = asgi.StaticFiles(directory=public, chunk_size=16384)  # large.bin: 13 chunks
    scope = scope_of(GET_LARGE)
    scope["asgi"]["spec_version"] = spec_version
    gone = asyncio.Event()
    bodies = 0

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal bodies
        if message["type"] == BODY:
            bodies += 1
            gone.set()
            if spec_version == "2.4":
                raise OSError("client gone")

    if spec_version == "2.4":
        with pytest.raises(OSError, match="client gone"):
            await app(scope, receive, send)
    else:
        await app(scope, receive, send)
    assert bodies <= 2


def test_recent_paths_remember_for_a_while_and_within_bounds() -> None:

    recent = RecentPaths(seconds=10, max_entries=2, max_bytes=100)
    assert not recent.seen(b"/a", 0)
    recent.saw(b"/a", 0)
    assert recent.seen(b"/a", 5)  # and noted again at 5
    assert recent.seen(b"/a", 14)
    assert not recent.seen(b"/a", 30)  # too long ago
    recent.saw(b"/b", 30)
    recent.saw(b"/c", 30)
    recent.saw(b"/d", 30)  # over max_entries: the least recent (/a) goes first, then /b
    assert len(recent) == 2
    assert not recent.seen(b"/b", 30)
    assert recent.seen(b"/c", 30)
    recent.saw(b"/" + b"x" * 99, 30)  # over max_bytes: only the newest fits
    assert len(recent) == 1


def test_under_trio(public: Path) -> None:
    """Outside asyncio (trio, as hypercorn's trio worker runs apps), thread hops and the disconnect
    watch go through anyio: the golden table answers the same under each extension set."""
    trio = pytest.importorskip("trio")

    async def main() -> None:
        for extensions in EXTENSIONS:
            app = app_for(public, "default", chunk_size=65536)  # large.bin: several chunks
            for _ in range(2):
                for name, raw in requests("default"):
                    if name in KNOWN_DIFFERENCES:
                        continue
                    got = normalise((await call(app, raw, extensions)).raw())
                    assert comparable(got) == comparable(GOLDEN["server"]["default"][name]), name

    trio.run(main)
