"""The static-file cases both doors answer alike, written and asserted once.

The aiohttp plugin (``tests/aiohttp/test_aiohttp_plugin.py``, mounted at ``/static``) and the native
engine (``tests/serve/test_serve_http.py``, mounted at ``/``) run ``StaticCases``, whose tests
parametrize over the tables here, each module through its own thin door fixture ``make_door``:
``await make_door(**config)`` gives a ``Door`` (``root``, ``mount``, ``tls``, ``session``, ``url``,
``get`` through aiohttp's client, ``raw`` for a request line sent as written; ``DoorClient``
has both, ``door_session`` the session). ``build_tree``
makes the fixture tree: ``public/`` (served) beside ``secret.txt`` (which must never leak).
"""

from __future__ import annotations

import datetime
import email.utils
import gzip
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from aiohttp import BodyPartReader, ClientSession, MultipartReader, TCPConnector

from aiosendfile import _platform

from .files import pattern
from .raw_http import Blob, Response

__all__ = (
    "BIG",
    "CONDITIONAL",
    "ESCAPING_SIBLINGS",
    "FULL_FILES",
    "HOSTILE",
    "IF_RANGE",
    "IGNORED_RANGES",
    "REJECTED_RANGES",
    "PRECOMPRESSED",
    "SINGLE_RANGES",
    "SMALL",
    "Door",
    "DoorClient",
    "SingleRange",
    "StaticCases",
    "build_tree",
    "door_session",
)

BIG = 3 * 2**20 + 11  # above the inline limit: goes through sendfile
SMALL = 4096  # at most the inline limit: leaves with the headers


class Door(Protocol):
    """What a door's test site offers the tests; paths are relative to ``mount``."""

    root: Path
    mount: str
    tls: bool
    session: ClientSession

    def url(self, path: str) -> str: ...

    async def get(self, path: str, method: str = "GET", **headers: str) -> tuple[int, Any, bytes]: ...

    async def raw(self, target: str, extra: str = "") -> tuple[int, bytes]: ...


def door_session(client_ctx: ssl.SSLContext | None) -> ClientSession:
    """The door's aiohttp session: TLS through *client_ctx* if given; no decompression."""
    return ClientSession(connector=TCPConnector(ssl=client_ctx or False), auto_decompress=False)


class DoorClient:
    """``get`` and ``raw`` of a ``Door``, over a door's ``session``, ``url`` and ``fetch``."""

    session: ClientSession

    def url(self, path: str) -> str:
        raise NotImplementedError

    async def fetch(self, data: bytes) -> Response:
        """Send *data* as is; read until the server closes."""
        raise NotImplementedError

    async def get(self, path: str, method: str = "GET", **headers: str) -> tuple[int, Any, bytes]:
        """Through aiohttp's client (no redirects followed): status, headers, body."""
        async with self.session.request(method, self.url(path), headers=headers, allow_redirects=False) as r:
            return r.status, r.headers, await r.read()

    async def raw(self, target: str, extra: str = "") -> tuple[int, bytes]:
        """Send a request line exactly as given (no client-side normalisation)."""
        data = f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode("latin-1")
        response = await self.fetch(data)
        return response.status, response.raw


def build_tree(root: Path) -> None:
    (root / "public").mkdir()
    pub = root / "public"
    (pub / "big.bin").write_bytes(pattern(BIG))
    (pub / "small.txt").write_bytes(pattern(SMALL))
    (pub / "empty.txt").write_bytes(b"")
    (pub / "page.html").write_text("<h1>hi</h1>")
    text = b"compress me " * 1000
    (pub / "doc.txt").write_bytes(text)
    (pub / "doc.txt.gz").write_bytes(gzip.compress(text))
    (pub / "doc.txt.br").write_bytes(b"not really brotli but a distinct body")
    (pub / "dir").mkdir()
    (pub / "dir" / "index.html").write_text("index!")
    (pub / "noindex").mkdir()
    (pub / "noindex" / "a.txt").write_text("a")
    (pub / "space name.txt").write_text("spaced")
    (pub / "%2e%2e").write_text("literal percent name")
    (root / "secret.txt").write_text("TOP SECRET")
    (pub / "escape").symlink_to(root / "secret.txt")
    # Symlinked siblings and index files must not escape either.
    (pub / "page.html.gz").symlink_to(root / "secret.txt")
    (pub / "ghost.js.br").symlink_to(root / "secret.txt")
    (pub / "linkedindex").mkdir()
    (pub / "linkedindex" / "index.html").symlink_to(root / "secret.txt")
    (pub / "outdir").symlink_to(root)
    (pub / "archive.tar.gz").write_bytes(gzip.compress(b"tar"))
    (pub / "inner-link").symlink_to(pub / "small.txt")
    os.mkfifo(pub / "fifo")


