"""``aiosendfile.django`` under real ASGI servers (processes): stock uvicorn, uvicorn with our
protocol, hypercorn and granian, serving the project in ``support.django_site``.

* ``FileResponse``: 0 B, 1 B, MiBs and (stress) a multi-GiB sparse file byte-exact, from an offset,
  as an attachment, with a cookie; ``HEAD``; zero-copy counted in the server process under our
  protocol; a 1 GiB body raises the server's RSS by a few MB (stock Django: the whole file); a
  client that leaves mid-file; a file truncated mid-file (never a complete-looking short body).
* ``StaticFiles``: whole, ranges, 304, a ``.gz`` sibling, WhiteNoise's ``Cache-Control``
  (immutable for the manifest's hashed names), a 404 or a ``POST`` falling through to Django.
* Differential: every response that is not a file body is Django's own, byte for byte (but
  ``date``/``server``), under the same server.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import asgi_servers
from ..support.asgi_servers import OUR_HTTPTOOLS, AsgiServer

pytest.importorskip("django")

SITE = "tests.support.django_site"
SERVERS = [
    pytest.param(("uvicorn", None), id="uvicorn"),
    pytest.param(("uvicorn", OUR_HTTPTOOLS), id="uvicorn+ours"),
    pytest.param(("hypercorn", None), id="hypercorn"),
    pytest.param(("granian", None), id="granian"),
]
BIG = 3 * 2**20 + 7


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``files/`` for the views, ``static/`` as collectstatic leaves it (a manifest, a hashed name,
    a ``.gz`` sibling)."""
    root = tmp_path_factory.mktemp("django")
    files, static = root / "files", root / "static"
    (static / "css").mkdir(parents=True)
    (root / "assets").mkdir()
    (root / "assets" / "only-in-assets.txt").write_bytes(b"found by a finder\n")
    files.mkdir()
    (files / "empty").write_bytes(b"")
    (files / "one").write_bytes(b"1")
    (files / "big.bin").write_bytes(os.urandom(BIG))
    (files / "sparse.bin").touch()
    os.truncate(files / "sparse.bin", 2**30)
    css = b"body { color: #123; }\n" * 200
    (static / "css" / "site.0123456789ab.css").write_bytes(css)
    (static / "css" / "site.0123456789ab.css.gz").write_bytes(gzip.compress(css))
    (static / "css" / "site.css").write_bytes(css)
    (static / "plain.txt").write_bytes(b"not hashed\n")
    (static / "css" / "index.html").write_bytes(b"<p>an index</p>\n")  # (a folder: passed to Django)
    manifest = {"paths": {"css/site.css": "css/site.0123456789ab.css"}, "version": "1.1", "hash": "0"}
    (static / "staticfiles.json").write_text(json.dumps(manifest))
    return root


@contextlib.contextmanager
def serving(
    project: Path,
    server: tuple[str, str | None],
    app: str = "static_ours",
    *,
    clean: bool = True,
    debug: bool = False,
    async_middleware: bool = False,
    options: tuple[str, ...] = (),
) -> Iterator[AsgiServer]:
    """The project under *server*; with *clean*, it must stop cleanly with no traceback logged.
    *async_middleware* adds a middleware that can only run async; *options* go to the server's
    command line."""
    name, http = server
    if not asgi_servers.available(name):
        pytest.skip(f"{name} is not installed")
    env = {"DJANGO_SETTINGS_MODULE": SITE, "AIOSENDFILE_DJANGO_ROOT": str(project)}
    if debug:
        env["AIOSENDFILE_DJANGO_DEBUG"] = "1"
    if async_middleware:
        env["AIOSENDFILE_DJANGO_ASYNC_MIDDLEWARE"] = "1"
    if clean:
        with asgi_servers.asgi_server(
            f"{SITE}:{app}", server=name, http=http, loop="uvloop", env=env, options=list(options)
        ) as running:
            yield running
        return
    running = AsgiServer(
        f"{SITE}:{app}", server=name, http=http, loop="uvloop", env=env, options=list(options)
    )
    try:
        yield running
    finally:
        running.kill()


