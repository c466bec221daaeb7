"""``serve`` under pressure from its own environment (#23 items 5 and 6): a stderr nobody reads,
signals other than Ctrl-C/SIGTERM, workers that die.

The server is a subprocess; the clients are this process. Each test runs on both loops where the
loop matters (the access log, signals in a one-process server); the supervisor of ``--workers``
is the same code whatever the loop.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..support.files import pattern
from ..support.processes import Server, alive, children
from ..support.raw_http import parse_head

LOOPS = ["asyncio", "uvloop"]
BIG = 20_000_000
AGENT = "a" * 600  # ~690-byte log lines: 2,000 requests are ~1.4 MB of log, past the pipe and the buffer
REQUESTS = 2000

LOG_LINE = re.compile(
    r'127\.0\.0\.1 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000\] "GET /small\.txt\?(?P<n>\d+) HTTP/1\.1" '
    rf'200 5 "-" "{AGENT}"'
)
DROPPED = re.compile(r"aiosendfile serve: (?P<n>\d+) log lines dropped \(stderr was not being read\)")


@pytest.fixture
def served(tmp_path: Path) -> Path:
    (tmp_path / "small.txt").write_bytes(b"hello")
    (tmp_path / "big.bin").write_bytes(pattern(BIG))
    return tmp_path


@pytest.fixture
def server_factory() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(*args: str, **popen: object) -> Server:
        server = Server(*args, **popen)
        started.append(server)
        return server

    yield start
    for server in started:
        leftovers = children(server.proc.pid) if server.proc.poll() is None else set()
        server.close()
        for pid in leftovers:
            _kill(pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class Client:
    """One keep-alive connection, one request at a time, each answer read whole. *timeout* only
    turns a hang into a failure (10 s, for a loaded machine); a test of promptness passes its own."""

    def __init__(self, server: Server, timeout: float = 10.0) -> None:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = bytearray()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _more(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def head(self, target: str, agent: str = AGENT) -> tuple[int, int]:
        """Send GET *target*, read its head: (status, Content-Length)."""
        self.sock.sendall(f"GET {target} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: {agent}\r\n\r\n".encode())
        while b"\r\n\r\n" not in self.buf:
            self._more()
        end = self.buf.index(b"\r\n\r\n") + 4
        status, fields = parse_head(bytes(self.buf[:end]))
        del self.buf[:end]
        return status, int(fields.get("content-length") or 0)

    def body(self, length: int) -> bytes:
        while len(self.buf) < length:
            self._more()
        body = bytes(self.buf[:length])
        del self.buf[:length]
        return body

    def get(self, target: str) -> tuple[int, bytes]:
        status, length = self.head(target)
        return status, self.body(length)


def _until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.005)


def _stopped(server: Server, signum: int = signal.SIGTERM, within: float = 5.0) -> tuple[int, str]:
    """Send *signum*, wait for the exit (without reading stderr): (status, stderr, with what
    :func:`_wait_for_lines` read before)."""
    server.proc.send_signal(signum)
    try:
        code = server.proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{signal.Signals(signum).name} not acted on within {within} s")
    assert server.proc.stderr is not None
    return code, getattr(server, "err_read", "") + server.proc.stderr.read()


def _wait_for_lines(server: Server, count: int, timeout: float = 10.0) -> None:
    """Read stderr (the raw pipe, before anything reads it as text) until it holds *count* lines."""
    assert server.proc.stderr is not None
    fd = server.proc.stderr.fileno()
    seen = getattr(server, "err_read", "")
    deadline = time.monotonic() + timeout
    while seen.count("\n") < count:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"{count} lines on stderr: not within {timeout} s: {seen!r}")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk.decode()
    server.err_read = seen  # type: ignore[attr-defined]


#: How long one answer may take while stderr is unread. A log written on the loop to a full pipe
#: blocks it for good (the request after ~64 KiB of lines never comes back); a loaded 2-core
#: machine (CI runs three sessions at once) can hold a first answer for over a second.
ANSWER_BOUND = 5.0


def _requests_answered_at_once(server: Server, start: int, count: int) -> None:
    """*count* GETs on one keep-alive connection, each answered within ANSWER_BOUND (the client's
    timeout)."""
    began = time.monotonic()
    with Client(server, timeout=ANSWER_BOUND) as client:
        for n in range(start, start + count):
            try:
                assert client.get(f"/small.txt?{n}") == (200, b"hello")
            except TimeoutError:
                pytest.fail(f"request {n} unanswered after {ANSWER_BOUND} s: the access log blocks the loop")
    assert time.monotonic() - began < 60.0


def _log(text: str) -> tuple[list[int], int]:
    """The request numbers of *text*'s access log lines, and the lines its notes say were dropped.
    Every line must be whole: an access log line or a dropped-lines note, nothing torn."""
    assert text == "" or text.endswith("\n"), text[-200:]
    logged: list[int] = []
    dropped = 0
    for line in text.splitlines():
        if match := LOG_LINE.fullmatch(line):
            logged.append(int(match["n"]))
        elif match := DROPPED.fullmatch(line):
            dropped += int(match["n"])
        else:
            pytest.fail(f"not a whole log line: {line[:300]!r}")
    assert logged == sorted(logged)  # in order; dropped lines leave gaps, never reorder
    return logged, dropped


# -- item 5: the access log never blocks serving ---------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_an_unread_stderr_does_not_block_serving_nor_the_stop(
    served: Path, server_factory: Callable[..., Server], loop: str
) -> None:
    """stderr is a pipe nobody reads: its 64 KiB fill after ~100 lines, the bounded buffer after
    ~1,500; every request is still answered at once, a new connection too, and SIGTERM stops it."""
    server = server_factory(str(served), "--port", "0", "--loop", loop, "--access-log")
    _requests_answered_at_once(server, 0, REQUESTS)
    with Client(server) as other:
        assert other.get("/small.txt?99999") == (200, b"hello")
    began = time.monotonic()
    code, err = _stopped(server)
    assert code == 0
    assert time.monotonic() - began < 3.0  # half a second for connections, at most 1 s for the log
    logged, _ = _log(err)  # what fit in the pipe (the rest was queued, then lost at the exit)
    assert 0 < len(logged) < REQUESTS


@pytest.mark.parametrize("loop", LOOPS)
def test_dropped_log_lines_are_counted_and_said_once_stderr_is_read(
    served: Path, server_factory: Callable[..., Server], loop: str
) -> None:
    """The same, then stderr is read again: one line says how many were dropped, and every
    request is either logged or counted in it."""
    server = server_factory(str(served), "--port", "0", "--loop", loop, "--access-log")
    _requests_answered_at_once(server, 0, REQUESTS)
    assert server.proc.stderr is not None
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.extend(iter(server.proc.stderr.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        _until(
            lambda: any(DROPPED.fullmatch(line.rstrip("\n")) for line in read), 5.0, "the dropped-lines note"
        )
        _requests_answered_at_once(server, REQUESTS, 50)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=5) == 0
    finally:
        reader.join(timeout=10)
    logged, dropped = _log("".join(read))
    assert dropped > 0
    assert len(logged) + dropped == REQUESTS + 50
    assert logged[-50:] == list(range(REQUESTS, REQUESTS + 50))  # after the note: all logged again


def test_the_supervisor_is_not_held_up_by_an_unread_stderr(
    served: Path, server_factory: Callable[..., Server]
) -> None:
    """The workers' log fills stderr; the parent's own lines (a worker died) must not block it."""
    server = server_factory(str(served), "--port", "0", "--workers", "2", "--access-log")
    for start in range(0, REQUESTS, 200):  # a new connection each time: both workers log
        _requests_answered_at_once(server, start, 200)
    _until(lambda: len(children(server.proc.pid)) == 2, 5.0, "two workers")
    known = children(server.proc.pid)
    os.kill(min(known), signal.SIGKILL)
    new, _ = _new_worker(server, known, 3.0)
    os.kill(new, signal.SIGKILL)
    _new_worker(server, known | {new}, 3.0)
    began = time.monotonic()
    code, err = _stopped(server)
    assert code == 0
    assert time.monotonic() - began < 3.0
    assert "Traceback" not in err


NOTE = re.compile(rb"test: (\d+) log lines dropped \(file descriptor \d+ was not being read\)")


def test_a_line_writer_never_blocks_drops_and_counts_and_says_so() -> None:
    """The writer alone, on a pipe: 2 MB put while nobody reads (64 KiB fit in the pipe, 1 MiB
    waits, the rest is dropped), put at once; a drain gives up after its time, once; read again,
    every line is whole and the note counts exactly what is missing."""
    from aiosendfile._serve._accesslog import BUFFER_BYTES, LineWriter

    r, w = os.pipe()
    writer = LineWriter(w, "test")
    try:
        line = b"x" * 99 + b"\n"
        began = time.monotonic()
        for _ in range(500):
            writer.put(line * 40, 40)
        assert time.monotonic() - began < 0.5
        assert writer.queued <= BUFFER_BYTES
        began = time.monotonic()
        assert not writer.drain(0.2)
        assert 0.2 <= time.monotonic() - began < 1.0
        began = time.monotonic()
        assert not writer.drain(5.0)  # once given up, the exit is not held up again
        assert time.monotonic() - began < 1.0
        # Read until every line put is accounted for: written whole, or counted by a note (more
        # than one note when the writer made room, and so took lines again, between two drops).
        got = bytearray()
        written = dropped = 0
        while written + dropped < 500 * 40:
            got += os.read(r, 1 << 16)
            lines = got[: got.rfind(b"\n") + 1].splitlines()
            notes = [NOTE.fullmatch(x) for x in lines if x != line.rstrip()]
            assert all(notes), [x for x in lines if x != line.rstrip()][:3]
            written = len(lines) - len(notes)
            dropped = sum(int(m[1]) for m in notes if m)
        assert written + dropped == 500 * 40
        assert dropped > 0
    finally:
        os.close(r)
        writer.put(b"after\n", 1)  # EPIPE: the writer knows its reader is gone, and ends
        _until(lambda: writer.thread is None, 3.0, "the writer's end")
        os.close(w)
    assert writer.gone


# -- item 6: signals ---------------------------------------------------------------------------------


def _sighup(disposition: signal.Handlers) -> Callable[[], object]:
    """A ``preexec_fn`` that starts serve with SIGHUP at *disposition*, whatever the runner's is."""
    return lambda: signal.signal(signal.SIGHUP, disposition)


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("loop", LOOPS)
def test_sighup_is_a_logged_graceful_stop(
    served: Path, server_factory: Callable[..., Server], loop: str, workers: str
) -> None:
    """A hangup stops serve as SIGTERM does (the download in flight finishes, exit 0), and says so.
    (serve starts with SIGHUP at its default, whatever the test runner's is: under ``nohup`` it
    would be ignored, as the next test checks.)"""
    server = server_factory(
        str(served), "--port", "0", "--loop", loop, "--workers", workers, preexec_fn=_sighup(signal.SIG_DFL)
    )
    workers_before = children(server.proc.pid)
    with Client(server, timeout=5.0) as client:
        status, length = client.head("/big.bin", agent="t")
        assert (status, length) == (200, BIG)
        first = client.body(65536)
        server.proc.send_signal(signal.SIGHUP)
        time.sleep(0.1)
        try:
            rest = client.body(BIG - 65536)
        except ConnectionError:
            pytest.fail("the download in flight was cut by SIGHUP")
    assert first + rest == pattern(BIG)
    code, err = _stopped(server, signal.SIGHUP)  # (a second hangup while it stops changes nothing)
    assert code == 0
    assert "Traceback" not in err
    assert re.fullmatch(r"aiosendfile serve: SIGHUP: stopping \(.*\)\n", err), err
    assert not any(alive(pid) for pid in workers_before)


