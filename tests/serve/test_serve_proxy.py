"""``serve`` behind a reverse proxy: under a path prefix (``--path-prefix``), on both loops, in the
test's loop and in its own process."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ..support.processes import cli_env
from ..support.serve import get, serve_process, serving

pytest.importorskip("httptools")


def put(target: bytes) -> bytes:
    return (
        b"PUT "
        + target
        + b" HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\nConnection: close\r\n\r\nnew"
    )


async def test_a_path_prefix_serves_under_it_and_nothing_else(tmp_path: Path) -> None:
    """``path_prefix="/files"``: /files/x is the tree's x (files, listings with breadcrumbs from
    the prefix, archives, the redirect of a folder without its slash), /files goes to /files/,
    anything outside is 404; uploads land under the root too."""
    async with serving(tmp_path, path_prefix="/files", show_index=True, upload=True) as site:
        small = await site.fetch(get("/files/small.txt", "Connection: close\r\n"))
        assert small.status == 200
        assert small.body == (site.public / "small.txt").read_bytes()
        assert (await site.fetch(get("/small.txt", "Connection: close\r\n"))).status == 404
        assert (await site.fetch(get("/filesx/small.txt", "Connection: close\r\n"))).status == 404
        bare = await site.fetch(get("/files?sort=size", "Connection: close\r\n"))
        assert (bare.status, bare.headers["location"]) == (301, "./files/?sort=size")  # (relative)
        sub = await site.fetch(get("/files/sub", "Connection: close\r\n"))
        assert (sub.status, sub.headers["location"]) == (301, "./sub/")
        (site.public / "dir").mkdir()
        listing = await site.fetch(get("/files/dir/", "Connection: close\r\n"))
        assert listing.status == 200
        assert b"<title>Index of /files/dir/</title>" in listing.body  # (the path as the browser has it)
        assert b'href="../"' in listing.body
        heading = listing.body.partition(b"<h1>")[2].partition(b"</h1>")[0]
        assert heading == b'Index of /<a href="../">files</a>/<a href="./">dir</a>/'  # (none out of it)
        assert (await site.fetch(put(b"/files/dir/new.txt"))).status == 201
        assert (site.public / "dir" / "new.txt").read_bytes() == b"new"
        outside = (
            b"PUT /new.txt HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\nConnection: close\r\n\r\nnew"
        )
        assert (await site.fetch(outside)).status == 404
        assert not (site.public / "new.txt").exists()
        for _ in range(3):  # (kept answers: the same, by the prefixed path only)
            assert (await site.fetch(get("/files/small.txt", "Connection: close\r\n"))).status == 200
            assert (await site.fetch(get("/small.txt", "Connection: close\r\n"))).status == 404


def test_serve_path_prefix_from_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "public"
    root.mkdir()
    (root / "a.txt").write_bytes(b"under the prefix")
    with serve_process(root, cli=True, options=["--path-prefix", "/files/"]) as server:
        with urllib.request.urlopen(server.url("/files/a.txt"), timeout=10) as response:
            assert response.read() == b"under the prefix"
        with pytest.raises(urllib.error.HTTPError) as outside:
            urllib.request.urlopen(server.url("/a.txt"), timeout=10)
        assert outside.value.code == 404
        outside.value.close()


@pytest.mark.parametrize("value", ["files", "/a/../b", "/a//b", "/a%20b", "/a?b", "/./a"])
def test_a_bad_path_prefix_is_refused_in_one_line(tmp_path: Path, value: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "serve", str(tmp_path), "--port", "0", "--path-prefix", value],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=cli_env(),
        timeout=30,
    )
    assert done.returncode == 2, done
    assert "--path-prefix" in done.stderr
    assert "Traceback" not in done.stderr


async def test_behind_a_proxy_that_strips_a_prefix_every_address_resolves_under_it(tmp_path: Path) -> None:
    """A proxy forwards /files/x as /x (nginx's ``location /files/ { proxy_pass http://up/; }``)
    and passes ``Location`` on as it is: what a folder's redirect and a resumable upload's address
    say, resolved against the address the client asked (as browsers and tus clients resolve them),
    stays under /files. They were absolute paths (``/sub/``), which led out of the prefix."""
    from urllib.parse import urljoin

    from ..support.resumable import TUS, V8, tus_metadata

    def seen(target: str, location: str) -> str:  # (what the client asks next)
        return urljoin("http://proxy/files" + target, location)

    def creation(method: str, target: str, *fields: str, body: bytes = b"") -> bytes:
        lines = "".join(f + "\r\n" for f in fields)
        length = f"Content-Length: {len(body)}\r\n"
        head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\n{length}Connection: close\r\n"
        return (head + lines + "\r\n").encode() + body

    async with serving(tmp_path, show_index=True, upload=True) as site:
        sub = await site.fetch(get("/sub?sort=size", "Connection: close\r\n"))
        assert sub.status == 301
        assert seen("/sub?sort=size", sub.headers["location"]) == "http://proxy/files/sub/?sort=size"
        (site.public / "a:b").mkdir()  # (a name a relative address could take for a scheme)
        colon = await site.fetch(get("/a:b", "Connection: close\r\n"))
        assert seen("/a:b", colon.headers["location"]) == "http://proxy/files/a:b/"
        # (with a body: a 104 goes before it)
        made = (await site.exchange(creation("PUT", "/sub/f", "Upload-Complete: ?0", V8, body=b"x"))).decode()
        assert made.startswith("HTTP/1.1 104 "), made
        assert "\r\n\r\nHTTP/1.1 201 " in made, made
        interim, final = (part.split("\r\n", 1)[0] for part in made.split("\r\nLocation: ")[1:])
        assert interim == final  # (the 104's, sent before the body, and the 201's)
        assert seen("/sub/f", final).startswith("http://proxy/files/sub/f?upload=")
        tus = await site.exchange(creation("POST", "/sub/", TUS, "Upload-Length: 3", tus_metadata("t.txt")))
        assert tus.startswith(b"HTTP/1.1 201 "), tus
        where = tus.decode().split("\r\nLocation: ")[1].split("\r\n", 1)[0]
        assert seen("/sub/", where).startswith("http://proxy/files/sub/t.txt?upload=")
