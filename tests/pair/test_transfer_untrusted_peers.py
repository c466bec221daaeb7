"""``python -m aiosendfile recv``, a receiver that does not trust whoever connects (issue #13), and
``send``, a sender that does not trust the receiver's words: stray peers, handshakes that never
complete, malformed or hostile announcements, a second connection, offers not made, a sender gone
silent, escape sequences; on both loops."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from aiosendfile._pair._protocol import BUSY

from ..support.files import pattern
from ..support.pair import (
    LOOPS,
    Peer,
    announce,
    finish,
    no_traceback,
    resume_completes,
    send,
    sha,
    start_receiver,
    wait_until,
)


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


@pytest.mark.parametrize("when", ["handshake", "body"])
def test_a_silent_or_stalled_receiver_cannot_hold_send(tmp_path: Path, when: str) -> None:
    """A "receiver" that accepts and says nothing, or that takes the start and then stops reading:
    send gives up after its timeout, in words (it waited for ever; recv had its timeouts)."""
    source = tmp_path / "in.bin"
    source.write_bytes(pattern(32 * 2**20))
    done = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def stall() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                if when == "body":
                    stream = conn.makefile("rwb")
                    stream.readline()
                    stream.write(b'{"offset": 0, "prefix_sha256": ""}\n')
                    stream.flush()
                    stream.readline()
                    stream.close()
                done.wait(15)

        holder = threading.Thread(target=stall, daemon=True)
        holder.start()
        began = time.monotonic()
        sent = send(source, port, "--handshake-timeout", "1", "--idle-timeout", "1")
        took = time.monotonic() - began
        done.set()
        holder.join(10)
    assert sent.returncode == 1, sent.stderr
    no_traceback(sent.stderr)
    assert took < 12, took
    if when == "handshake":
        # (1 s, and the time the receiver may take to hash a partial OUT as long as the file)
        assert f"127.0.0.1:{port} said nothing for 1.67s" in sent.stderr, sent.stderr
    else:
        assert f"127.0.0.1:{port} took nothing for 1s; stopped after" in sent.stderr, sent.stderr
