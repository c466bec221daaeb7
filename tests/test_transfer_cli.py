"""``python -m aiosendfile send`` / ``recv`` as subprocesses: byte-exact, checksums, resume, errors."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import pattern

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


_receivers: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_receiver_outlives_its_test() -> Iterator[None]:
    """A failed or hung test must not leave a receiver process running (spinning) behind."""
    yield
    while _receivers:
        proc = _receivers.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def start_receiver(out: Path, *extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiosendfile", "recv", str(out), "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=ENV,
    )
    _receivers.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    assert match, line
    return proc, int(match[1])


def send(path: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiosendfile", "send", str(path), f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_send_and_receive_byte_exact(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(20 * 2**20 + 3))
    receiver, port = start_receiver(tmp_path / "out.bin")
    sent = send(source, port)
    code, out, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert "checksum verified" in sent.stdout
    assert "sha256 verified" in out
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    receiver, port = start_receiver(tmp_path / "out")
    assert send(tmp_path / "empty", port).returncode == 0
    assert finish(receiver)[0] == 0
    assert (tmp_path / "out").read_bytes() == b""


def _fake_sender(
    port: int, body: bytes, size: int, sha256: str, *, start_expected: int = 0
) -> dict[str, object]:
    """Speak the protocol by hand: announce *size*/*sha256*, send *body*, then close."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        stream = sock.makefile("rwb")
        stream.write(json.dumps({"name": "x", "size": size, "sha256": sha256}).encode() + b"\n")
        stream.flush()
        offer = json.loads(stream.readline())
        stream.write(json.dumps({"start": start_expected}).encode() + b"\n")
        stream.write(body)
        stream.flush()
        if len(body) < size:
            return offer  # a sender killed mid-transfer: just go away
        return json.loads(stream.readline())


def test_checksum_mismatch_is_detected_and_the_file_kept(tmp_path: Path) -> None:
    body = pattern(3 * 2**20)
    receiver, port = start_receiver(tmp_path / "out.bin")
    verdict = _fake_sender(port, body, len(body), "0" * 64)
    code, _, err = finish(receiver)
    assert verdict["ok"] is False
    assert code == 1
    assert "checksum mismatch" in err
    assert (tmp_path / "out.bin").read_bytes() == body  # kept, and reported


def test_resume_after_a_killed_sender(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(12 * 2**20 + 1, seed=3))
    data = source.read_bytes()
    import hashlib

    receiver, port = start_receiver(tmp_path / "out.bin")
    _fake_sender(port, data[: 5 * 2**20], len(data), hashlib.sha256(data).hexdigest())
    code, _, err = finish(receiver)
    assert code == 1
    assert "kept the first 5242880" in err
    assert (tmp_path / "out.bin").read_bytes() == data[: 5 * 2**20]
    receiver, port = start_receiver(tmp_path / "out.bin", "--resume")
    sent = send(source, port)
    code, out, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert "resumed at 5242880" in out
    assert (tmp_path / "out.bin").read_bytes() == data


def test_refused_connection(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        (tmp_path / "f").write_bytes(b"x")
        result = send(tmp_path / "f", port)
    assert result.returncode == 1
    assert "cannot connect" in result.stderr
