"""What a peer can make ``aiosendfile.asgi.StaticFiles`` keep: its hot-answer memo stays under its
bounds, keys included (#23 item 2).

The memo's key is the raw path, or the raw path and the ``Accept-Encoding`` value: both come from
the peer. In process: 10,000 long keys, 5,000 ``Accept-Encoding`` values of 256 bytes then 5,000
spellings of a 4 KiB file's path (~800 bytes each), and the memo holds at most its entries and its
bytes, each entry charged its key, its header pairs and the rest. In a uvicorn process (stock and
with our protocol, both loops): 200 requests each with a new 1 MB ``Accept-Encoding`` value, twice;
the server's RSS is flat after the first round (it grew ~190 MB a round, for good, before).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiosendfile import asgi
from aiosendfile._asgi._app import MEMO_MAX_ACCEPT_ENCODING
from aiosendfile._static import _hot
from aiosendfile._static._memo import ENTRY_OVERHEAD, MEMO_MAX_BYTES, MEMO_MAX_ENTRIES

from ..support.asgi_apps import ours_available as apps_available
from ..support.asgi_servers import OUR_HTTPTOOLS, AsgiServer, ours_available
from ..support.raw_http import SocketResponses

MiB = 2**20


#: A 4 KiB file 750 bytes deep (three directories of 250-byte names): long keys, a short walk.
DEEP = "/".join(f"{i}".ljust(250, "d") for i in range(3)) + "/d.bin"
DEEP_BODY = b"d" * 4096


@pytest.fixture
def public(tmp_path: Path) -> Iterator[Path]:
    _hot.hot_files.clear()
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / DEEP).parent.mkdir(parents=True)
    (tmp_path / DEEP).write_bytes(DEEP_BODY)
    (tmp_path / "b.txt").write_bytes(b"plain b\n" * 8)
    (tmp_path / "b.txt.gz").write_bytes(b"gzipped b")
    yield tmp_path
    _hot.hot_files.clear()


class Reply:
    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message["headers"])
        else:
            self.body += message.get("body", b"")

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}


async def get(app: asgi.StaticFiles, raw: bytes, accept_encoding: bytes | None = None) -> Reply:
    headers = [(b"host", b"localhost")]
    if accept_encoding is not None:
        headers.append((b"accept-encoding", accept_encoding))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "method": "GET",
        "path": "/",  # (the app reads raw_path)
        "raw_path": raw,
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }
    reply = Reply()
    await app(scope, reply.receive, reply.send)
    return reply


def spelling(i: int) -> bytes:
    """The *i*-th of 16,384 spellings of :data:`DEEP`'s path (~800 bytes): ``./`` or ``%2e/`` by the
    bits of *i*, then the path."""
    return b"/" + b"".join(b"%2e/" if i >> bit & 1 else b"./" for bit in range(14)) + DEEP.encode()


def key_bytes(key: bytes | tuple[bytes, bytes]) -> int:
    return len(key) if isinstance(key, bytes) else len(key[0]) + len(key[1])


def head_bytes(reply: Reply) -> int:
    return sum(len(name) + len(value) for name, value in reply.headers)


def check_bounds(app: asgi.StaticFiles, fed: dict[Any, int]) -> None:
    """The memo holds at most its entries and its bytes, each key held charged at least its own
    bytes, its answer's header bytes (the value in *fed*) and the memo's overhead."""
    memo = app._answers
    assert len(memo) <= MEMO_MAX_ENTRIES, f"{len(memo)} entries held"
    held = [key for key in fed if key in memo]
    assert held
    assert len(held) == len(memo)
    assert memo.size <= MEMO_MAX_BYTES, memo.size
    floor = sum(key_bytes(key) + fed[key] + ENTRY_OVERHEAD for key in held)
    assert memo.size >= floor, (memo.size, floor)


async def test_the_memo_stays_under_its_bounds_whatever_the_keys(public: Path) -> None:
    """5,000 Accept-Encoding values (memoised once the path is recent), then 5,000 path spellings
    (plain requests: memoised at first sight): the memo never holds more than its entries or its
    bytes, and what it holds is charged its keys and headers. Before #23 it held all 5,000 values."""
    app = asgi.StaticFiles(directory=public)
    fed: dict[Any, int] = {}
    for i in range(5_000):
        value = (b"gzip, deflate, br;q=0.%04d, " % i).ljust(MEMO_MAX_ACCEPT_ENCODING, b"x")
        reply = await get(app, b"/a.txt", value)
        assert (reply.status, reply.body) == (200, b"a")
        fed[b"/a.txt", value] = head_bytes(reply)
    check_bounds(app, fed)
    assert len(app._answers) == MEMO_MAX_ENTRIES  # (here the entries bound held)
    for i in range(5_000):
        raw = spelling(i)
        reply = await get(app, raw)
        assert (reply.status, reply.body) == (200, DEEP_BODY), raw[:40]
        fed[raw] = head_bytes(reply)
    check_bounds(app, fed)
    assert app._answers.size > MEMO_MAX_BYTES - 64 * 1024  # (here the bytes bound held)


