"""Concurrency benchmark: N simultaneous downloads of one file from one server loop.

For each contender (a server-side send strategy from ``harness.senders.SENDERS``)
and each concurrency level N, a fresh ``spawn``ed server process accepts N
connections on one event loop; every connection sends the whole file (each
handler opens the file itself). The reader is this process: one thread, a
``selectors`` loop over N non-blocking sockets, 1 MiB ``recv_into``. All N
"go" bytes are sent at once; the trial's time runs from the first "go" to the
last byte of the last download. Trials are interleaved: every round runs every
level x contender once. Server CPU, the 1 ms loop-delay ticker and other load
are measured as in ``raw_transfer`` (``benchmarks/harness/measure.py``).

Run from the repository root::

    python -m benchmarks.concurrency --quick
    python -m benchmarks.concurrency --size 16 --levels 1,16,256 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import selectors
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from benchmarks.harness import GB, MB, MiB, TrialError
from benchmarks.harness.children import (
    client_then_result,
    recv_result,
    serve_on_contender_loop,
    serving_locally,
    spawned,
)
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.files import make_file, warm
from benchmarks.harness.measure import ClientWindow, LoopTicker, loop_name, measured, usage
from benchmarks.harness.report import finish_section, loop_trial_line, median_range, summary_row, table
from benchmarks.harness.senders import SENDERS, Options
from benchmarks.harness.transfer import READ_BUFFER

CONTENDERS = ("aiosendfile-uvloop", "copy-uvloop", "loop.sendfile-asyncio")
LEVELS = (1, 16, 256)
SUMMARIZED = ("mb_per_s", "cpu_s_per_gb", "loop_delay_p99_ms", "loop_delay_worst_ms", "other_load_cpus")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "concurrency.json"


# ---------------------------------------------------------------------------
# Server (spawned child)
# ---------------------------------------------------------------------------


async def _serve_many(conn: Connection, contender: str, path: str, n: int, opts: Options) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    send = SENDERS[contender]
    ticker = LoopTicker()
    done: asyncio.Future[None] = loop.create_future()
    sent_total = 0
    finished = 0
    started: list[Any] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent_total, finished
        try:
            await reader.readexactly(1)
            if not started:
                started.append(usage())
            with open(path, "rb") as f:
                sent = await send(writer, f, opts)
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            sent_total += sent
            finished += 1
            if finished == n and not done.done():
                done.set_result(None)
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)

    if contender.startswith("aiosendfile"):
        import aiosendfile  # noqa: F401  (imported before the clock starts)

    async with serving_locally(conn, handle, ticker, backlog=max(128, 2 * n)):
        await asyncio.wait_for(done, opts.timeout)
        end = usage()
    result = measured(started[0], end, sent_total)
    t0, t1 = result["t_start"], result["t_end"]
    result["loop_busy"] = ticker.busy(t0, t1)
    result["loop_idle"] = ticker.idle(t0)
    result["loop"] = loop_name(loop)
    return result


# ---------------------------------------------------------------------------
# Reader (this process)
# ---------------------------------------------------------------------------


def read_many(port: int, n: int, size: int, timeout: float) -> ClientWindow:
    """Open *n* connections, send every "go" byte, read each to EOF with one selector."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=timeout) for _ in range(n)]
    view = memoryview(bytearray(READ_BUFFER))
    got = dict.fromkeys(range(n), 0)
    sel = selectors.DefaultSelector()
    try:
        for i, s in enumerate(socks):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, i)
        window = ClientWindow()
        clock = time.perf_counter
        for s in socks:
            s.send(b"G")
        open_ = n
        deadline = window.t0 + timeout
        while open_:
            events = sel.select(1.0)
            if not events and clock() > deadline:
                raise TrialError(f"reader: {open_} downloads unfinished after {timeout} s")
            for key, _ in events:
                s = socks[key.data]
                try:
                    k = s.recv_into(view)
                except BlockingIOError:
                    continue
                if k:
                    got[key.data] += k
                else:
                    sel.unregister(s)
                    open_ -= 1
        window.stop()
    finally:
        sel.close()
        for s in socks:
            s.close()
    short = [v for v in got.values() if v != size]
    if short:
        raise TrialError(f"reader: {len(short)}/{n} downloads got the wrong size (e.g. {short[0]})")
    return window


@dataclass
class Sample:
    contender: str
    concurrency: int
    round: int
    ok: bool = False
    error: str | None = None
    file_bytes: int = 0
    total_bytes: int = 0
    mb_per_s: float | None = None  # total bytes of all downloads / reader seconds
    reader_seconds: float | None = None
    server_seconds: float | None = None
    cpu_user_s: float | None = None
    cpu_sys_s: float | None = None
    cpu_s_per_gb: float | None = None  # server process, user+sys, per 10^9 bytes sent
    loop_ticks: int | None = None
    loop_delay_worst_ms: float | None = None
    loop_delay_p99_ms: float | None = None
    loop_delay_p50_ms: float | None = None
    idle_delay_p99_ms: float | None = None
    reader_cpu_s: float | None = None
    other_cpu_s: float | None = None
    other_load_cpus: float | None = None
    loop: str | None = None


