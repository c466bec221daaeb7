"""Loop stalls of ``serve`` on the cold mixed set: the worst loop delay while cold files stream.

``loop_stall`` measures one large transfer. This measures the server the way users meet it: the
mixed set of ``http_static`` (10,000 files, log-normal sizes, 16 KiB median), evicted from the
page cache before each trial, requested at random by ``wrk`` at a moderate load (16 connections:
the loop is not saturated, so a late tick means something held it, not a queue of ready
connections). ``serve`` runs as ``benchmarks.programs.ticked_serve``: the CLI itself, with a
1 ms ticker on its loop and every cyclic garbage collection timed.

Rows, interleaved in every round, on uvloop and stock asyncio:

* ``serve``: as shipped (the page-cache probe on: cold pages are read ahead or sent from the
  cold-read pool, never waited for on the loop);
* ``serve-no-probe``: the same with the probe off, so ``sendfile`` waits for the disk on the
  loop as stock ``loop.sendfile`` and nginx do: the proof that the benchmark sees a stall;
* ``floor``: no server at all. A bare loop with the ticker (``benchmarks.programs.bare_ticker``)
  on the server's CPU while as many threads as wrk has connections read the evicted set from
  wrk's CPU (``benchmarks.programs.cold_reader``): the machine's own worst delay under that disk
  load. On a virtual machine the host may not run the virtual CPU for milliseconds, more often
  while the disk is busy; a ``serve`` row can be no better than this one.

Reported per row (median and range over rounds): worst tick lateness, p99.9 and p99, ticks later
than 5 ms, the longest garbage collection, and req/s (files read per second for ``floor``). The
target: ``serve``'s worst ≤ 5 ms; the report says the floor's worst beside it.
The server is pinned to one CPU and wrk to another, so the cold-read pool's threads, the disk's
interrupts and the loop share one CPU (as in ``http_static``).

``--slow-read-iops N`` runs every row on a slow disk: the server (and the floor's readers) in a
cgroup that holds its reads of the disk to N a second (``benchmarks.harness.throttle``; root).
Where a read's pages come in slowly and out of order, a probe that trusts the page cache's count
sends on the loop's thread and waits (issue #53's slow-disk run found 200-300 ms stalls so).

Run from the repository root::

    python -m benchmarks.mixed_stall --quick       # 1,000 files, 2 s trials, 1 round (< 1 min)
    python -m benchmarks.mixed_stall --slow-read-iops 200 --loops uvloop   # on a slow disk
    python -m benchmarks.mixed_stall               # 10,000 files, 5 s trials, 3 rounds
    python -m benchmarks.loop_stall --mixed        # the same
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.harness import TrialError
from benchmarks.harness.cli import comma_list
from benchmarks.harness.files import evict_files, storage_info
from benchmarks.harness.measure import TICK_S, percentile
from benchmarks.harness.report import REPO, document_head, finish_samples, machine_info, table
from benchmarks.harness.servers import (
    can_pin,
    ensure_tools,
    free_port,
    log_tail,
    pin_prefix,
    repo_env,
    start_server,
    stop_server,
)
from benchmarks.harness.throttle import read_throttle
from benchmarks.harness.wrk import parse_wrk, run_wrk, wrk_command
from benchmarks.http_static import write_mixed_set

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "mixed_stall.json"
PROGRAM = "benchmarks.programs.ticked_serve"
FLOOR_PROGRAM, READER_PROGRAM = "benchmarks.programs.bare_ticker", "benchmarks.programs.cold_reader"
FLOOR = "floor"
VARIANTS = {"serve": [], "serve-no-probe": ["--no-probe"], FLOOR: []}
LOOPS = ("uvloop", "asyncio")
TARGET_WORST_MS = 5.0
LATE_MS = 5.0
SERVER_CPUS, CLIENT_CPUS = "0", "1"


@dataclass
class Sample:
    """One trial: one variant on one loop, one round."""

    variant: str
    loop: str
    round: int
    ok: bool = False
    error: str | None = None
    ticks: int = 0
    worst_ms: float | None = None
    p999_ms: float | None = None
    p99_ms: float | None = None
    late_ticks: int = 0  # later than LATE_MS
    gc_worst_ms: float | None = None
    gc_by_generation: dict[str, int] = field(default_factory=dict)
    requests_per_s: float | None = None
    socket_errors: int = 0
    resident_pages_before: int | None = None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.mixed_stall", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="1,000 files, 2 s trials, 1 round")
    p.add_argument(
        "--files", type=int, default=None, help="files in the mixed set (default 10000; 1000 --quick)"
    )
    p.add_argument("--duration", type=int, default=None, help="seconds per trial (default 5; 2 --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 --quick)")
    p.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    p.add_argument("--loops", default=",".join(LOOPS), help="uvloop,asyncio (default both)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="serve,serve-no-probe,floor (default all)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument(
        "--slow-read-iops",
        type=int,
        default=None,
        help="a slow disk: the server's reads of it held to N a second (a cgroup; root)",
    )
    args = p.parse_args(argv)
    q = args.quick
    args.files = args.files if args.files is not None else (1000 if q else 10_000)
    args.duration = args.duration if args.duration is not None else (2 if q else 5)
    args.rounds = args.rounds if args.rounds is not None else (1 if q else 3)
    args.loops = comma_list(p, args.loops, LOOPS, "loops")
    args.variants = comma_list(p, args.variants, tuple(VARIANTS), "variants")
    if min(args.files, args.duration, args.rounds, args.connections, args.slow_read_iops or 1) < 1:
        p.error("--files, --duration, --rounds, --connections and --slow-read-iops must be >= 1")
    return args


def _get(port: int, path: str) -> None:
    """One GET, its answer read whatever the status (a warm-up request)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        exc.read()


