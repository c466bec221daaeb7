"""Raw transfer benchmark: one large file, server to a fast local reader over TCP.

Each contender is a server-side send strategy. Every trial runs the server in a
fresh ``spawn``ed process; the reader is this (parent) process, a blocking
``recv_into`` loop with a 1 MiB buffer. Contenders are interleaved
(A B C ... A B C ... for ``--rounds`` rounds) so drift on the machine hits them
all alike. The network is loopback TCP, or (``--network veth``, root only) TCP
across a veth pair between two network namespaces made for the run and removed
after it (``benchmarks/netns.py``), or (``--network unix``) a Unix stream
socket; ``--network loopback,veth,unix`` (``both`` = ``loopback,veth``)
interleaves every contender over each. See ``benchmarks/README.md`` for what
each number means.

Run from the repository root::

    python benchmarks/raw_transfer.py           # 1 GiB, 5 rounds, loopback
    python benchmarks/raw_transfer.py --quick   # 256 MiB, 3 rounds
    python benchmarks/raw_transfer.py --size 512 --rounds 7 --json /tmp/out.json
    python benchmarks/raw_transfer.py --network both --copy-chunk 65536,262144   # as root
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from benchmarks.harness import GB, MB, MiB, TrialError
from benchmarks.harness.children import (
    child_error_first,
    recv_result,
    report_to_parent,
    run_on_contender_loop,
    serving,
    spawned,
)
from benchmarks.harness.files import CACHE_STATE_ERROR, cache_state, make_file, resident_ranges, warm
from benchmarks.harness.measure import (
    CLK_TCK,
    IDLE_S,
    TICK_S,
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
from benchmarks.harness.report import (
    finish,
    json_default,
    machine_info,
    median_min_max,
    median_or_none,
    ms,
    other_load_warning,
    table,
)

# Until http_static and tls_static import these from the harness themselves (helper B2):
_CLK_TCK, _host_cpu, _table, _json_default = CLK_TCK, host_cpu, table, json_default

CONTENDERS = (
    "aiosendfile-uvloop",
    "aiosendfile-asyncio",
    "loop.sendfile-asyncio",
    "copy-uvloop",
    "thread-os.sendfile",
)
BASELINE = "aiosendfile-uvloop"
THREAD = "thread-os.sendfile"
THREAD_COPY = "thread-copy"  # blocking read + sendall in a thread (only when named in --contenders)
THREADS = (THREAD, THREAD_COPY)
COPY_ROWS = ("copy-uvloop", "copy-asyncio", THREAD_COPY)  # the rows that use --copy-chunk
NETWORKS = ("loopback", "veth", "unix")  # --network: "auto", "both" (loopback,veth) or a list of these

READ_BUFFER = MiB
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "raw_transfer.json"


# ---------------------------------------------------------------------------
# Server side (runs in the spawned child process)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What a trial needs to know (pickled to the server process)."""

    size: int
    max_chunk: int
    copy_chunk: int
    timeout: float
    probe: bool = True  # aiosendfile's probe= (page-cache check, cold chunks to its pool)
    # Evict the file from the page cache right before the transfer (and check it is out);
    # otherwise check that it is in (see ``cache_state``).
    cold: bool = False
    host: str = "127.0.0.1"  # the server binds here and the reader connects here
    netns: str | None = None  # the server process enters this network namespace first (veth mode)
    unix_path: str | None = None  # a Unix stream socket instead of TCP (unix mode)
    client_netns: str | None = None  # the reader (this process's trial thread) enters this one (veth mode)


Sender = Callable[[asyncio.StreamWriter, IO[bytes], Options], Awaitable[int]]


async def _send_aiosendfile(writer: asyncio.StreamWriter, f: IO[bytes], opts: Options) -> int:
    import aiosendfile

    return await aiosendfile.sendfile(writer, f, max_chunk=opts.max_chunk, probe=opts.probe)


async def _send_loop_sendfile(writer: asyncio.StreamWriter, f: IO[bytes], opts: Options) -> int:
    loop = asyncio.get_running_loop()
    return await loop.sendfile(writer.transport, f)


async def _send_copy(writer: asyncio.StreamWriter, f: IO[bytes], opts: Options) -> int:
    # aiohttp's FileResponse fallback, minus its run_in_executor hop: with the file
    # in the page cache f.read() here is a memcpy; with a cold file it waits for the disk.
    sent = 0
    while chunk := f.read(opts.copy_chunk):
        writer.write(chunk)
        await writer.drain()
        sent += len(chunk)
    return sent


