"""The examples as a newcomer runs them: they work, and bad input gets one line, not a traceback."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support.files import pattern

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_file_server_and_client_move_a_file(tmp_path: Path, loop: str) -> None:
    src, out = tmp_path / "src.bin", tmp_path / "out.bin"
    src.write_bytes(pattern(3_000_000))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "file_server.py"), str(src), "--port", str(port), "--loop", loop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert re.search(r"serving .* on 127\.0\.0\.1:\d+", server.stdout.readline())
        client = run(str(EXAMPLES / "file_client.py"), str(out), "--port", str(port))
        assert client.returncode == 0, client.stderr
        assert ": ok" in client.stdout
        assert out.read_bytes() == src.read_bytes()
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0
    assert "Traceback" not in err


def test_file_client_without_a_server_says_so(tmp_path: Path) -> None:
    done = run(str(EXAMPLES / "file_client.py"), str(tmp_path / "out.bin"), "--port", str(free_port()))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1
    assert "cannot connect" in done.stderr
    assert "file_server.py" in done.stderr


def test_file_server_with_a_missing_file_says_so(tmp_path: Path) -> None:
    done = run(str(EXAMPLES / "file_server.py"), str(tmp_path / "missing.bin"), "--port", str(free_port()))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "not a file" in done.stderr


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@contextlib.contextmanager
def example_server(example: str, directory: Path, loop: str) -> Iterator[int]:
    """``python examples/EXAMPLE DIRECTORY --port P --loop LOOP`` until it accepts; its port. On the
    way out: SIGTERM, a clean exit (uvicorn re-raises SIGTERM once shut down), no traceback."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / example), str(directory), "--port", str(port), "--loop", loop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert "serving" in server.stdout.readline()
        for _ in range(100):  # the banner comes before uvicorn binds
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    assert server.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err
    assert "Finished server process" in err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_fastapi_example_serves_files(tmp_path: Path, loop: str) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    data = pattern(2_000_000)
    (tmp_path / "big.bin").write_bytes(data)
    (tmp_path / "note.txt").write_text("hello\n")
    with example_server("fastapi_app.py", tmp_path, loop) as port:
        status, _, body = _get(port, "/static/big.bin")
        assert (status, body) == (200, data)
        status, fields, body = _get(port, "/static/big.bin", {"Range": "bytes=10-19"})
        assert (status, body, fields["content-range"]) == (206, data[10:20], "bytes 10-19/2000000")
        status, fields, body = _get(port, "/download/note.txt")
        assert (status, body) == (200, b"hello\n")
        assert fields["content-disposition"] == 'attachment; filename="note.txt"'
        assert _get(port, "/download/..%2F..%2Fetc%2Fpasswd")[0] == 404
        assert _get(port, "/static/missing")[0] == 404


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_django_example_serves_static_files_and_downloads(tmp_path: Path, loop: str) -> None:
    pytest.importorskip("django")
    data = pattern(2_000_000)
    (tmp_path / "static" / "css").mkdir(parents=True)
    (tmp_path / "static" / "css" / "site.css").write_bytes(data)
    (tmp_path / "report.pdf").write_bytes(data[:100_000])
    with example_server("django_app.py", tmp_path, loop) as port:
        status, fields, body = _get(port, "/static/css/site.css")
        assert (status, body, fields["cache-control"]) == (200, data, "max-age=60, public")
        status, fields, body = _get(port, "/static/css/site.css", {"Range": "bytes=10-19"})
        assert (status, body) == (206, data[10:20])
        status, fields, body = _get(port, "/download/report.pdf")
        assert (status, body) == (200, data[:100_000])
        assert fields["content-disposition"] == 'attachment; filename="report.pdf"'
        assert _get(port, "/download/..%2F..%2Fetc%2Fpasswd")[0] == 404
        assert _get(port, "/static/missing.css")[0] == 404
        assert _get(port, "/")[0] == 200


def test_fastapi_example_with_a_missing_directory_says_so(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    done = run(str(EXAMPLES / "fastapi_app.py"), str(tmp_path / "missing"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "not a directory" in done.stderr
