"""``aiosendfile.asgi`` in process: the golden table through a fake ASGI server, the message rules,
descriptor lifetime, and Starlette/FastAPI apps through httpx.

The fake server (:class:`FakeServer`) builds the scope a server would (uvicorn's spelling: path
decoded, ``raw_path`` as sent without the query, lowercase header names), lists one set of
extensions, collects the messages, checks their order, and carries out ``pathsend`` (ours with a
descriptor and ranges, or a plain path) and ``zerocopysend`` by reading the file the way a server
would. The response rendered from those messages must be the aiohttp plugin's recorded answer
(``tests/data/static_golden.json``) but for header-name case (ASGI names are lowercase) and the
reason phrase: at the root against the plugin on ``web.Server``, under a ``/static`` mount
(``root_path``, as Starlette's ``Mount`` sets it) against the plugin in an ``Application``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import pytest

from aiosendfile import asgi
from aiosendfile._asgi import _app
from aiosendfile._static import _hot

from ..support.files import CHANGES, change_file
from ..support.static_requests import (
    GOLDEN_PATH,
    KNOWN_DIFFERENCES,
    LARGE_SIZE,
    POLICIES,
    SMALL,
    build_tree,
    large_bytes,
    normalise,
    requests,
)

GOLDEN = json.loads(GOLDEN_PATH.read_text())

#: The extension sets a server may list: none (hypercorn, stock uvicorn), pathsend (granian),
#: zerocopysend, and ours (aiosendfile.uvicorn's protocols list all three).
EXTENSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "none": {},
    "pathsend": {"http.response.pathsend": {}},
    "zerocopysend": {"http.response.zerocopysend": {}},
    "ours": {"http.response.pathsend": {}, "http.response.zerocopysend": {}, "aiosendfile.pathsend": {}},
}


def scope_of(raw_request: bytes, extensions: str = "none", root_path: str = "") -> dict[str, Any]:
    """The http scope uvicorn builds for *raw_request* (root_path: what a ``Mount`` adds)."""
    head = raw_request.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    method, target, _ = head[0].split(" ")
    raw_path, _, query = target.encode("latin-1").partition(b"?")
    headers = [
        (name.strip().lower().encode("latin-1"), value.strip().encode("latin-1"))
        for name, _, value in (line.partition(":") for line in head[1:])
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path.decode("ascii")),
        "raw_path": raw_path,
        "query_string": query,
        "root_path": root_path,
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
        "extensions": dict(EXTENSIONS[extensions]),
    }


class FakeServer:
    """Collects one response's messages, checks their order, carries out pathsend/zerocopysend."""

    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.kinds: list[str] = []
        self.done = False
        self.asked = False
        self.fds: list[int] = []  # descriptors the app handed over (closed after, checked by tests)

    async def receive(self) -> dict[str, Any]:
        """The request (no body), then, as servers do, nothing until the client leaves."""
        if not self.asked:
            self.asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()  # (anyio: the trio test uses this server too)
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        assert not self.done, f"{kind} after the response was complete"
        self.kinds.append(kind)
        if self.status is None:
            assert kind == "http.response.start", kind
            self.status = message["status"]
            self.headers = [(bytes(n), bytes(v)) for n, v in message["headers"]]
            for name, _ in self.headers:
                assert name == name.lower(), name
            return
        assert kind != "http.response.start"
        ext = self.scope["extensions"]
        if kind == "http.response.body":
            assert isinstance(message.get("body", b""), bytes)
            self.body += message.get("body", b"")
            self.done = not message.get("more_body", False)
        elif kind == "http.response.pathsend":
            assert "http.response.pathsend" in ext
            fd = message.get("aiosendfile.fd")
            if fd is None:
                assert not any(k.startswith("aiosendfile.") for k in message), message
                with open(message["path"], "rb") as f:
                    self.body += f.read()
            else:
                assert "aiosendfile.pathsend" in ext
                os.fstat(fd)  # open while send runs
                self.fds.append(fd)
                if "aiosendfile.parts" in message:
                    for head, offset, count in message["aiosendfile.parts"]:
                        self.body += head + os.pread(fd, count, offset)
                    self.body += message["aiosendfile.closing"]
                else:
                    offset = message.get("aiosendfile.offset", 0)
                    count = message.get("aiosendfile.count", os.fstat(fd).st_size - offset)
                    self.body += os.pread(fd, count, offset)
            self.done = True
        elif kind == "http.response.zerocopysend":
            assert "http.response.zerocopysend" in ext
            fd = message["file"].fileno()
            self.fds.append(fd)
            self.body += os.pread(fd, message["count"], message["offset"])
            self.done = not message.get("more_body", False)
        else:
            raise AssertionError(f"unexpected message {message!r}")

    def raw(self) -> bytes:
        assert self.done
        assert self.status is not None
        lines = [f"HTTP/1.1 {self.status} X".encode()]
        lines += [n + b": " + v for n, v in self.headers]
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n" + bytes(self.body)