# -- the tables -------------------------------------------------------------------------------------

#: (name, size): whole files, sendfile's, inline and empty.
FULL_FILES = [("big.bin", BIG), ("small.txt", SMALL), ("empty.txt", 0)]

#: (request headers, expected status) on small.txt; "{etag}", "{last_modified}" and "{older}"
#: (a day before) stand for the file's own validators.
CONDITIONAL: list[tuple[dict[str, str], int]] = [
    ({"If-None-Match": "{etag}"}, 304),
    ({"If-None-Match": "W/{etag}"}, 304),  # weak comparison
    ({"If-None-Match": '"other", {etag}'}, 304),
    ({"If-None-Match": "*"}, 304),
    ({"If-None-Match": '"other"'}, 200),
    ({"If-Modified-Since": "{last_modified}"}, 304),
    ({"If-Modified-Since": "{older}"}, 200),
    ({"If-Modified-Since": "garbage"}, 200),
    ({"If-None-Match": '"other"', "If-Modified-Since": "{last_modified}"}, 200),  # INM wins over IMS
    ({"If-Match": "{etag}"}, 200),
    ({"If-Match": '"other"'}, 412),
    ({"If-Match": "W/{etag}"}, 412),  # strong comparison
    ({"If-Match": "*"}, 200),
    ({"If-Unmodified-Since": "{last_modified}"}, 200),
    ({"If-Unmodified-Since": "{older}"}, 412),
    ({"If-Match": "{etag}", "If-Unmodified-Since": "{older}"}, 200),  # If-Match wins over IUS
]


@dataclass(frozen=True)
class SingleRange:
    """A ``Range`` header and the bytes it selects, both as functions of the file's size."""

    id: str
    header: Callable[[int], str]
    span: Callable[[int], tuple[int, int]]


#: One range each, on big.bin and small.txt.
SINGLE_RANGES = [
    SingleRange("first-100", lambda n: "bytes=0-99", lambda n: (0, 100)),
    SingleRange("from-100", lambda n: "bytes=100-", lambda n: (100, n)),
    SingleRange("last-500", lambda n: "bytes=-500", lambda n: (n - 500, n)),
    SingleRange("one-byte", lambda n: "bytes=10-10", lambda n: (10, 11)),
    SingleRange("past-the-end", lambda n: f"bytes=0-{n + 1000}", lambda n: (0, n)),
    SingleRange("suffix-too-long", lambda n: f"bytes=-{n * 2}", lambda n: (0, n)),
    SingleRange("middle", lambda n: "bytes=1000-1999", lambda n: (1000, 2000)),
]

#: Range headers a server ignores (a 200 with the whole file).
#: Range headers answered with the whole file: another unit (RFC 9110 §14.2), not ``unit=set``.
IGNORED_RANGES = ["items=0-1", "blocks=0-10", "bytes 0-1"]

#: Invalid ``bytes`` ranges, rejected with 416 as nginx and aiohttp do (RFC 9110 §15.5.17).
REJECTED_RANGES = ["bytes=5-1", "bytes=abc", "bytes=--1", "bytes=", "bytes=a-f", "bytes=0--10", "bytes=-"]

#: (If-Range, expected status) with ``Range: bytes=0-9`` on big.bin.
IF_RANGE = [
    ("{etag}", 206),
    ('"stale"', 200),
    ("W/{etag}", 200),
    ("{last_modified}", 206),
    ("Mon, 01 Jan 2001 00:00:00 GMT", 200),
    ("junk", 200),
]

#: (Accept-Encoding, Content-Encoding, the file served) for doc.txt.
PRECOMPRESSED = [
    ("gzip", "gzip", "doc.txt.gz"),
    ("br, gzip", "br", "doc.txt.br"),
    ("gzip;q=1.0, br;q=0.5", "gzip", "doc.txt.gz"),
    ("br;q=0, gzip;q=0", None, "doc.txt"),
    ("identity", None, "doc.txt"),
    ("", None, "doc.txt"),
    ("*", "br", "doc.txt.br"),
]

