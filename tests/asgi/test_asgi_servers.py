"""``aiosendfile.asgi.StaticFiles`` under real ASGI servers, each a subprocess, on both loops.

Servers: stock uvicorn (no extensions: body messages), uvicorn with our protocols (our pathsend:
zero-copy, ranges too), hypercorn (no extensions) and granian (pathsend of a full 200). Each serves
``tests.support.asgi_apps.ours_starlette_app`` over the golden tree; the golden requests (full,
``HEAD``, single and multiple ranges, 304, missing files, traversal attempts, pre-compressed
siblings, symlinks out of the root) must answer as the aiohttp plugin recorded them under a
``/static`` mount: same status, same fields in order (names compared without case: ASGI servers
send them lowercase) but those the server adds (``Date``, ``Server``, ``Connection``), and the same
body bytes. Then, behind Starlette's ``GZipMiddleware`` and ``BaseHTTPMiddleware`` and FastAPI's
``@app.middleware("http")``, full and ranged files must come out whole, under stock uvicorn and ours.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support import asgi_servers
from ..support.asgi_apps import FILE_NAME
from ..support.asgi_servers import OUR_H11, OUR_HTTPTOOLS, AsgiServer
from ..support.raw_http import raw_sync
from ..support.static_requests import (
    GOLDEN_PATH,
    KNOWN_DIFFERENCES,
    build_tree,
    large_bytes,
    normalise,
    requests,
)

GOLDEN = json.loads(GOLDEN_PATH.read_text())["app"]["default"]
APPS = "tests.support.asgi_apps"

#: (id, server, --http, loop)
SERVERS = [
    ("uvicorn-asyncio", "uvicorn", "httptools", "asyncio"),
    ("uvicorn-uvloop", "uvicorn", "httptools", "uvloop"),
    ("uvicorn-h11", "uvicorn", "h11", "asyncio"),
    ("ours-asyncio", "uvicorn", OUR_HTTPTOOLS, "asyncio"),
    ("ours-uvloop", "uvicorn", OUR_HTTPTOOLS, "uvloop"),
    ("ours-h11-uvloop", "uvicorn", OUR_H11, "uvloop"),
    ("hypercorn-asyncio", "hypercorn", None, "asyncio"),
    ("hypercorn-uvloop", "hypercorn", None, "uvloop"),
    ("hypercorn-trio", "hypercorn", None, "trio"),
    ("granian-asyncio", "granian", None, "asyncio"),
    ("granian-uvloop", "granian", None, "uvloop"),
]

#: Golden requests worth a round trip to every server (the in-process tests run them all).
CASES = [
    "get-small",
    "get-small-again",
    "head-small",
    "get-empty",
    "get-large",
    "head-large",
    "get-html",
    "get-query-ignored",
    "dir-no-slash",
    "dir-no-slash-query",
    "dir-index",
    "dir-no-index",
    "missing",
    "missing-head",
    "fifo",
    "dotfile",
    "well-known",
    "pct-dotdot",
    "pct-dotdot-deep",
    "pct-slash-dotdot",
    "nul",
    "backslash",
    "non-utf8",
    "pct-space",
    "odd-name",
    "range-single",
    "range-suffix-small",
    "range-open",
    "range-multi",
    "range-multi-small",
    "range-unsatisfiable",
    "range-head",
    "if-range-match",
    "if-range-mismatch",
    "inm-match",
    "inm-match-head",
    "inm-star",
    "ims-later",
    "im-mismatch",
    "ius-earlier",
    "ae-br",
    "ae-gzip",
    "ae-range",
    "symlink-in",
    "symlink-out",
    "symlink-dir-out",
]

#: Fields a server adds of its own.
SERVER_FIELDS = {"date", "server", "connection"}


def _available(server: str, http: str | None, loop: str = "asyncio") -> bool:
    if not asgi_servers.available(server) or (loop == "trio" and not asgi_servers.available("trio")):
        return False
    return http not in (OUR_HTTPTOOLS, OUR_H11) or asgi_servers.ours_available()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    public = build_tree(tmp_path_factory.mktemp("asgi-servers"))
    (public / FILE_NAME).write_bytes(large_bytes())
    yield public
    shutil.rmtree(public.parent)


@pytest.fixture(scope="module", params=SERVERS, ids=[s[0] for s in SERVERS])
def asgi_server(request: pytest.FixtureRequest, tree: Path) -> Iterator[AsgiServer]:
    _, name, http, loop = request.param
    if not _available(name, http, loop):
        pytest.skip(f"{name} {http or ''} is not installed here")
    with asgi_servers.asgi_server(
        f"{APPS}:ours_starlette_app", tree, server=name, http=http, loop=loop
    ) as running:
        yield running


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": answer["status"].split()[1],
        "headers": [[n.lower(), v] for n, v in answer["headers"] if n.lower() not in SERVER_FIELDS],
        "body": answer["body"],
    }


def test_golden_requests_answer_as_the_plugin(asgi_server: AsgiServer) -> None:
    for name, raw in requests("default", b"/static"):
        if name not in CASES or name in KNOWN_DIFFERENCES:
            continue
        got = normalise(raw_sync(asgi_server.host, asgi_server.port, raw))
        assert comparable(got) == comparable(GOLDEN[name]), (name, got)
    assert not asgi_server.problems(), asgi_server.logs()


def _get(server: AsgiServer, target: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    connection = server.connection()
    try:
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        body = response.read()
        fields = {k.lower(): v for k, v in response.getheaders()}
        if fields.get("content-encoding") == "gzip" and not target.endswith(".gz"):
            body = gzip.decompress(body)
        return response.status, fields, body
    finally:
        connection.close()


@pytest.mark.parametrize("mount", ["/gz", "/mw"])
def test_files_come_out_whole_behind_starlettes_middlewares(
    asgi_server: AsgiServer, tree: Path, mount: str
) -> None:
    """GZipMiddleware compresses body messages and lets pathsend and 206 through; BaseHTTPMiddleware
    forwards every message: full, ranged and multi-ranged files stay right under every server."""
    whole = large_bytes()
    for target in (f"{mount}/static/large.bin", f"{mount}/file"):
        status, fields, body = _get(asgi_server, target, **{"Accept-Encoding": "gzip"})
        assert (status, body) == (200, whole), target
        status, fields, body = _get(
            asgi_server, target, Range="bytes=100-65635", **{"Accept-Encoding": "gzip"}
        )
        assert (status, fields["content-range"], body) == (
            206,
            f"bytes 100-65635/{len(whole)}",
            whole[100:65636],
        )
        status, fields, body = _get(asgi_server, target, Range="bytes=0-0,-2")
        assert status == 206
        assert fields["content-type"].startswith("multipart/byteranges")
        assert whole[:1] in body
        assert whole[-2:] in body
    status, _, body = _get(asgi_server, f"{mount}/static/a.txt", **{"Accept-Encoding": "gzip"})
    assert (status, body) == (200, (tree / "a.txt").read_bytes())
    assert not asgi_server.problems(), asgi_server.logs()


@pytest.mark.parametrize("http", [None, OUR_HTTPTOOLS], ids=["stock", "ours"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_fastapi_middleware_in_front(tree: Path, http: str | None, loop: str) -> None:
    """FastAPI's ``@app.middleware("http")`` (a BaseHTTPMiddleware) around aiosendfile's StaticFiles."""
    if not _available("uvicorn", http):
        pytest.skip("our protocol is not in the tree yet")
    whole = large_bytes()
    with asgi_servers.asgi_server(f"{APPS}:ours_fastapi_app", tree, http=http, loop=loop) as server:
        for target in ("/static/large.bin", "/file"):
            status, fields, body = _get(server, target)
            assert (status, body, fields["x-through"]) == (200, whole, "fastapi")
            status, fields, body = _get(server, target, Range="bytes=7-70000")
            assert (status, body) == (206, whole[7:70001])
        etag = _get(server, "/static/a.txt")[1]["etag"]
        status, fields, body = _get(server, "/static/a.txt", **{"If-None-Match": etag})
        assert (status, body, fields["x-through"]) == (304, b"", "fastapi")


def test_zero_copy_under_our_protocol(tree: Path) -> None:
    """Under our protocol the body goes through the shim's sendfile in the server process."""
    if not _available("uvicorn", OUR_HTTPTOOLS):
        pytest.skip("our protocol is not in the tree yet")
    with asgi_servers.asgi_server(f"{APPS}:ours_starlette_app", tree, http=OUR_HTTPTOOLS) as server:
        before = json.loads(_get(server, "/_counters")[2])["bytes"]
        assert _get(server, "/static/large.bin")[2] == large_bytes()
        assert _get(server, "/static/large.bin", Range="bytes=5-100004")[2] == large_bytes()[5:100005]
        after = json.loads(_get(server, "/_counters")[2])["bytes"]
        assert after - before == len(large_bytes()) + 100000