SENDERS: dict[str, Sender] = {
    "aiosendfile-uvloop": _send_aiosendfile,
    "aiosendfile-asyncio": _send_aiosendfile,
    "loop.sendfile-asyncio": _send_loop_sendfile,
    "copy-uvloop": _send_copy,
    "copy-asyncio": _send_copy,  # not run by default (loop_stall.py uses it)
}


async def _serve_async(conn: Connection, send: Sender, f: IO[bytes], opts: Options) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ticker = LoopTicker()
    done: asyncio.Future[dict[str, Any]] = loop.create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
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
            if counters is not None:
                result["zero_copy_calls"], result["zero_copy_bytes"] = counters.calls, counters.bytes
                result["zero_copy_eagain"], result["zero_copy_waits"] = counters.eagain, counters.waits
                result["zero_copy_cold"] = counters.cold
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
        else:
            done.set_result(result)

    if send is _send_aiosendfile:
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
        return measured(start, end, sent)


def _server_process(conn: Connection, contender: str, path: str, opts: Options) -> None:
    """Child-process entry point: serve one connection, send back the measurements."""

    def serve() -> dict[str, Any]:
        if opts.netns:
            from benchmarks.harness.netns import setns

            setns(f"/run/netns/{opts.netns}")
        try:
            if contender in THREADS:
                return _serve_thread(conn, path, opts, copy=contender == THREAD_COPY)
            return _serve_loop(conn, contender, path, opts)
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
    }


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
            try:
                rd = _read_all(port, opts.size, opts.timeout, opts.host, window, opts.unix_path)
            except (OSError, TrialError) as exc:
                child_error_first(parent, proc)
                raise TrialError(f"reader: {exc!r}") from exc
            srv = recv_result(parent, opts.timeout, proc)
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
# Setup, summary, report
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
                load = _other_load([s])
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
    if load := _other_load([s]):
        msg += f"  other load {load[0]:.2f} CPUs"
    if s.host_steal_s:
        msg += f"  steal {s.host_steal_s * 1e3:.0f} ms"
    if s.discarded:
        msg += "  -> discarded, retrying"
    return msg


def _other_load(samples: list[Sample]) -> list[float]:
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
                "other_load_cpus_median": median_or_none(_other_load(ok)),
                "other_load_cpus_max": max(_other_load(ok), default=None),
                "zero_copy_bytes": sorted({s.zero_copy_bytes for s in ok if s.zero_copy_bytes is not None}),
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


def network(opts: Options) -> str:
    """What the bytes crossed: "loopback", the veth pair of the server's namespace, or a Unix socket."""
    if opts.unix_path:
        return "a Unix stream socket"
    return f"veth ({opts.host}, server netns {opts.netns}) TCP" if opts.netns else "loopback TCP"


