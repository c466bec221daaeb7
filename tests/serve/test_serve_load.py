"""Load on the native engine, in its own process: idle keep-alive connections, slowloris, many downloads.

The server runs as ``tests/support/serve.py``'s runner (so its memory is measured alone, and a
client in its loop cannot hide a blocked loop); the clients run in this process or in
``tests/support/stress_clients.py``. The default run does small versions; ``nox -s stress``
(``pytest -m stress``) the sizes issue #15 names. Each prints what it measured (``-s``). Bounds are
correctness bounds (nobody dropped, nothing short, nothing kept after), never timings.

* N idle keep-alive connections (500; 10,000 under stress), each after one request: the server
  holds them all (each answers a second request afterwards), and its RSS growth is reported.
* Slowloris: clients (100; 500 under stress) each trickle one header byte a second; a fast client
  meanwhile gets every answer right, and the header timeout closes every slow one.
* Concurrent downloads (100; 1,000 under stress) of mixed sizes, byte-exact (SHA-256).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import uvloop

from ..support.files import download_sizes, pattern, write_download_mix
from ..support.raw_http import read_response
from ..support.serve import ServeProcess, raise_nofile, serve_process
from ..support.waiting import wait_for

pytest.importorskip("aiosendfile._serve._server")

MiB = 2**20
CLIENTS = Path(__file__).parent.parent / "support" / "stress_clients.py"
STRESS = [pytest.mark.stress, pytest.mark.timeout(900)]


@pytest.fixture(scope="module", autouse=True)
def _libuv_started() -> None:
    """The clients here run in ``uvloop.run``: libuv's process-wide signal pipe, made with the first
    loop of the process, is opened before the fd guard looks (as for the async tests)."""
    uvloop.new_event_loop().close()


def report(title: str, **figures: Any) -> None:
    print(f"\n[native load] {title}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


class Peak:
    """Samples a process's RSS and fd count every 50 ms in a thread, until stopped."""

    def __init__(self, server: ServeProcess) -> None:
        self.server = server
        self.rss = self.fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError, AssertionError):
                self.rss = max(self.rss, self.server.rss())
                self.fds = max(self.fds, self.server.fd_count())


def _need_fds(n: int) -> None:
    if raise_nofile(n) < n:
        pytest.skip(f"RLIMIT_NOFILE cannot be raised to {n}")


# -- idle keep-alive connections ----------------------------------------------------------------------

TINY = b"t" * 100


@pytest.mark.parametrize(
    "n",
    [pytest.param(500, id="500"), pytest.param(10_000, id="10000", marks=STRESS)],
)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_idle_keep_alive_connections(tmp_path: Path, n: int, loop: str) -> None:
    (tmp_path / "tiny.txt").write_bytes(TINY)
    _need_fds(n + 1000)
    with serve_process(tmp_path, loop=loop, options=["--nofile", str(n + 1000)]) as server:
        asyncio.run(_idle(server, n)) if loop == "asyncio" else uvloop.run(_idle(server, n))


