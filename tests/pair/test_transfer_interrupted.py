"""``python -m aiosendfile send`` / ``recv`` interrupted: a signal mid-transfer, while waiting, while
starting or as the handlers are installed, and a write that fails; each says what was kept, in one
line, and ``recv --resume`` continues it."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.files import pattern
from ..support.pair import (
    ENV,
    LOOPS,
    HoldingProxy,
    Peer,
    announce,
    finish,
    no_traceback,
    receivers,
    resume_completes,
    send,
    start_receiver,
    wait_until,
)
from ..support.processes import aiosendfile_process, cli_env, signal_while_starting


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_receiver_interrupted_mid_transfer_keeps_a_prefix(tmp_path: Path, signum: int, loop: str) -> None:
    """(SIGHUP too: what a dropped ssh session sends, and the pair is run over one. It killed
    the command, OUT not flushed and nothing said.)"""
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_sender_interrupted_mid_transfer(tmp_path: Path, signum: int) -> None:
    source = tmp_path / "in.bin"
    data = pattern(48 * 2**20, seed=10)
    source.write_bytes(data)
    out = tmp_path / "out.bin"
    part = 3 * 2**20
    receiver, port = start_receiver(out)
    proxy = HoldingProxy(port, part)
    sender = aiosendfile_process("send", str(source), f"127.0.0.1:{proxy.port}")
    receivers.append(sender)
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
    receivers.append(proc)
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


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
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


async def test_a_receive_cut_twice_settles_before_its_file_is_told() -> None:
    """A signal cancels every task, then the loop's shutdown cancels them again: the wait for the
    receive to settle (a splice's drain in flight, its file's position put back) goes on through
    the second cancellation (it was cut short, and OUT's length was told 0 of 1 GB kept)."""
    from aiosendfile._pair._session import until_idle

    settled: list[str] = []

    async def receive() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # (cancellation-safe: what is in flight lands first)
            settled.append("landed")
            raise

    loop = asyncio.get_running_loop()
    outer = asyncio.ensure_future(until_idle(receive(), 60.0, loop.time))
    await asyncio.sleep(0.05)
    outer.cancel()
    await asyncio.sleep(0.05)
    outer.cancel()  # (the shutdown's)
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert settled == ["landed"]