async def call(app: Any, raw_request: bytes, extensions: str = "none", root_path: str = "") -> FakeServer:
    scope = scope_of(raw_request, extensions, root_path)
    server = FakeServer(scope)
    await app(scope, server.receive, server.send)
    for fd in server.fds:  # every descriptor the app handed over is closed once it returned
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)
    return server


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """A normalised answer with the status code only and header names lowercase."""
    return {
        "status": answer["status"].split()[1],
        "headers": [[name.lower(), value] for name, value in answer["headers"]],
        "body": answer["body"],
    }


def app_for(public: Path, policy: str, **kwargs: Any) -> asgi.StaticFiles:
    options = POLICIES[policy]
    return asgi.StaticFiles(
        directory=public,
        listings=options.get("show_index", False),
        dotfiles=options.get("show_dotfiles", False),
        follow_symlinks=options.get("follow_symlinks", False),
        **kwargs,
    )


@pytest.fixture
def public(tmp_path: Path) -> Path:
    _hot.hot_files.clear()
    yield build_tree(tmp_path)
    _hot.hot_files.clear()


# -- the golden table ------------------------------------------------------------------------


@pytest.mark.parametrize("mount", ["root", "static"])
@pytest.mark.parametrize("extensions", sorted(EXTENSIONS))
async def test_golden_table_through_each_extension_set(public: Path, extensions: str, mount: str) -> None:
    """Every golden request answers as the plugin recorded, whatever the server lists."""
    prefix, root_path, door = (b"", "", "server") if mount == "root" else (b"/static", "/static", "app")
    for policy in POLICIES:
        app = app_for(public, policy)
        for name, raw in requests(policy, prefix):
            if name in KNOWN_DIFFERENCES:
                continue
            got = normalise((await call(app, raw, extensions, root_path)).raw())
            assert comparable(got) == comparable(GOLDEN[door][policy][name]), (policy, name)


@pytest.mark.parametrize("extensions", sorted(EXTENSIONS))
async def test_golden_table_answers_again_from_the_hot_memo(public: Path, extensions: str) -> None:
    """Asked three times (first sight in the pool, then inline, then the memo), each answer is the same."""
    app = app_for(public, "default")
    for _ in range(3):
        for name, raw in requests("default"):
            if name in KNOWN_DIFFERENCES:
                continue
            got = normalise((await call(app, raw, extensions)).raw())
            assert comparable(got) == comparable(GOLDEN["server"]["default"][name]), name


# -- which message each server gets ----------------------------------------------------------

GET_LARGE = b"GET /large.bin HTTP/1.1\r\nHost: x\r\n\r\n"
RANGE_LARGE = b"GET /large.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=10-19\r\n\r\n"
MULTI_LARGE = b"GET /large.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0,100-199\r\n\r\n"
HEAD_LARGE = b"HEAD /large.bin HTTP/1.1\r\nHost: x\r\n\r\n"

START, BODY, PATHSEND, ZEROCOPY = (
    "http.response.start",
    "http.response.body",
    "http.response.pathsend",
    "http.response.zerocopysend",
)