@pytest.mark.parametrize("loop", LOOPS)
def test_sighup_stays_ignored_when_serve_starts_with_it_ignored(
    served: Path, server_factory: Callable[..., Server], loop: str
) -> None:
    """Under nohup (SIGHUP ignored from the start), a hangup changes nothing."""
    server = server_factory(str(served), "--port", "0", "--loop", loop, preexec_fn=_sighup(signal.SIG_IGN))
    server.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    assert server.proc.poll() is None
    with Client(server) as client:
        assert client.get("/small.txt") == (200, b"hello")
    code, err = _stopped(server)
    assert (code, err) == (0, "")


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("loop", LOOPS)
def test_sigusr1_and_sigusr2_are_ignored_with_a_line(
    served: Path, server_factory: Callable[..., Server], loop: str, workers: str
) -> None:
    server = server_factory(str(served), "--port", "0", "--loop", loop, "--workers", workers)
    pids = children(server.proc.pid)
    for i, signum in enumerate((signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR1)):
        server.proc.send_signal(signum)
        _wait_for_lines(server, i + 1)  # (two of one signal pending at once would be one)
    assert server.proc.poll() is None
    assert children(server.proc.pid) == pids  # no worker stopped either
    with Client(server) as client:
        assert client.get("/small.txt") == (200, b"hello")
    code, err = _stopped(server)
    assert code == 0
    lines = err.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "aiosendfile serve: SIGUSR1 ignored",
        "aiosendfile serve: SIGUSR2 ignored",
        "aiosendfile serve: SIGUSR1 ignored",
    ], err


