"""One HTTP(S) trial: a fresh server, a checked GET, wrk, the server's CPU; and the per-contender summary.

``http_static`` (plain HTTP) and ``tls_static`` (HTTPS, ``scheme="https"``) run
the same trial: start the server, check one GET for status 200 and a
byte-exact body, warm up with a 1 s wrk run, measure with ``wrk --latency``
while reading the server's process-tree CPU, the wrk CPU and the whole
machine's, check the GET again and stop the server. Each benchmark says how to
start its contenders and writes its own report from :func:`summarize`.
``Context.script`` makes wrk pick the paths (a Lua script), and ``before_run``
prepares the measured run after the warm-up (the mixed set evicts its files
there, so every trial starts from a cold page cache). With a ``probe``
(``benchmarks.harness.probe``), another client GETs a hot file every 10 ms
during the measured run, in its own process on the client CPUs, and the
sample gets that client's latencies (``probe_*``).
"""

from __future__ import annotations

import math
import resource
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import GB, MB, TrialError
from benchmarks.harness.measure import host_cpu, other_load, tree_cpu
from benchmarks.harness.probe import Probe, ProbeSpec, probe_stats
from benchmarks.harness.report import median_min_max
from benchmarks.harness.servers import Server, log_tail, stop_server
from benchmarks.harness.wrk import parse_wrk, run_wrk, wrk_command

__all__ = ["WARMUP_S", "Context", "Sample", "progress_line", "run_trial", "summarize", "verify"]

WARMUP_S = 1  # wrk -d takes whole seconds


@dataclass
class Context:
    """What every trial needs."""

    root: str  # the served directory
    tmp: str
    wrk: str
    nginx: str | None
    threads: int
    connections: int
    duration: int
    server_cpus: str | None
    client_cpus: str | None
    bodies: dict[str, bytes]  # file name -> expected body
    script: str | None = None  # wrk -s: a Lua script that picks the paths (overrides the URL's path)
    headers: tuple[str, ...] = ()  # wrk -H: request fields ("Connection: close": a connection per request)
    workers: int = 1  # server processes (worker processes: nginx's, serve's --workers)
    wrap: tuple[str, ...] = ()  # a prefix of the server's command (the probe-slow set's read throttle)
    wrk_timeout: int | None = None  # wrk --timeout, seconds (None: wrk's 2 s)

    def wrk_command(self, url: str, duration: int) -> list[str]:
        return wrk_command(
            self.wrk,
            url,
            duration,
            threads=self.threads,
            connections=self.connections,
            cpus=self.client_cpus,
            script=self.script,
            headers=self.headers,
            timeout=self.wrk_timeout,
        )


def verify(url: str, expected: bytes) -> None:
    """One plain GET: status 200 and a byte-exact body, or TrialError.

    Over HTTPS the server's certificate is not checked (it is the benchmark's own, self-signed).
    """
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        raise TrialError(f"GET {url}: HTTP {exc.code}, expected 200") from exc
    except OSError as exc:
        raise TrialError(f"GET {url}: {exc!r}") from exc
    if status != 200:
        raise TrialError(f"GET {url}: HTTP {status}, expected 200")
    if body != expected:
        first = next(
            (i for i, (a, b) in enumerate(zip(body, expected, strict=False)) if a != b),
            min(len(body), len(expected)),
        )
        raise TrialError(
            f"GET {url}: body NOT byte-exact: {len(body)} bytes, expected {len(expected)}; "
            f"first difference at byte {first}"
        )


