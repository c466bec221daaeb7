"""One file, server to a fast local reader: the trial ``raw_transfer`` and ``loop_stall`` both run.

The server is a fresh ``spawn``ed process per trial (``children``) that sends the file with one
strategy from ``senders`` while a 1 ms ticker runs on its loop; the reader is this process, a
blocking ``recv_into`` loop with a ``READ_BUFFER`` buffer, over loopback TCP, a veth pair
(``netns``) or a Unix socket. ``run_rounds`` interleaves the cases (re-running disturbed
trials), ``summarize`` reduces the samples to per-label medians, min and max.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import resource
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Any

from benchmarks.harness import GB, MB, MiB, TrialError
from benchmarks.harness.children import (
    client_then_result,
    recv_result,
    report_to_parent,
    run_on_contender_loop,
    serving,
    spawned,
)
from benchmarks.harness.files import CACHE_STATE_ERROR, cache_state, resident_ranges
from benchmarks.harness.measure import (
    LoopTicker,
    PerfSpec,
    PerfWindow,
    host_cpu,
    host_split,
    loop_name,
    measured,
    other_load,
    usage,
    zero_copy_counters,
)
from benchmarks.harness.report import median_min_max, median_or_none
from benchmarks.harness.senders import (
    COPY_ROWS,
    SENDERS,
    THREAD_COPY,
    THREADS,
    Options,
    Sender,
    send_aiosendfile,
)
from benchmarks.harness.servers import cpu_list, pin_threads, pinned

BASELINE = "aiosendfile-uvloop"  # summarize's ratio_vs_<BASELINE>
READ_BUFFER = MiB


# ---------------------------------------------------------------------------
# Server side (runs in the spawned child process)
# ---------------------------------------------------------------------------


def _congestion(sock: Any, opts: Options) -> str | None:
    """Give the server's TCP socket ``opts.congestion`` (if any); return the algorithm it now uses."""
    if sock is None or opts.unix_path or not hasattr(socket, "TCP_CONGESTION"):
        return None
    if opts.congestion:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, opts.congestion.encode())
    name: bytes = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return name.rstrip(b"\0").decode()


async def _serve_async(conn: Connection, send: Sender, f: IO[bytes], opts: Options) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ticker = LoopTicker()
    done: asyncio.Future[dict[str, Any]] = loop.create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            congestion = _congestion(writer.get_extra_info("socket"), opts)
            await reader.readexactly(1)  # the reader's "go"
            counters = zero_copy_counters()
            if counters is not None:
                counters.reset()
            start = usage()
            sent = await send(writer, f, opts)
            await writer.drain()
            writer.close()
            await writer.wait_closed()  # everything is in the kernel; the socket is closed
            result = measured(start, usage(), sent)
            result["congestion"] = congestion
            if counters is not None:
                result["zero_copy_calls"], result["zero_copy_bytes"] = counters.calls, counters.bytes
                result["zero_copy_eagain"], result["zero_copy_waits"] = counters.eagain, counters.waits
                result["zero_copy_cold"] = counters.cold
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
        else:
            done.set_result(result)

    if send is send_aiosendfile:
        # Before the clock starts. The package loads its public names on first use (PEP 562):
        # resolve sendfile here, or its ~15 ms import lands on the loop inside the transfer.
        from aiosendfile import sendfile  # noqa: F401

    if opts.unix_path:
        server = await asyncio.start_unix_server(handle, opts.unix_path)
    else:
        server = await asyncio.start_server(handle, opts.host, 0)
    async with serving(conn, server, 0 if opts.unix_path else server.sockets[0].getsockname()[1], ticker):
        result = await asyncio.wait_for(done, opts.timeout)
    t0, t1 = result["t_start"], result["t_end"]
    # A tick belongs to the transfer if its sleep overlaps [t0, t1] at all, so a
    # loop blocked for the whole transfer still shows up as one huge delay.
    result["loop_idle"] = ticker.idle(t0)
    result["loop_busy"] = ticker.busy(t0, t1)
    result["loop"] = loop_name(loop)
    return result


def _serve_loop(conn: Connection, contender: str, path: str, opts: Options) -> dict[str, Any]:
    with open(path, "rb") as f:
        return run_on_contender_loop(contender, lambda: _serve_async(conn, SENDERS[contender], f, opts))


