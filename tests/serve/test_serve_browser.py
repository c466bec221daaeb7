"""``serve --upload``'s listing page in a real browser (headless Chromium, ``support.browser``).

With script: the page lists, sorts by its column headings, uploads a file chosen in the form and
one dropped on the page (each then listed, and byte-exact on disk), and downloads a file back
byte-exact through the browser; an upload whose connection drops (a proxy cuts it) resumes where
the server was; names holding markup (``<img onerror=...>``, ``<svg onload=...>``)
are shown as text and run nothing. Without script: the headings still sort and the form still
uploads (a plain form post, answered 303 back to the page). The server runs in its own process,
on each loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import struct
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support.browser import browser, save_downloads_in
from ..support.processes import Server

pytest.importorskip("httptools")
pytest.importorskip("python_multipart")
pytest.importorskip("selenium")

from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

HOSTILE = ("<img src=x onerror=document.title='pwned'>", "<svg onload=alert(1)>")


@pytest.fixture
def public(tmp_path: Path) -> Path:
    root = tmp_path / "public"
    (root / "folder").mkdir(parents=True)
    (root / "small.txt").write_bytes(b"small file")
    (root / "big.bin").write_bytes(os.urandom(300_000))
    for name in HOSTILE:
        (root / name).write_bytes(b"<")  # (smaller than small.txt)
    return root


@pytest.fixture(scope="module")
def chromium_for_the_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium (script on) for the module's tests: a browser costs about 2 s of CPU
    to start. Each test has its own server, on its own port: its own origin, so no page storage of
    one test reaches another (and ``serve`` sets no cookie, which would be shared by host)."""
    with browser(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


@pytest.fixture
def page(chromium_for_the_module: Any) -> Any:
    """The module's browser, on a blank page, for one test (an alert a failed test left open
    dismissed first: that test has failed already, the next one is not to fail for it)."""
    with contextlib.suppress(NoAlertPresentException):
        chromium_for_the_module.switch_to.alert.dismiss()
    chromium_for_the_module.get("about:blank")
    return chromium_for_the_module


@pytest.fixture(params=["asyncio", "uvloop"])
def serve_cli(request: pytest.FixtureRequest, public: Path) -> Any:
    server = Server(str(public), "--port", "0", "--upload", "--loop", request.param)
    yield server
    server.close()


def _names(driver: Any) -> list[str]:
    """The names the page lists, in order (read in one script: a page reloading meanwhile gives
    the old list or the new one, never a stale element)."""
    script = 'return Array.from(document.querySelectorAll("tbody td:first-child a"), a => a.textContent);'
    return list(driver.execute_script(script) or [])


def _upload(driver: Any, picked: Path, name: str) -> None:
    """Pick *picked* in the page's upload form, send it, and wait until *name* is listed."""
    driver.find_element(By.CSS_SELECTOR, "#upload input[type=file]").send_keys(str(picked))
    driver.find_element(By.CSS_SELECTOR, "#upload button").click()
    _listed(driver, name)


def _listed(driver: Any, name: str) -> None:
    """Wait for the page (reloaded after an upload) to list *name*."""
    WebDriverWait(driver, 30).until(lambda d: name in _names(d))


def _no_script_ran(driver: Any) -> None:
    assert driver.title == "Index of /"
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018


_DROP = """
const bytes = new Uint8Array(arguments[0]).map((_, i) => (i * 7 + 3) % 251);
const data = new DataTransfer();
data.items.add(new File([bytes], "dropped.bin"));
for (const kind of ["dragover", "drop"]) {
  document.body.dispatchEvent(new DragEvent(kind, {dataTransfer: data, bubbles: true, cancelable: true}));
}
"""

_DIGEST = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(r => r.arrayBuffer()).then(b => crypto.subtle.digest("SHA-256", b)).then(
  d => done(Array.from(new Uint8Array(d)).map(x => x.toString(16).padStart(2, "0")).join("")),
  e => done("failed: " + e));
"""


def test_the_listing_page_lists_sorts_uploads_and_downloads(
    serve_cli: Any, public: Path, tmp_path: Path, page: Any
) -> None:
    picked = tmp_path / "picked.bin"
    picked.write_bytes(os.urandom(3 * 2**20 + 5))
    driver = page
    driver.get(serve_cli.url)
    _no_script_ran(driver)
    assert _names(driver) == ["folder/", *sorted(HOSTILE), "big.bin", "small.txt"]
    driver.find_element(By.LINK_TEXT, "Size").click()  # small to large, then large to small
    WebDriverWait(driver, 10).until(lambda d: "sort=size" in d.current_url)
    assert _names(driver)[0] == "folder/"
    assert _names(driver)[-2:] == ["small.txt", "big.bin"]
    driver.find_element(By.LINK_TEXT, "Size").click()
    WebDriverWait(driver, 10).until(lambda d: "order=desc" in d.current_url)
    assert _names(driver)[:2] == ["folder/", "big.bin"]
    _no_script_ran(driver)

    driver.get(serve_cli.url)
    _upload(driver, picked, "picked.bin")
    assert (public / "picked.bin").read_bytes() == picked.read_bytes()

    driver.execute_script(_DROP, 100_000)
    _listed(driver, "dropped.bin")
    assert (public / "dropped.bin").read_bytes() == bytes((i * 7 + 3) % 251 for i in range(100_000))

    digest = driver.execute_async_script(_DIGEST, "picked.bin")
    assert digest == hashlib.sha256(picked.read_bytes()).hexdigest()
    _no_script_ran(driver)
    assert sorted(os.listdir(public)) == sorted(
        [".upload-state", "folder", "small.txt", "big.bin", *HOSTILE, "picked.bin", "dropped.bin"]
    )  # (.upload-state: the record of each upload, a while after it completes: never served)


def test_without_script_the_page_still_sorts_and_uploads(
    serve_cli: Any, public: Path, tmp_path: Path
) -> None:
    picked = tmp_path / "plain form.txt"
    picked.write_bytes(b"sent by a form without script\n" * 1000)
    with browser(tmp_path / "profile", javascript=False) as driver:
        driver.get("data:text/html,<title>before</title><script>document.title='ran'</script>")
        assert driver.title == "before"  # (scripts are off in this browser)
        driver.get(serve_cli.url)
        driver.find_element(By.LINK_TEXT, "Size").click()
        WebDriverWait(driver, 10).until(lambda d: "sort=size" in d.current_url)
        assert _names(driver)[-2:] == ["small.txt", "big.bin"]
        _upload(driver, picked, "plain form.txt")
        _no_script_ran(driver)
    assert (public / "plain form.txt").read_bytes() == picked.read_bytes()


class _Proxy:
    """A proxy in front of the server on *port*: each client connection gets its own upstream
    one; what comes back is passed on as it is (``_down``), what goes up as ``_up`` says."""

    def __init__(self, port: int) -> None:
        self.upstream_port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.sockets += (client, upstream)
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        raise NotImplementedError

    @staticmethod
    def _down(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)
            client.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


class _CuttingProxy(_Proxy):
    """A TCP proxy in front of the server that drops the first *cuts* connections carrying a
    ``PATCH`` once *cut_after* bytes of it have passed (a dropped network), and notes each
    ``PATCH``'s ``Upload-Offset``."""

    def __init__(self, port: int, cut_after: int, cuts: int) -> None:
        self.cut_after = cut_after
        self.cuts = cuts
        self.offsets: list[int] = []
        super().__init__(port)

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        counted: int | None = None
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                found = re.search(rb"PATCH [^\r]*\r\n(?:[^\r]*\r\n)*?upload-offset: *(\d+)", data, re.I)
                if found:
                    self.offsets.append(int(found.group(1)))
                    counted = 0 if self.cuts else None
                if counted is not None:
                    counted += len(data)
                    if counted >= self.cut_after:
                        self.cuts -= 1
                        for s in (client, upstream):  # (a reset, as a network gone)
                            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            s.close()
                        return
                upstream.sendall(data)


def test_an_upload_from_the_page_resumes_after_the_connection_drops(
    serve_cli: Any, public: Path, tmp_path: Path, page: Any
) -> None:
    picked = tmp_path / "resumed.bin"
    picked.write_bytes(os.urandom(6 * 2**20 + 3))
    port = int(serve_cli.url.rsplit(":", 1)[1].strip("/"))
    # Six cuts: Chromium sends a request cut on a reused connection again by itself (from its
    # start: the server answers 409 with its offset, and the page asks where to go on); the later
    # cuts reach the page as errors, and it resumes (each cut that fails the test without it).
    proxy = _CuttingProxy(port, cut_after=2 * 2**20, cuts=6)
    try:
        driver = page
        driver.get(f"http://127.0.0.1:{proxy.port}/")
        _upload(driver, picked, "resumed.bin")
    finally:
        proxy.close()
    assert proxy.cuts == 0
    assert proxy.offsets[0] == 0
    assert 0 < proxy.offsets[-1] < picked.stat().st_size  # (resumed where the server was, not again)
    assert (public / "resumed.bin").read_bytes() == picked.read_bytes()
    assert not [n for n in os.listdir(public) if n.endswith(".partial")]


class _StrippingProxy(_Proxy):
    """An HTTP proxy that serves the server under ``/files/``, stripping the prefix before it
    forwards (as nginx's ``location /files/ { proxy_pass http://up/; }``); requests framed by
    ``Content-Length``, as the page sends them."""

    def __init__(self, port: int) -> None:
        self.targets: list[bytes] = []
        super().__init__(port)

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        buffered = b""
        with contextlib.suppress(OSError):
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = client.recv(65536)
                    if not data:
                        upstream.shutdown(socket.SHUT_WR)
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                line, _, fields = head.partition(b"\r\n")
                method, target, version = line.split(b" ")
                self.targets.append(target)
                if not target.startswith(b"/files/"):
                    client.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                upstream.sendall(
                    b" ".join((method, target[len(b"/files") :], version)) + b"\r\n" + fields + b"\r\n\r\n"
                )
                length = re.search(rb"(?im)^content-length: *(\d+)", fields)
                left = int(length.group(1)) if length else 0
                while left:
                    if not buffered:
                        buffered = client.recv(65536)
                        if not buffered:
                            return
                    part, buffered = buffered[:left], buffered[left:]
                    upstream.sendall(part)
                    left -= len(part)


def test_an_upload_from_the_page_behind_a_proxy_that_strips_a_prefix(
    serve_cli: Any, public: Path, tmp_path: Path, page: Any
) -> None:
    """The server never sees the ``/files`` prefix: the page's upload goes on at its address
    taken from its folder, not at the server's absolute one (which the proxy does not route)."""
    picked = tmp_path / "behind.bin"
    picked.write_bytes(os.urandom(300_000))
    port = int(serve_cli.url.rsplit(":", 1)[1].strip("/"))
    proxy = _StrippingProxy(port)
    try:
        driver = page
        driver.get(f"http://127.0.0.1:{proxy.port}/files/")
        _upload(driver, picked, "behind.bin")
    finally:
        proxy.close()
    assert (public / "behind.bin").read_bytes() == picked.read_bytes()
    assert not [n for n in os.listdir(public) if n.endswith(".partial")]
    asked = [t for t in proxy.targets if t != b"/favicon.ico"]  # (the browser's own)
    assert all(t.startswith(b"/files/") for t in asked), proxy.targets


def test_the_listings_archive_links_download_the_folder(
    serve_cli: Any, public: Path, tmp_path: Path, page: Any
) -> None:
    """The links "tar" and "zip" on a folder's listing, clicked: the browser saves the folder as
    an archive under the folder's name, and the archive holds the folder's files byte-exact."""
    (public / "folder" / "inner.txt").write_bytes(b"inside the folder\n" * 100)
    (public / "folder" / "deeper").mkdir()
    (public / "folder" / "deeper" / "blob.bin").write_bytes(os.urandom(200_000))
    saved = tmp_path / "downloads"
    saved.mkdir()
    save_downloads_in(page, saved)
    driver = page
    driver.get(serve_cli.url + "folder/")
    for kind in ("tar", "zip"):
        driver.find_element(By.LINK_TEXT, kind).click()
        arrived = saved / f"folder.{kind}"
        WebDriverWait(driver, 30).until(lambda _, arrived=arrived: arrived.exists())
    names = {
        "folder/inner.txt": b"inside the folder\n" * 100,
        "folder/deeper/blob.bin": (public / "folder" / "deeper" / "blob.bin").read_bytes(),
    }
    with tarfile.open(saved / "folder.tar") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got == names
    with zipfile.ZipFile(saved / "folder.zip") as archive:
        assert archive.testzip() is None
        assert {n: archive.read(n) for n in archive.namelist() if not n.endswith("/")} == names
