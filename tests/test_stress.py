"""Load, slowloris and long fault runs: ``pytest -m stress`` (``nox -s stress``); not in the default run.

Each test prints what it measured (run with ``-s`` to see it). The bounds are
correctness bounds (nothing leaks, nobody starves), not benchmarks: they are
generous on purpose, so a loaded 2-core CI machine passes them too.

* 1,000 concurrent downloads of mixed sizes from one server loop through the
  aiohttp plugin, byte-exact, on both loops, over TCP (zero-copy) and TLS (the
  userspace fallback); peak RSS growth < 64 MiB. Over TLS, 1,000 connections
  cost that much with no transfer at all (asyncio's TLS layer touches a
  256 KiB read buffer per connection), so there the bound is on what the
  transfers add: the peak minus the peak of as many idle TLS connections.
* 10,000 sequential keep-alive requests to ``python -m aiosendfile serve``: no
  growth in its fd count, RSS growth within a small bound.
* Slowloris: 500 clients that stall after their request (or dribble their
  headers) against one server loop, while a fast client's requests still
  complete quickly; memory bounded.
* Cancellation at random points, many more iterations than the default run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import hashlib
import http.client
import json
import os
import ssl
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import aiosendfile.aiohttp as sf

from .support.cancellations import random_cancellations
from .support.connections import Connector, loop_name
from .support.files import download_sizes, pattern, write_download_mix
from .support.processes import Server
from .support.serve import raise_nofile

pytestmark = [pytest.mark.stress, pytest.mark.timeout(600)]

MiB = 2**20
CLIENTS = Path(__file__).parent / "support" / "stress_clients.py"


# -- measuring --------------------------------------------------------------------------------------


def _status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    return out


def rss(pid: int | str = "self") -> int:
    return _status(pid)["VmRSS"]


def malloc_trim() -> bool:
    """Give the C allocator's free memory back to the OS (glibc), so RSS shows what is still in use.

    Freed 256 KiB buffers often stay in glibc's heap (its mmap threshold adapts
    upwards): without a trim, RSS after a load mixes live memory with cached free
    memory. False where there is no glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0) or True)
    except (OSError, AttributeError):
        return False


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def report(title: str, **figures: Any) -> None:
    print(
        f"\n[stress] {title} ({loop_name() if _in_loop() else 'subprocess'}): "
        + ", ".join(f"{k}={v}" for k, v in figures.items())
    )


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


# -- an in-process plugin server with a deep accept queue ----------------------------------------


@dataclass
class Site:
    runner: web.AppRunner
    port: int
    tls: bool

    def url(self, path: str) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"


@pytest.fixture(params=[False, True], ids=["tcp", "tls"])
def over_tls(request: pytest.FixtureRequest) -> bool:
    """Whether the site is served over TLS (True) or plain TCP."""
    return bool(request.param)


async def start_site(root: Path, tls_ctx: ssl.SSLContext | None) -> Site:
    app = web.Application()
    app.add_routes([sf.static("/s", root)])
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls_ctx, backlog=4096)
    await site.start()
    port = runner.addresses[0][1]
    return Site(runner, port, tls_ctx is not None)


@pytest.fixture
async def site_factory(over_tls: bool, tls_server_ctx: ssl.SSLContext) -> AsyncIterator[Any]:
    sites: list[Site] = []

    async def make(root: Path) -> Site:
        s = await start_site(root, tls_server_ctx if over_tls else None)
        sites.append(s)
        return s

    yield make
    for s in sites:
        await s.runner.cleanup()


# -- 1,000 concurrent downloads ---------------------------------------------------------------------


class Sampler:
    """Samples this process's RSS and fd count every 50 ms while the load runs."""

    def __init__(self) -> None:
        self.max_rss = 0
        self.max_fds = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            self.max_rss = max(self.max_rss, rss())
            self.max_fds = max(self.max_fds, fd_count())
            await asyncio.sleep(0.05)