# -- item 6: workers -----------------------------------------------------------------------------------


def _new_worker(server: Server, known: set[int], timeout: float) -> tuple[int, float]:
    """Wait for a worker pid not in *known*: (pid, when it appeared)."""
    found: list[int] = []

    def appeared() -> bool:
        found[:] = children(server.proc.pid) - known
        return bool(found)

    _until(appeared, timeout, "a new worker")
    return found[0], time.monotonic()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_worker_that_dies_is_logged_and_restarted(
    served: Path, server_factory: Callable[..., Server], loop: str
) -> None:
    server = server_factory(str(served), "--port", "0", "--loop", loop, "--workers", "2")
    _until(lambda: len(children(server.proc.pid)) == 2, 5.0, "two workers")
    first, second = sorted(children(server.proc.pid))
    known = {first, second}
    os.kill(first, signal.SIGKILL)
    third, _ = _new_worker(server, known, 3.0)
    known.add(third)
    os.kill(second, signal.SIGTERM)  # stopped by someone else: a graceful exit, still restarted
    fourth, _ = _new_worker(server, known, 3.0)
    _until(lambda: children(server.proc.pid) == {third, fourth}, 3.0, "the two new workers alone")
    time.sleep(0.3)  # (the new workers listen)
    for _ in range(20):  # a new connection each time: spread over both workers
        with Client(server) as client:
            assert client.get("/small.txt") == (200, b"hello")
    code, err = _stopped(server)
    assert code == 0
    assert err.splitlines() == [
        f"aiosendfile serve: worker {first} was killed by SIGKILL; restarting in 0.1 s",
        f"aiosendfile serve: worker {second} exited with status 0; restarting in 0.1 s",
    ], err
    assert not any(alive(pid) for pid in (third, fourth))