def _raw(server: AsgiServer, data: bytes) -> bytes:
    """*data* sent on a new connection (TLS or a Unix socket as the server listens), read to EOF."""
    with server.socket() as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.parametrize(
    ("name", "http", "loop", "transport"),
    [
        ("uvicorn", "httptools", "uvloop", "tls"),
        ("uvicorn", OUR_HTTPTOOLS, "asyncio", "tls"),
        ("uvicorn", OUR_HTTPTOOLS, "uvloop", "tls"),
        ("uvicorn", OUR_HTTPTOOLS, "uvloop", "unix"),
        ("hypercorn", None, "uvloop", "tls"),
        ("granian", None, "uvloop", "tls"),
        ("granian", None, "asyncio", "unix"),
    ],
    ids=lambda v: v.rpartition(":")[2] if isinstance(v, str) else str(v),
)
def test_golden_requests_over_tls_and_unix_sockets(
    tree: Path, tmp_path: Path, tls_ca: Any, name: str, http: str | None, loop: str, transport: str
) -> None:
    """Over TLS our protocol sends with the bounded copy and granian reads the file itself; over a
    Unix socket the zero-copy paths run as over TCP: the answers are the same."""
    if not _available(name, http):
        pytest.skip(f"{name} {http or ''} is not installed here")
    kwargs: dict[str, Any] = {"server": name, "http": http, "loop": loop}
    if transport == "tls":
        kwargs["tls"] = asgi_servers.tls_files(tls_ca, tmp_path)
    else:
        kwargs["uds"] = tmp_path / "s.sock"
    with asgi_servers.asgi_server(f"{APPS}:ours_starlette_app", tree, **kwargs) as server:
        for case, raw in requests("default", b"/static"):
            if case not in CASES or case in KNOWN_DIFFERENCES:
                continue
            got = normalise(_raw(server, raw))
            assert comparable(got) == comparable(GOLDEN[case]), (case, got)