@pytest.mark.parametrize(
    ("extensions", "request_", "kinds"),
    [
        ("ours", GET_LARGE, [START, PATHSEND]),
        ("ours", RANGE_LARGE, [START, PATHSEND]),
        ("ours", MULTI_LARGE, [START, PATHSEND]),
        ("ours", HEAD_LARGE, [START, BODY]),
        ("pathsend", GET_LARGE, [START, PATHSEND]),
        ("pathsend", RANGE_LARGE, [START, BODY]),
        ("pathsend", HEAD_LARGE, [START, BODY]),
        ("zerocopysend", GET_LARGE, [START, ZEROCOPY]),
        ("zerocopysend", RANGE_LARGE, [START, ZEROCOPY]),
        ("zerocopysend", MULTI_LARGE, [START, BODY, ZEROCOPY, BODY, ZEROCOPY, BODY]),
        ("none", GET_LARGE, [START, BODY]),  # 200 KiB: one chunk of 256 KiB
        ("none", RANGE_LARGE, [START, BODY]),
        ("none", MULTI_LARGE, [START, BODY, BODY]),  # each part's header rides with its bytes
    ],
)
async def test_each_server_gets_the_message_its_extensions_allow(
    public: Path, extensions: str, request_: bytes, kinds: list[str]
) -> None:
    app = asgi.StaticFiles(directory=public)
    bodies = set()
    for _ in range(3):  # the pool's first sight, inline, then from the answer cache: the same messages
        server = await call(app, request_, extensions)
        assert server.kinds == kinds
        bodies.add(bytes(server.body))
    assert len(bodies) == (3 if request_ is MULTI_LARGE else 1)  # (a new boundary each time)


async def test_standard_pathsend_names_the_checked_file_not_a_descriptor(public: Path) -> None:
    """granian opens a pathsend's path in a task of its own after send returns: the path must name
    the file itself (read back from /proc/self/fd), never /proc/self/fd/N, which may be another
    file's by then."""
    seen: list[dict[str, Any]] = []
    app = asgi.StaticFiles(directory=public)
    scope = scope_of(b"GET /large.bin HTTP/1.1\r\n\r\n", "pathsend")
    server = FakeServer(scope)

    async def send(message: dict[str, Any]) -> None:
        seen.append(message)
        await server.send(message)

    await app(scope, server.receive, send)
    assert seen[-1]["path"] == str((public / "large.bin").resolve())
    assert bytes(server.body) == large_bytes()


async def test_chunks_are_bounded(public: Path) -> None:
    app = asgi.StaticFiles(directory=public, chunk_size=65536)
    server = await call(app, GET_LARGE)
    assert server.kinds == [START] + [BODY] * 4
    assert bytes(server.body) == large_bytes()
    assert len(server.body) == LARGE_SIZE


# -- the hot path ----------------------------------------------------------------------------