@dataclass
class Sample:
    """One trial: one contender, one file, one round. Latencies in ms."""

    contender: str
    file: str
    size: int
    round: int
    case: str | None = None  # the summary's row label when it is not just the file (http_static's grid)
    connections: int | None = None  # wrk -c
    workers: int | None = None  # server worker processes
    ok: bool = False
    discarded: bool = False  # re-run for other load on the machine (--max-other-load); not summarized
    error: str | None = None
    requests: int | None = None
    duration_s: float | None = None  # wrk's measured duration
    req_per_s: float | None = None  # wrk's Requests/sec
    mb_per_s: float | None = None  # body bytes: req/s * file size / 10^6
    wire_mb_per_s: float | None = None  # wrk's Transfer/sec (headers included), in 10^6 bytes/s
    latency_avg_ms: float | None = None
    latency_stdev_ms: float | None = None
    latency_max_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p75_ms: float | None = None
    latency_p90_ms: float | None = None
    latency_p99_ms: float | None = None
    socket_errors: dict[str, int] | None = None
    non_2xx: int | None = None
    server_pids: list[int] | None = None
    server_cpu_user_s: float | None = None  # /proc/PID/stat deltas over the wrk run, process tree
    server_cpu_sys_s: float | None = None
    server_cpu_s: float | None = None
    server_cpu_us_per_req: float | None = None
    server_user_us_per_req: float | None = None  # its user time alone: the interpreter's share
    server_cpu_s_per_gb: float | None = None  # per 10^9 body bytes
    server_cpus_busy: float | None = None  # server CPU seconds / wall seconds
    wrk_cpu_s: float | None = None  # RUSAGE_CHILDREN delta (wrk is the only child reaped meanwhile)
    wrk_cpus_busy: float | None = None  # wrk CPU seconds / wall seconds (1.00: wrk is the limit)
    wall_s: float | None = None  # around the wrk process, start to exit
    host_busy_s: float | None = None  # /proc/stat, whole machine
    host_steal_s: float | None = None
    other_cpu_s: float | None = None  # host busy - server - wrk - this process
    other_load_cpus: float | None = None  # other_cpu_s / wall_s, minus /proc/stat tick slack
    server_exit: int | None = None  # exit status after the clean stop (None: had to be killed)
    cache_resident_pages: int | None = None  # before_run's eviction: pages still cached (-1: unknown)
    cache_pages: int | None = None  # ... out of the set's pages
    cold_read_us: float | None = None  # before_run: the median 4 KiB read of a file just evicted
    # The hot-file probe (a trial with a ProbeSpec): its requests that started in wrk's window.
    probe_requests: int | None = None
    probe_p50_ms: float | None = None
    probe_p99_ms: float | None = None
    probe_max_ms: float | None = None
    probe_errors: int | None = None  # failed requests (each followed by a new connection)
    probe_reconnects: int | None = None  # requests that had to connect first (server closed, or an error)
    probe_late_ticks: int | None = None  # 10 ms ticks skipped because a request was still running
    probe_cpu_s: float | None = None  # the probe process's CPU (not counted as other load)
    probe_unfinished: int | None = None  # 1: a GET unanswered at the stop (counted as waited so far)
    probe_first_errors: list[str] | None = None
    wrk_output: str | None = None


def run_trial(
    ctx: Context,
    start: Callable[[str], Server],
    contender: str,
    label: str,
    name: str,
    size: int,
    rnd: int,
    scheme: str = "http",
    *,
    case: str | None = None,
    before_run: Callable[[Sample], None] | None = None,
    probe: ProbeSpec | None = None,
) -> Sample:
    """One trial of ``contender`` (started by ``start(contender)``) serving file ``name`` over ``scheme``.

    ``size``: the body bytes per request (the mean size when a script picks among files).
    ``before_run(sample)`` runs after the warm-up, right before the measured run; it may raise TrialError.
    ``probe``: run the hot-file probe (plain HTTP) beside the measured wrk run, on ``ctx.client_cpus``.
    """
    sample = Sample(
        contender=contender,
        file=label,
        size=size,
        round=rnd,
        case=case,
        connections=ctx.connections,
        workers=ctx.workers,
    )
    server: Server | None = None
    running: Probe | None = None
    try:
        server = start(contender)
        sample.server_pids = server.pids
        url = f"{scheme}://127.0.0.1:{server.port}/{name}"
        verify(url, ctx.bodies[name])
        if probe is not None:
            verify(f"{scheme}://127.0.0.1:{server.port}/{probe.path}", ctx.bodies[probe.path])
        run_wrk(ctx.wrk_command(url, WARMUP_S), WARMUP_S)
        if before_run is not None:
            before_run(sample)
        if probe is not None:
            running = Probe(probe, server.port, ctx.client_cpus)
        u0, h0 = tree_cpu(server.pids), host_cpu()
        c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        text = run_wrk(ctx.wrk_command(url, ctx.duration), ctx.duration)
        t1 = time.perf_counter()
        c1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        u1, h1 = tree_cpu(server.pids), host_cpu()
        sample.wrk_output = text
        if running is not None:
            result, running = running.finish(), None
            for key, value in probe_stats(result, t0, t1).items():
                setattr(sample, key, value)
            if not sample.probe_requests and not sample.probe_unfinished:
                raise TrialError(f"the hot-file probe completed no request: {result['first_errors']}")
        if server.proc.poll() is not None:
            raise TrialError(f"{contender} died during the wrk run (status {server.proc.returncode})")
        verify(url, ctx.bodies[name])
        parsed = parse_wrk(text)
    except TrialError as exc:
        sample.error = str(exc) + (log_tail(server) if server else "")
        return sample
    finally:
        if running is not None:
            running.kill()
        if server is not None:
            sample.server_exit = stop_server(server)

    for key, value in parsed.items():
        if hasattr(sample, key) and key != "bytes_read_approx":
            setattr(sample, key, value)
    if sample.non_2xx:
        sample.error = f"wrk saw {sample.non_2xx} non-2xx/3xx responses"
        return sample
    if not sample.requests or not sample.duration_s:
        sample.error = "wrk completed no requests"
        return sample
    sample.req_per_s = sample.req_per_s or sample.requests / sample.duration_s
    sample.mb_per_s = sample.req_per_s * size / MB
    sample.wall_s = t1 - t0
    sample.server_cpu_user_s, sample.server_cpu_sys_s = u1[0] - u0[0], u1[1] - u0[1]
    cpu = sample.server_cpu_user_s + sample.server_cpu_sys_s
    sample.server_cpu_s = cpu
    sample.server_cpu_us_per_req = cpu / sample.requests * 1e6
    sample.server_user_us_per_req = sample.server_cpu_user_s / sample.requests * 1e6
    sample.server_cpu_s_per_gb = cpu / (sample.requests * size) * GB
    sample.server_cpus_busy = cpu / sample.wall_s
    wrk_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    self_cpu = (s1.ru_utime - s0.ru_utime) + (s1.ru_stime - s0.ru_stime)
    sample.wrk_cpu_s = wrk_cpu
    sample.wrk_cpus_busy = wrk_cpu / sample.wall_s
    if not math.isnan(h0[0]):
        sample.host_busy_s, sample.host_steal_s = h1[0] - h0[0], h1[1] - h0[1]
        sample.other_cpu_s = sample.host_busy_s - cpu - wrk_cpu - self_cpu - (sample.probe_cpu_s or 0.0)
        sample.other_load_cpus = other_load(sample.other_cpu_s, sample.wall_s)
    sample.ok = True
    return sample