async def run_clients(mode: str, config: dict[str, Any], tmp_path: Path) -> asyncio.subprocess.Process:
    path = tmp_path / f"{mode}-clients.json"
    path.write_text(json.dumps(config))
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(CLIENTS),
        mode,
        str(path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@contextlib.asynccontextmanager
async def slow_clients(
    site: Site, ca: Path | None, tmp_path: Path, *, clients: int, dribblers: int, path: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The "slow" clients: each asks for *path* and then stops reading; *dribblers* of them
    send a partial request first. Killed on the way out if still running."""
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n"
    config = {
        "host": "127.0.0.1",
        "port": site.port,
        "ca": str(ca) if ca else None,
        "clients": clients,
        "dribblers": dribblers,
        "request": request + "\r\n",
        "partial": request if dribblers else "",
    }
    proc = await run_clients("slow", config, tmp_path)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def until_ready(proc: asyncio.subprocess.Process) -> None:
    """Wait for the clients' "ready" line: every connection is open and has sent its request."""
    assert proc.stdout is not None
    assert proc.stdin is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    assert line.strip() == b"ready", line


async def let_go(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """Tell the slow clients to close (end of their stdin) and return their report."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.close()
    out = await asyncio.wait_for(proc.stdout.read(), 60)
    await asyncio.wait_for(proc.wait(), 60)
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


async def idle_connections_peak(site: Site, ca: Path | None, n: int, tmp_path: Path) -> int:
    """Peak RSS growth while *n* connections are open and idle.

    Each asks for one tiny file first (answered inline), so the server holds
    what a connection costs once its download is done: the TLS session, the
    keep-alive HTTP handler. Measured the way the downloads are.
    """
    gc.collect()
    malloc_trim()
    before, fds_before = rss(), fd_count()
    async with slow_clients(site, ca, tmp_path, clients=n, dribblers=0, path="/s/tiny.txt") as proc:
        async with Sampler() as sampler:
            await until_ready(proc)
            await _until(lambda: fd_count() >= fds_before + n, timeout=30)
            await asyncio.sleep(1.0)
        result = await let_go(proc)
    assert result["closed_by_server"] == 0
    await _until(lambda: fd_count() <= fds_before, timeout=30)
    return sampler.max_rss - before


async def test_a_thousand_concurrent_downloads(
    tmp_path: Path, site_factory: Any, over_tls: bool, tls_ca: Any
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    digests = write_download_mix(root)
    (root / "tiny.txt").write_bytes(b"x" * 100)
    site = await site_factory(root)
    sizes = download_sizes(1000)
    ca = tmp_path / "ca.pem"
    tls_ca.cert_pem.write_to_path(str(ca))
    config = {
        "base": site.url(""),
        "ca": str(ca) if over_tls else None,
        "jobs": [(f"/s/f{size}.bin", size, digests[size]) for size in sizes],
    }
    # What 1,000 open connections cost with no transfer: the baseline the TLS bound subtracts.
    idle_growth = await idle_connections_peak(site, ca if over_tls else None, len(sizes), tmp_path)
    gc.collect()
    malloc_trim()
    rss_before, fds_before = rss(), fd_count()
    start = time.monotonic()
    async with Sampler() as sampler:
        proc = await run_clients("download", config, tmp_path)
        out, err = await asyncio.wait_for(proc.communicate(), 500)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, err.decode()[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    await asyncio.sleep(0.2)
    gc.collect()
    rss_untrimmed = rss()
    trimmed = malloc_trim()
    rss_after, fds_after = rss(), fd_count()
    total = sum(sizes)
    report(
        f"1000 concurrent downloads ({'TLS' if over_tls else 'TCP'})",
        bytes=mib(total),
        seconds=f"{elapsed:.1f}",
        MB_per_s=f"{total / elapsed / 1e6:.0f}",
        peak_in_flight=result["peak_in_flight"],
        server_rss_before=mib(rss_before),
        server_rss_peak=mib(sampler.max_rss),
        server_rss_after=mib(rss_untrimmed),
        server_rss_after_malloc_trim=mib(rss_after) if trimmed else "n/a",
        rss_growth=mib(rss_after - rss_before),
        peak_growth=mib(sampler.max_rss - rss_before),
        idle_connections_peak_growth=mib(idle_growth),
        peak_growth_from_transfers=mib(sampler.max_rss - rss_before - idle_growth),
        fds_before=fds_before,
        fds_peak=sampler.max_fds,
        fds_after=fds_after,
    )
    assert result["error_count"] == 0, result["errors"]
    assert result["ok"] == 1000
    # Bodies in flight at once: 150-330 measured, depending on the loop and on how fast the server
    # starts transfers (stock asyncio's TLS handshakes and 16 KiB TLS pieces are the slowest).
    assert result["peak_in_flight"] >= 128, "the downloads did not really overlap"
    assert sampler.max_fds - fds_before >= 200
    # Nothing kept once the load is gone (after handing the allocator's free memory back).
    assert rss_after - rss_before < 64 * MiB
    # While it runs. Over TLS the 1,000 connections alone cost about 280 MiB on stock asyncio (its
    # TLS layer's 256 KiB read buffer, touched, per connection) and 25-35 MiB on uvloop: the bound is
    # on what the transfers add to them (pieces in the TLS layer and in the socket transport under
    # it, the TLS layer's buffer sized by the largest write, the requests in progress). Measured:
    # 33-51 MiB on asyncio, 50-62 MiB on uvloop (160-180 MiB on both before the TLS pieces).
    assert sampler.max_rss - rss_before - (idle_growth if over_tls else 0) < 64 * MiB


# -- 10,000 sequential keep-alive requests to serve -------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_ten_thousand_keep_alive_requests_to_serve(tmp_path: Path, loop: str) -> None:
    small = pattern(2_000, seed=1)
    mid = pattern(200_000, seed=2)
    (tmp_path / "small.txt").write_bytes(small)
    (tmp_path / "mid.bin").write_bytes(mid)
    server = Server(str(tmp_path), "--port", "0", "--loop", loop)
    pid = server.proc.pid
    host, port = server.url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    etag: str | None = None
    connections = 0
    last_sock: Any = None

    def one(i: int) -> None:
        nonlocal etag, connections, last_sock
        kind = i % 5
        headers: dict[str, str] = {}
        if kind == 0:
            path, expected_status, expected = "/small.txt", 200, small
        elif kind == 1:
            path, expected_status, expected = "/mid.bin", 200, mid  # zero-copy
        elif kind == 2:
            start = (i * 7919) % 150_000
            headers["Range"] = f"bytes={start}-{start + 70_000}"
            path, expected_status, expected = "/mid.bin", 206, mid[start : start + 70_001]
        elif kind == 3:
            path, expected_status, expected = "/missing", 404, None
        else:
            assert etag is not None
            headers["If-None-Match"] = etag
            path, expected_status, expected = "/mid.bin", 304, b""
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == expected_status, (i, path, resp.status)
        if expected is not None:
            assert body == expected, (i, path)
        if kind == 1:
            etag = resp.headers["ETag"]
        if conn.sock is not last_sock:
            connections += 1
            last_sock = conn.sock

    try:
        warmup = 500
        for i in range(warmup):
            one(i)

        def sample() -> tuple[int, int]:
            time.sleep(0.05)  # a transfer's dup'd fd closes just after its last byte reached us
            return fd_count(pid), rss(pid)

        base_fds, base_rss = sample()
        samples = []
        start = time.monotonic()
        n = 10_000
        for i in range(warmup, warmup + n):
            one(i)
            if (i - warmup + 1) % 2_000 == 0:
                samples.append(sample())
        elapsed = time.monotonic() - start
        conn.close()
        end_rss = samples[-1][1]
        report(
            f"10000 keep-alive requests to serve --loop {loop}",
            seconds=f"{elapsed:.1f}",
            req_per_s=f"{n / elapsed:.0f}",
            connections=connections,
            server_fds=[base_fds] + [f for f, _ in samples],
            server_rss=[mib(base_rss)] + [mib(r) for _, r in samples],
            rss_growth=mib(end_rss - base_rss),
        )
        assert connections == 1, "the server closed a keep-alive connection"
        assert max(f for f, _ in samples) <= base_fds, "the server's fd count grew"
        assert end_rss - base_rss < 8 * MiB
        assert server.interrupt() == 0
    finally:
        conn.close()
        server.close()


# -- 1,000 HTTPS downloads from serve ----------------------------------------------------------------

HTTPS_CLIENTS = 1000
HTTPS_FILE = 8 * MiB


async def _https_client(port: int, ctx: ssl.SSLContext, started: asyncio.Event, go: asyncio.Event) -> bytes:
    """One download of /big.bin that reads nothing until *go*: the server stalls on a full socket."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, limit=64 * 1024)
    try:
        writer.write(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        started.set()
        await go.wait()
        body = await reader.read()
        return head + b"\r\n\r\n" + hashlib.sha256(body).digest() + len(body).to_bytes(8, "big")
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_thousand_https_downloads_from_serve_stay_bounded(
    tmp_path: Path, loop: str, tls_ca: Any, tls_client_ctx: ssl.SSLContext
) -> None:
    """1,000 clients (this process, stock asyncio) download an 8 MiB file over HTTPS from ``serve
    --tls-cert`` (its own process), all stalled at once, then all read: every body byte-exact;
    the server's peak RSS growth is reported, and bounded by what its TLS connections and body
    buffers may hold (OpenSSL's buffers, a ``BODY_MIN`` buffer each, the shared budget)."""
    from aiosendfile._serve._tls_body import BODY_BUDGET, BODY_MIN

    fds = 2 * HTTPS_CLIENTS + 500  # (the server inherits it: a socket and a file per download)
    if raise_nofile(fds) < fds:
        pytest.skip(f"RLIMIT_NOFILE cannot be raised to {fds}")
    body = pattern(HTTPS_FILE, seed=5)
    (tmp_path / "big.bin").write_bytes(body)
    digest = hashlib.sha256(body).digest() + len(body).to_bytes(8, "big")
    cert = tmp_path / "server.pem"
    tls_ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
    server = Server(str(tmp_path), "--port", "0", "--loop", loop, "--tls-cert", str(cert))
    pid = server.proc.pid
    port = int(server.url.rstrip("/").rsplit(":", 1)[1])
    peak = 0

    async def run() -> list[bytes]:
        nonlocal peak
        go = asyncio.Event()
        starts = [asyncio.Event() for _ in range(HTTPS_CLIENTS)]
        tasks = []
        for i in range(HTTPS_CLIENTS):
            tasks.append(asyncio.ensure_future(_https_client(port, tls_client_ctx, starts[i], go)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)  # (within the listen queue and the handshake timeout)
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in starts)), 120)
        await asyncio.sleep(1.0)  # every body stalled on its full socket
        peak = _status(pid)["VmRSS"]
        go.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), 300)

    try:
        before = rss(pid)
        # (Stock asyncio: uvloop 0.23's TLS client drops what it has buffered, unread, when the
        # server's close_notify comes while its reading is paused: short bodies from nginx too.)
        results = asyncio.run(run())
        after = rss(pid)
        hwm = _status(pid)["VmHWM"]
        bound = HTTPS_CLIENTS * (BODY_MIN + 96 * 1024) + BODY_BUDGET + 32 * MiB
        report(
            f"{HTTPS_CLIENTS} HTTPS downloads of 8 MiB from serve --loop {loop}",
            server_rss_before=mib(before),
            server_rss_all_stalled=mib(peak),
            server_rss_peak=mib(hwm),
            server_rss_after=mib(after),
            per_connection_stalled=f"{(peak - before) / HTTPS_CLIENTS / 1024:.0f} KiB",
            bound=mib(bound),
        )
        assert all(r.endswith(digest) and r.startswith(b"HTTP/1.1 200") for r in results)
        assert hwm - before < bound
        assert server.interrupt(30) == 0
    finally:
        server.close()


