"""``aiosendfile.asgi`` in process, through a fake ASGI server (``tests/support/asgi_fake_server.py``):
the golden table through each extension set, which message each server gets, the hot path, and
non-http scopes.

The response rendered from the app's messages must be the aiohttp plugin's recorded answer
(``tests/data/static_golden.json``) but for header-name case (ASGI names are lowercase) and the
reason phrase: at the root against the plugin on ``web.Server``, under a ``/static`` mount
(``root_path``, as Starlette's ``Mount`` sets it) against the plugin in an ``Application``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import asgi
from aiosendfile._static import _hot

from ..support.asgi_fake_server import (
    BODY,
    EXTENSIONS,
    GET_LARGE,
    HEAD_LARGE,
    MULTI_LARGE,
    PATHSEND,
    RANGE_LARGE,
    START,
    ZEROCOPY,
    FakeServer,
    app_for,
    call,
    comparable,
    no_core,
    scope_of,
)
from ..support.files import CHANGES, change_file
from ..support.static_requests import (
    GOLDEN_PATH,
    KNOWN_DIFFERENCES,
    LARGE_SIZE,
    POLICIES,
    SMALL,
    large_bytes,
    normalise,
    requests,
)

GOLDEN = json.loads(GOLDEN_PATH.read_text())


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
    no_core(monkeypatch)
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


async def test_accept_encoding_alone_is_answered_from_the_memo(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Browsers always send Accept-Encoding: with no sibling it admits, a hot file is still a memo
    hit (checked by the file's stat and its directory's)."""
    app = asgi.StaticFiles(directory=public)
    first = await call(app, AE_GET)
    await call(app, AE_GET)
    with monkeypatch.context() as patched:
        no_core(patched)
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


async def test_the_roots_index_is_kept_for_browsers_until_a_sibling_appears(
    public: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/`` routes to the root itself: the folder looked at for a browser's answer of its index
    was the root's parent, so the answer kept was never replayed (its file's folder was not the
    one kept). Now it is, until a sibling appears in the root."""
    (public / "index.html").write_bytes(b"<p>root</p>")
    app = asgi.StaticFiles(directory=public, html=True)
    root_get = AE_GET.replace(b"/a.txt", b"/")
    for _ in range(2):
        got = await call(app, root_get)
        assert (bytes(got.body), dict(got.headers).get(b"content-encoding")) == (b"<p>root</p>", None)
    with monkeypatch.context() as patched:
        no_core(patched)
        assert bytes((await call(app, root_get)).body) == b"<p>root</p>"
    (public / "index.html.br").write_bytes(b"BR of the index")
    got = await call(app, root_get)
    assert (dict(got.headers)[b"content-encoding"], bytes(got.body)) == (b"br", b"BR of the index")


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
        no_core(patched)
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
        no_core(patched)
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
        no_core(patched)
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