def _listen(opts: Options) -> socket.socket:
    if opts.unix_path:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(opts.unix_path)
        listener.listen()
        return listener
    return socket.create_server((opts.host, 0))


def _serve_thread(conn: Connection, path: str, opts: Options, copy: bool = False) -> dict[str, Any]:
    """The ceiling: blocking os.sendfile in a plain thread, no event loop at all.

    With *copy*: the same thread, but ``f.readinto()`` of ``copy_chunk`` bytes then
    ``sock.sendall()`` (the kernel copies twice) instead of ``os.sendfile``.
    """
    with _listen(opts) as listener, open(path, "rb", buffering=0) as f:
        conn.send(("ready", 0 if opts.unix_path else listener.getsockname()[1]))
        listener.settimeout(opts.timeout)
        sock, _ = listener.accept()
        sock.settimeout(None)  # blocking
        congestion = _congestion(sock, opts)
        sent = 0
        errors: list[BaseException] = []

        def run() -> None:
            nonlocal sent
            try:
                if copy:
                    buf = memoryview(bytearray(opts.copy_chunk))
                    while sent < opts.size:
                        n = f.readinto(buf[: min(opts.copy_chunk, opts.size - sent)])
                        if not n:
                            raise EOFError(f"file ended after {sent} bytes")
                        sock.sendall(buf[:n])
                        sent += n
                    return
                while sent < opts.size:
                    n = os.sendfile(sock.fileno(), f.fileno(), sent, opts.size - sent)
                    if n == 0:
                        raise EOFError(f"file ended after {sent} bytes")
                    sent += n
            except BaseException as exc:
                errors.append(exc)

        with sock:
            sock.recv(1)  # the reader's "go"
            start = usage()
            worker = threading.Thread(target=run, name="sendfile")
            worker.start()
            worker.join()
        end = usage()  # after close, as for the loop contenders
        if errors:
            raise errors[0]
        return {**measured(start, end, sent), "congestion": congestion}


