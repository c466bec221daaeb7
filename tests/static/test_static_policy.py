"""Static directory policy: dotfiles hidden by default, and listings (a page, or JSON).

Runs the plugin's StaticResource both ways it is mounted: in an Application
under a prefix (``add_static``) and at the root of aiohttp's low-level server;
and the native engine (``aiosendfile._serve``, what ``serve`` runs) at the root.
Requests are sent byte for byte, so percent-escapes reach the server exactly as
written.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import html
import json
import os
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web
from aiohttp.test_utils import RawTestServer, TestServer

import aiosendfile.aiohttp as sf

from ..support.raw_http import parse_response
from ..support.serve import serve_site

RAW_NAME = b"caf\xe9-\xff.txt"  # Latin-1 bytes: not valid UTF-8


@dataclass
class Mounted:
    base: str  # "" at the root, "/static" under a prefix
    host: str
    port: int

    async def get(self, target: str, extra: str = "") -> tuple[int, dict[str, str], bytes]:
        """GET ``base + target``, sent exactly as written (*extra*: header lines, each ending in
        CRLF); status, headers (lower-case names), body."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        head = f"GET {self.base}{target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n"
        writer.write(head.encode("latin-1"))
        data = await reader.read()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        answer = parse_response(data)
        return answer.status, dict(answer.headers.pairs), answer.body


def build(root: Path) -> Path:
    public = root / "public"
    (public / ".git").mkdir(parents=True)
    (public / ".git" / "config").write_text("[core] secret")
    (public / ".env").write_text("TOKEN=secret")
    (public / ".well-known").mkdir()
    (public / ".well-known" / "security.txt").write_text("Contact: x")
    (public / ".well-known" / ".hidden").write_text("no")
    (public / "sub" / ".ssh").mkdir(parents=True)
    (public / "sub" / ".ssh" / "id_rsa").write_text("key")
    (public / "sub" / ".well-known").mkdir()
    (public / "sub" / ".well-known" / "x").write_text("not the site's")
    (public / "sub" / "b.txt").write_text("b" * 1536)
    (public / "sub" / "deeper").mkdir()
    (public / "a.txt").write_text("a")
    (public / "zeta").mkdir()
    (public / "Big.bin").write_bytes(b"\0" * (3 * 2**20))
    (public / '<odd & "name">.txt').write_text("odd")
    (public / "space name.txt").write_text("spaced")
    (public / "link-to-git").symlink_to(public / ".git")
    with open(os.fsencode(public) + b"/" + RAW_NAME, "wb") as f:
        f.write(b"raw bytes name")
    stamp = calendar.timegm((2026, 11, 24, 3, 21, 0))  # 24-Nov-2026 03:21 UTC
    os.utime(public / "a.txt", (stamp, stamp))
    return public


@pytest.fixture(params=["app", "server", "native"])
async def mount(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    public = build(tmp_path)
    servers: list[Any] = []
    natives = contextlib.AsyncExitStack()

    async def make(**kwargs: Any) -> Mounted:
        if request.param == "native":  # the native engine (serve), at the root; kwargs are ServeConfig's
            site = await natives.enter_async_context(serve_site(public, **kwargs))
            return Mounted("", site.host, site.port)
        if request.param == "app":
            app = web.Application()
            sf.add_static(app.router, "/static", public, **kwargs)
            server: Any = TestServer(app)
            base = "/static"
        else:
            resource = sf.StaticResource("", public, **kwargs)
            server = RawTestServer(resource.handle)
            base = ""
        await server.start_server()
        servers.append(server)
        return Mounted(base, server.host, server.port)

    if request.param == "native":
        pytest.importorskip("aiosendfile._serve._server")
    async with natives:
        yield make
    for server in servers:
        await server.close()


# -- dotfiles ----------------------------------------------------------------------------------

HIDDEN = [
    "/.env",
    "/.git/config",
    "/.git/",
    "/.git",  # a directory: 404, not a 301 that shows it exists
    "/%2egit/config",  # percent-decoded before the check
    "/%2Eenv",
    "/sub/.ssh/id_rsa",
    "/sub/%2essh/id_rsa",
    "/sub/.ssh/",
    "/.well-known/.hidden",  # only the .well-known component itself is allowed
    "/sub/.well-known/x",  # .well-known is a top-level name (RFC 8615)
    "/.env/",
    "/...",
]


@pytest.mark.parametrize("target", HIDDEN)
async def test_dotfiles_are_hidden_by_default(mount: Any, target: str) -> None:
    s = await mount()
    status, _, body = await s.get(target)
    assert status == 404, body
    assert b"secret" not in body


async def test_well_known_and_dot_segments_are_served(mount: Any) -> None:
    s = await mount()
    assert (await s.get("/.well-known/security.txt"))[::2] == (200, b"Contact: x")
    assert (await s.get("/./a.txt"))[::2] == (200, b"a")  # "." is a dot segment, not a name
    # A normally named symlink into a dot directory: the request path decides (nginx's practice).
    assert (await s.get("/link-to-git/config"))[::2] == (200, b"[core] secret")


@pytest.mark.parametrize("target", ["/.env", "/.git/config", "/%2egit/config", "/sub/.ssh/id_rsa"])
async def test_show_dotfiles_serves_them(mount: Any, target: str) -> None:
    s = await mount(show_dotfiles=True)
    status, _, body = await s.get(target)
    assert status == 200
    assert body in (b"TOKEN=secret", b"[core] secret", b"key")


async def test_listing_leaves_dotfiles_out_unless_shown(mount: Any) -> None:
    hidden = await mount(show_index=True)
    _, _, body = await hidden.get("/")
    assert b".env" not in body
    assert b".git" not in body
    assert b".well-known" not in body
    _, _, body = await hidden.get("/sub/")
    assert b".ssh" not in body
    shown = await mount(show_index=True, show_dotfiles=True)
    _, _, body = await shown.get("/")
    assert b'<a href=".env">.env</a>' in body
    assert b'<a href=".git/">.git/</a>' in body


# -- listings ------------------------------------------------------------------------------------


def links(body: bytes) -> list[tuple[str, str]]:
    """(href, shown text) of each entry's link (the table's body), in order."""
    rows = body.decode("utf-8").partition("<tbody>")[2].partition("</tbody>")[0]
    return [
        (html.unescape(href), html.unescape(text))
        for href, text in re.findall(r'<a href="([^"]*)">([^<]*)</a>', rows)
    ]


async def test_listing_is_sorted_with_parent_sizes_and_dates(mount: Any) -> None:
    s = await mount(show_index=True)
    status, headers, body = await s.get("/")
    assert status == 200
    assert headers["content-type"] == "text/html; charset=utf-8"
    names = [text for _, text in links(body)]
    assert "../" not in names  # no parent above the served root
    assert names == [
        "link-to-git/",
        "sub/",
        "zeta/",
        '<odd & "name">.txt',
        "Big.bin",
        "a.txt",
        "caf\ufffd-\ufffd.txt",  # shown with U+FFFD, fetched by its raw bytes
        "space name.txt",
    ], names
    page = body.decode()
    date = '<td class="date">'
    assert (
        f'href="a.txt">a.txt</a></td>{date}24-Nov-2026 03:21</td><td class="size" title="1 bytes">1</td>'
        in page
    )
    assert re.search(
        r'href="Big.bin">Big.bin</a></td><td class="date">[^<]+</td>'
        r'<td class="size" title="3145728 bytes">3.0M</td>',
        page,
    )
    assert re.search(
        r'href="zeta/">zeta/</a></td><td class="date">\d\d-\w\w\w-\d{4} \d\d:\d\d</td>'
        r'<td class="size">-</td>',
        page,
    )
    assert "&lt;odd &amp; &quot;name&quot;&gt;.txt" in page  # escaped as text...
    assert 'href="%3Codd%20%26%20%22name%22%3E.txt"' in page  # ...and quoted as a link

    status, _, body = await s.get("/sub/")
    assert status == 200
    assert links(body) == [("../", "../"), ("deeper/", "deeper/"), ("b.txt", "b.txt")]
    assert b'<td class="size" title="1536 bytes">1.5K</td>' in body


async def test_every_listed_link_fetches_its_entry(mount: Any) -> None:
    """Including a name that is not UTF-8: its link quotes the raw bytes, and they find the file."""
    s = await mount(show_index=True)
    _, _, body = await s.get("/")
    hrefs = dict((text, href) for href, text in links(body))
    assert hrefs["caf\ufffd-\ufffd.txt"] == "caf%E9-%FF.txt"
    for text, href in hrefs.items():
        status, _, got = await s.get("/" + href)
        assert status == 200, (text, href)
        if text == "caf\ufffd-\ufffd.txt":
            assert got == b"raw bytes name"
        if text == '<odd & "name">.txt':
            assert got == b"odd"
    # A literal "%" in a name still means itself (%25), not a raw byte.
    assert (await s.get("/caf%25E9-%25FF.txt"))[0] == 404


async def test_listing_of_a_non_utf8_directory_name(mount: Any, tmp_path: Path) -> None:
    raw_dir = os.fsencode(tmp_path / "public") + b"/d\xff"
    os.mkdir(raw_dir)
    with open(raw_dir + b"/in.txt", "wb") as f:
        f.write(b"inside")
    s = await mount(show_index=True)
    status, _, body = await s.get("/d%FF/")
    assert status == 200
    assert "Index of " in body.decode("utf-8")
    assert links(body) == [("../", "../"), ("in.txt", "in.txt")]
    assert (await s.get("/d%FF/in.txt"))[::2] == (200, b"inside")
    status, headers, _ = await s.get("/d%FF")
    assert status == 301
    assert headers["location"].endswith("/d%FF/")


async def test_listing_leaves_out_what_cannot_be_fetched(mount: Any, tmp_path: Path) -> None:
    """A symlink out of the root (served only with follow_symlinks) and a name with a backslash
    (refused by the path rules) are not listed: their links would 404, and the link out would
    show the size and date of a file outside the root."""
    public = tmp_path / "public"
    (tmp_path / "outside.txt").write_bytes(b"o" * 12345)
    (public / "link-out").symlink_to(tmp_path / "outside.txt")
    (public / "dir-out").symlink_to(tmp_path)
    (public / "back\\slash.txt").write_text("b")
    (public / "link-in").symlink_to(public / "a.txt")  # inside: listed and served
    s = await mount(show_index=True)
    _, _, body = await s.get("/")
    names = [text for _, text in links(body)]
    assert "link-in" in names
    for name in ("link-out", "dir-out/", "back\\slash.txt"):
        assert name not in names, names
    assert b"12K" not in body
    for href, text in links(body):
        assert (await s.get("/" + href))[0] == 200, (text, href)
    followed = await mount(show_index=True, follow_symlinks=True)
    _, _, body = await followed.get("/")
    names = [text for _, text in links(body)]
    assert "link-out" in names
    assert "dir-out/" in names
    assert (await followed.get("/link-out"))[::2] == (200, b"o" * 12345)


# -- the listing as people and programs use it ---------------------------------------------------


async def test_listing_sorts_by_each_column_either_way_directories_first(mount: Any, tmp_path: Path) -> None:
    """The headings are links (no script): ``?sort=size|date|name&order=asc|desc``; directories
    stay first in every order; the current column's heading links to the other way."""
    public = tmp_path / "public"
    for name, size, day in (("small.txt", 10, 1), ("mid.txt", 500, 3), ("large.txt", 90000, 2)):
        (public / "sub" / name).write_bytes(b"x" * size)
        stamp = calendar.timegm((2026, 1, day, 0, 0, 0))
        os.utime(public / "sub" / name, (stamp, stamp))
    s = await mount(show_index=True)

    async def names(query: str) -> list[str]:
        status, _, body = await s.get("/sub/" + query)
        assert status == 200
        return [text for _, text in links(body) if text != "../"]

    files = ["b.txt", "large.txt", "mid.txt", "small.txt"]
    assert await names("") == ["deeper/", *files]
    assert await names("?sort=name&order=desc") == ["deeper/", *reversed(files)]
    assert await names("?sort=size") == ["deeper/", "small.txt", "mid.txt", "b.txt", "large.txt"]
    assert await names("?sort=size&order=desc") == ["deeper/", "large.txt", "b.txt", "mid.txt", "small.txt"]
    assert (await names("?sort=date"))[1:4] == ["small.txt", "large.txt", "mid.txt"]  # (b.txt: now)
    assert await names("?sort=bogus&order=sideways&x=1") == ["deeper/", *files]  # defaults
    _, _, body = await s.get("/sub/?sort=size")
    assert b'<a href="?sort=size&amp;order=desc">Size</a>' in body  # the other way
    assert b'<a href="?sort=name&amp;order=asc">Name</a>' in body


async def test_listing_breadcrumbs_link_each_level_relatively(mount: Any) -> None:
    """``Index of /sub/deeper/``: ``/``, ``sub`` and ``deeper`` are links, each relative (right
    behind a proxy that mounts the server under a prefix); a viewport for phones."""
    s = await mount(show_index=True)
    status, _, body = await s.get("/sub/deeper/")
    assert status == 200
    page = body.decode()
    heading = page.partition("<h1>")[2].partition("</h1>")[0]
    crumbs = re.findall(r'<a href="([^"]*)">([^<]*)</a>', heading)
    levels = [p for p in f"{s.base}/sub/deeper/".split("/") if p]
    ups = len(levels)
    # Under a mount prefix, the levels above the served tree are text: no link leads out of it.
    mounted = len([p for p in s.base.split("/") if p])
    linked = range(max(mounted - 1, 0), ups)
    assert [text for _, text in crumbs] == ([] if mounted else ["/"]) + [levels[i] for i in linked]
    assert [href for href, _ in crumbs] == ([] if mounted else ["../" * ups]) + [
        "../" * (ups - i - 1) or "./" for i in linked
    ]
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page


async def test_listing_as_json(mount: Any) -> None:
    """``?json`` (or an ``Accept`` that prefers JSON) answers the same listing as JSON: name,
    href (what fetches it, the raw bytes percent-encoded), type, size, mtime; ``Vary: Accept``.
    A browser's ``Accept`` gets the page."""
    s = await mount(show_index=True)
    status, headers, body = await s.get("/?json")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert headers["vary"] == "Accept"
    got = json.loads(body)
    assert got["path"] == f"{s.base}/"
    entries = {e["name"]: e for e in got["entries"]}
    assert [e["name"] for e in got["entries"]][:3] == ["link-to-git", "sub", "zeta"]  # directories first
    assert entries["a.txt"] == {
        "name": "a.txt",
        "href": "a.txt",
        "type": "file",
        "size": 1,
        "mtime": calendar.timegm((2026, 11, 24, 3, 21, 0)),
    }
    assert entries["sub"]["type"] == "dir"
    assert entries["sub"]["size"] is None
    assert entries["sub"]["href"] == "sub/"
    assert entries['<odd & "name">.txt']["href"] == "%3Codd%20%26%20%22name%22%3E.txt"
    assert entries["caf\ufffd-\ufffd.txt"]["href"] == "caf%E9-%FF.txt"
    assert ".env" not in entries
    for entry in got["entries"]:
        assert (await s.get("/" + entry["href"]))[0] == 200, entry
    as_json = "Accept: application/json\r\n"
    status, headers, body = await s.get("/", as_json)
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == got
    browser = "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
    for extra in (browser, "Accept: */*\r\n", "Accept: application/json;q=0.5, text/html\r\n", ""):
        status, headers, body = await s.get("/", extra)
        assert headers["content-type"] == "text/html; charset=utf-8", extra
        assert headers["vary"] == "Accept"
        assert body.startswith(b"<!DOCTYPE html>")
    assert json.loads((await s.get("/sub/?json&sort=size&order=desc"))[2])["entries"][0]["name"] == "deeper"


HOSTILE_NAMES = [  # (a name holds no "/")
    "<script>alert(1).txt",
    '"><img src=x onerror=alert(2)>.txt',
    "<svg onload=alert(3)>",
    "';alert(4);'.txt",
    "javascript:alert(5)",
    "&lt;b&gt;not bold",
]


async def test_no_markup_or_script_from_a_name_ever_runs(mount: Any, tmp_path: Path) -> None:
    """Names holding markup, quotes, entities or a ``javascript:`` scheme show as text and link
    to themselves (percent-encoded, relative): the page has no element nor attribute a name
    made; the JSON gives the names back exactly."""
    public = tmp_path / "public"
    (public / "evil").mkdir()
    for name in HOSTILE_NAMES:
        (public / "evil" / name).write_text("x")
    (public / "evil" / "<i>dir").mkdir()
    s = await mount(show_index=True)
    for target in ("/evil/", "/evil/%3Ci%3Edir/"):
        _, _, body = await s.get(target)
        page = body.decode()
        assert "<script" not in page
        assert "<img" not in page
        assert "<svg" not in page
        assert "<i>" not in page
        assert "<b>" not in page
    _, _, body = await s.get("/evil/")
    shown = dict((text, href) for href, text in links(body))
    for name in HOSTILE_NAMES:
        assert name in shown, name
        href = shown[name]
        assert href == quote(name), href  # relative, percent-encoded: never a scheme
        assert (await s.get("/evil/" + href))[::2] == (200, b"x")
    got = json.loads((await s.get("/evil/?json"))[2])
    assert sorted(e["name"] for e in got["entries"]) == sorted([*HOSTILE_NAMES, "<i>dir"])