#: Targets (below the mount) that try to leave the root: 400, 403 or 404, never the secret.
HOSTILE = [
    "/../secret.txt",
    "/..%2fsecret.txt",
    "/%2e%2e/secret.txt",
    "/%2e%2e%2fsecret.txt",
    "/%2E%2E/secret.txt",
    "/.%2e/secret.txt",
    "/dir/../../secret.txt",
    "/dir/%2e%2e/%2e%2e/secret.txt",
    "/..\\secret.txt",
    "/..%5csecret.txt",
    "/%5c..%5csecret.txt",
    "//etc/passwd",
    "/%2fetc%2fpasswd",
    "/%2F..%2F..%2Fsecret.txt",
    "/small.txt%00.html",
    "/%00",
    "/....//secret.txt",
    "/escape",
    "/./../secret.txt",
    "/%252e%252e/secret.txt",
    "/dir/..%00/secret.txt",
    "/%c0%ae%c0%ae/secret.txt",
    "/fifo",
]

#: (path, Accept-Encoding) whose sibling or index is a symlink out of the root.
ESCAPING_SIBLINGS = [("/page.html", "gzip"), ("/ghost.js", "br"), ("/linkedindex/", "")]


# -- the tests ---------------------------------------------------------------------------------------


async def _validators(s: Door, name: str) -> dict[str, str]:
    """The file's ETag and Last-Modified as the door sends them, and a date a day older."""
    _, headers, _ = await s.get(f"{s.mount}/{name}")
    last_modified = headers["Last-Modified"]
    older = email.utils.format_datetime(
        email.utils.parsedate_to_datetime(last_modified) - datetime.timedelta(days=1), usegmt=True
    )
    return {"etag": headers["ETag"], "last_modified": last_modified, "older": older}


def case_id(value: object) -> str | None:
    """Test ids for the tables' rows: headers as ``Name=value&...``, a range by its name."""
    if isinstance(value, dict):
        return "&".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, SingleRange):
        return value.id
    return None