# -- slowloris --------------------------------------------------------------------------------------

SLOW_CLIENTS = 500
DRIBBLERS = 100  # of which: send their headers one byte per second, never finishing
FAST_REQUESTS = 60


async def test_slowloris_does_not_starve_a_fast_client(
    tmp_path: Path, site_factory: Any, over_tls: bool, tls_ca: Any, tls_client_ctx: ssl.SSLContext
) -> None:
    """500 stalled clients (another process) on one server loop; a fast client in this one."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "big.bin").write_bytes(pattern(8 * MiB))
    (root / "small.txt").write_bytes(pattern(4096, seed=5))
    (root / "mid.bin").write_bytes(pattern(MiB, seed=6))
    site = await site_factory(root)
    ca = tmp_path / "ca.pem"
    tls_ca.cert_pem.write_to_path(str(ca))
    gc.collect()
    malloc_trim()
    rss_before, fds_before = rss(), fd_count()

    # A loop-lag probe: how late a 10 ms sleep wakes up, all along.
    lags: list[tuple[float, float]] = []  # (when, how late)
    stop = asyncio.Event()

    async def probe() -> None:
        while not stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append((t, time.monotonic() - t - 0.01))

    prober = asyncio.create_task(probe())
    t0 = time.monotonic()
    async with slow_clients(
        site, ca if over_tls else None, tmp_path, clients=SLOW_CLIENTS, dribblers=DRIBBLERS, path="/s/big.bin"
    ) as proc:
        await until_ready(proc)
        setup = time.monotonic() - t0
        await asyncio.sleep(1.0)  # the stalled transfers fill their sockets and wait
        held_fds = fd_count() - fds_before

        latencies: list[float] = []
        fast_start = time.monotonic()
        connector = aiohttp.TCPConnector(ssl=tls_client_ctx if over_tls else False)
        async with (
            Sampler() as sampler,
            aiohttp.ClientSession(connector=connector, auto_decompress=False) as session,
        ):
            for i in range(FAST_REQUESTS):
                name, expected = (
                    ("small.txt", pattern(4096, seed=5)) if i % 2 else ("mid.bin", pattern(MiB, seed=6))
                )
                t = time.monotonic()
                async with session.get(site.url(f"/s/{name}")) as resp:
                    body = await resp.read()
                latencies.append(time.monotonic() - t)
                assert resp.status == 200
                assert body == expected
                await asyncio.sleep(0.05)
        rss_during = rss()
        fds_end = fd_count() - fds_before
        result = await let_go(proc)
    stop.set()
    await prober
    await _until(lambda: fd_count() <= fds_before + 2, timeout=30)  # every aborted transfer cleaned up
    gc.collect()
    malloc_trim()
    rss_after_close = rss()
    latencies.sort()
    setup_lags = sorted(lag for t, lag in lags if t < fast_start)
    fast_lags = sorted(lag for t, lag in lags if t >= fast_start)
    p50 = statistics.median(latencies)
    report(
        f"slowloris {SLOW_CLIENTS} clients ({DRIBBLERS} dribbling headers, {'TLS' if over_tls else 'TCP'})",
        connect_seconds=f"{setup:.1f}",
        server_sockets_held=held_fds,
        server_sockets_at_end=fds_end,
        client_saw_closed=result["closed_by_server"],
        fast_p50_ms=f"{p50 * 1000:.1f}",
        fast_p95_ms=f"{latencies[int(len(latencies) * 0.95) - 1] * 1000:.1f}",
        fast_max_ms=f"{latencies[-1] * 1000:.1f}",
        loop_lag_while_connecting_max_ms=f"{setup_lags[-1] * 1000:.1f}",
        loop_lag_p99_ms=f"{fast_lags[int(len(fast_lags) * 0.99) - 1] * 1000:.1f}",
        loop_lag_max_ms=f"{fast_lags[-1] * 1000:.1f}",
        server_rss_before=mib(rss_before),
        server_rss_peak=mib(sampler.max_rss),
        server_rss_during=mib(rss_during),
        rss_growth=mib(rss_during - rss_before),
        per_stalled_transfer=f"{(sampler.max_rss - rss_before) / (SLOW_CLIENTS - DRIBBLERS) / 1024:.0f} KiB",
        server_rss_after_clients_gone=mib(rss_after_close),
        fds_after_clients_gone=fd_count(),
    )
    # The server still holds every slow connection (nobody was dropped to make room), and each
    # stalled client's transfer is in progress (its file is open; on TCP its socket is also dup'd) ...
    stalled = SLOW_CLIENTS - DRIBBLERS
    assert min(held_fds, fds_end) >= SLOW_CLIENTS + stalled * (1 if over_tls else 2)
    assert result["closed_by_server"] == 0
    # ... and the fast client is not starved.
    assert p50 < 0.2, f"median fast request {p50 * 1000:.0f} ms"
    # Memory: zero-copy keeps a stalled body in the kernel. Over TLS a stalled transfer holds one
    # 16 KiB piece in the TLS layer and the socket transport under it its own 64 KiB and one piece
    # more (see aiosendfile/_fallback.py); with the connection itself (stock asyncio's TLS layer
    # touches a 256 KiB read buffer per connection) that measured 0.45-0.5 MiB of RSS per stalled
    # TLS download on asyncio, 0.25 MiB on uvloop (1.3-1.5 MiB on both before the TLS pieces).
    per_stalled = 640 * 1024 if over_tls else 64 * 1024
    assert sampler.max_rss - rss_before < 64 * MiB + stalled * per_stalled
    # Once the slow clients are gone, so is what their transfers held.
    assert rss_after_close - rss_before < 64 * MiB


# -- the TLS fallback's pieces ------------------------------------------------------------------------


# -- many random cancellations ------------------------------------------------------------------------


async def test_cancellation_at_random_points_many(connect: Connector, kind: str, make_file: Any) -> None:
    size = 4 * MiB + 3
    path = make_file(size)
    conn = await connect(rcvbuf=16384)
    seed = int(os.environ.get("AIOSENDFILE_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "big")
    start = time.monotonic()
    try:
        outcomes = await random_cancellations(conn, path, size, iterations=500, seed=seed)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (reproduce with AIOSENDFILE_TEST_SEED={seed})") from exc
    report(f"500 random cancellations ({kind})", seconds=f"{time.monotonic() - start:.1f}", **outcomes)
    assert outcomes["cancelled"] >= 100, outcomes