def progress_line(s: Sample) -> str:
    """One trial's numbers (or its error) for the progress line."""
    if not s.ok:
        return "ERROR: " + (s.error or "?")
    msg = (
        f"{s.req_per_s:9.0f} req/s {s.mb_per_s:8.1f} MB/s  p50 {s.latency_p50_ms:6.2f} ms"
        f"  p99 {s.latency_p99_ms:6.2f} ms  cpu {s.server_cpu_us_per_req:6.1f} us/req"
        f" ({s.server_cpus_busy:.2f} CPUs, wrk {s.wrk_cpus_busy:.2f})"
    )
    if s.other_load_cpus is not None:
        msg += f"  other load {s.other_load_cpus:.2f}"
    if s.cache_pages:
        msg += f"  evicted ({s.cache_resident_pages} of {s.cache_pages} pages left)"
    if s.cold_read_us is not None:
        msg += f"  cold read {s.cold_read_us:.0f} us"
    if s.probe_requests or s.probe_unfinished:
        msg += (
            f"  probe p50 {s.probe_p50_ms:.2f} p99 {s.probe_p99_ms:.2f} max {s.probe_max_ms:.2f} ms"
            f" ({s.probe_requests} GETs"
            + "".join(
                f", {n} {what}"
                for n, what in (
                    (s.probe_errors, "errors"),
                    (s.probe_reconnects, "reconnects"),
                    (s.probe_late_ticks, "late ticks"),
                    (s.probe_unfinished, "unanswered at the stop"),
                )
                if n
            )
            + ")"
        )
    if s.socket_errors and any(s.socket_errors.values()):
        msg += f"  socket errors {s.socket_errors}"
    if s.server_exit not in (0, None):
        msg += f"  server exit status {s.server_exit}"
    if s.discarded:
        msg += "  -> discarded (other load), retrying"
    return msg


def _values(samples: list[Sample], name: str) -> list[float]:
    return [v for s in samples if s.ok and (v := getattr(s, name)) is not None]


def summarize(
    samples: list[Sample], contenders: list[str], labels: list[str], key: str = "file"
) -> dict[str, Any]:
    """label -> contender -> runs, errors and the median/min/max of each number over the kept trials.

    A label is a sample's ``key`` attribute: its ``file`` (default) or its ``case``. A contender
    with no trial for a label (not run in that case) gets no row there.
    """
    summary: dict[str, Any] = {}
    for label in labels:
        for name in contenders:
            every = [s for s in samples if s.contender == name and getattr(s, key) == label]
            if not every:
                continue
            mine = [s for s in every if not s.discarded]
            ok = [s for s in mine if s.ok]
            row: dict[str, Any] = {
                "runs": len(mine),
                "ok": len(ok),
                "discarded": sum(s.discarded for s in every),
                "errors": [s.error for s in mine if not s.ok],
                "socket_errors_total": sum(sum((s.socket_errors or {}).values()) for s in ok),
                "probe_errors_total": sum(s.probe_errors or 0 for s in ok),
                "probe_reconnects_total": sum(s.probe_reconnects or 0 for s in ok),
                "probe_late_ticks_total": sum(s.probe_late_ticks or 0 for s in ok),
                "probe_unfinished_total": sum(s.probe_unfinished or 0 for s in ok),
                "unclean_server_exits": sum(s.server_exit != 0 for s in mine),
            }
            for figure in (
                "req_per_s",
                "mb_per_s",
                "wire_mb_per_s",
                "latency_p50_ms",
                "latency_p99_ms",
                "server_cpu_us_per_req",
                "server_user_us_per_req",
                "server_cpu_s_per_gb",
                "server_cpus_busy",
                "wrk_cpus_busy",
                "other_load_cpus",
                "probe_p50_ms",
                "probe_p99_ms",
                "probe_max_ms",
                "probe_requests",
                "cold_read_us",
            ):
                vals = _values(ok, figure)
                if vals:
                    row.update(median_min_max(figure, vals))
            summary.setdefault(label, {})[name] = row
    return summary