class StaticCases:
    """The tests both doors pass: a door's module subclasses this as ``TestStaticCases`` beside
    its ``make_door`` fixture (``await make_door(**config)`` gives a ``Door``)."""

    def check_a_304(self, headers: Any) -> None:
        """A door's own rule for a 304's headers, beyond the shared ones (none by default)."""

    @pytest.mark.parametrize(("name", "size"), FULL_FILES)
    async def test_get_full_file(self, make_door: Any, name: str, size: int) -> None:
        s: Door = await make_door()
        status, headers, body = await s.get(f"{s.mount}/{name}")
        assert status == 200
        assert Blob(body) == Blob((s.root / name).read_bytes())
        assert headers["Content-Length"] == str(size)
        assert headers["Accept-Ranges"] == "bytes"
        st = (s.root / name).stat()
        assert headers["ETag"] == f'"{st.st_mtime_ns:x}-{st.st_size:x}"'
        assert email.utils.parsedate_to_datetime(headers["Last-Modified"]).timestamp() == int(st.st_mtime)
        assert "Content-Encoding" not in headers

    async def test_big_file_is_zero_copy_except_over_tls(self, make_door: Any) -> None:
        s: Door = await make_door()
        for _ in range(2):  # and the keep-alive connection is fine afterwards
            status, _, body = await s.get(f"{s.mount}/big.bin")
            assert status == 200
            assert Blob(body) == Blob(pattern(BIG))
        assert _platform.counters.bytes == (0 if s.tls else 2 * BIG)

    async def test_content_types(self, make_door: Any) -> None:
        s: Door = await make_door()
        _, headers, body = await s.get(f"{s.mount}/archive.tar.gz")
        assert headers["Content-Type"] == "application/gzip"  # gzip data, served as itself
        assert "Content-Encoding" not in headers
        assert gzip.decompress(body) == b"tar"
        assert (await s.get(f"{s.mount}/page.html"))[1]["Content-Type"].startswith("text/html")
        assert (await s.get(f"{s.mount}/big.bin"))[1]["Content-Type"] == "application/octet-stream"
        assert (await s.get(f"{s.mount}/small.txt"))[1]["Content-Type"].startswith("text/plain")

    async def test_head_sends_headers_only(self, make_door: Any) -> None:
        s: Door = await make_door()
        status, headers, body = await s.get(f"{s.mount}/big.bin", method="HEAD")
        assert status == 200
        assert body == b""
        assert headers["Content-Length"] == str(BIG)
        # The connection is still in sync: a GET on it works.
        assert (await s.get(f"{s.mount}/small.txt"))[2] == pattern(SMALL)
        # Range applies to GET only (RFC 9110 §14.2): HEAD describes the whole representation.
        status, headers, _ = await s.get(f"{s.mount}/big.bin", method="HEAD", Range="bytes=0-9")
        assert (status, headers["Content-Length"]) == (200, str(BIG))
        assert "Content-Range" not in headers

    # -- conditional requests

    @pytest.mark.parametrize(("headers_in", "expected"), CONDITIONAL, ids=case_id)
    async def test_conditional_requests(
        self, make_door: Any, headers_in: dict[str, str], expected: int
    ) -> None:
        s: Door = await make_door()
        validators = await _validators(s, "small.txt")
        sent = {k: v.format(**validators) for k, v in headers_in.items()}
        status, headers_out, body = await s.get(f"{s.mount}/small.txt", **sent)
        assert status == expected, sent
        if status == 304:
            assert body == b""
            assert headers_out["ETag"] == validators["etag"]
            self.check_a_304(headers_out)
        elif status == 412:
            assert body == b""
        else:
            assert body == pattern(SMALL)

    # -- ranges

    @pytest.mark.parametrize("case", SINGLE_RANGES, ids=case_id)
    @pytest.mark.parametrize("name", ["big.bin", "small.txt"])
    async def test_single_ranges(self, make_door: Any, name: str, case: SingleRange) -> None:
        s: Door = await make_door()
        data = (s.root / name).read_bytes()
        size = len(data)
        header, (start, stop) = case.header(size), case.span(size)
        status, headers, body = await s.get(f"{s.mount}/{name}", Range=header)
        assert status == 206, header
        assert Blob(body) == Blob(data[start:stop]), header
        assert headers["Content-Range"] == f"bytes {start}-{stop - 1}/{size}"
        assert headers["Content-Length"] == str(stop - start)

    async def test_unsatisfiable_range(self, make_door: Any) -> None:
        s: Door = await make_door()
        status, headers, body = await s.get(f"{s.mount}/small.txt", Range=f"bytes={SMALL}-")
        assert status == 416
        assert headers["Content-Range"] == f"bytes */{SMALL}"
        assert body == b""

    @pytest.mark.parametrize("ignored", IGNORED_RANGES)
    async def test_ignored_ranges(self, make_door: Any, ignored: str) -> None:
        s: Door = await make_door()
        status, _, body = await s.get(f"{s.mount}/small.txt", Range=ignored)
        assert (status, body) == (200, pattern(SMALL)), ignored

    @pytest.mark.parametrize("rejected", REJECTED_RANGES)
    async def test_rejected_ranges(self, make_door: Any, rejected: str) -> None:
        s: Door = await make_door()
        status, headers, body = await s.get(f"{s.mount}/small.txt", Range=rejected)
        assert (status, headers["Content-Range"], body) == (416, f"bytes */{SMALL}", b""), rejected

    async def test_multiple_ranges_are_multipart(self, make_door: Any) -> None:
        s: Door = await make_door()
        data = pattern(BIG)
        parts = []
        async with s.session.get(
            s.url(f"{s.mount}/big.bin"), headers={"Range": "bytes=0-9,2000000-2999999,-5"}
        ) as resp:
            assert resp.status == 206
            assert resp.headers["Content-Type"].startswith("multipart/byteranges; boundary=")
            length = int(resp.headers["Content-Length"])
            reader = MultipartReader.from_response(resp)
            while (part := await reader.next()) is not None:
                assert isinstance(part, BodyPartReader)
                parts.append((part.headers["Content-Range"], Blob(await part.read(decode=False))))
            assert resp.content.total_bytes == length  # Content-Length is exact
        assert parts == [
            (f"bytes 0-9/{BIG}", Blob(data[0:10])),
            (f"bytes 2000000-2999999/{BIG}", Blob(data[2000000:3000000])),
            (f"bytes {BIG - 5}-{BIG - 1}/{BIG}", Blob(data[-5:])),
        ]

    async def test_overlapping_ranges_are_coalesced(self, make_door: Any) -> None:
        s: Door = await make_door()
        status, headers, body = await s.get(f"{s.mount}/small.txt", Range="bytes=0-99,50-149,150-199")
        assert status == 206
        assert headers["Content-Range"] == f"bytes 0-199/{SMALL}"
        assert body == pattern(SMALL)[:200]

    @pytest.mark.parametrize(("if_range", "expected"), IF_RANGE)
    async def test_if_range(self, make_door: Any, if_range: str, expected: int) -> None:
        s: Door = await make_door()
        sent = if_range.format(**await _validators(s, "big.bin"))
        status, _, body = await s.get(f"{s.mount}/big.bin", Range="bytes=0-9", **{"If-Range": sent})
        assert status == expected, sent
        assert Blob(body) == Blob(pattern(BIG)[:10] if expected == 206 else pattern(BIG))

    async def test_file_changing_between_requests(self, make_door: Any) -> None:
        s: Door = await make_door()
        path = s.root / "small.txt"
        _, h1, b1 = await s.get(f"{s.mount}/small.txt")
        path.write_bytes(b"shorter now")
        os.utime(path, ns=(1, 10**18))  # a different mtime for certain
        _, h2, b2 = await s.get(f"{s.mount}/small.txt")
        assert (b1, b2) == (pattern(SMALL), b"shorter now")
        assert h2["Content-Length"] == "11"
        assert h1["ETag"] != h2["ETag"]
        assert (await s.get(f"{s.mount}/small.txt", **{"If-None-Match": h1["ETag"]}))[0] == 200

    # -- pre-compressed variants

    @pytest.mark.parametrize(("accept", "encoding", "served"), PRECOMPRESSED)
    async def test_precompressed_siblings(
        self, make_door: Any, accept: str, encoding: str | None, served: str
    ) -> None:
        s: Door = await make_door()
        status, headers, body = await s.get(f"{s.mount}/doc.txt", **{"Accept-Encoding": accept})
        assert status == 200
        assert headers.get("Content-Encoding") == encoding, accept
        assert body == (s.root / served).read_bytes(), accept
        assert headers["Content-Type"].startswith("text/plain")
        assert "Accept-Encoding" in headers.getall("Vary", [])

    async def test_vary_on_a_plain_file(self, make_door: Any) -> None:
        """Vary whenever pre-compressed variants are on, as nginx's gzip_vary (and the .gz sibling
        is doc.txt compressed)."""
        s: Door = await make_door()
        assert gzip.decompress((s.root / "doc.txt.gz").read_bytes()) == (s.root / "doc.txt").read_bytes()
        _, headers, _ = await s.get(f"{s.mount}/small.txt", **{"Accept-Encoding": "gzip"})
        assert "Accept-Encoding" in headers.getall("Vary", [])

    # -- path safety

    @pytest.mark.parametrize("target", HOSTILE)
    async def test_hostile_paths_never_escape(self, make_door: Any, target: str) -> None:
        s: Door = await make_door()
        status, raw = await s.raw(f"{s.mount}{target}")
        assert status in (400, 403, 404), (target, status)
        assert b"TOP SECRET" not in raw, target

    @pytest.mark.parametrize(("path", "encoding"), ESCAPING_SIBLINGS)
    async def test_symlinked_siblings_and_index_cannot_escape(
        self, make_door: Any, path: str, encoding: str
    ) -> None:
        s: Door = await make_door()
        status, _, body = await s.get(f"{s.mount}{path}", **{"Accept-Encoding": encoding} if encoding else {})
        assert b"TOP SECRET" not in body, path
        assert status in (403, 404, 200), path

    async def test_symlinked_out_of_the_root(self, make_door: Any) -> None:
        """page.html keeps its own bytes; a directory symlinked out is 404, and so is inside it."""
        s: Door = await make_door()
        assert (await s.get(f"{s.mount}/page.html", **{"Accept-Encoding": "gzip"}))[2] == b"<h1>hi</h1>"
        assert (await s.get(f"{s.mount}/outdir/"))[0] == 404
        assert (await s.get(f"{s.mount}/outdir/secret.txt"))[0] == 404

    # -- directories and symlinks

    async def test_directories(self, make_door: Any) -> None:
        s: Door = await make_door()
        status, headers, _ = await s.get(f"{s.mount}/dir")
        assert status == 301
        assert headers["Location"].endswith(f"{s.mount}/dir/")
        assert (await s.get(f"{s.mount}/small.txt/"))[0] == 404  # a file named as a directory
        assert (await s.raw(f"{s.mount}/small.txt/."))[0] == 404
        assert (await s.get(f"{s.mount}/dir/"))[2] == b"index!"
        assert (await s.get(f"{s.mount}/noindex/"))[0] == 403
        assert (await s.get(f"{s.mount}/missing.txt"))[0] == 404
        assert (await s.get(f"{s.mount}/space%20name.txt"))[2] == b"spaced"
        assert (await s.get(f"{s.mount}/%252e%252e"))[2] == b"literal percent name"
        listing: Door = await make_door(show_index=True)
        status, _, body = await listing.get(f"{s.mount}/noindex/")
        assert status == 200
        assert b'<a href="a.txt">a.txt</a>' in body

    async def test_symlinks(self, make_door: Any) -> None:
        """A link that stays inside is served; one out of the root only with follow_symlinks."""
        s: Door = await make_door()
        assert (await s.get(f"{s.mount}/inner-link"))[2] == pattern(SMALL)
        assert (await s.get(f"{s.mount}/escape"))[0] == 404
        s2: Door = await make_door(follow_symlinks=True)
        status, _, body = await s2.get(f"{s.mount}/escape")
        assert (status, body) == (200, b"TOP SECRET")
