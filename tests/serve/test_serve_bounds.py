"""What one hostile client can make ``serve`` hold or do, bounded (issue "Hardening II").

The engine runs in its own process (``tests/support/serve.py``), so its memory is its own and
a client in the test's process cannot hide a blocked loop. Each case on both loops:

* pipelined requests from a client that never reads: the answers waiting for it are bounded (the
  transport's buffer, one flush and the parsed requests of one read), other clients are answered
  meanwhile, and ``send_timeout`` without progress cuts it;
* a request body that never arrives is cut at the header timeout (408), not the keep-alive one;
* the same file asked for under thousands of spellings of its path: the memo keeps its bound,
  keys included, and memory is flat after the first round;
* a big directory listing: built off the loop, once, while other clients are answered;
* a listing never shows a directory outside (a symlink swapped in) nor what answers 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.files import pattern
from ..support.processes import cli_env
from ..support.raw_http import Response, SocketResponses
from ..support.serve import ServeProcess, serve_process
from ..support.waiting import wait_for

pytest.importorskip("aiosendfile._serve._server")

MiB = 2**20
LOOPS = ["asyncio", "uvloop"]


def request(target: bytes, *headers: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def read_answer(sock: socket.socket) -> Response:
    """One answer to the one request sent (nothing may follow it)."""
    answers = SocketResponses(sock)
    answer = answers.next()
    assert answers.buffer == b"", answers.buffer[:300]
    return answer


class Prober:
    """Another client: a hot small file on one keep-alive connection every 20 ms, in a thread;
    ``worst`` is the longest it waited for an answer."""

    def __init__(self, server: ServeProcess, target: bytes) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=10)
        self.target = target
        self.worst = 0.0
        self.answers = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                start = time.monotonic()
                self.sock.sendall(request(self.target))
                assert read_answer(self.sock).raw.startswith(b"HTTP/1.1 200 ")
                self.worst = max(self.worst, time.monotonic() - start)
                self.answers += 1
                time.sleep(0.02)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Prober:
        # (warm: the first answer is not timed: a first sight is decided in the pool)
        self.sock.sendall(request(self.target))
        read_answer(self.sock)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close()
        if self.error is not None:
            raise self.error


@contextlib.contextmanager
def silent_clients(server: ServeProcess, n: int, data: bytes) -> Iterator[list[socket.socket]]:
    """*n* connections with a 4 KiB receive buffer that each send *data* and never read."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((server.host, server.port))
            sock.setblocking(False)
            socks.append(sock)
        for sock in socks:  # as much as the server takes: it may stop reading, as it should
            sent = 0
            deadline = time.monotonic() + 2
            while sent < len(data) and time.monotonic() < deadline:
                try:
                    sent += sock.send(data[sent:])
                except BlockingIOError:
                    time.sleep(0.01)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def settle_rss(server: ServeProcess) -> int:
    """The server's RSS once it stops changing (a read every 0.1 s, two equal in a row, at most 3 s)."""
    last, deadline = -1, time.monotonic() + 3
    while time.monotonic() < deadline:
        now = server.rss()
        if abs(now - last) < 256 * 1024:
            return now
        last = now
        time.sleep(0.1)
    return server.rss()


# -- 1. pipelined requests from a client that never reads --------------------------------------------

#: The longest another client may wait meanwhile: a loop frozen by the flood or the listings waits
#: seconds (the listings froze it 3.5-9.4 s); the loop delay itself is measured by
#: ``benchmarks.mixed_stall``, not here. A 2-vCPU CI machine running four test workers beside
#: another lane's sessions has made a client wait 107 ms, then 582 ms (7-174 ms here with two CPU
#: hogs), so the bound sits between that noise and a freeze.
PROBE_BOUND = 1.5