def test_a_worker_that_keeps_dying_is_restarted_ever_later_and_a_stop_still_stops(
    served: Path, server_factory: Callable[..., Server]
) -> None:
    """A crash loop: each replacement is killed as soon as it appears. The restarts are said to
    come 0.1, 0.2, 0.4, 0.8, 1.6 s after each death, and do (never sooner); the other worker
    serves meanwhile; SIGTERM during a backoff stops everything at once."""
    server = server_factory(str(served), "--port", "0", "--workers", "2")
    _until(lambda: len(children(server.proc.pid)) == 2, 5.0, "two workers")
    known = children(server.proc.pid)
    victim = min(known)
    waits: list[float] = []
    for _ in range(5):
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        victim, appeared = _new_worker(server, known, 5.0)
        known.add(victim)
        waits.append(appeared - killed)
    with Client(server) as client:  # the other worker
        assert client.get("/small.txt") == (200, b"hello")
    os.kill(victim, signal.SIGKILL)  # the next restart is 3.2 s away
    time.sleep(0.2)
    began = time.monotonic()
    code, err = _stopped(server)
    assert code == 0
    assert time.monotonic() - began < 2.0
    said = re.findall(r"was killed by SIGKILL; restarting in ([\d.]+) s", err)
    assert said == ["0.1", "0.2", "0.4", "0.8", "1.6", "3.2"], err
    for wait, delay in zip(waits, map(float, said), strict=False):
        assert delay * 0.95 <= wait < delay + 1.0, (waits, said)
    assert not any(alive(pid) for pid in known)


def test_backoff_doubles_to_a_cap_and_resets_after_a_worker_ran_a_while() -> None:
    from aiosendfile._cli._supervisor import Backoff

    backoff = Backoff()
    assert [backoff.after(0.0) for _ in range(10)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]
    assert backoff.after(Backoff.STABLE - 1) == 10.0
    assert backoff.after(Backoff.STABLE) == 0.1
    assert backoff.after(1.0) == 0.2


def test_tls_workers_share_one_context_loaded_once(
    served: Path, server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """With ``--workers`` and TLS, the context is loaded once, before the workers are forked (as
    nginx's master does): a session resumed on any worker (each had its own ticket keys: about
    one in N resumed), a worker restarted after the files were removed (or replaced) still
    serving the same certificate (it read them again: a traceback, and restarts for ever), and
    ``http/1.1`` named in ALPN (none was: curl said the server did not agree on a protocol)."""
    import ssl

    import trustme

    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    server = server_factory(str(served), "--port", "0", "--workers", "2", *tls)
    _until(lambda: len(children(server.proc.pid)) == 2, 5.0, "two workers")
    port = int(server.url.rsplit(":", 1)[1].strip("/"))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    client.set_alpn_protocols(["h2", "http/1.1"])

    def fetch(session: ssl.SSLSession | None = None) -> tuple[ssl.SSLSession | None, bool, str | None]:
        """A GET on a new connection: its session, whether it was resumed, its ALPN protocol."""
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        with raw, client.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as sock:
            sock.sendall(b"GET /small.txt HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
            assert got.endswith(b"\r\n\r\nhello"), got
            return sock.session, sock.session_reused, sock.selected_alpn_protocol()

    session, _, alpn = fetch()
    assert alpn == "http/1.1"
    assert session is not None
    reused = [fetch(session)[1] for _ in range(12)]  # (new connections: spread over both workers)
    assert all(reused), reused
    cert.unlink()
    key.unlink()
    known = children(server.proc.pid)
    os.kill(min(known), signal.SIGKILL)
    _new_worker(server, set(known), 3.0)
    time.sleep(0.3)  # (the new worker listens)
    assert all(fetch(session)[1] for _ in range(12))
    code, err = _stopped(server)
    assert code == 0
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err  # (the killed worker's line)
