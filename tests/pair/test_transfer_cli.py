"""``python -m aiosendfile send`` / ``recv`` as subprocesses: byte-exact, checksums, resume, and the
command line (what is checked before listening, ``--force``, errors in words, the disk space)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ..support.files import pattern
from ..support.pair import (
    ENV,
    HoldingProxy,
    Peer,
    announce,
    finish,
    no_traceback,
    receivers,
    resume_completes,
    run_cli,
    send,
    sha,
    start_receiver,
)
from ..support.processes import aiosendfile_process


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


# -- the command line ----------------------------------------------------------------------------


def test_out_is_checked_before_listening(tmp_path: Path) -> None:
    existing = tmp_path / "existing.bin"
    existing.write_bytes(b"keep me")
    cases = {
        str(tmp_path / "missing" / "out.bin"): "does not exist",
        str(tmp_path): "is a directory",
        str(existing): "already exists; use --force to overwrite it, or --resume",
        "": "OUT is empty",
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


def test_a_pipe_out_with_no_reader_fails_in_words_at_once(tmp_path: Path) -> None:
    """OUT a FIFO nobody reads: the receiver says so and exits 1 (its open held the loop, the
    idle timeout and Ctrl-C until a reader came); the sender is told too."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(1 << 20))
    receiver, port = start_receiver(fifo, "--force")
    sent = send(source, port)
    code, _, err = finish(receiver)
    assert (sent.returncode, code) == (1, 1), (sent.stderr, err)
    assert "no program reads that pipe" in err, err
    assert err.count("\n") == 1, err
    assert "cannot write its file" in sent.stderr, sent.stderr


def test_a_source_that_shrinks_mid_transfer(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    data = pattern(48 * 2**20, seed=14)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out)
    proxy = HoldingProxy(port, 3 * 2**20)
    sender = aiosendfile_process("send", str(source), f"127.0.0.1:{proxy.port}")
    receivers.append(sender)
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


def test_a_fifo_to_send_is_refused_at_once(tmp_path: Path) -> None:
    """FILE a FIFO: refused in words (its open waited for a writer for ever, deaf to signals)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = run_cli("send", str(fifo), "127.0.0.1:9")
    assert done.returncode == 1
    assert done.stderr.strip() == f"aiosendfile send: {fifo} is not a regular file"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_out_that_cannot_be_read_back_is_checked_as_it_is_written(tmp_path: Path, kind: str) -> None:
    """OUT a FIFO (a reader on it) or /dev/null: the bytes are hashed as they are written (its
    read back hung on the FIFO's open for ever, and gave /dev/null's empty hash: a mismatch
    for every byte delivered, exit 1 on both sides)."""
    source = tmp_path / "in.bin"
    data = pattern(3 * 2**20 + 1, seed=5)
    source.write_bytes(data)
    got = bytearray()
    if kind == "fifo":
        out = tmp_path / "fifo"
        os.mkfifo(out)
        reader = threading.Thread(target=lambda: got.extend(out.read_bytes()))
    else:
        out = Path(os.devnull)
    receiver, port = start_receiver(out, "--force")
    if kind == "fifo":
        reader.start()
    sent = send(source, port)
    code, said, err = finish(receiver)
    assert (sent.returncode, code) == (0, 0), (sent.stderr, err)
    assert "sha256 verified" in said
    if kind == "fifo":
        reader.join(10)
        assert bytes(got) == data


@pytest.mark.parametrize("how", ["closed", "broken"])
def test_a_stdout_nobody_reads_fails_no_transfer(tmp_path: Path, how: str) -> None:
    """``recv ... | head -1`` (its first line read, then nobody), and send's stdout closed
    (``>&-``) or a pipe nobody reads (``| true``): the transfer is made and verified, and both
    exit 0 without a traceback (send failed before it began, or both after, on their summary)."""
    source = tmp_path / "in.bin"
    data = pattern(2**20, seed=6)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    receiver, port = start_receiver(out)
    assert receiver.stdout is not None
    receiver.stdout.close()  # (head -1: its first line read, and gone)
    r, w = os.pipe()
    os.close(r)  # (every write to it fails: EPIPE)
    sent = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "send", str(source), f"127.0.0.1:{port}"],
        stdout=None if how == "closed" else w,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        timeout=60,
        preexec_fn=(lambda: os.close(1)) if how == "closed" else None,
    )
    os.close(w)
    assert receiver.stderr is not None
    err = receiver.stderr.read()
    assert (sent.returncode, receiver.wait(60)) == (0, 0), (sent.stderr, err)
    no_traceback(sent.stderr, err)
    assert out.read_bytes() == data


def test_a_pipe_out_whose_reader_stops_ends_at_the_idle_timeout(tmp_path: Path) -> None:
    """OUT a FIFO whose reader holds it open and stops reading: recv ends at its idle timeout, in
    words, and exits (its write blocked in a thread held the close, then the process: SIGKILL)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # (a reader that never reads)
    try:
        source = tmp_path / "in.bin"
        source.write_bytes(pattern(8 * 2**20))
        receiver, port = start_receiver(fifo, "--force", "--idle-timeout", "1")
        sent = send(source, port)
        code, _, err = finish(receiver)
    finally:
        os.close(held)
    assert (sent.returncode, code) == (1, 1), (sent.stderr, err)
    no_traceback(err, sent.stderr)
    assert f"nothing moved for 1s: {fifo} took nothing, or 127.0.0.1:" in err, err
    assert "--resume" not in err  # (a pipe is not resumed)