def report(summary: dict[str, dict[str, Any]], opts: Options, rounds: int, over: str | None = None) -> str:
    """The tables; *over* names the network(s) in the title (default: ``network(opts)``)."""
    main_rows, detail_rows = [], []
    for name, row in summary.items():
        if not row["ok"]:
            main_rows.append(
                [name, f"ERROR ({len(row['errors'])}/{row['runs']} runs failed)", "", "", "", ""]
            )
            continue
        ratio = row.get("ratio_vs_" + BASELINE)
        failed = f" ({row['runs'] - row['ok']} failed)" if row["ok"] < row["runs"] else ""
        main_rows.append(
            [
                name + failed,
                f"{row['mb_per_s_median']:.0f} [{row['mb_per_s_min']:.0f}-{row['mb_per_s_max']:.0f}]",
                f"{row['cpu_user_s_per_gb_median']:.3f}+{row['cpu_sys_s_per_gb_median']:.3f}"
                f" = {row['cpu_total_s_per_gb_median']:.3f}",
                ms(row["loop_delay_worst_ms"]),
                ms(row["loop_delay_p99_ms_median"]),
                "n/a" if ratio is None else f"{ratio:.2f}x",
            ]
        )
        zc = row["zero_copy_bytes"]
        detail_rows.append(
            [
                name,
                f"{row['server_mb_per_s_median']:.0f}",
                f"{row['ttfb_ms_median']:.2f}",
                f"{row['cpu_process_time_s_per_gb_median']:.3f}",
                f"{row['reader_cpu_s_per_gb_median']:.3f}",
                "n/a" if (h := row.get("host_cpu_s_per_gb_median")) is None else f"{h:.3f}",
                ms(row["idle_delay_p99_ms_median"]),
                ms(row["other_load_cpus_median"]),
                "n/a" if not zc else ("all" if zc == [opts.size] else "MISMATCH " + ",".join(map(str, zc))),
            ]
        )
    out = [
        f"raw_transfer: {opts.size // MiB} MiB over {over or network(opts)}, {rounds} interleaved rounds "
        f"(medians [min-max]; MB = 10^6 bytes, GB = 10^9 bytes)",
        "",
        table(
            [
                "contender",
                "MB/s median [min-max]",
                "CPU s/GB user+sys",
                "loop delay worst ms",
                "p99 ms",
                f"vs {BASELINE}",
            ],
            main_rows,
        ),
        "",
        "MB/s: reader side, 'go' byte sent -> last byte received. CPU: server process (all threads),",
        "RUSAGE_SELF from 'go' seen to send + drain + close done. Loop delay: 1 ms sleep ticker on the",
        "server loop during the transfer; worst over all rounds, p99 = median of per-round p99s.",
    ]
    if detail_rows:
        out += [
            "",
            table(
                [
                    "details",
                    "server-side MB/s",
                    "ttfb ms",
                    "CPU s/GB process_time",
                    "reader CPU s/GB",
                    "machine CPU s/GB",
                    "idle-loop p99 ms",
                    "other load CPUs",
                    "zero-copy bytes",
                ],
                detail_rows,
            ),
        ]
    n_discarded = sum(row.get("discarded", 0) for row in summary.values())
    if n_discarded:
        out += [
            "",
            f"{n_discarded} trial(s) re-run for other load on the machine (kept in the JSON as discarded).",
        ]
    # Medians: one trial's figure is only good to ~10 ms of CPU (/proc/stat ticks).
    loads = [v for row in summary.values() if (v := row.get("other_load_cpus_median")) is not None]
    return "\n".join(out + other_load_warning(loads))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.raw_transfer", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--size", type=int, default=None, help="file size in MiB (default 1024; 256 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; 3 with --quick)")
    p.add_argument("--quick", action="store_true", help="256 MiB, 3 rounds: a smoke run")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument("--dir", default=None, help="where to create the temporary file (default: system temp)")
    p.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma-separated subset, in the order to run them (default: all)",
    )
    p.add_argument("--max-chunk", type=int, default=2 * MiB, help="aiosendfile max_chunk in bytes")
    p.add_argument(
        "--copy-chunk",
        default=str(256 * 1024),
        help="read size of the copy rows in bytes (default 262144); a comma-separated list runs each "
        "copy row once per size, labelled e.g. copy-uvloop-64KiB",
    )
    p.add_argument(
        "--network",
        default="loopback",
        help="loopback (TCP, the default); veth: TCP across a veth pair between two network namespaces "
        "made for the run and removed after it (root only); unix: a Unix stream socket; a comma-separated "
        "list (both = loopback,veth) runs every contender over each, interleaved in the same rounds; "
        "auto: veth when it can be made, else loopback",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="per-trial timeout, seconds")
    p.add_argument(
        "--veth-mtu",
        type=int,
        default=None,
        help="MTU of both ends of the veth pair (default 1500, as on Ethernet: MSS 1448, and TCP's "
        "64 KiB GSO packets cross the pair unsegmented; loopback's MTU is 65536)",
    )
    p.add_argument(
        "--max-other-load",
        type=float,
        default=None,
        metavar="CPUS",
        help="re-run a trial during which other processes used more than CPUS of CPU "
        "(e.g. 0.25 on a shared machine; default: keep every trial)",
    )
    p.add_argument("--retries", type=int, default=5, help="re-runs per trial with --max-other-load")
    p.add_argument(
        "--perf",
        default=None,
        metavar="ARGS",
        help="run `perf ARGS` over each trial's transfer window, e.g. --perf 'stat -e task-clock' or "
        "--perf 'record -g -e cpu-clock -F 1999' (root; one output file per trial in --perf-dir)",
    )
    p.add_argument("--perf-dir", type=Path, default=DEFAULT_JSON.parent / "perf", help="--perf output files")
    p.add_argument(
        "--perf-scope",
        choices=("system", "server"),
        default="system",
        help="--perf: the whole machine (perf -a, the default) or the server process (perf -p PID)",
    )
    args = p.parse_args(argv)
    args.size = args.size if args.size is not None else (256 if args.quick else 1024)
    args.rounds = args.rounds if args.rounds is not None else (3 if args.quick else 5)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    known = (*SENDERS, *THREADS)  # CONTENDERS, plus the rows only run on request (copy-asyncio, thread-copy)
    unknown = set(args.contenders) - set(known)
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(known)}")
    if args.size <= 0 or args.rounds <= 0:
        p.error("--size and --rounds must be positive")
    try:
        args.copy_chunks = [int(v) for v in args.copy_chunk.split(",") if v.strip()]
    except ValueError:
        p.error(f"--copy-chunk: not a comma-separated list of byte counts: {args.copy_chunk!r}")
    chunks = args.copy_chunks
    if not chunks or min(chunks) <= 0 or len(set(chunks)) != len(chunks):
        p.error("--copy-chunk: one or more distinct positive byte counts")
    args.perf_spec = None
    if args.perf:
        import shlex

        perf_args = tuple(shlex.split(args.perf))
        if not perf_args or perf_args[0] not in ("stat", "record"):
            p.error("--perf: ARGS must start with `stat` or `record`")
        args.perf_spec = PerfSpec(perf_args, args.perf_dir, args.perf_scope)
    if args.network == "both":
        args.network = "loopback,veth"
    if args.network != "auto":
        nets = [n.strip() for n in args.network.split(",") if n.strip()]
        if not nets or set(nets) - set(NETWORKS) or len(set(nets)) != len(nets):
            p.error(f"--network: auto, both, or a comma-separated list of {', '.join(NETWORKS)}")
        args.network = ",".join(nets)
        if "veth" in nets:
            from benchmarks.harness import netns

            if why := netns.available():
                p.error(f"--network {args.network}: a veth pair cannot be made here: {why}")
    return args