def run_trial(
    ctx: multiprocessing.context.SpawnContext, contender: str, n: int, rnd: int, path: str, opts: Options
) -> Sample:
    sample = Sample(contender=contender, concurrency=n, round=rnd, file_bytes=opts.size)
    with spawned(ctx, serve_on_contender_loop, contender, _serve_many, path, n, opts) as (parent, proc):
        try:
            port = recv_result(parent, opts.timeout, proc)
            rd, srv = client_then_result(
                parent, proc, opts.timeout, lambda: read_many(port, n, opts.size, opts.timeout)
            )
        except TrialError as exc:
            sample.error = str(exc)
            return sample
    total = opts.size * n
    if srv["sent"] != total:
        sample.error = f"server reported {srv['sent']} bytes sent, expected {total}"
        return sample
    sample.ok = True
    sample.total_bytes = total
    sample.reader_seconds = rd.seconds
    sample.mb_per_s = total / sample.reader_seconds / MB
    sample.server_seconds = srv["t_end"] - srv["t_start"]
    sample.cpu_user_s, sample.cpu_sys_s = srv["cpu_user_s"], srv["cpu_sys_s"]
    sample.cpu_s_per_gb = (srv["cpu_user_s"] + srv["cpu_sys_s"]) * GB / total
    busy, idle = srv["loop_busy"], srv["loop_idle"]
    sample.loop_ticks = busy["ticks"]
    sample.loop_delay_worst_ms, sample.loop_delay_p99_ms = busy["worst_ms"], busy["p99_ms"]
    sample.loop_delay_p50_ms, sample.idle_delay_p99_ms = busy["p50_ms"], idle["p99_ms"]
    sample.reader_cpu_s = rd.cpu_s
    sample.loop = srv["loop"]
    sample.other_cpu_s, sample.other_load_cpus = rd.others(srv["cpu_process_time_s"])
    return sample


# ---------------------------------------------------------------------------
# Summary and report
# ---------------------------------------------------------------------------


def summarize(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Keyed ``"<contender> x<N>"``: medians, min and max of the headline numbers."""
    summary: dict[str, dict[str, Any]] = {}
    for s in samples:
        key = f"{s.contender} x{s.concurrency}"
        if key in summary:
            continue
        mine = [t for t in samples if t.contender == s.contender and t.concurrency == s.concurrency]
        summary[key] = {
            "contender": s.contender,
            "concurrency": s.concurrency,
            **summary_row(mine, SUMMARIZED),
        }
    return summary


def report(summary: dict[str, dict[str, Any]], size: int, rounds: int) -> str:
    rows = []
    for key, r in summary.items():
        if not r["ok"]:
            rows.append([key, f"ERROR ({len(r['errors'])}/{r['runs']})", "", "", "", ""])
            continue
        rows.append(
            [
                key,
                median_range(r, "mb_per_s", ".0f"),
                f"{r['cpu_s_per_gb_median']:.3f}",
                f"{r['loop_delay_p99_ms_median']:.2f}",
                f"{r['loop_delay_worst_ms_max']:.2f}",
                f"{r.get('other_load_cpus_median', math.nan):.2f}",
            ]
        )
    return "\n".join(
        [
            f"concurrency: N simultaneous downloads of a {size // MiB} MiB file from one server loop, "
            f"{rounds} interleaved rounds (medians [min-max])",
            "",
            table(
                [
                    "contender x N",
                    "total MB/s",
                    "CPU s/GB",
                    "loop p99 ms",
                    "loop worst ms",
                    "other load CPUs",
                ],
                rows,
            ),
            "",
            "total MB/s: all N downloads' bytes / (first 'go' sent -> last byte received). CPU: server",
            "process user+sys per 10^9 bytes. Loop delay: 1 ms ticker on the server loop during the trial.",
        ]
    )


def run(
    size_mib: int,
    levels: list[int],
    rounds: int,
    contenders: list[str],
    *,
    directory: str | None = None,
    timeout: float = 300.0,
    log: IO[str] = sys.stderr,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the section; return its JSON document (also used by ``benchmarks.suite``)."""
    opts = Options(size=size_mib * MiB, max_chunk=2 * MiB, copy_chunk=256 * 1024, timeout=timeout)
    ctx = multiprocessing.get_context("spawn")
    started = datetime.now(timezone.utc)
    samples: list[Sample] = []
    say = progress or (lambda line: print(line, file=log, flush=True))
    with tempfile.TemporaryDirectory(prefix="aiosendfile-conc-", dir=directory) as tmp:
        path = make_file(tmp, opts.size)
        warm(path)
        t_bench = time.perf_counter()
        for rnd in range(1, rounds + 1):
            for n in levels:
                for contender in rotated(contenders, rnd):
                    s = run_trial(ctx, contender, n, rnd, path, opts)
                    samples.append(s)
                    say(f"round {rnd}/{rounds}  {contender:<22} x{n:<4} {loop_trial_line(s, worst=True)}")
        elapsed = time.perf_counter() - t_bench
    summary = summarize(samples)
    return {
        "benchmark": "concurrency",
        "date": started.isoformat(timespec="seconds"),
        "params": {
            "size_bytes": opts.size,
            "levels": levels,
            "rounds": rounds,
            "contenders": contenders,
            "reader_buffer": READ_BUFFER,
            "elapsed_s": elapsed,
        },
        "summary": summary,
        "report": report(summary, opts.size, rounds),
        "samples": [asdict(s) for s in samples],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.concurrency", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 MiB file, 1 round")
    p.add_argument("--size", type=int, default=None, help="file size in MiB (default 16; 4 with --quick)")
    p.add_argument(
        "--levels", default=",".join(map(str, LEVELS)), help="comma-separated N (default 1,16,256)"
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    args.size = args.size or (4 if args.quick else 16)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.levels = [int(v) for v in args.levels.split(",") if v.strip()]
    args.contenders = comma_list(p, args.contenders, SENDERS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = run(args.size, args.levels, args.rounds, args.contenders, directory=args.dir)
    return finish_section(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