async def _idle(server: ServeProcess, n: int) -> None:
    request = b"GET /tiny.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    gate = asyncio.Semaphore(200)  # connects in flight at once (the accept queue stays short)

    async def one_request(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        conn[1].write(request)
        r = await read_response(conn[0], timeout=60)
        assert (r.status, r.body) == (200, TINY)

    async def open_one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with gate:
            conn = await asyncio.open_connection(server.host, server.port)
            await one_request(conn)
            return conn

    await asyncio.sleep(0.2)
    base_rss, base_fds = server.rss(), server.fd_count()
    start = time.monotonic()
    conns = await asyncio.gather(*(open_one() for _ in range(n)))
    opened = time.monotonic() - start
    try:
        await asyncio.sleep(0.5)
        held_rss, held_fds = server.rss(), server.fd_count()
        # Every connection is still served (none was dropped to make room): a second request each.
        for i in range(0, n, 500):
            await asyncio.gather(*(one_request(c) for c in conns[i : i + 500]))
        assert not any(reader.at_eof() for reader, _ in conns)
        after_rss = server.rss()
    finally:
        for _, writer in conns:
            writer.close()
    await asyncio.sleep(0)
    report(
        f"{n} idle keep-alive connections (server on {server.loop})",
        connect_and_first_request_s=f"{opened:.1f}",
        server_rss_before=mib(base_rss),
        server_rss_idle=mib(held_rss),
        server_rss_after_second_requests=mib(after_rss),
        rss_growth=mib(held_rss - base_rss),
        per_connection=f"{(held_rss - base_rss) / n / 1024:.1f} KiB",
        server_fds=f"{base_fds} -> {held_fds}",
    )
    assert held_fds >= base_fds + n
    # A correctness bound, generous on purpose: a connection at rest must not hold buffers.
    assert held_rss - base_rss < n * 32 * 1024 + 32 * MiB
    deadline = time.monotonic() + 30
    while server.fd_count() > base_fds + 5:  # the server saw every connection go
        assert time.monotonic() < deadline, f"server fds {server.fd_count()} (base {base_fds})"
        await asyncio.sleep(0.05)


# -- slowloris -----------------------------------------------------------------------------------------

SMALL = pattern(4096, seed=5)
MID = pattern(MiB, seed=6)


@pytest.mark.parametrize(
    ("clients", "header_timeout"),
    [pytest.param(100, 3.0, id="100"), pytest.param(500, 20.0, id="500", marks=STRESS)],
)
def test_slowloris_is_cut_at_the_header_timeout_while_a_fast_client_is_served(
    tmp_path: Path, clients: int, header_timeout: float
) -> None:
    (tmp_path / "small.txt").write_bytes(SMALL)
    (tmp_path / "mid.bin").write_bytes(MID)
    _need_fds(clients + 1000)
    options = ["--nofile", str(clients + 1000), "--header-timeout", str(header_timeout)]
    with serve_process(tmp_path, options=options) as server:
        uvloop.run(_slowloris(server, clients, header_timeout))


async def _slowloris(server: ServeProcess, clients: int, header_timeout: float) -> None:
    gate = asyncio.Semaphore(200)
    ended: list[float] = []  # when each slow connection saw the server close it
    opened_at = time.monotonic()

    async def slow() -> bytes:
        async with gate:
            reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(b"GET /small.txt HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        got = b""
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(reader.read(4096), 1.0)
                except asyncio.TimeoutError:
                    writer.write(b"a")  # one more header byte a second, never the end
                    continue
                except ConnectionError:
                    break
                if not chunk:
                    break
                got += chunk
        finally:
            ended.append(time.monotonic())
            writer.close()
        return got

    slow_tasks = [asyncio.create_task(slow()) for _ in range(clients)]
    await asyncio.sleep(1.0)
    # The fast client: keep-alive requests while every slow one is held.
    fast = 0
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        while time.monotonic() - opened_at < header_timeout * 0.6:
            for path, data in (("/small.txt", SMALL), ("/mid.bin", MID)):
                writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                r = await read_response(reader, timeout=30)
                assert (r.status, r.body == data) == (200, True), path
                fast += 1
            await asyncio.sleep(0.05)
    finally:
        writer.close()
    held_during = len(ended)
    answers = await asyncio.wait_for(asyncio.gather(*slow_tasks), header_timeout + 60)
    report(
        f"slowloris {clients} clients, header timeout {header_timeout} s",
        fast_requests=fast,
        slow_closed_while_fast_ran=held_during,
        slow_closed_after_s=f"{min(ended) - opened_at:.1f}..{max(ended) - opened_at:.1f}",
        answers=sorted({a[:12] for a in answers}),
    )
    assert fast >= 2
    assert held_during == 0, "a slow client was cut before its header timeout"
    # Each was closed (nothing, or a 408, never a file) once its head took too long.
    assert all(a == b"" or a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}


# -- concurrent downloads --------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_downloads_are_byte_exact_when_each_iteration_answers_one_request(tmp_path: Path, loop: str) -> None:
    """100 concurrent downloads from another process while the engine's iteration budget is spent
    at once (each iteration of its loop answers one request, the others wait their turn with
    reading paused): every body byte-exact, nobody dropped, every connection let go after."""
    public = tmp_path / "public"
    public.mkdir()
    digests = write_download_mix(public)
    sizes = download_sizes(100)
    options = ["--iteration-budget", "-1", "--nofile", "2000"]
    with serve_process(public, loop=loop, options=options) as server:
        (tmp_path / "jobs.json").write_text(
            json.dumps(
                {
                    "base": server.base,
                    "ca": None,
                    "jobs": [(f"/f{size}.bin", size, digests[size]) for size in sizes],
                }
            )
        )
        proc = subprocess.run(
            [sys.executable, str(CLIENTS), "download", str(tmp_path / "jobs.json")],
            capture_output=True,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        wait_for(lambda: server.fd_count() < 64, 30, "connections closed")
    assert result["error_count"] == 0, result["errors"]
    assert result["ok"] == 100


@pytest.mark.parametrize(
    ("n", "tls"),
    [
        pytest.param(100, False, id="100-tcp"),
        pytest.param(100, True, id="100-tls"),
        pytest.param(1000, False, id="1000-tcp", marks=STRESS),
        pytest.param(1000, True, id="1000-tls", marks=STRESS),
    ],
)
def test_concurrent_downloads_are_byte_exact(tmp_path: Path, tls_ca: Any, n: int, tls: bool) -> None:
    public = tmp_path / "public"
    public.mkdir()
    digests = write_download_mix(public)
    sizes = download_sizes(n)  # the default run takes 1 in 10 of the mix
    cert = ca = None
    if tls:
        cert, ca = tmp_path / "server.pem", tmp_path / "ca.pem"
        tls_ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
        tls_ca.cert_pem.write_to_path(str(ca))
    _need_fds(n + 1000)
    with serve_process(public, cert=cert, ca=ca, options=["--nofile", str(n + 1000)]) as server:
        config = {
            "base": server.base,
            "ca": str(ca) if ca else None,
            "jobs": [(f"/f{size}.bin", size, digests[size]) for size in sizes],
        }
        (tmp_path / "jobs.json").write_text(json.dumps(config))
        base_rss = server.rss()
        start = time.monotonic()
        with Peak(server) as peak:
            proc = subprocess.run(
                [sys.executable, str(CLIENTS), "download", str(tmp_path / "jobs.json")],
                capture_output=True,
                timeout=600,
                check=False,
            )
        elapsed = time.monotonic() - start
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        wait_for(lambda: server.fd_count() <= peak.fds and server.fd_count() < 64, 30, "connections closed")
        after_rss = server.rss()
    total = sum(sizes)
    report(
        f"{n} concurrent downloads ({'TLS' if tls else 'TCP'})",
        bytes=mib(total),
        seconds=f"{elapsed:.1f}",
        peak_in_flight=result["peak_in_flight"],
        server_rss_before=mib(base_rss),
        server_rss_peak=mib(peak.rss),
        server_rss_after=mib(after_rss),
        server_fds_peak=peak.fds,
    )
    assert result["error_count"] == 0, result["errors"]
    assert result["ok"] == n
    if n >= 1000:
        assert result["peak_in_flight"] >= 128, "the downloads did not really overlap"