@pytest.mark.parametrize("loop", LOOPS)
def test_a_pipelined_flood_that_is_never_read_holds_a_bounded_amount(tmp_path: Path, loop: str) -> None:
    """7,000 pipelined GETs of a hot 60 KiB file in one write, from five clients with a 4 KiB
    window that never read: each connection holds a few MB at most (it held 215-260 MB: every
    request of a read was answered into the output at once), another client is answered within
    PROBE_BOUND throughout, and after ``send_timeout`` without progress the five are cut."""
    (tmp_path / "h60k.bin").write_bytes(pattern(60 * 1024))
    (tmp_path / "small.txt").write_bytes(b"small\n")
    flood = request(b"/h60k.bin") * 7000
    with serve_process(tmp_path, loop=loop, options=["--send-timeout", "3"]) as server:
        for _ in range(2):  # hot and memoised
            with socket.create_connection((server.host, server.port), timeout=10) as sock:
                sock.sendall(request(b"/h60k.bin"))
                assert read_answer(sock).raw.startswith(b"HTTP/1.1 200 ")
        base_fds = server.fd_count()
        base = settle_rss(server)
        with Prober(server, b"/small.txt") as prober, silent_clients(server, 5, flood):
            time.sleep(1.0)
            grown = settle_rss(server) - base
            assert grown < 5 * 8 * MiB, f"{grown / MiB:.0f} MiB for 5 connections"
            # send_timeout: no progress for 3 s: the server lets the five go (and what they held)
            wait_for(lambda: server.fd_count() <= base_fds + 1, 15, "the silent clients cut")
        assert prober.answers > 50
        assert prober.worst < PROBE_BOUND, f"another client waited {prober.worst * 1000:.0f} ms"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_flood_behind_a_file_body_in_flight_is_read_no_further(tmp_path: Path, loop: str) -> None:
    """A client with a 4 KiB window that never reads gets a 16 MiB file body stuck in flight,
    then pipelines 40 MB of requests behind it: reading pauses while the body is in flight, and
    a read the transport still delivers joins the backlog, which keeps it paused: the server
    holds a read or two of the flood, not the flood (whatever the policy for pausing per body)."""
    (tmp_path / "big.bin").write_bytes(pattern(16 * MiB))
    flood = request(b"/big.bin") * (40 * MiB // len(request(b"/big.bin")))
    with serve_process(tmp_path, loop=loop) as server:
        base = settle_rss(server)
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((server.host, server.port))
            sock.sendall(request(b"/big.bin"))
            time.sleep(0.5)  # (the body is in flight, stuck on the client's window)
            sock.setblocking(False)
            sent, deadline = 0, time.monotonic() + 3
            while sent < len(flood) and time.monotonic() < deadline:
                try:
                    sent += sock.send(flood[sent : sent + MiB])
                except BlockingIOError:
                    time.sleep(0.01)
            grown = settle_rss(server) - base
            assert sent < len(flood) // 2, f"the server read {sent / MiB:.0f} MiB of the flood"
            assert grown < 16 * MiB, f"{grown / MiB:.0f} MiB held"
        finally:
            sock.close()


# -- 8. a request body that never comes --------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_a_body_that_never_comes_is_cut_at_the_header_timeout(tmp_path: Path, loop: str) -> None:
    """A GET promising a body that does not arrive gets 408 at the header timeout (it waited for
    the keep-alive timeout, 75 s by default), as a head that does not arrive does."""
    (tmp_path / "small.txt").write_bytes(b"small\n")
    options = ["--header-timeout", "1", "--keepalive-timeout", "30"]
    with serve_process(tmp_path, loop=loop, options=options) as server:
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            start = time.monotonic()
            sock.sendall(request(b"/small.txt", b"Content-Length: 10") + b"abc")
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
            waited = time.monotonic() - start
        assert got.startswith(b"HTTP/1.1 408 "), got[:200]
        assert waited < 5, waited


# -- 2. the memo under many spellings of one path ---------------------------------------------------


def spellings(n: int, size: int, first: int = 0) -> Iterator[bytes]:
    """*n* different targets, each about *size* bytes, that all name /one.txt (``/./`` and ``//``)."""
    pad = b"/." * ((size - 60) // 2)
    for i in range(first, first + n):
        bits = [b"/./" if i >> k & 1 else b"//" for k in range(20)]
        yield b"/." + b"".join(bits) + pad + b"/one.txt"  # (a leading // would name an absolute path)


@pytest.mark.parametrize("loop", LOOPS)
def test_many_spellings_of_one_path_keep_memory_flat(tmp_path: Path, loop: str) -> None:
    """Two rounds of 1,500 new spellings of a 1-byte file's path, ~3.9 KB each, each asked twice
    (the second answer is memoised): the memo holds at most its bound, keys included, so memory
    is flat after the first round (it grew by every key: 28 → 172 → 298 MB for 2 x 10,000)."""
    (tmp_path / "one.txt").write_bytes(b"1")
    with serve_process(tmp_path, loop=loop) as server:

        def round_of_requests(first: int) -> int:
            targets = list(spellings(1500, 3900, first))
            with socket.create_connection((server.host, server.port), timeout=30) as sock:
                answers = SocketResponses(sock)
                for i in range(0, len(targets), 25):  # 25 pipelined at a time
                    sock.sendall(b"".join(request(t) * 2 for t in targets[i : i + 25]))
                    for _ in range(50):
                        assert answers.next().raw.endswith(b"\r\n\r\n1")
            return settle_rss(server)

        rss = [round_of_requests(first) for first in (0, 1500)]
    assert rss[1] - rss[0] < 8 * MiB, " → ".join(f"{r / MiB:.0f}" for r in rss) + " MiB"


def test_the_memo_is_bounded_by_entries_and_bytes_keys_included() -> None:
    """A memo charges an entry its key, path, head and body: 10,000 long keys for one small file
    never take it past its bounds."""
    from aiosendfile._static._hot import HotEntry
    from aiosendfile._static._memo import ENTRY_OVERHEAD, Memo

    memo: Memo[bytes, tuple[HotEntry, str, bytes]] = Memo(max_entries=1000, max_bytes=4 * MiB)
    entry = HotEntry((1, 2, 3, 4, 5), b"1", "/srv/one.txt")
    for key in spellings(10_000, 3900):
        memo.put(key, (entry, entry.path, b"HTTP/1.1 200 OK\r\n"), len(key) + 30)
        assert memo.size <= 4 * MiB
        assert len(memo) <= 1000
    keys = list(spellings(10_000, 3900))[-len(memo) :]  # the most recent stayed
    assert memo.size == sum(len(k) + 30 + ENTRY_OVERHEAD for k in keys)
    assert len(set(keys)) == len(keys)
    assert all(k in memo for k in keys)
    assert memo.put(b"/huge", (entry, "", b""), 4 * MiB) is False  # one entry never takes it all


def test_the_memo_evicts_what_was_not_used_since_its_generations_turned() -> None:
    """Nearly least recently used, with no reordering on a hit: once full, a sweep of new keys
    evicts the entries in the order they came, except those used since the generations turned
    (one hit keeps an entry through the turn), and a value is never lost while it fits."""
    from aiosendfile._static._memo import ENTRY_OVERHEAD, Memo

    memo: Memo[str, int] = Memo(max_entries=4)
    for i, key in enumerate("abcd"):
        memo.put(key, i, 1)
    assert memo.get("a") == 0  # (a hit in the young generation: nothing moves)
    memo.put("e", 4, 1)  # full: the generations turn, and the oldest goes
    assert "a" not in memo
    assert memo.get("b") == 1  # used since the turn: kept through the sweep below
    for i, key in enumerate("fgh"):
        memo.put(key, 5 + i, 1)
    assert [k for k in "bcdefgh" if k in memo] == ["b", "f", "g", "h"]
    assert len(memo) == 4
    memo.put("i", 8, 1)  # the next turn: b, not used since, is the oldest now
    assert [k for k in "bfghi" if k in memo] == ["f", "g", "h", "i"]
    assert memo.get("f") == 5
    memo.pop("f")
    assert memo.get("f") is None
    assert len(memo) == 3
    assert memo.size == 3 * (1 + ENTRY_OVERHEAD)


def test_the_answer_cache_charges_keys_paths_and_renderings() -> None:
    """An answer is charged its key (both parts of a tuple key), its path, prefix, folder and every
    filled rendering slot: 10,000 long keys never take the cache past its bounds, and a key over
    MEMO_MAX_KEY is never held."""
    from aiosendfile._static._answers import Answers, Decided
    from aiosendfile._static._memo import ENTRY_OVERHEAD, MEMO_MAX_KEY

    decided = Decided((1, 2, 3, 4, 5), "/srv/one.txt", 1, True, "/static")
    decided.head = b"HTTP/1.1 200 OK\r\n" + b"X" * 100
    decided.pairs = [(b"content-type", b"text/plain")]
    decided.folder = ("/srv", (1, 2, 3, 4))
    decided.body = b"1"
    cost = decided.cost()
    assert cost == len("/srv/one.txt") + len("/static") + len("/srv") + 117 + (12 + 10 + 100) + 1
    answers = Answers(max_entries=1000, max_bytes=4 * MiB)
    for key in spellings(10_000, 3900):
        answers.keep((key[:MEMO_MAX_KEY], b"gzip, br"), decided)
        assert answers.size <= 4 * MiB
        assert len(answers) <= 1000
    held = len(answers)
    assert answers.size == held * (MEMO_MAX_KEY + 8 + cost + ENTRY_OVERHEAD)
    assert not answers.keep(b"/" * (MEMO_MAX_KEY + 1), decided)
    assert not answers.keep((b"/" * (MEMO_MAX_KEY + 1), b""), decided)
    assert len(answers) == held


async def test_the_engines_answer_cache_stays_bounded_under_100000_distinct_paths(tmp_path: Path) -> None:
    """The engine's answer cache (answers of every size, no bodies) under 100,000 distinct paths of
    up to 1 KiB: at most ANSWERS_ENTRIES entries and its bytes, whatever the paths, each entry
    charged its key, path and renderings."""
    from aiosendfile._serve._server import ANSWERS_ENTRIES, Engine, ServeConfig
    from aiosendfile._static._answers import Decided
    from aiosendfile._static._memo import MEMO_MAX_BYTES

    engine = Engine(ServeConfig(str(tmp_path)), asyncio.get_running_loop())
    try:
        answers = engine.answers
        for i in range(100_000):
            raw = b"/" + str(i).encode() * (1 + i % 100)
            decided = Decided((1, i, 3, 4, 5), "/srv/" + str(i), 10, i % 2 == 0)
            decided.head = b"HTTP/1.1 200 OK\r\n" + b"X" * 300
            assert engine.remember(raw[:1024], decided, decided.head)
            assert len(answers) <= ANSWERS_ENTRIES
            assert answers.size <= MEMO_MAX_BYTES
        assert len(answers) > ANSWERS_ENTRIES // 2  # (it does hold a working set)
    finally:
        engine.stop()


# -- 3. a big listing --------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_a_big_listing_is_built_off_the_loop_and_once(tmp_path: Path, loop: str) -> None:
    """A 10,000-entry directory listed 3 x 40 times, pipelined on one connection: the page is built
    off the loop, once a second at most (it was rebuilt on the loop for each request, ~0.2 s
    each, freezing every other client for 9.4 s), and another client is answered within PROBE_BOUND
    throughout, builds included."""
    public = tmp_path / "public"
    big = public / "big"
    big.mkdir(parents=True)
    for i in range(10_000):
        (big / f"file-{i:05d}.txt").write_bytes(b"")
    (public / "small.txt").write_bytes(b"small\n")
    with serve_process(public, loop=loop, options=["--show-index"]) as server:
        with (
            socket.create_connection((server.host, server.port), timeout=30) as sock,
            Prober(server, b"/small.txt") as prober,
        ):
            sock.sendall(request(b"/big/"))  # first sight: decided in the pool, while probed
            head, _, page = read_answer(sock).raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            assert b"file-09999.txt" in page
            for _ in range(3):  # built again once a second has passed
                time.sleep(0.4)
                sock.sendall(request(b"/big/") * 40)
                answers = SocketResponses(sock)
                for _ in range(40):
                    assert answers.next().raw.partition(b"\r\n\r\n")[2] == page
        assert prober.answers > 20
        assert prober.worst < PROBE_BOUND, f"another client waited {prober.worst * 1000:.0f} ms"


# -- 4. a listing never shows a directory outside --------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_a_symlink_swapped_in_never_lists_outside(tmp_path: Path, loop: str) -> None:
    """While another thread swaps ``racedir`` between a directory inside and a symlink to one
    outside, a listing of it shows the inside or is 404, never the outside's names (666 of ~5,500
    did: the containment was checked on the path, then the path was listed), and never a 500 (a
    link swapped under ``realpath`` raised from the core: 500, a traceback, the connection closed)."""
    public, outside = tmp_path / "public", tmp_path / "outside"
    (public / "racedir").mkdir(parents=True)
    (public / "racedir" / "inside.txt").write_bytes(b"in")
    outside.mkdir()
    (outside / "secret-name.txt").write_bytes(b"secret")
    link, real, aside = public / "racedir.link", public / "racedir", public / "racedir.real"
    stop = threading.Event()
    swaps: list[int] = [0]
    failed: list[BaseException] = []

    def swap() -> None:
        try:
            while not stop.is_set():
                real.rename(aside)  # racedir: a symlink out
                link.symlink_to(outside)
                link.rename(real)
                time.sleep(0.001)
                real.unlink()  # racedir: the directory again
                aside.rename(real)
                time.sleep(0.001)
                swaps[0] += 1
        except BaseException as exc:  # (seen by the test, not lost with the thread)
            failed.append(exc)

    with serve_process(public, loop=loop, options=["--show-index"]) as server:
        swapper = threading.Thread(target=swap)
        swapper.start()
        statuses: dict[int, int] = {}
        try:
            with socket.create_connection((server.host, server.port), timeout=10) as sock:
                answers = SocketResponses(sock)
                # Two seconds of the race; on a loaded machine, on until the inside was listed
                # at least once (the race ran both ways), for at most 20 s.
                start = time.monotonic()

                def racing() -> bool:
                    now = time.monotonic()
                    return now < start + 2 or (not statuses.get(200) and now < start + 20)

                while racing():
                    sock.sendall(request(b"/racedir/") * 10)
                    for _ in range(10):
                        answer = answers.next()
                        assert b"secret-name" not in answer.raw, answer.raw[:400]
                        status = answer.status
                        statuses[status] = statuses.get(status, 0) + 1
        finally:
            stop.set()
            swapper.join()
    assert not failed, failed
    assert set(statuses) <= {200, 404}, statuses
    assert statuses.get(200, 0) > 0, (statuses, swaps)


# -- 9. a listing shows only what can be fetched ----------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_a_listing_leaves_out_what_answers_403(tmp_path: Path, loop: str) -> None:
    """A FIFO and a Unix socket answer 403 when fetched: they are not listed (they were)."""
    public = tmp_path / "public"
    (public / "dir").mkdir(parents=True)
    (public / "dir" / "file.txt").write_bytes(b"x")
    os.mkfifo(public / "dir" / "a-fifo")
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(public / "dir" / "a-socket"))
        with (
            serve_process(public, loop=loop, options=["--show-index"]) as server,
            socket.create_connection((server.host, server.port), timeout=10) as sock,
        ):
            answers = SocketResponses(sock)
            for target in (b"/dir/a-fifo", b"/dir/a-socket", b"/dir/"):
                sock.sendall(request(target))
                got = answers.next()
                if target != b"/dir/":
                    assert got.status == 403, got.raw[:200]
        assert b"file.txt" in got.raw
        assert b"a-fifo" not in got.raw
        assert b"a-socket" not in got.raw


# Run as nobody (root may read anything): import while root, then drop privileges and list.
AS_NOBODY = """
import os, sys
from aiosendfile._static._fs import POOL_FS
os.setgroups([]); os.setgid(65534); os.setuid(65534)
found = POOL_FS.scan(sys.argv[1], None)
entries = found[0] if isinstance(found, tuple) else found  # (it returned the list alone)
print(" ".join(sorted(name for name, _ in entries)))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to list as nobody")
def test_a_listing_leaves_out_what_the_server_may_not_read(tmp_path: Path) -> None:
    """Listed as the unprivileged user a server runs as: a file it may not read, and a directory
    it may not enter, answer 403 when fetched, so they are not listed."""
    public = Path(tempfile.mkdtemp(prefix="aiosendfile-listing-"))
    try:
        public.chmod(0o755)
        (public / "readable.txt").write_bytes(b"x")
        (public / "secret.txt").write_bytes(b"x")
        (public / "secret.txt").chmod(0o600)
        (public / "open-dir").mkdir(mode=0o755)
        (public / "closed-dir").mkdir(mode=0o700)
        (public / "open-dir").chmod(0o755)
        (public / "closed-dir").chmod(0o700)
        done = subprocess.run(
            [sys.executable, "-c", AS_NOBODY, str(public)],
            capture_output=True,
            text=True,
            env=cli_env(),
            cwd=public,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["open-dir", "readable.txt"]
    finally:
        shutil.rmtree(public)