async def test_a_hot_file_is_answered_from_the_memo_without_the_core(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = asgi.StaticFiles(directory=public)
    get = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    first = await call(app, get)
    await call(app, get)

    def no_core(*args: Any) -> Any:
        raise AssertionError("the core was asked")

    monkeypatch.setattr(_app, "answer", no_core)
    monkeypatch.setattr(_app, "_decide_off_loop", no_core)
    third = await call(app, get)
    assert third.kinds == [START, BODY]
    assert third.raw() == first.raw()
    assert bytes(third.body) == SMALL
    head = await call(app, b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.headers == first.headers
    assert not head.body
    # A changed file is noticed (its stat no longer matches), and asked of the core again.
    (public / "a.txt").write_bytes(b"changed")
    monkeypatch.undo()
    changed = await call(app, get)
    assert bytes(changed.body) == b"changed"


AE_GET = b"GET /a.txt HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, deflate, br\r\n\r\n"


def _no_core(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_core(*args: Any) -> Any:
        raise AssertionError("the core was asked")

    for name in ("answer", "_decide_off_loop", "route", "resolve", "respond"):
        monkeypatch.setattr(_app, name, no_core)


async def test_accept_encoding_alone_is_answered_from_the_memo(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Browsers always send Accept-Encoding: with no sibling it admits, a hot file is still a memo
    hit (checked by the file's stat and its directory's)."""
    app = asgi.StaticFiles(directory=public)
    first = await call(app, AE_GET)
    await call(app, AE_GET)
    with monkeypatch.context() as patched:
        _no_core(patched)
        again = await call(app, AE_GET)
    assert again.raw() == first.raw()
    assert bytes(again.body) == SMALL


async def test_a_sibling_that_appears_after_the_memo_is_served(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new pre-compressed sibling changes its directory: the memo of "no sibling" is dropped."""
    app = asgi.StaticFiles(directory=public)
    for _ in range(3):
        assert not any(n == b"content-encoding" for n, _ in (await call(app, AE_GET)).headers)
    (public / "a.txt.br").write_bytes(b"BR of a.txt")
    got = await call(app, AE_GET)
    assert (dict(got.headers)[b"content-encoding"], bytes(got.body)) == (b"br", b"BR of a.txt")


@pytest.mark.parametrize("name", ["a.txt", "large.bin"])
@pytest.mark.parametrize("ae", [False, True], ids=["plain", "ae"])
@pytest.mark.parametrize("change", CHANGES)
async def test_a_changed_file_is_never_answered_from_the_answer_cache(
    public: Path, change: str, ae: bool, name: str
) -> None:
    """A file's plain 200, kept in the app's answer cache, is checked before it is used (a hot
    file by a stat of its path, a larger one by the fstat of the file opened again): whatever
    happens to the file between two requests, the answer is the new one."""
    app = asgi.StaticFiles(directory=public)
    path = public / name
    before = path.read_bytes()
    size = len(before)
    request_ = f"GET /{name} HTTP/1.1\r\nHost: x\r\n".encode() + (b"Accept-Encoding: gzip\r\n" if ae else b"")
    request_ += b"\r\n"
    outside = public.parent / "outside-a.txt"
    outside.write_bytes(b"o" * size)
    for _ in range(3):  # first sight, then inline and kept, then from the cache
        first = await call(app, request_)
        assert bytes(first.body) == before
    assert len(app._answers) == 1
    change_file(path, change, outside)
    got = await call(app, request_)
    if change == "symlink out":
        assert got.status == 404
    elif change == "chmod" and os.geteuid() != 0:
        assert got.status == 403
    else:
        assert got.status == 200
        assert bytes(got.body) == path.read_bytes()
        assert dict(got.headers)[b"etag"] != dict(first.headers)[b"etag"]


async def test_a_large_file_is_answered_again_from_the_answer_cache_without_the_core(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large file's plain 200 is kept too: asked again, it is opened, checked by fstat and sent
    with the kept header pairs, with no core decision; HEAD as well."""
    app = asgi.StaticFiles(directory=public)
    for _ in range(2):
        first = await call(app, GET_LARGE, "ours")
    with monkeypatch.context() as patched:
        _no_core(patched)
        again = await call(app, GET_LARGE, "ours")
        head = await call(app, HEAD_LARGE, "ours")
        plain = await call(app, GET_LARGE, "none")
    assert (again.kinds, again.headers) == ([START, PATHSEND], first.headers)
    assert (head.kinds, head.headers, bytes(head.body)) == ([START, BODY], first.headers, b"")
    assert plain.headers == first.headers
    assert bytes(plain.body) == large_bytes()


async def test_a_kept_small_file_dropped_from_the_hot_cache_is_read_back(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept answer of a small file without its bytes (decided while the hot-file cache did not
    hold them) whose bytes the hot-file cache does not hold is sent from its file, with no
    decision, and read back into the cache (as the core would), byte-exact."""
    app = asgi.StaticFiles(directory=public)
    get = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(2):
        first = await call(app, get)
    decided = app._answers.get(b"/a.txt")
    assert decided is not None
    assert decided.body == SMALL
    decided.body = None
    _hot.hot_files.clear()
    with monkeypatch.context() as patched:
        _no_core(patched)
        again = await call(app, get)
        assert (again.kinds, again.headers, bytes(again.body)) == ([START, BODY], first.headers, SMALL)
        assert len(_hot.hot_files._entries) == 1  # read back in
        hot = await call(app, get)  # from the cache again
    assert (hot.kinds, bytes(hot.body)) == ([START, BODY], SMALL)


async def test_an_answer_is_kept_per_mount_prefix(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a mount (root_path ``/static``) a hot file is answered from the cache; the same raw
    path under another root_path names another file and is never answered with the first's."""
    app = asgi.StaticFiles(directory=public)
    get = b"GET /static/a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(2):
        first = await call(app, get, root_path="/static")
    with monkeypatch.context() as patched:
        _no_core(patched)
        again = await call(app, get, root_path="/static")
    assert (again.raw(), bytes(again.body)) == (first.raw(), SMALL)
    (public / "static").mkdir()
    (public / "static" / "a.txt").write_bytes(b"another a")
    other = await call(app, get, root_path="")
    assert (other.status, bytes(other.body)) == (200, b"another a")


async def test_a_dangling_sibling_symlink_keeps_the_core_asked(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sibling that is a dangling symlink can come to life without its directory changing: while
    one exists, an Accept-Encoding request is not memoised."""
    target = public.parent / "outside" / "a.txt.gz"
    (public / "a.txt.gz").symlink_to(target)
    app = asgi.StaticFiles(directory=public, follow_symlinks=True)
    for _ in range(3):
        assert bytes((await call(app, AE_GET)).body) == SMALL
    target.write_bytes(b"GZ of a.txt")
    got = await call(app, AE_GET)
    assert (dict(got.headers)[b"content-encoding"], bytes(got.body)) == (b"gzip", b"GZ of a.txt")


async def test_the_memoised_header_pairs_are_not_shared_with_middlewares(public: Path) -> None:
    """A middleware may edit the start message's header list in place (GZipMiddleware does)."""
    app = asgi.StaticFiles(directory=public)
    get = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(4):
        scope = scope_of(get)
        server = FakeServer(scope)
        await app(scope, server.receive, _editing(server))
        assert b"x-edited" not in dict(server.headers)


def _editing(server: FakeServer) -> Any:
    async def send(message: dict[str, Any]) -> None:
        await server.send(message)
        if message["type"] == START:
            message["headers"].append((b"x-edited", b"1"))

    return send


async def test_a_mount_spelled_with_escapes_is_still_the_mount(public: Path) -> None:
    """Starlette matches a Mount on the decoded path: ``/st%61tic/a.txt`` is ``/static/a.txt``."""
    app = asgi.StaticFiles(directory=public)
    scope = scope_of(b"GET /st%61tic/a.txt HTTP/1.1\r\n\r\n", root_path="/static")
    server = FakeServer(scope)
    await app(scope, server.receive, server.send)
    assert server.status == 200
    assert bytes(server.body) == SMALL


async def test_a_server_that_leaves_root_path_out_of_path(public: Path) -> None:
    """hypercorn's ``root_path`` setting is not in ``path``: the path is then below the root as it is."""
    app = asgi.StaticFiles(directory=public)
    scope = scope_of(b"GET /a.txt HTTP/1.1\r\n\r\n", root_path="/api")
    server = FakeServer(scope)
    await app(scope, server.receive, server.send)
    assert server.status == 200
    assert bytes(server.body) == SMALL


async def test_no_raw_path_falls_back_to_path(public: Path) -> None:
    app = asgi.StaticFiles(directory=public)
    scope = scope_of(b"GET /space%20name.txt HTTP/1.1\r\n\r\n")
    del scope["raw_path"]
    server = FakeServer(scope)
    await app(scope, server.receive, server.send)
    assert server.status == 200
    assert bytes(server.body) == b"spaced\n"


# -- non-http scopes -------------------------------------------------------------------------


async def test_lifespan_is_acknowledged_and_a_websocket_refused(public: Path) -> None:
    app = asgi.StaticFiles(directory=public)
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    sent.clear()
    incoming[:] = [{"type": "websocket.connect"}]
    await app({"type": "websocket", "path": "/", "headers": []}, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1000, "reason": ""}]


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
                _no_core(monkeypatch)
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
    """The decision runs in the pool and opens the file; cancelled meanwhile, its answer is closed."""
    import threading

    from aiosendfile._static import _core

    release = threading.Event()
    started = threading.Event()

    def slow_answer(*args: Any) -> Any:
        started.set()
        release.wait(10)
        return _core.answer(*args)

    monkeypatch.setattr(_app, "answer", slow_answer)
    app = asgi.StaticFiles(directory=public)
    scope = scope_of(GET_LARGE)
    task = asyncio.ensure_future(app(scope, FakeServer(scope).receive, FakeServer(scope).send))
    while not started.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


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
    from aiosendfile._static._recent import RecentPaths

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