def _request(server: AsgiServer, target: str, method: str = "GET", **headers: str) -> tuple[int, list, bytes]:
    connection = server.connection(timeout=60)
    try:
        connection.request(method, target, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        connection.close()


def _fields(headers: list[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("server", SERVERS)
def test_file_responses_and_static_files(project: Path, server: tuple[str, str | None]) -> None:
    files = project / "files"
    with serving(project, server) as running:
        for name in ("empty", "one", "big.bin"):
            status, headers, body = _request(running, f"/file/{name}")
            fields = _fields(headers)
            assert (status, body) == (200, (files / name).read_bytes()), name
            assert fields["content-length"] == str(len(body))
            assert fields["content-disposition"] == f'inline; filename="{name}"'
        status, headers, body = _request(running, "/file/big.bin?skip=10&attachment=1&cookie=1")
        fields = _fields(headers)
        assert (status, body) == (200, (files / "big.bin").read_bytes()[10:])
        assert fields["content-length"] == str(BIG - 10)
        assert fields["content-disposition"] == 'attachment; filename="big.bin"'
        assert fields["set-cookie"].startswith("seen=yes")
        status, headers, body = _request(running, "/file/big.bin", "HEAD")
        assert (status, body, _fields(headers)["content-length"]) == (200, b"", str(BIG))

        css = (project / "static" / "css" / "site.css").read_bytes()
        status, headers, body = _request(running, "/static/css/site.0123456789ab.css")
        fields = _fields(headers)
        assert (status, body) == (200, css)
        assert fields["cache-control"] == "max-age=315360000, public, immutable"
        status, headers, body = _request(running, "/static/css/site.css")
        assert (status, body, _fields(headers)["cache-control"]) == (200, css, "max-age=60, public")
        status, headers, body = _request(running, "/static/css/site.css", Range="bytes=5-104")
        assert (status, body) == (206, css[5:105])
        etag = _fields(headers)["etag"]
        status, headers, body = _request(running, "/static/css/site.css", **{"If-None-Match": etag})
        assert (status, body) == (304, b"")
        status, headers, body = _request(
            running, "/static/css/site.0123456789ab.css", **{"Accept-Encoding": "gzip"}
        )
        assert _fields(headers).get("content-encoding") == "gzip"
        assert gzip.decompress(body) == css
        status, headers, body = _request(running, "/static/missing.css")  # (Django's own 404)
        assert status == 404
        assert b"Not Found" in body
        for folder in ("/static/css/", "/static/css"):  # (a folder, index.html or not, as WhiteNoise)
            status, headers, body = _request(running, folder)
            assert (status, b"Not Found" in body) == (404, True), folder
        assert _request(running, "/static/plain.txt", "POST")[0] == 404  # (no URL for it in Django)


def test_with_debug_the_finders_serve_what_static_root_lacks(project: Path) -> None:
    """As WhiteNoise with ``DEBUG``: a file in an app's or ``STATICFILES_DIRS``' folder is served
    (``max-age=0``), found off the loop; without ``DEBUG`` it is Django's 404."""
    for debug in (True, False):
        with serving(project, ("uvicorn", OUR_HTTPTOOLS), debug=debug) as running:
            status, headers, body = _request(running, "/static/only-in-assets.txt")
            if debug:
                assert (status, body) == (200, b"found by a finder\n")
                assert _fields(headers)["cache-control"] == "max-age=0, public"
                assert _request(running, "/static/plain.txt")[2] == b"not hashed\n"
                for target in ("/static/../../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd"):
                    assert _request(running, target)[0] == 404, target  # (no traceback either)
            else:
                assert status == 404


def test_zero_copy_and_bounded_memory_under_our_protocol(project: Path) -> None:
    """Our protocol sends the file with the shim's ``sendfile`` (counted in the server process);
    a 1 GiB body leaves the server's RSS within a few MB."""
    with serving(project, ("uvicorn", OUR_HTTPTOOLS)) as running:
        before = json.loads(_request(running, "/_counters")[2])["bytes"]
        assert _sha(_request(running, "/file/big.bin")[2]) == _sha(
            (project / "files" / "big.bin").read_bytes()
        )
        after = json.loads(_request(running, "/_counters")[2])["bytes"]
        assert after - before >= BIG
        rss = running.rss()
        assert len(_request(running, "/file/sparse.bin")[2]) == 2**30
        assert running.rss() - rss < 32 * 2**20


@pytest.mark.stress
@pytest.mark.parametrize("server", SERVERS[:2])
def test_a_multi_gib_sparse_file_response_byte_exact(project: Path, server: tuple[str, str | None]) -> None:
    """5 GiB (past 2**32) of a sparse file as a ``FileResponse``, from an offset past 4 GiB too:
    every byte counted and checked (zeros, then the marker written at the end), the server's
    RSS within a few MB."""
    huge = project / "files" / "huge.bin"
    size = 5 * 2**30
    with open(huge, "wb") as f:
        f.truncate(size - 16)
        f.seek(size - 16)
        f.write(b"the end, 16 byte")
    zeros = bytes(1 << 20)
    try:
        with serving(project, server) as running:
            rss = running.rss()
            for skip in (0, 2**32 + 5):
                connection = running.connection(timeout=300)
                try:
                    connection.request("GET", f"/file/huge.bin?skip={skip}")
                    response = connection.getresponse()
                    assert response.status == 200
                    assert int(response.getheader("Content-Length")) == size - skip
                    digest, got, tail = hashlib.sha256(), 0, b""
                    while chunk := response.read(1 << 20):
                        got += len(chunk)
                        digest.update(chunk)
                        tail = (tail + chunk)[-16:]
                    assert got == size - skip
                    assert tail == b"the end, 16 byte"
                    expected = hashlib.sha256()
                    left = size - skip - 16
                    while left:
                        step = min(left, len(zeros))
                        expected.update(zeros[:step])
                        left -= step
                    expected.update(b"the end, 16 byte")
                    assert digest.hexdigest() == expected.hexdigest()
                finally:
                    connection.close()
            assert running.rss() - rss < 32 * 2**20
    finally:
        huge.unlink()


@pytest.mark.parametrize("app", ["ours", "stock"])
def test_a_gib_file_response_and_memory(project: Path, app: str) -> None:
    """Under stock uvicorn (body messages): ours reads 256 KiB at a time; Django's own handler
    reads the whole file first (its RSS grows by about the file)."""
    with serving(project, ("uvicorn", None), app) as running:
        rss = running.rss()
        peak = 0
        connection = running.connection(timeout=120)
        try:
            connection.request("GET", "/file/sparse.bin")
            response = connection.getresponse()
            got = 0
            while chunk := response.read(1 << 20):
                got += len(chunk)
                peak = max(peak, running.rss())
        finally:
            connection.close()
        assert got == 2**30
        grew = peak - rss
        if app == "ours":
            assert grew < 32 * 2**20, grew
        else:
            assert grew > 512 * 2**20, grew  # (the bug ours fixes, seen in the same test)


DIFFERENTIAL = [
    ("GET", "/text"),
    ("GET", "/stream"),
    ("GET", "/status/418"),
    ("GET", "/status/201"),
    ("GET", "/memory"),
    ("GET", "/nowhere"),
    ("GET", "/file/nope"),
    ("GET", "/thread"),
    ("GET", "/closed"),
    ("GET", "/thread-file"),  # (a file written by the request's thread under our protocol)
    ("GET", "/closed?after=file"),
    ("GET", "/async"),
    ("GET", "/slash"),  # (CommonMiddleware's redirect)
    ("POST", "/text"),  # (CsrfViewMiddleware's 403)
    ("GET", "/boom"),  # (Django's 500)
    ("HEAD", "/text"),
]


@pytest.mark.parametrize(
    ("server", "async_middleware"),
    [
        pytest.param(SERVERS[0].values[0], False, id="uvicorn"),
        pytest.param(SERVERS[1].values[0], False, id="uvicorn+ours"),
        pytest.param(SERVERS[1].values[0], True, id="uvicorn+ours-async-middleware"),
    ],
)
def test_every_other_response_is_djangos(
    project: Path, server: tuple[str, str | None], async_middleware: bool
) -> None:
    """The same requests to Django's own handler and ours: status, fields (but date and server) and
    bytes alike, through ``startproject``'s middleware: a ``FileResponse`` of a ``BytesIO`` (no file:
    Django's way), redirects, CSRF's 403, a failing view's 500, an async view (on the loop's thread
    under both) and a sync view (on the thread its middleware ran on, not the loop's, its response
    closed there too, under both); with a middleware that can only run async too."""
    seen: dict[str, list[tuple[int, list, bytes]]] = {}
    for app in ("stock", "ours"):
        with serving(project, server, app, clean=False, async_middleware=async_middleware) as running:
            seen[app] = [_request(running, target, method) for method, target in DIFFERENTIAL]
            assert "Exception in ASGI application" not in running.logs()
    for (method, target), theirs, mine in zip(DIFFERENTIAL, seen["stock"], seen["ours"], strict=True):
        strip = [(k.lower(), v) for k, v in theirs[1] if k.lower() not in ("date", "server")]
        mine_strip = [(k.lower(), v) for k, v in mine[1] if k.lower() not in ("date", "server")]
        assert (mine[0], mine_strip, mine[2]) == (theirs[0], strip, theirs[2]), (method, target)
    answers = dict(zip(DIFFERENTIAL, seen["ours"], strict=True))
    assert json.loads(answers["GET", "/thread"][2]) == {"same_thread": True, "main": False}
    assert json.loads(answers["GET", "/closed"][2]) == {"closed_on_its_thread": True, "closes": 1}
    assert answers["GET", "/thread-file"][2] == b"1"
    seen_by_file_view = _fields(answers["GET", "/thread-file"][1])
    assert (seen_by_file_view["x-same-thread"], seen_by_file_view["x-main"]) == ("yes", "no")
    assert json.loads(answers["GET", "/closed?after=file"][2]) == {"closed_on_its_thread": True, "closes": 1}
    assert json.loads(answers["GET", "/async"][2]) == {"main": True}
    assert answers["GET", "/boom"][0] == 500
    assert answers["POST", "/text"][0] == 403
    has_async_field = _fields(answers["GET", "/text"][1]).get("x-async-middleware") == "yes"
    assert has_async_field == async_middleware


@pytest.mark.parametrize("server", SERVERS[:2])
def test_request_bodies_reach_the_view_as_under_djangos_handler(
    project: Path, server: tuple[str, str | None]
) -> None:
    """None (a ``GET``), empty, a few bytes, 2 MB in many
    messages (under ``DATA_UPLOAD_MAX_MEMORY_SIZE``): the view reads the same bytes under
    Django's handler and ours."""
    big = os.urandom(2 * 2**20 + 5)
    cases: list[tuple[str, bytes | None]] = [("GET", None), ("POST", b""), ("POST", b"abc"), ("POST", big)]
    seen: dict[str, list[tuple[int, dict]]] = {}
    for app in ("stock", "ours"):
        with serving(project, server, app) as running:
            answers = []
            for method, body in cases:
                connection = running.connection(timeout=60)
                try:
                    connection.request(method, "/echo", body=body)
                    response = connection.getresponse()
                    answers.append((response.status, json.loads(response.read())))
                finally:
                    connection.close()
            seen[app] = answers
    assert seen["ours"] == seen["stock"]
    assert [answer[1]["length"] for answer in seen["ours"]] == [0, 0, 3, len(big)]
    assert seen["ours"][3][1]["sha256"] == _sha(big)


@pytest.mark.parametrize("app", ["ours", "stock"])
def test_a_client_that_leaves_during_a_sync_view(project: Path, app: str) -> None:
    """The client leaves while a sync view runs: nothing is logged as an error, the next requests
    are answered at once on other threads (the request keeps its thread until the view is done:
    its ``request_finished`` runs there, as under Django's handler), and it answers again once
    done. Django's handler alike."""
    with serving(project, ("uvicorn", OUR_HTTPTOOLS), app) as running:
        with running.socket() as sock:
            sock.sendall(b"GET /slow?s=1.5 HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.3)
        started = time.monotonic()
        for _ in range(3):
            assert _request(running, "/thread")[0] == 200
        assert time.monotonic() - started < 1.0
        time.sleep(1.5)
        assert _request(running, "/slow?s=0")[2] == b"slow\n"
        assert "Exception in ASGI application" not in running.logs()


@pytest.mark.parametrize("app", ["ours", "stock"])
def test_an_async_view_a_middlewares_urlconf_picks_is_cancelled_when_its_client_leaves(
    project: Path, app: str
) -> None:
    """A middleware sets ``request.urlconf`` (as django-hosts does) to a URLconf whose view is
    async: the handler cannot tell from ``ROOT_URLCONF``, yet the view is cancelled when its
    client leaves and the next request is answered, as under Django's handler; a client that
    stays gets the view's answer."""
    with serving(project, ("uvicorn", OUR_HTTPTOOLS), app) as running:
        with running.socket() as sock:
            sock.sendall(b"GET /alt/wait?s=5 HTTP/1.1\r\nHost: x\r\nX-Urlconf: alt\r\n\r\n")
            for _ in range(100):
                if json.loads(_request(running, "/alt-state")[2])["started"]:
                    break
                time.sleep(0.02)
        for _ in range(150):
            state = json.loads(_request(running, "/alt-state")[2])
            if state["cancelled"]:
                break
            time.sleep(0.02)
        assert state == {"started": 1, "finished": 0, "cancelled": 1}
        assert _request(running, "/alt/wait?s=0", **{"X-Urlconf": "alt"})[2] == b"waited\n"
        assert "Exception in ASGI application" not in running.logs()


@pytest.mark.parametrize("server", SERVERS[:2])
@pytest.mark.parametrize("app", ["ours", "stock"])
def test_a_request_is_finished_when_the_application_returns(
    project: Path, server: tuple[str, str | None], app: str
) -> None:
    """``request_finished`` (the response's close) has run once by the time the application
    returns, for every kind of response: a server, a middleware or a test tool that accounts per
    request sees it finished. Django's handler alike."""
    targets = ["/text", "/stream", "/memory", "/file/one", "/file/big.bin", "/thread-file", "/status/404"]
    targets += ["/file/missing", "/boom"]
    with serving(project, server, f"accounted_{app}", clean=False) as running:
        for target in targets:
            _request(running, target)
        for _ in range(100):  # (the client has its answer before the application returns)
            accounts = json.loads(_request(running, "/_accounting")[2])["finished_when_returned"]
            if len(accounts) == len(targets):
                break
            time.sleep(0.02)
    assert accounts == [1] * len(targets)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_file_its_thread_wrote_is_closed_when_its_client_leaves_at_once(loop: str) -> None:
    """The request's thread writes a ``FileResponse`` whole; its client reads it and leaves before
    the thread goes on, and the loop gives the request up first. As Django closes a response its
    client left once it was sent, the response is closed once and ``request_finished`` sent once,
    both by the time the application returns (they were not: the thread closed only the file).
    Made certain in a process of its own (``tests/support/django_thread_race.py``)."""
    root = Path(__file__).resolve().parent.parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.django_thread_race", loop],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("server", SERVERS[:2])
@pytest.mark.parametrize("app", ["ours", "stock"])
def test_an_endless_stream_ends_when_its_client_leaves(
    project: Path, server: tuple[str, str | None], app: str
) -> None:
    """A sync view's streaming response that never ends by itself (an async iterator) stops
    when the client leaves: stock uvicorn's ``send`` says nothing then, so it takes Django's
    listener for the client leaving (which ours keeps for such a send). Django's handler alike."""
    with serving(project, server, app) as running:
        with running.socket() as sock:
            sock.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while len(got) < 64 * 1024:
                got += sock.recv(65536)
            assert got.startswith(b"HTTP/1.1 200 ")
            assert json.loads(_request(running, "/endless-state")[2])["running"] == 1
        for _ in range(100):
            state = json.loads(_request(running, "/endless-state")[2])
            if state["running"] == 0:
                break
            time.sleep(0.05)
        assert state == {"running": 0, "stopped": 1}


def _flood_of_slow_views(project: Path, options: tuple[str, ...]) -> tuple[int, int, list[bytes]]:
    """40 clients at once on a sync view that sleeps 2 s: the server's threads before and while
    they wait, and the status lines they get."""
    with (
        serving(project, ("uvicorn", OUR_HTTPTOOLS), "ours", clean=False, options=options) as running,
        contextlib.ExitStack() as socks,
    ):
        assert _request(running, "/thread")[0] == 200
        before = len(os.listdir(f"/proc/{running.pid}/task"))
        clients = []
        for _ in range(40):
            sock = socks.enter_context(running.socket(timeout=30))
            sock.sendall(b"GET /slow?s=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            clients.append(sock)
        time.sleep(1.0)
        during = len(os.listdir(f"/proc/{running.pid}/task"))
        heads = []
        for sock in clients:
            got = b""
            with contextlib.suppress(OSError):
                while b"\r\n" not in got and (chunk := sock.recv(4096)):
                    got += chunk
            heads.append(got.split(b"\r\n", 1)[0])
        return before, during, heads


def test_the_threads_a_flood_of_slow_views_gets_are_bounded_by_the_servers_limit(project: Path) -> None:
    """A thread per request in flight (as Django's handler): a flood of requests to a slow sync
    view gets no more threads than the server lets requests in at once (uvicorn's
    ``--limit-concurrency``: 503 beyond it), and those let in are answered."""
    before, during, heads = _flood_of_slow_views(project, ("--limit-concurrency", "8"))
    assert during - before <= 8, (before, during)
    assert heads.count(b"HTTP/1.1 200 OK") >= 4, heads
    assert set(heads) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"}, heads


def _leave_mid_file(running: AsgiServer, target: str) -> None:
    """A client reads the start of *target* and leaves; the next request is answered and the
    server's descriptors come back to what they were."""
    fds = running.fd_count()
    with running.socket(rcvbuf=65536) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sock.recv(65536)
        time.sleep(0.3)
    time.sleep(0.2)
    assert _request(running, "/file/one")[2] == b"1"
    deadline = time.monotonic() + 10
    while running.fd_count() > fds and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running.fd_count() <= fds


def test_a_client_that_leaves_mid_file_under_our_protocol(project: Path) -> None:
    """Our protocol sends the file whole by itself (no listener for the client leaving): a client
    that leaves mid-file costs nothing lasting either (the next request is answered, the file is
    closed, no descriptor stays, nothing logged as an error)."""
    (project / "files" / "long.bin").write_bytes(os.urandom(64 * 2**20))
    with serving(project, ("uvicorn", OUR_HTTPTOOLS), "ours") as running:
        _leave_mid_file(running, "/file/long.bin")
        assert not any("long.bin" in target for target in running.fds().values())
        assert "Exception in ASGI application" not in running.logs()


def test_a_file_cut_short_under_our_protocol(project: Path) -> None:
    """A file that loses its second half once its ``FileResponse`` is made: the request's thread
    meets its end, the connection is aborted short of the ``Content-Length`` (never a body that
    looks complete), one warning line, and the server serves on."""
    victim = project / "files" / "cut.bin"
    victim.write_bytes(os.urandom(4 * 2**20))
    with serving(project, ("uvicorn", OUR_HTTPTOOLS), "ours", clean=False) as running:
        connection = running.connection(timeout=30)
        try:
            connection.request("GET", "/cut/cut.bin")
            response = connection.getresponse()
            assert int(response.getheader("Content-Length")) == 4 * 2**20
            with pytest.raises(http.client.IncompleteRead):
                response.read()
        finally:
            connection.close()
        assert _request(running, "/file/one")[2] == b"1"
        assert "File body cut short" in running.logs()
        assert "Exception in ASGI application" not in running.logs()


def test_a_client_that_leaves_and_a_file_cut_short(project: Path) -> None:
    """Under stock uvicorn (bounded chunks): a client that leaves mid-file costs nothing lasting
    (the next request is answered, no descriptor stays); a file truncated mid-file ends the
    response short of its Content-Length (the client sees it incomplete)."""
    victim = project / "files" / "victim.bin"
    victim.write_bytes(os.urandom(64 * 2**20))
    with serving(project, ("uvicorn", None), "ours", clean=False) as running:
        _leave_mid_file(running, "/file/big.bin")
        connection = running.connection(timeout=30)
        try:
            connection.request("GET", "/file/victim.bin")
            response = connection.getresponse()
            first = response.read(1 << 20)
            assert len(first) == 1 << 20
            os.truncate(victim, 2 * 2**20)
            with pytest.raises(http.client.IncompleteRead):
                response.read()
        finally:
            connection.close()
        assert "FileTruncatedError" in running.logs()  # (logged as the error it is)
        assert running.alive()
