"""``python -m aiosendfile send`` / ``recv`` as subprocesses: byte-exact, checksums, resume, errors."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aiosendfile._pair._protocol import BUSY

from ..support.files import pattern
from ..support.processes import aiosendfile_process, cli_env, signal_while_starting

ROOT = Path(__file__).resolve().parent.parent.parent
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
    proc = aiosendfile_process("recv", str(out), "--listen", "127.0.0.1:0", *extra)
    _receivers.append(proc)
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

    receiver, port = start_receiver(tmp_path / "out.bin")
    _fake_sender(port, data[: 5 * 2**20], len(data), hashlib.sha256(data).hexdigest())
    code, _, err = finish(receiver)
    assert code == 1
    assert "kept the first 5242880" in err
    assert (tmp_path / "out.bin").read_bytes() == data[: 5 * 2**20]
    resume_completes(source, tmp_path / "out.bin", 5 * 2**20)


# -- a receiver that does not trust whoever connects (issue #13) ------------------------------

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


@pytest.mark.parametrize("loop", LOOPS)
def test_byte_exact_on_both_loops(tmp_path: Path, loop: str) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(5 * 2**20 + 7, seed=1))
    receiver, port = start_receiver(tmp_path / "out.bin", "--loop", loop)
    sent = send(source, port, "--loop", loop)
    code, _out, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()


@pytest.mark.parametrize("loop", LOOPS)
def test_stray_peers_before_the_sender_are_logged_and_ignored(tmp_path: Path, loop: str) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(3 * 2**20, seed=2))
    receiver, port = start_receiver(tmp_path / "out.bin", "--loop", loop)
    with Peer(port) as garbage:
        garbage.send(b"\x00\xffhello, is anyone there?\n")
        assert b'"error"' in garbage.until_closed()
    with Peer(port) as http:
        http.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        http.until_closed()
    Peer(port).close()  # a port scanner: connect, close
    with Peer(port):  # stays connected, says nothing, during the real transfer
        sent = send(source, port)
        code, _, err = finish(receiver)
        assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()
    ignored = [line for line in err.splitlines() if "ignored 127.0.0.1:" in line]
    assert len(ignored) == 3, err
    assert "not an aiosendfile sender" in ignored[0]
    assert "GET / HTTP/1.1" in ignored[1]
    no_traceback(err, sent.stderr)


def test_a_handshake_that_never_completes_is_dropped(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(2**20, seed=4))
    receiver, port = start_receiver(tmp_path / "out.bin", "--handshake-timeout", "0.3")
    with Peer(port) as silent, Peer(port) as dribbler:
        dribbler.send(b'{"name": "x", "size"')  # never a newline
        assert b"within 0.3s" in silent.until_closed()
        assert b"within 0.3s" in dribbler.until_closed()
    sent = send(source, port)
    code, _, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()
    assert err.count("sent no complete handshake within 0.3s") == 2, err


def test_malformed_announcements_are_bad_peers(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(2**20 + 1, seed=5))
    good = sha(b"")
    bad: list[object] = [
        [1, 2],
        {"name": "x", "size": -1, "sha256": good},
        {"name": "x", "size": "12", "sha256": good},
        {"name": "x", "size": 1.5, "sha256": good},
        {"name": "x", "size": True, "sha256": good},
        {"name": "x", "size": 2**64, "sha256": good},
        {"name": "x", "sha256": good},
        {"name": "x", "size": 1, "sha256": "xyz"},
        {"name": "x", "size": 1, "sha256": "g" * 64},
        {"name": "../escape", "size": 1, "sha256": good},
        {"name": "a/b", "size": 1, "sha256": good},
        {"name": 7, "size": 1, "sha256": good},
    ]
    receiver, port = start_receiver(tmp_path / "out.bin")
    for message in bad:
        with Peer(port) as peer:
            peer.say(message)
            reply = peer.hear()
            assert reply is not None, message
            assert "error" in reply, (message, reply)
    assert not (tmp_path / "out.bin").exists()
    sent = send(source, port)
    code, _, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()
    assert len([line for line in err.splitlines() if "ignored" in line]) == len(bad), err
    assert not (tmp_path.parent / "escape").exists()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_second_connection_cannot_take_over(tmp_path: Path, loop: str) -> None:
    data = pattern(4 * 2**20, seed=6)
    half = len(data) // 2
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out, "--loop", loop)
    with Peer(port) as first:
        assert announce(first, data)["offset"] == 0
        first.say({"start": 0})
        first.send(data[:half])
        wait_until(lambda: out.exists() and out.stat().st_size == half, "the first half in OUT")
        with Peer(port) as intruder:
            intruder.say({"name": "evil", "size": 10, "sha256": sha(b"0123456789")})
            reply = intruder.hear()
            assert reply is not None
            assert "busy" in str(reply["error"])
            intruder.send(b"0123456789")
        (tmp_path / "other.bin").write_bytes(b"other")
        other = send(tmp_path / "other.bin", port)  # the real sender says why, in one line
        assert other.returncode == 1
        assert other.stderr == f"aiosendfile send: the receiver refused the transfer: {BUSY}\n"
        assert out.read_bytes() == data[:half]
        first.send(data[half:])
        assert first.hear() == {"ok": True, "sha256": sha(data)}
    code, _, err = finish(receiver)
    assert code == 0, err
    assert out.read_bytes() == data
    assert "refused 127.0.0.1:" in err
    assert "a transfer is in progress" in err


def test_resume_offers_no_hash_of_a_prefix(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    secret = pattern(1000, seed=7)
    out.write_bytes(secret)
    receiver, port = start_receiver(out, "--resume")
    for size in (1, 999):  # a probe: "my file is 1 byte long; what is the hash of yours?"
        with Peer(port) as probe:
            offer = announce(probe, secret[:size])
            assert offer["offset"] == 0, offer
            assert offer["prefix_sha256"] == "", offer
            assert str(out) not in str(offer)
            probe.leave()
    with Peer(port) as peer:  # a file at least as long: only the whole of OUT is offered
        offer = announce(peer, secret + b"more")
        assert offer == {"offset": 1000, "prefix_sha256": sha(secret)}
    assert out.read_bytes() == secret
    receiver.kill()


def test_a_start_that_was_not_offered_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    data = pattern(2**20, seed=8)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out)
    with Peer(port) as peer:
        assert announce(peer, data)["offset"] == 0
        peer.say({"start": 4096})
        assert "was offered" in str((peer.hear() or {}).get("error"))
    assert not out.exists()  # not created, not padded with NUL bytes
    sent = send(source, port)
    assert (sent.returncode, finish(receiver)[0]) == (0, 0), sent.stderr
    assert out.read_bytes() == data

    out.write_bytes(data[:1000])
    receiver, port = start_receiver(out, "--resume")
    for start in (500, 1001, -1, "0", None):
        with Peer(port) as peer:
            assert announce(peer, data)["offset"] == 1000
            peer.say({"start": start})
            reply = peer.hear()
            assert reply is not None, start
            assert "was offered" in str(reply["error"]), (start, reply)
    assert out.read_bytes() == data[:1000]
    sent = send(source, port)
    code, got, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert "resumed at 1000" in got
    assert out.read_bytes() == data


def test_deeply_nested_json_is_a_bad_peer_not_the_end_of_recv(tmp_path: Path) -> None:
    """A line of 5000 '[' is under the line limit, but json.loads raises RecursionError on it
    (not a ValueError): it must be one more garbage peer, not an 'unexpected error' exit."""
    source = tmp_path / "in.bin"
    data = pattern(2**20, seed=12)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out)
    with Peer(port) as peer:  # as the handshake
        peer.send(b"[" * 5000 + b"\n")
        reply = peer.hear()
        assert reply is not None
        assert "not an aiosendfile sender" in str(reply["error"]), reply
    with Peer(port) as peer:  # as the start line
        assert announce(peer, data)["offset"] == 0
        peer.send(b'{"start": ' + b"[" * 5000 + b"\n")
        reply = peer.hear()
        assert reply is not None
        assert "not an aiosendfile sender" in str(reply["error"]), reply
    assert not out.exists()
    sent = send(source, port)
    code, _, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert out.read_bytes() == data
    assert err.count("ignored 127.0.0.1:") == 2, err
    no_traceback(err, sent.stderr)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_receiver_interrupted_mid_transfer_keeps_a_prefix(tmp_path: Path, signum: int, loop: str) -> None:
    source = tmp_path / "in.bin"
    data = pattern(6 * 2**20 + 5, seed=9)
    source.write_bytes(data)
    part = 2 * 2**20 + 3
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out, "--loop", loop)
    with Peer(port) as sender:  # a sender that pauses mid-body
        announce(sender, data)
        sender.say({"start": 0})
        sender.send(data[:part])
        wait_until(lambda: out.exists() and out.stat().st_size == part, "part of the body in OUT")
        receiver.send_signal(signum)
        code, _, err = finish(receiver)
    assert code == 128 + signum, err
    no_traceback(err)
    assert err.strip().splitlines()[-1] == (
        f"aiosendfile recv: interrupted; kept the first {part} of {len(data)} bytes in {out} "
        "(recv --resume continues it)"
    ), err
    assert out.read_bytes() == data[:part]
    resume_completes(source, out, part, ("--loop", loop), ("--loop", loop))


def test_receiver_interrupted_while_waiting(tmp_path: Path) -> None:
    receiver, _ = start_receiver(tmp_path / "out.bin")
    receiver.send_signal(signal.SIGINT)
    code, _, err = finish(receiver)
    assert code == 130
    assert err == f"aiosendfile recv: interrupted before any transfer; {tmp_path / 'out.bin'} untouched\n"


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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_sender_interrupted_mid_transfer(tmp_path: Path, signum: int) -> None:
    source = tmp_path / "in.bin"
    data = pattern(48 * 2**20, seed=10)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    part = 3 * 2**20
    receiver, port = start_receiver(out)
    proxy = HoldingProxy(port, part)
    sender = aiosendfile_process("send", str(source), f"127.0.0.1:{proxy.port}")
    _receivers.append(sender)
    assert proxy.holding.wait(60)
    sender.send_signal(signum)
    sent_code, _, sent_err = finish(sender)
    proxy.release.set()
    code, _, err = finish(receiver)
    assert sent_code == 128 + signum, sent_err
    no_traceback(sent_err, err)
    line = sent_err.strip()
    assert "\n" not in line, line
    assert line.startswith("aiosendfile send: interrupted after sending "), line
    assert f"of {len(data)} bytes" in line
    assert "recv --resume" in line
    assert code == 1, err
    assert f"kept the first {part} of {len(data)} bytes" in err, err
    assert out.read_bytes() == data[:part]
    resume_completes(source, out, part)


def test_a_failed_write_is_told_to_the_sender(tmp_path: Path) -> None:
    """A full disk, simulated by a file size limit: both sides say why; OUT keeps a prefix."""
    resource = pytest.importorskip("resource")
    source = tmp_path / "in.bin"
    data = pattern(6 * 2**20, seed=11)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    limit = 2**20

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "aiosendfile", "recv", str(out), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=ENV,
        preexec_fn=small_disk,
    )
    _receivers.append(proc)
    assert proc.stdout is not None
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", proc.stdout.readline())
    assert match
    sent = send(source, int(match[1]))
    code, _, err = finish(proc)
    assert (sent.returncode, code) == (1, 1), (sent.stderr, err)
    no_traceback(sent.stderr, err)
    assert sent.stderr.startswith("aiosendfile send: the receiver stopped the transfer: cannot write")
    assert "file too large" in sent.stderr
    assert f"kept the first {limit} of" in sent.stderr
    assert f"kept the first {limit} of {len(data)} bytes in {out}" in err
    assert out.read_bytes() == data[:limit]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiosendfile", *args], capture_output=True, text=True, env=ENV, timeout=60
    )


def test_out_is_checked_before_listening(tmp_path: Path) -> None:
    existing = tmp_path / "existing.bin"
    existing.write_bytes(b"keep me")
    cases = {
        str(tmp_path / "missing" / "out.bin"): "does not exist",
        str(tmp_path): "is a directory",
        str(existing): "already exists; use --force to overwrite it, or --resume",
    }
    for out, words in cases.items():
        result = run_cli("recv", out, "--listen", "127.0.0.1:0")
        assert result.returncode == 2, result
        assert result.stdout == ""  # no listening banner
        assert result.stderr.startswith("aiosendfile recv: "), result.stderr
        assert words in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1
    assert existing.read_bytes() == b"keep me"


def test_force_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"old contents, longer than the new")
    (tmp_path / "in.bin").write_bytes(b"new")
    receiver, port = start_receiver(out, "--force")
    sent = send(tmp_path / "in.bin", port)
    assert (sent.returncode, finish(receiver)[0]) == (0, 0), sent.stderr
    assert out.read_bytes() == b"new"


@pytest.mark.parametrize("case", ["differs", "longer"])
def test_resume_that_starts_over_says_so_on_both_sides(tmp_path: Path, case: str) -> None:
    source = tmp_path / "in.bin"
    data = pattern(2**20, seed=12)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    out.write_bytes(b"not the start" if case == "differs" else data + b"tail")
    receiver, port = start_receiver(out, "--resume")
    sent = send(source, port)
    code, got, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert "starting over" in err
    assert "sending it all again" in sent.stderr or "starting over" in sent.stderr
    assert "resumed" not in got
    assert out.read_bytes() == data


def test_sender_errors_in_words(tmp_path: Path) -> None:
    for path, words in ((tmp_path / "missing", "no such file or directory"), (tmp_path, "is a directory")):
        result = run_cli("send", str(path), "127.0.0.1:9")
        assert result.returncode == 1
        assert result.stderr.startswith(f"aiosendfile send: {path}") or "cannot read" in result.stderr
        assert words in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "Errno" not in result.stderr


def test_refused_connection_in_words(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        (tmp_path / "f").write_bytes(b"x")
        result = send(tmp_path / "f", port)
    assert result.returncode == 1
    assert result.stderr == (
        f"aiosendfile send: cannot connect to 127.0.0.1:{port}: "
        "nothing is listening there (connection refused)\n"
    )


def test_help_describes_the_arguments() -> None:
    send_help = run_cli("send", "--help").stdout
    for words in ("FILE ", "the file to send", "HOST:PORT ", "where 'aiosendfile recv' listens", "examples:"):
        assert words in send_help, send_help
    recv_help = run_cli("recv", "--help").stdout
    for words in (
        "OUT ",
        "--force",
        "--resume",
        "default: 127.0.0.1:9000",
        "--handshake-timeout",
        "examples:",
    ):
        assert words in recv_help, recv_help


def test_a_file_too_big_for_the_disk_is_refused_up_front(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(1000, seed=13))
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out)
    with Peer(port) as peer:
        peer.say({"name": "huge", "size": 2**62, "sha256": sha(b"")})
        reply = peer.hear()
        assert reply is not None
        assert "not enough disk space" in str(reply["error"]), reply
    assert not out.exists()
    sent = send(source, port)  # the receiver kept waiting
    code, _, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert out.read_bytes() == source.read_bytes()
    assert "refused 127.0.0.1:" in err


def test_no_disk_space_check_for_a_device_out(tmp_path: Path) -> None:
    """OUT a device (/dev/null, /dev/stdout piped on): the free space of /dev says nothing
    about what it can take, so a big file is offered, not refused as 'not enough disk space'."""
    receiver, port = start_receiver(Path(os.devnull), "--force")
    with Peer(port) as peer:
        assert announce(peer, b"", size=2**62) == {"offset": 0, "prefix_sha256": ""}
        peer.leave()
    receiver.kill()
    _, _, err = finish(receiver)
    assert "disk space" not in err, err


def test_a_source_that_shrinks_mid_transfer(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    data = pattern(48 * 2**20, seed=14)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out)
    proxy = HoldingProxy(port, 3 * 2**20)
    sender = aiosendfile_process("send", str(source), f"127.0.0.1:{proxy.port}")
    _receivers.append(sender)
    assert proxy.holding.wait(60)
    shorter = 24 * 2**20  # beyond what the sender can have handed the kernel by now
    os.truncate(source, shorter)
    proxy.pass_rest = True
    proxy.release.set()
    sent_code, _, sent_err = finish(sender)
    code, _, err = finish(receiver)
    no_traceback(sent_err, err)
    assert sent_code == 1
    assert sent_err == (
        f"aiosendfile send: {source} got shorter while it was being sent, after {shorter} of its "
        f"{len(data)} bytes; the receiver keeps what arrived\n"
    )
    assert code == 1
    assert f"kept the first {shorter} of {len(data)} bytes" in err
    assert out.read_bytes() == data[:shorter]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["recv", "send"])
def test_a_signal_while_starting_is_one_line(tmp_path: Path, command: str, signum: int) -> None:
    """Ctrl-C/SIGTERM while send/recv start (imports, argparse, before the loop): 128+N, one line.

    As for serve, a signal that lands before our code runs (no handler in /proc yet) has
    Python's default effect; such runs are told apart by looking before sending.
    """
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    with socket.socket() as silent:  # a receiver that never answers: send stays in its handshake
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        argv = {
            "recv": ["recv", str(tmp_path / "out.bin"), "--listen", "127.0.0.1:0"],
            "send": ["send", str(src), f"127.0.0.1:{silent.getsockname()[1]}"],
        }[command]
        for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
            ours, status, err = signal_while_starting(argv, signum, delay)
            if ours:
                assert status == 128 + signum, (delay, err)
                assert err.count("\n") == 1, (delay, err)
                no_traceback(err)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_sender_that_goes_silent_mid_body_is_dropped(tmp_path: Path, loop: str) -> None:
    """Like nginx's client_body_timeout: a body that stops coming for --idle-timeout seconds ends
    the transfer (recv used to wait forever, refusing every real sender as busy). OUT keeps what
    arrived, and --resume continues it."""
    data = pattern(2 * 2**20, seed=21)
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out, "--idle-timeout", "1", "--loop", loop)
    with Peer(port) as peer:
        assert announce(peer, data)["offset"] == 0
        peer.say({"start": 0})
        peer.send(data[:1000])
        code, _, err = finish(receiver)  # the peer stays connected and silent meanwhile
    assert code == 1, err
    assert "sent nothing for 1s" in err
    assert "kept the first 1000 of 2097152 bytes" in err
    assert err.count("\n") == 1, err
    no_traceback(err)
    assert out.read_bytes() == data[:1000]
    source = tmp_path / "in.bin"
    source.write_bytes(data)
    resume_completes(source, out, 1000, ("--loop", loop))


def test_a_hostile_receivers_words_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """send prints what the receiver says; escape sequences in it are shown, not obeyed."""
    source = tmp_path / "in.bin"
    source.write_bytes(b"x" * 100)
    with socket.create_server(("127.0.0.1", 0)) as server:

        def receiver() -> None:
            conn, _ = server.accept()
            with conn, conn.makefile("rwb") as stream:
                stream.readline()
                evil = "\x1b[2J\x1b]0;pwned\x07busy\r\nfake line"
                stream.write(json.dumps({"error": evil}).encode() + b"\n")
                stream.flush()

        thread = threading.Thread(target=receiver)
        thread.start()
        done = send(source, server.getsockname()[1])
        thread.join(30)
    assert done.returncode == 1
    assert "\x1b" not in done.stderr
    assert "\x07" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "\\x1b[2J" in done.stderr


_SIGNAL_BEFORE_THE_LOOP_RUNS = """
import asyncio, os, signal, sys
from aiosendfile._pair import _session

loop_class = {"uvloop": __import__("uvloop").Loop, "asyncio": asyncio.SelectorEventLoop}[sys.argv[1]]


class Loop(loop_class):
    def add_signal_handler(self, sig, callback, *args):
        super().add_signal_handler(sig, callback, *args)
        if sig == signal.SIGTERM:  # (both installed: a Ctrl-C comes now)
            os.kill(os.getpid(), signal.SIGINT)


_session.loop_factory = lambda name: (Loop, name)


async def forever():
    await asyncio.sleep(3600)
    return "not interrupted"


sys.exit(_session.run("aiosendfile send", sys.argv[1], forever(), lambda: "interrupted"))
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_a_signal_as_the_handlers_are_installed_is_not_lost(loop: str) -> None:
    """uvloop keeps a signal that comes while the loop is not running for its next wakeup: one
    that lands between the handlers' installation and the loop's start was lost (send waited on
    a silent receiver for ever). The handlers are installed from inside the running loop."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_BEFORE_THE_LOOP_RUNS, loop],
        capture_output=True,
        text=True,
        timeout=20,
        env=cli_env(),
    )
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert done.stderr.strip() == "aiosendfile send: interrupted"
