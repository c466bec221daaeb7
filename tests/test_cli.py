"""``python -m aiosendfile serve`` as a user runs it: a subprocess, on both loops.

These are synchronous tests (the server is another process); the event loop
under test is chosen with ``--loop``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import pattern

ROOT = Path(__file__).resolve().parent.parent
BANNER = re.compile(r"serving (?P<dir>.+) at (?P<url>http://\S+) \((?P<loop>\w+), (?P<workers>\d+) workers?")


class Server:
    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aiosendfile", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = BANNER.search(line)
        if not match:
            self.proc.kill()
            raise AssertionError(f"no banner: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.banner = match
        self.url = match["url"]

    def get(self, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path.lstrip("/"), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def interrupt(self, timeout: float = 5.0) -> int:
        """SIGINT, as Ctrl-C sends; returns the exit status (fails if it hangs)."""
        self.proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        code = self.proc.wait(timeout=timeout)
        self.stopped_after = time.monotonic() - start
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def served(tmp_path: Path) -> Path:
    (tmp_path / "file.bin").write_bytes(pattern(300_000))
    (tmp_path / "hello.txt").write_text("hello")
    return tmp_path


@pytest.fixture
def server_factory() -> Iterator[type[Server]]:
    started: list[Server] = []

    class Tracked(Server):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield Tracked
    for s in started:
        s.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_serve_starts_serves_ranges_and_stops_on_sigint(
    served: Path, server_factory: type[Server], loop: str
) -> None:
    server = server_factory(str(served), "--port", "0", "--loop", loop)
    assert server.banner["loop"] == loop
    assert Path(server.banner["dir"]) == served
    status, _, body = server.get("/file.bin")
    assert (status, body) == (200, pattern(300_000))
    status, headers, body = server.get("/file.bin", Range="bytes=1000-1999")
    assert (status, body) == (206, pattern(300_000)[1000:2000])
    assert headers["Content-Range"] == "bytes 1000-1999/300000"
    assert server.get("/missing")[0] == 404
    assert server.interrupt() == 0
    assert server.proc.stderr is not None
    assert "Traceback" not in server.proc.stderr.read()


def test_serve_defaults_to_the_current_directory(
    served: Path, server_factory: type[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(served)
    server = server_factory("--port", "0")
    assert Path(server.banner["dir"]) == served
    assert server.get("/hello.txt")[2] == b"hello"
    assert server.interrupt() == 0


def test_serve_workers_share_the_port(served: Path, server_factory: type[Server]) -> None:
    server = server_factory(str(served), "--port", "0", "--workers", "2")
    assert server.banner["workers"] == "2"
    for _ in range(20):  # new connection each time: the kernel spreads them over the workers
        assert server.get("/hello.txt")[2] == b"hello"
    assert server.interrupt() == 0


def test_serve_access_log_is_opt_in(served: Path, server_factory: type[Server]) -> None:
    quiet = server_factory(str(served), "--port", "0")
    quiet.get("/hello.txt")
    assert quiet.interrupt() == 0
    assert quiet.proc.stderr is not None
    assert "GET /hello.txt" not in quiet.proc.stderr.read()
    loud = server_factory(str(served), "--port", "0", "--access-log")
    loud.get("/hello.txt")
    assert loud.interrupt() == 0
    assert loud.proc.stderr is not None
    assert "GET /hello.txt" in loud.proc.stderr.read()


def test_serve_errors(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    missing = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "serve", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert missing.returncode == 2
    assert "not a directory" in missing.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = subprocess.run(
            [sys.executable, "-m", "aiosendfile", "serve", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    assert taken.returncode == 1
    assert "cannot listen" in taken.stderr
    version = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert version.returncode == 0
    assert version.stdout.startswith("aiosendfile ")


def test_workers_exit_when_the_parent_is_killed(served: Path, server_factory: type[Server]) -> None:
    """A SIGKILLed parent leaves no orphaned workers behind."""
    server = server_factory(str(served), "--port", "0", "--workers", "2")
    children = [
        int(pid)
        for pid in Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    ]
    assert len(children) == 2
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        Path(f"/proc/{pid}").exists() and _alive(pid) for pid in children
    ):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", ".", "--port", "99999"],
        ["serve", ".", "--port", "65536"],
        ["serve", ".", "--port", "-1"],
        ["serve", ".", "--port", "http"],
        ["send", "README.md", "127.0.0.1:99999"],
        ["send", "README.md", "127.0.0.1:0"],
        ["send", "README.md", "127.0.0.1"],
        ["recv", "out.bin", "--listen", "127.0.0.1:99999"],
        ["recv", "out.bin", "--listen", "127.0.0.1:-1"],
    ],
)
def test_bad_ports_are_refused_in_one_line_at_once(tmp_path: Path, argv: list[str]) -> None:
    """Every command checks ports the same way: no wrap-around (99999 → 34463), no cryptic resolver text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aiosendfile", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"aiosendfile {argv[0]}: ")
    assert "port" in lines[0].lower()
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out.bin").exists()