def _size_label(n: int) -> str:
    return f"{n // MiB}MiB" if n % MiB == 0 else f"{n // 1024}KiB" if n % 1024 == 0 else f"{n}B"


class NetworkUnavailable(RuntimeError):
    """The veth pair asked for could not be made."""


def setup_network(
    requested: str, stack: contextlib.ExitStack, log: IO[str], mtu: int | None = None
) -> dict[str, Any]:
    """Make the veth pair if *requested* needs or allows one (removed when *stack* closes).

    *requested* is "auto" or a comma-separated list of NETWORKS. Returns ``{"requested", "used":
    the networks in run order, "veth": {...} | None, "loopback_why": why not veth (auto) | None,
    "veth_sysctl": {...}}``. Raises NetworkUnavailable when an asked-for veth pair cannot be made.
    """
    from benchmarks.harness import netns

    wanted = ["veth"] if requested == "auto" else requested.split(",")
    info: dict[str, Any] = {"requested": requested, "used": wanted, "veth": None, "loopback_why": None}
    if "veth" not in wanted:
        info["loopback_why"] = f"asked for (--network {requested})"
        return info
    why = netns.available()
    if why is None:
        try:
            veth = stack.enter_context(netns.veth_pair(mtu or netns.DEFAULT_MTU))
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"veth setup failed: {exc!r} {getattr(exc, 'stderr', '') or ''}".strip()
        else:
            info["veth"] = asdict(veth)
            sysctl = {}
            with netns.entered(veth.server_ns):
                for name in ("net/ipv4/tcp_wmem", "net/ipv4/tcp_rmem", "net/ipv4/tcp_congestion_control"):
                    with contextlib.suppress(OSError):
                        sysctl[name.replace("/", ".")] = Path("/proc/sys", name).read_text().split()
            info["veth_sysctl"] = sysctl
            print(
                f"network: veth pair, server in netns {veth.server_ns} ({veth.server_addr}), reader in "
                f"{veth.client_ns} ({veth.client_addr}), MTU {veth.mtu}; both namespaces are removed "
                "at the end",
                file=log,
                flush=True,
            )
            return info
    if requested != "auto":
        raise NetworkUnavailable(f"--network {requested}: {why}")
    info["used"] = ["loopback"]
    info["loopback_why"] = why
    print(f"network: loopback (veth not used: {why})", file=log, flush=True)
    return info


def build_cases(
    contenders: list[str], copy_chunks: list[int], net: dict[str, Any], base: Options, tmp: str
) -> tuple[list[Case], dict[str, str]]:
    """The trials of one round, in order (network by network), and each label's baseline label."""
    cases: list[Case] = []
    baselines: dict[str, str] = {}
    for name in net["used"]:
        opts = base
        if name == "veth":
            v = net["veth"]
            opts = replace(base, host=v["server_addr"], netns=v["server_ns"], client_netns=v["client_ns"])
        elif name == "unix":
            opts = replace(base, unix_path=os.path.join(tmp, "server.sock"))
        prefix = f"{name}/" if len(net["used"]) > 1 else ""
        for contender in contenders:
            chunks = copy_chunks if contender in COPY_ROWS else [copy_chunks[0]]
            for chunk in chunks:
                label = contender + (f"-{_size_label(chunk)}" if len(chunks) > 1 else "")
                cases.append(Case(prefix + label, contender, replace(opts, copy_chunk=chunk)))
                baselines[prefix + label] = prefix + BASELINE
    return cases, baselines


