"""The pair's harness: ``python -m aiosendfile recv`` and ``send`` as subprocesses, and a peer written
by hand (``Peer``) to play any part of the protocol.

``start_receiver`` starts ``recv`` on a free port and registers it in ``receivers``, which
``tests/pair/conftest.py`` empties after each test (a failed or hung test leaves no receiver behind);
``send`` and ``run_cli`` run the command to its end, ``finish`` waits for a receiver,
``resume_completes`` checks a ``recv --resume`` then ``send`` completes a file; a
``HoldingProxy`` between them holds the sender mid-body.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .processes import aiosendfile_process

ROOT = Path(__file__).resolve().parent.parent.parent


ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


#: What ``start_receiver`` (and a test) started: killed after the test if still running.
receivers: list[subprocess.Popen[str]] = []


def start_receiver(out: Path, *extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = aiosendfile_process("recv", str(out), "--listen", "127.0.0.1:0", *extra)
    receivers.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    assert match, line
    return proc, int(match[1])


def send(path: Path, port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiosendfile", "send", str(path), f"127.0.0.1:{port}", *extra],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def resume_completes(
    source: Path, out: Path, start: int, recv_args: tuple[str, ...] = (), send_args: tuple[str, ...] = ()
) -> None:
    """A ``recv --resume`` of *out*, holding the first *start* bytes of *source*, then a ``send``:
    both succeed, the receiver says it resumed at *start*, and *out* is *source* byte for byte."""
    receiver, port = start_receiver(out, "--resume", *recv_args)
    sent = send(source, port, *send_args)
    code, got, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert f"resumed at {start}" in got
    assert out.read_bytes() == source.read_bytes()


LOOPS = ["asyncio", "uvloop"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll *condition* (a generous deadline only catches a hang; nothing here is timed)."""
    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.01)


class Peer:
    """A hand-written client speaking (or not) the protocol, to play any part."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.stream = self.sock.makefile("rwb")

    def send(self, data: bytes) -> None:
        self.stream.write(data)
        self.stream.flush()

    def say(self, message: object) -> None:
        self.send(json.dumps(message).encode() + b"\n")

    def hear(self) -> dict[str, object] | None:
        line = self.stream.readline()
        return json.loads(line) if line else None

    def until_closed(self) -> bytes:
        """Everything the receiver sends until it closes (its error line, if any)."""
        try:
            return self.stream.read()
        except ConnectionResetError:
            return b""

    def leave(self) -> bytes:
        """Hang up and wait until the receiver has let go of this connection."""
        self.sock.shutdown(socket.SHUT_WR)
        return self.until_closed()

    def close(self) -> None:
        self.stream.close()
        self.sock.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def announce(peer: Peer, data: bytes, size: int | None = None) -> dict[str, object]:
    peer.say({"name": "x", "size": len(data) if size is None else size, "sha256": sha(data)})
    offer = peer.hear()
    assert offer is not None
    return offer


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiosendfile", *args], capture_output=True, text=True, env=ENV, timeout=60
    )


class HoldingProxy:
    """Between sender and receiver: passes the handshake and *body* bytes, then stops reading from
    the sender (which then blocks mid-transfer), until told to close both sides."""

    def __init__(self, target: int, body: int) -> None:
        self.target, self.body = target, body
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        self.holding = threading.Event()
        self.release = threading.Event()
        self.pass_rest = False  # on release: forward the rest (True) or hang up (False)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        down, _ = self.listener.accept()
        up = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=self.back, args=(up, down), daemon=True).start()
        newlines, body = 0, 0
        while body < self.body:
            chunk = down.recv(min(65536, self.body - body) if newlines >= 2 else 1)
            if not chunk:
                break
            if newlines < 2:
                newlines += chunk.count(b"\n")
            else:
                body += len(chunk)
            up.sendall(chunk)
        self.holding.set()
        self.release.wait(60)
        if self.pass_rest:
            with contextlib.suppress(OSError):
                while chunk := down.recv(65536):
                    up.sendall(chunk)
        for sock in (up, down):  # shutdown first: close() alone waits for back()'s recv
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.listener.close()

    @staticmethod
    def back(up: socket.socket, down: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := up.recv(65536):
                down.sendall(chunk)