def _server_process(conn: Connection, contender: str, path: str, opts: Options) -> None:
    """Child-process entry point: serve one connection, send back the measurements."""

    def serve() -> dict[str, Any]:
        if opts.server_cpus:
            pin_threads(opts.server_cpus)
        if opts.netns:
            from benchmarks.harness.netns import setns

            setns(f"/run/netns/{opts.netns}")
        try:
            if contender in THREADS:
                result = _serve_thread(conn, path, opts, copy=contender == THREAD_COPY)
            else:
                result = _serve_loop(conn, contender, path, opts)
            result["cpus"] = cpu_list(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            return result
        finally:
            if opts.unix_path:
                with contextlib.suppress(OSError):
                    os.unlink(opts.unix_path)

    report_to_parent(conn, serve)


# ---------------------------------------------------------------------------
# Reader side (this process)
# ---------------------------------------------------------------------------


def _connect(host: str, port: int, timeout: float, unix_path: str | None) -> socket.socket:
    if unix_path is None:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(unix_path)
    return sock


def _read_all(
    port: int,
    size: int,
    timeout: float,
    host: str = "127.0.0.1",
    window: PerfWindow | None = None,
    unix_path: str | None = None,
) -> dict[str, Any]:
    """Send the "go" byte, then recv_into until EOF; time the first and the size-th byte."""
    view = memoryview(bytearray(READ_BUFFER))
    cpus = cpu_list(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    with _connect(host, port, timeout, unix_path) as sock:
        recv_into = sock.recv_into
        clock = time.perf_counter
        total = 0
        t_first = math.nan
        if window is not None:
            window.start()
        s0 = host_split()
        h0 = host_cpu()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = clock()
        sock.sendall(b"G")
        n = recv_into(view)
        if n:
            t_first = clock()
            total = n
        while n and total < size:
            n = recv_into(view)
            total += n
        t_last = clock()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        h1 = host_cpu()
        s1 = host_split()
        if window is not None:
            window.stop()
        while n:  # anything past the file's size is an error: count it
            n = recv_into(view)
            total += n
    if total != size:
        raise TrialError(f"reader got {total} bytes, expected {size}")
    return {
        "t_go": t0,
        "t_first": t_first,
        "t_last": t_last,
        "cpu_user_s": r1.ru_utime - r0.ru_utime,
        "cpu_sys_s": r1.ru_stime - r0.ru_stime,
        "host_busy_s": h1[0] - h0[0],
        "host_steal_s": h1[1] - h0[1],
        "host_user_s": s1[0] - s0[0],
        "host_sys_s": s1[1] - s0[1],
        "host_softirq_s": s1[2] - s0[2],
        "cpus": cpus,
    }


def _read_pinned(port: int, opts: Options, window: PerfWindow | None) -> dict[str, Any]:
    """``_read_all`` with this thread on ``opts.client_cpus`` (if given) for the read only."""
    with pinned(opts.client_cpus):
        return _read_all(port, opts.size, opts.timeout, opts.host, window, opts.unix_path)


@dataclass
class Sample:
    """One trial: one contender, one round. Times in seconds unless named otherwise."""

    contender: str
    round: int
    ok: bool
    discarded: bool = False  # re-run for other load on the machine (--max-other-load); not summarized
    error: str | None = None
    bytes: int = 0
    mb_per_s: float | None = None  # bytes / reader_seconds (the headline number)
    reader_seconds: float | None = None  # reader: "go" sent -> last byte received
    ttfb_ms: float | None = None  # reader: "go" sent -> first byte received
    server_mb_per_s: float | None = None  # bytes / server_seconds
    server_seconds: float | None = None  # server: "go" seen -> send + drain + close done
    cpu_user_s: float | None = None  # server process, RUSAGE_SELF delta over server_seconds
    cpu_sys_s: float | None = None
    cpu_user_s_per_gb: float | None = None
    cpu_sys_s_per_gb: float | None = None
    cpu_process_time_s: float | None = None  # time.process_time() delta: exact user+sys total
    cpu_process_time_s_per_gb: float | None = None
    vol_ctx_switches: int | None = None
    invol_ctx_switches: int | None = None
    loop_ticks: int | None = None  # 1 ms ticker wake-ups during the transfer
    loop_delay_worst_ms: float | None = None
    loop_delay_p99_ms: float | None = None
    loop_delay_p50_ms: float | None = None
    idle_delay_worst_ms: float | None = None  # same ticker, idle loop, before the transfer
    idle_delay_p99_ms: float | None = None
    zero_copy_calls: int | None = None  # aiosendfile._platform.counters (aiosendfile rows only)
    zero_copy_bytes: int | None = None
    zero_copy_eagain: int | None = None
    zero_copy_waits: int | None = None
    zero_copy_cold: int | None = None  # chunks whose sendfile ran in aiosendfile's cold-read pool
    server: str | None = None  # the server-side strategy (contender may be a longer label)
    cold: bool = False  # the file was evicted from the page cache before the transfer
    # Page-cache residency right before "go" (mincore over the whole file; see cache_state).
    cached_pages: int | None = None
    file_pages: int | None = None
    reader_cpu_user_s: float | None = None
    reader_cpu_sys_s: float | None = None
    # Other load: whole-machine busy CPU over the reader's window minus reader and server
    # CPU (approximate: /proc/stat has 10 ms ticks and the server's window differs slightly).
    other_cpu_s: float | None = None
    host_steal_s: float | None = None
    # The whole machine's busy CPU over the reader's window (/proc/stat: server, reader, softirq
    # and anyone else), per 10^9 bytes, and its split (user, system, irq + softirq).
    host_cpu_s_per_gb: float | None = None
    host_user_s: float | None = None
    host_sys_s: float | None = None
    host_softirq_s: float | None = None
    loop: str | None = None
    network: str = "loopback"  # "loopback", "veth" or "unix"
    copy_chunk: int | None = None  # the read size of the copy rows
    server_pid: int | None = None
    # The CPUs each side could run on during the trial (``taskset -c`` lists; --server-cpus and
    # --client-cpus, or every CPU unpinned), as the server process and the reader's thread saw them.
    server_cpus: str | None = None
    reader_cpus: str | None = None
    congestion: str | None = None  # the server socket's TCP congestion control (None: a Unix socket)
    perf_output: str | None = None  # --perf: this trial's perf output file


def run_trial(
    ctx: multiprocessing.context.SpawnContext,
    contender: str,
    rnd: int,
    path: str,
    opts: Options,
    label: str | None = None,
    perf: PerfSpec | None = None,
) -> Sample:
    """One trial of server strategy *contender*; the sample is filed under *label* (default: contender).

    With *perf*, ``perf`` measures the transfer window (``PerfWindow``).
    """
    sample = Sample(
        contender=label or contender,
        round=rnd,
        ok=False,
        bytes=opts.size,
        server=contender,
        cold=opts.cold,
        network="unix" if opts.unix_path else "veth" if opts.netns else "loopback",
        copy_chunk=opts.copy_chunk if contender in COPY_ROWS else None,
    )
    if opts.client_netns:
        from benchmarks.harness.netns import entered

        # The reader's socket, and the server process started from this thread, live in the client's
        # namespace; the server then enters its own (opts.netns).
        with entered(opts.client_netns):
            return _run_trial(ctx, contender, path, opts, sample, perf)
    return _run_trial(ctx, contender, path, opts, sample, perf)


def _run_trial(
    ctx: multiprocessing.context.SpawnContext,
    contender: str,
    path: str,
    opts: Options,
    sample: Sample,
    perf: PerfSpec | None = None,
) -> Sample:
    with spawned(ctx, _server_process, contender, path, opts) as (parent, proc):
        sample.server_pid = proc.pid
        window = None
        if perf is not None:
            suffix = ".data" if perf.args[0] == "record" else ".txt"
            out = perf.directory / f"{sample.contender.replace('/', '_')}-r{sample.round}{suffix}"
            window = PerfWindow(perf, proc.pid or 0, out)
            sample.perf_output = str(out)
        try:
            port = recv_result(parent, opts.timeout, proc)
            # The server is up (its file open, nothing read): now make the cache state the trial needs.
            resident, sample.file_pages = cache_state(path, evict=opts.cold)
            if resident is not None:
                sample.cached_pages = sum(resident)
                if sample.cached_pages != (0 if opts.cold else sample.file_pages):
                    raise TrialError(
                        f"{CACHE_STATE_ERROR}{'cold' if opts.cold else 'warm'}: {sample.cached_pages}/"
                        f"{sample.file_pages} pages resident ({resident_ranges(resident)})"
                    )
            rd, srv = client_then_result(
                parent,
                proc,
                opts.timeout,
                lambda: _read_pinned(port, opts, window),
            )
        except TrialError as exc:
            sample.error = str(exc)
            return sample
        finally:
            if window is not None:
                window.close()

    if srv["sent"] != opts.size:
        sample.error = f"server reported {srv['sent']} bytes sent, expected {opts.size}"
        return sample
    size = opts.size
    sample.ok = True
    sample.reader_seconds = rd["t_last"] - rd["t_go"]
    sample.mb_per_s = size / sample.reader_seconds / MB
    sample.ttfb_ms = (rd["t_first"] - rd["t_go"]) * 1e3
    sample.reader_cpu_user_s, sample.reader_cpu_sys_s = rd["cpu_user_s"], rd["cpu_sys_s"]
    other = rd["host_busy_s"] - rd["cpu_user_s"] - rd["cpu_sys_s"] - srv["cpu_process_time_s"]
    sample.other_cpu_s = None if math.isnan(other) else other
    sample.host_steal_s = None if math.isnan(rd["host_steal_s"]) else rd["host_steal_s"]
    if not math.isnan(rd["host_busy_s"]):
        sample.host_cpu_s_per_gb = rd["host_busy_s"] * GB / size
        sample.host_user_s, sample.host_sys_s = rd["host_user_s"], rd["host_sys_s"]
        sample.host_softirq_s = rd["host_softirq_s"]
    sample.server_seconds = srv["t_end"] - srv["t_start"]
    sample.server_mb_per_s = size / sample.server_seconds / MB
    sample.cpu_user_s, sample.cpu_sys_s = srv["cpu_user_s"], srv["cpu_sys_s"]
    sample.cpu_user_s_per_gb = srv["cpu_user_s"] * GB / size
    sample.cpu_sys_s_per_gb = srv["cpu_sys_s"] * GB / size
    sample.cpu_process_time_s = srv["cpu_process_time_s"]
    sample.cpu_process_time_s_per_gb = srv["cpu_process_time_s"] * GB / size
    sample.vol_ctx_switches = srv["vol_ctx_switches"]
    sample.invol_ctx_switches = srv["invol_ctx_switches"]
    sample.zero_copy_calls = srv.get("zero_copy_calls")
    sample.zero_copy_bytes = srv.get("zero_copy_bytes")
    sample.zero_copy_eagain = srv.get("zero_copy_eagain")
    sample.zero_copy_waits = srv.get("zero_copy_waits")
    sample.zero_copy_cold = srv.get("zero_copy_cold")
    sample.loop = srv.get("loop")
    sample.server_cpus, sample.reader_cpus = srv.get("cpus"), rd.get("cpus")
    sample.congestion = srv.get("congestion")
    if "loop_busy" in srv:
        busy, idle = srv["loop_busy"], srv["loop_idle"]
        sample.loop_ticks = busy["ticks"]
        sample.loop_delay_worst_ms = busy["worst_ms"]
        sample.loop_delay_p99_ms = busy["p99_ms"]
        sample.loop_delay_p50_ms = busy["p50_ms"]
        sample.idle_delay_worst_ms = idle["worst_ms"]
        sample.idle_delay_p99_ms = idle["p99_ms"]
    return sample


# ---------------------------------------------------------------------------
# Rounds and summary
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One row of a benchmark: a label, the server strategy (a ``SENDERS`` key or THREAD), its options."""

    label: str
    contender: str
    opts: Options


def run_rounds(
    ctx: multiprocessing.context.SpawnContext,
    cases: list[Case],
    path: str,
    rounds: int,
    retries: int,
    max_other_load: float | None,
    log: IO[str],
    perf: PerfSpec | None = None,
    max_steal_s: float | None = None,
) -> list[Sample]:
    """Interleaved trials: each case once per round, in order.

    A trial is re-run (the first try kept as ``discarded``) when other load
    exceeded *max_other_load*, when the hypervisor stole more than *max_steal_s*
    of CPU during it, or when the page cache could not be made cold or warm.
    """
    samples: list[Sample] = []
    width = max(22, *(len(c.label) for c in cases))
    for rnd in range(1, rounds + 1):
        for case in cases:
            for attempt in range(retries + 1):
                s = run_trial(ctx, case.contender, rnd, path, case.opts, label=case.label, perf=perf)
                samples.append(s)
                load = other_loads([s])
                noisy = max_other_load is not None and bool(load) and load[0] > max_other_load
                stolen = s.host_steal_s or 0.0
                noisy = noisy or (max_steal_s is not None and stolen > max_steal_s)
                no_cache_state = not s.ok and (s.error or "").startswith(CACHE_STATE_ERROR)
                if (noisy or no_cache_state) and attempt < retries:
                    s.discarded = True
                print(f"round {rnd}/{rounds}  {case.label:<{width}} {_progress(s)}", file=log, flush=True)
                if not s.discarded:
                    break
                time.sleep(attempt + 1)  # let a burst of other load pass
    return samples


def _values(samples: list[Sample], name: str) -> list[float]:
    return [v for s in samples if s.ok and (v := getattr(s, name)) is not None and not math.isnan(v)]


def _progress(s: Sample) -> str:
    if not s.ok:
        return f"ERROR: {s.error}" + ("  -> discarded, retrying" if s.discarded else "")
    cpu = (s.cpu_user_s_per_gb or 0) + (s.cpu_sys_s_per_gb or 0)
    msg = f"{s.mb_per_s:8.0f} MB/s  cpu {cpu:.3f} s/GB"
    if s.loop_delay_worst_ms is not None:
        msg += f"  loop worst {s.loop_delay_worst_ms:.2f} ms"
    if s.zero_copy_cold:
        msg += f"  cold chunks {s.zero_copy_cold}/{s.zero_copy_calls}"
    if load := other_loads([s]):
        msg += f"  other load {load[0]:.2f} CPUs"
    if s.host_steal_s:
        msg += f"  steal {s.host_steal_s * 1e3:.0f} ms"
    if s.discarded:
        msg += "  -> discarded, retrying"
    return msg


def other_loads(samples: list[Sample]) -> list[float]:
    """Other processes' load during each trial, in CPUs (``measure.other_load``: a quiet trial reads 0)."""
    return [
        other_load(s.other_cpu_s, s.reader_seconds)
        for s in samples
        if s.other_cpu_s is not None and s.reader_seconds
    ]


def summarize(
    samples: list[Sample], contenders: list[str], baselines: dict[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per label: medians, min and max. *baselines* maps a label to the label its ratio is against
    (``ratio_vs_aiosendfile-uvloop``); by default every label's baseline is ``BASELINE``."""
    summary: dict[str, dict[str, Any]] = {}
    for name in contenders:
        mine = [s for s in samples if s.contender == name and not s.discarded]
        ok = [s for s in mine if s.ok]
        discarded = sum(s.discarded for s in samples if s.contender == name)
        row: dict[str, Any] = {
            "discarded": discarded,
            "runs": len(mine),
            "ok": len(ok),
            "errors": [s.error for s in mine if not s.ok],
        }
        if ok:
            mbps = _values(ok, "mb_per_s")
            user, sys_ = _values(ok, "cpu_user_s_per_gb"), _values(ok, "cpu_sys_s_per_gb")
            totals = [u + s for u, s in zip(user, sys_, strict=True)]
            ptime = _values(ok, "cpu_process_time_s_per_gb")
            worst, p99 = _values(ok, "loop_delay_worst_ms"), _values(ok, "loop_delay_p99_ms")
            row |= {
                "mb_per_s_median": statistics.median(mbps),
                "mb_per_s_min": min(mbps),
                "mb_per_s_max": max(mbps),
                "server_mb_per_s_median": statistics.median(_values(ok, "server_mb_per_s")),
                "cpu_user_s_per_gb_median": statistics.median(user),
                "cpu_sys_s_per_gb_median": statistics.median(sys_),
                "cpu_total_s_per_gb_median": statistics.median(totals),
                "cpu_process_time_s_per_gb_median": statistics.median(ptime),
                "cpu_total_s_per_gb_min": min(totals),
                "cpu_total_s_per_gb_max": max(totals),
                # worst: over every tick of every round; p99: median of the per-round p99s
                "loop_delay_worst_ms": max(worst) if worst else None,
                "loop_delay_worst_ms_median": median_or_none(worst),  # of the per-round worsts
                "loop_delay_worst_ms_min": min(worst, default=None),
                "loop_delay_p99_ms_median": median_or_none(p99),
                "loop_delay_p99_ms_min": min(p99, default=None),
                "loop_delay_p99_ms_max": max(p99, default=None),
                "idle_delay_p99_ms_median": median_or_none(_values(ok, "idle_delay_p99_ms")),
                "ttfb_ms_median": statistics.median(_values(ok, "ttfb_ms")),
                "host_cpu_s_per_gb_median": median_or_none(_values(ok, "host_cpu_s_per_gb")),
                "reader_cpu_s_per_gb_median": statistics.median(
                    [(s.reader_cpu_user_s or 0) + (s.reader_cpu_sys_s or 0) for s in ok]
                )
                * GB
                / ok[0].bytes,
                # CPUs' worth of other load on the machine during the trial (0 = quiet)
                "other_load_cpus_median": median_or_none(other_loads(ok)),
                "other_load_cpus_max": max(other_loads(ok), default=None),
                "zero_copy_bytes": sorted({s.zero_copy_bytes for s in ok if s.zero_copy_bytes is not None}),
                "server_cpus": sorted({s.server_cpus for s in ok if s.server_cpus is not None}),
                "reader_cpus": sorted({s.reader_cpus for s in ok if s.reader_cpus is not None}),
                "congestion": sorted({s.congestion for s in ok if s.congestion is not None}),
            }
            for counter in ("calls", "eagain", "waits", "cold"):  # aiosendfile._platform.counters
                if got := _values(ok, "zero_copy_" + counter):
                    row |= median_min_max("zero_copy_" + counter, got)
        summary[name] = row
    for name, row in summary.items():
        base = summary.get((baselines or {}).get(name, BASELINE), {}).get("mb_per_s_median")
        if base and "mb_per_s_median" in row:
            row["ratio_vs_" + BASELINE] = row["mb_per_s_median"] / base
    return summary