def trial(
    sample: Sample,
    root: Path,
    tmp: Path,
    script: str,
    files: list[str],
    wrk: str,
    args: argparse.Namespace,
    wrap: list[str],
) -> None:
    """Start the ticked server (or, for the floor, the bare ticker), warm it up (not the set), evict
    the set, load it, collect the ticks."""
    pinned = can_pin()
    port = free_port()
    out = tmp / f"ticks-{sample.variant}-{sample.loop}-{sample.round}.json"
    floor = sample.variant == FLOOR
    if floor:
        cmd = [sys.executable, "-m", FLOOR_PROGRAM, str(out), str(port), sample.loop]
    else:
        cmd = [
            sys.executable, "-m", PROGRAM, str(out), *VARIANTS[sample.variant], "--",
            str(root), "--host", "127.0.0.1", "--port", str(port), "--loop", sample.loop,
        ]  # fmt: skip
    log = tmp / f"server-{sample.variant}-{sample.loop}.log"
    server = start_server(
        sample.variant, cmd, port, log, cpus=SERVER_CPUS if pinned else None, env=repo_env(), wrap=wrap
    )
    try:
        if not floor:  # One-time costs (the first answer's imports and tables) are not stalls under load.
            for path in ("/", "/warmup.bin", "/missing"):
                _get(port, path)
        resident, total = evict_files(files)
        sample.resident_pages_before = resident
        if resident > total // 100:
            raise TrialError(f"page cache not cold: {resident} of {total} pages still cached")
        start = time.perf_counter()
        if floor:
            read = _read_cold(files, tmp, args.duration, args.connections, pinned, wrap)
        else:
            cmd = wrk_command(
                wrk, f"http://127.0.0.1:{port}/", args.duration, threads=1, connections=args.connections,
                cpus=CLIENT_CPUS if pinned else None, script=script, timeout=60 if wrap else None,
            )  # fmt: skip
            report = run_wrk(cmd, args.duration)
        end = time.perf_counter()
    except BaseException:
        stop_server(server)
        raise
    status = stop_server(server)
    if status != 0:
        raise TrialError(f"the server stopped with status {status}{log_tail(server)}")
    if floor:
        sample.requests_per_s = read["files"] / read["seconds"]
    else:
        parsed = parse_wrk(report)
        sample.requests_per_s = parsed.get("req_per_s")
        if parsed["non_2xx"]:
            raise TrialError(f"{parsed['non_2xx']} answers were not 2xx or 3xx")
        sample.socket_errors = sum((parsed.get("socket_errors") or {}).values())
    recorded = json.loads(out.read_text())
    # (LoopTicker.busy's rule: every tick whose sleep overlaps wrk's window)
    lateness = sorted(
        woke - slept - TICK_S for slept, woke in recorded["ticks"] if woke >= start and slept <= end
    )
    if not lateness:
        raise TrialError("no tick inside wrk's window")
    sample.ticks = len(lateness)
    sample.worst_ms = lateness[-1] * 1e3
    sample.p999_ms = percentile(lateness, 99.9) * 1e3
    sample.p99_ms = percentile(lateness, 99) * 1e3
    sample.late_ticks = sum(1 for late in lateness if late * 1e3 > LATE_MS)
    pauses = [(gen, took) for when, gen, took in recorded["gc"] if start <= when <= end]
    sample.gc_worst_ms = max((took for _, took in pauses), default=0.0) * 1e3
    for gen, _ in pauses:
        sample.gc_by_generation[str(gen)] = sample.gc_by_generation.get(str(gen), 0) + 1
    sample.ok = True