async def test_a_long_accept_encoding_is_no_memo_key_and_answered_as_any(public: Path) -> None:
    """A value of more than MEMO_MAX_ACCEPT_ENCODING bytes goes through the core every time (the
    right answer, a pre-compressed sibling included) and is never held; one of exactly that many
    bytes is a key as before."""
    app = asgi.StaticFiles(directory=public)
    await get(app, b"/a.txt")
    await get(app, b"/b.txt")  # both paths recent: an Accept-Encoding alone is memoised from now on
    held = len(app._answers)
    for i in range(3):
        long = (b"identity;q=0.%d, " % i).ljust(MEMO_MAX_ACCEPT_ENCODING + 1, b"x")
        reply = await get(app, b"/a.txt", long)
        assert (reply.status, reply.body) == (200, b"a")
        gz = await get(app, b"/b.txt", b"gzip, " + long)
        assert (gz.status, gz.body) == (200, b"gzipped b")
        assert (b"content-encoding", b"gzip") in gz.headers
    assert len(app._answers) == held
    longest = b"identity".ljust(MEMO_MAX_ACCEPT_ENCODING, b"x")
    await get(app, b"/a.txt", longest)
    assert (b"/a.txt", longest) in app._answers


# -- in a uvicorn process ---------------------------------------------------------------------


APPS = "tests.support.asgi_apps"
#: uvicorn's httptools protocol, stock and ours, on both loops. (Its h11 protocol refuses a 1 MB
#: field with 400: h11 buffers at most ``--h11-max-incomplete-event-size``, 16 KiB, of a head.)
SERVERS = [(http, loop) for http in ("httptools", OUR_HTTPTOOLS) for loop in ("asyncio", "uvloop")]
VALUE = 1_000_000
#: ~8 ms of server CPU each (the core parses the 1 MB value). 100 MB a round is six times the
#: memo's bytes bound: an unbounded memo grows past both limits below.
ROUND = 100


def one_round(server: AsgiServer, tag: bytes, count: int, size: int) -> None:
    """*count* GETs of a hot file on one connection, each with a new *size*-byte Accept-Encoding."""
    with server.raw_socket(timeout=30) as sock:
        replies = SocketResponses(sock)
        for i in range(count):
            value = (tag + b"-%d-" % i).ljust(size, b"x")
            sock.sendall(
                b"GET /static/hot.txt HTTP/1.1\r\nHost: x\r\nAccept-Encoding: " + value + b"\r\n\r\n"
            )
            reply = replies.next()
            assert reply.head.startswith(b"HTTP/1.1 200 "), reply.head[:200]
            assert reply.body == b"hot\n"


@pytest.mark.parametrize(("http", "loop"), SERVERS, ids=[f"{h.rpartition(':')[2]}-{lp}" for h, lp in SERVERS])
def test_new_megabyte_accept_encodings_leave_rss_flat(tmp_path: Path, http: str, loop: str) -> None:
    """ROUND requests each with a new 1 MB Accept-Encoding value, then ROUND more: the server's RSS
    after the second round is within a few MB of after the first, and the first grew it by at
    most a few tens of MB (the memo's bytes bound is 16 MiB). Before #23: ~+190 MB each round of 200."""
    if not ours_available() or not apps_available():
        pytest.skip("aiosendfile.uvicorn / aiosendfile.asgi are not in the tree")
    (tmp_path / "hot.txt").write_bytes(b"hot\n")
    server = AsgiServer(
        f"{APPS}:ours_starlette_app", tmp_path, http=http, loop=loop, options=["--no-access-log"]
    )
    try:
        one_round(server, b"warm", 3, 32)
        before = server.rss()
        one_round(server, b"first", ROUND, VALUE)
        first = server.rss()
        one_round(server, b"second", ROUND, VALUE)
        second = server.rss()
    finally:
        _, logs = server.stop()
    figures = f"RSS {before / MiB:.0f} -> {first / MiB:.0f} -> {second / MiB:.0f} MiB"
    assert second - first <= 8 * MiB, figures
    assert first - before <= 48 * MiB, figures
    assert "Traceback" not in logs, logs[-3000:]