def describe_network(net: dict[str, Any]) -> str:
    """For the report's title, e.g. "loopback TCP and veth TCP (10.213.77.1 -> ..., MTU 1500)"."""
    v = net["veth"]
    names = {
        "loopback": "loopback TCP",
        "veth": f"veth TCP ({v['server_addr']} -> {v['client_addr']}, MTU {v['mtu']})" if v else "veth",
        "unix": "a Unix stream socket",
    }
    text = " and ".join(names[n] for n in net["used"])
    if net["requested"] == "auto" and net["used"] == ["loopback"]:
        text += f" (veth not used: {net['loopback_why']})"
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = Options(
        size=args.size * MiB,
        max_chunk=args.max_chunk,
        copy_chunk=args.copy_chunks[0],
        timeout=args.timeout,
    )
    ctx = multiprocessing.get_context("spawn")
    log = sys.stderr
    started = datetime.now(timezone.utc)
    # The stack removes the veth pair (if any) on the way out, on errors and Ctrl-C too.
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="aiosendfile-bench-", dir=args.dir))
        try:
            net = setup_network(args.network, stack, log, args.veth_mtu)
        except NetworkUnavailable as exc:
            print(f"raw_transfer: error: {exc}", file=log, flush=True)
            return 2
        cases, baselines = build_cases(args.contenders, args.copy_chunks, net, base, tmp)
        print(f"creating {args.size} MiB test file in {tmp} ...", file=log, flush=True)
        path = make_file(tmp, base.size)
        print(f"page cache warm-up read: {warm(path):.2f} s", file=log, flush=True)
        t_bench = time.perf_counter()
        samples = run_rounds(
            ctx, cases, path, args.rounds, args.retries, args.max_other_load, log, args.perf_spec
        )
        elapsed = time.perf_counter() - t_bench

    labels = [c.label for c in cases]
    summary = summarize(samples, labels, baselines)
    over = describe_network(net)
    text = report(summary, base, args.rounds, over=over) + f"\n\n({len(samples)} trials in {elapsed:.1f} s)"
    if args.max_other_load is not None:
        kept_noisy = [
            f"{s.contender} round {s.round}"
            for s in samples
            if not s.discarded and any(v > args.max_other_load for v in _other_load([s]))
        ]
        if kept_noisy:
            text += f"\nkept after {args.retries} retries, still over --max-other-load: "
            text += ", ".join(kept_noisy)

    document = {
        "benchmark": "raw_transfer",
        "date": started.isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "params": {
            "size_bytes": base.size,
            "network": over,
            "networks": net,
            "rounds": args.rounds,
            "contenders": args.contenders,
            "labels": labels,
            "max_chunk": base.max_chunk,
            "copy_chunk": base.copy_chunk,
            "copy_chunks": args.copy_chunks,
            "reader_buffer": READ_BUFFER,
            "ticker_sleep_s": TICK_S,
            "idle_baseline_s": IDLE_S,
            "max_other_load": args.max_other_load,
            "retries": args.retries,
            "reader_pid": os.getpid(),  # the reader is this process (with server_pid: perf report --pid)
            "perf": None
            if args.perf_spec is None
            else {**asdict(args.perf_spec), "directory": str(args.perf_spec.directory)},
            "elapsed_s": elapsed,
        },
        "units": {
            "mb_per_s": "10^6 bytes per second, reader side: 'go' sent -> last byte received",
            "server_mb_per_s": "10^6 bytes per second, server side: 'go' seen -> send+drain+close done",
            "cpu_*_s_per_gb": "server process CPU seconds (RUSAGE_SELF, all threads) per 10^9 bytes",
            "loop_delay_*_ms": "1 ms asyncio.sleep ticker lateness on the server loop during the transfer",
        },
        "machine": machine_info(),
        "summary": summary,
        "samples": [asdict(s) for s in samples],
        "sample_fields": [f.name for f in fields(Sample)],
    }
    return finish(text, document, args.json, ok=all(s.ok for s in samples), allow_nan=False, log=log)


if __name__ == "__main__":
    from benchmarks.harness.netns import Terminated

    try:
        sys.exit(main())
    except (KeyboardInterrupt, Terminated) as exc:  # the veth pair, if any, is already removed
        print(f"\ninterrupted ({exc!r})", file=sys.stderr)
        sys.exit(128 + getattr(exc, "signum", 2))