def _read_cold(
    files: list[str], tmp: Path, seconds: int, threads: int, pinned: bool, wrap: list[str]
) -> dict[str, Any]:
    """The floor's load: *threads* readers of *files* on wrk's CPU for *seconds* (``cold_reader``;
    *wrap*: the slow disk's cgroup, as the server's)."""
    listing = tmp / "files.txt"
    listing.write_text("\n".join(files))
    cmd = [*pin_prefix(CLIENT_CPUS if pinned else None), *wrap, sys.executable, "-m", READER_PROGRAM]
    done = subprocess.run(
        [*cmd, str(listing), str(seconds), str(threads)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=repo_env(),
        timeout=seconds + 60,
    )
    if done.returncode != 0:
        raise TrialError(f"the cold reader failed: {done.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _cell(values: list[float], fmt: str = ".2f") -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def report(samples: list[Sample], args: argparse.Namespace, machine: dict[str, Any]) -> str:
    rows = []
    verdicts = []
    for loop in args.loops:
        for variant in args.variants:
            got = [s for s in samples if s.ok and s.loop == loop and s.variant == variant]
            rows.append([
                f"{variant} ({loop})",
                _cell([s.worst_ms for s in got if s.worst_ms is not None]),
                _cell([s.p999_ms for s in got if s.p999_ms is not None]),
                _cell([s.p99_ms for s in got if s.p99_ms is not None]),
                _cell([float(s.late_ticks) for s in got], ".0f"),
                _cell([s.gc_worst_ms for s in got if s.gc_worst_ms is not None]),
                _cell([s.requests_per_s for s in got if s.requests_per_s is not None], ".0f"),
                str(sum(s.socket_errors for s in got)),
            ])  # fmt: skip
            if variant == "serve" and got:
                worst = max(s.worst_ms or 0.0 for s in got)
                mark = "met" if worst <= TARGET_WORST_MS else "NOT met"
                verdicts.append(f"serve ({loop}): worst {worst:.2f} ms over {len(got)} rounds: {mark}")
            if variant == FLOOR and got:
                worst = max(s.worst_ms or 0.0 for s in got)
                verdicts.append(
                    f"floor ({loop}): a bare loop's worst {worst:.2f} ms over {len(got)} rounds "
                    "under the same disk load (the machine's own delay)"
                )
    failed = [f"{s.variant} ({s.loop}) round {s.round}: {s.error}" for s in samples if not s.ok]
    head = (
        f"mixed_stall: {args.files} files, cold, wrk -c{args.connections} for {args.duration} s, "
        f"{args.rounds} round(s); 1 ms ticker on the server's loop; CPU {machine.get('cpu_model')}"
        + (f"; the server's disk reads held to {args.slow_read_iops}/s" if args.slow_read_iops else "")
    )
    header = [
        "row",
        "worst ms",
        "p99.9 ms",
        "p99 ms",
        f">{LATE_MS:.0f} ms ticks",
        "longest gc ms",
        "req/s",
        "sock err",
    ]
    lines = [head, "", table(header, rows), "", f"target: serve's worst loop delay <= {TARGET_WORST_MS} ms"]
    lines += [f"  {v}" for v in verdicts]
    if failed:
        lines += ["", "failed trials:", *(f"  {f}" for f in failed)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = sys.stderr
    started = datetime.now(timezone.utc)
    wrk, _ = ensure_tools(False, "mixed_stall")
    machine = machine_info()
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="mixed_stall-") as tmpdir:
        tmp = Path(tmpdir)
        root = tmp / "root"
        root.mkdir()
        _, _, script, files = write_mixed_set(root, str(tmp), args.files)
        (root / "warmup.bin").write_bytes(os.urandom(4096))
        storage = storage_info(str(root))
        wrap: list[str] = []
        if args.slow_read_iops is not None:
            made = read_throttle(str(root), args.slow_read_iops)
            if isinstance(made, str):
                raise SystemExit(f"mixed_stall: no slow disk here: {made}")
            wrap = made.prefix()
            storage["slow_disk"] = made.describe()
        for rnd in range(args.rounds):
            for loop in args.loops:
                for variant in args.variants:
                    sample = Sample(variant, loop, rnd)
                    print(f"round {rnd + 1}/{args.rounds}: {variant} ({loop}) ...", file=log, flush=True)
                    try:
                        trial(sample, root, tmp, script, files, wrk, args, wrap)
                    except TrialError as exc:
                        sample.error = str(exc)
                    samples.append(sample)
        text = report(samples, args, machine)
    document = document_head("mixed_stall", started)
    document.update(
        machine=machine,
        storage=storage,
        settings={
            "files": args.files,
            "connections": args.connections,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "tick_ms": 1,
            "server_cpus": SERVER_CPUS if can_pin() else None,
            "client_cpus": CLIENT_CPUS if can_pin() else None,
            "target_worst_ms": TARGET_WORST_MS,
            "slow_read_iops": args.slow_read_iops,
        },
    )
    return finish_samples(text, document, Sample, samples, args.json, log)


if __name__ == "__main__":
    sys.exit(main())
