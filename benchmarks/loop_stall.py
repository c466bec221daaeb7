"""Loop-stall benchmark: how long one large transfer blocks the server's event loop.

One file of ``--size`` MiB goes to a fast local reader (a separate process)
while a 1 ms ticker runs on the *same* server loop. For each send strategy, on
stock asyncio and on uvloop, with the file WARM (in the page cache) and COLD
(evicted right before the transfer), it reports throughput, server CPU and the
ticker's worst and p99 lateness. A ``max_chunk`` sweep (aiosendfile, uvloop,
warm) shows what the chunk bound costs. The machinery (server process, reader,
ticker, CPU and other-load accounting, cache control) is ``raw_transfer``'s trial,
``benchmarks/harness/transfer.py``. See ``benchmarks/README.md``.

Run from the repository root::

    python -m benchmarks.loop_stall --quick     # 128 MiB, 1 round: a smoke run, < 1 min
    python -m benchmarks.loop_stall             # 512 MiB, 3 rounds
    python -m benchmarks.loop_stall --size 1024 --rounds 5 --json /tmp/out.json
    python -m benchmarks.loop_stall --mixed     # serve on the cold mixed set (benchmarks.mixed_stall)
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.harness import MiB
from benchmarks.harness.cli import comma_list
from benchmarks.harness.files import cache_state, make_file, storage_info, warm
from benchmarks.harness.measure import IDLE_S, TICK_S
from benchmarks.harness.report import (
    document_head,
    finish_samples,
    machine_info,
    median_range,
    other_load_warning,
    table,
)
from benchmarks.harness.senders import Options, unavailable
from benchmarks.harness.transfer import READ_BUFFER, Case, Sample, run_rounds, summarize

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "loop_stall.json"
KiB = 1 << 10
UNBOUNDED_CHUNK = 1 << 30  # "unbounded mode": one sendfile per wakeup of up to 1 GiB, no probe
DEFAULT_SWEEP = (256 * KiB, MiB, 2 * MiB, 4 * MiB, 8 * MiB)
TARGET_WORST_MS = 5.0  # the project's targets for aiosendfile with default settings
TARGET_THROUGHPUT = 0.90  # of its own unbounded mode

# Table rows: (row name, server strategy in harness.senders.SENDERS without the loop, option overrides)
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "aiosendfile": ("aiosendfile", {}),
    "aiosendfile-unbounded": ("aiosendfile", {"max_chunk": UNBOUNDED_CHUNK, "probe": False}),
    "loop.sendfile": ("loop.sendfile", {}),
    "copy": ("copy", {}),
    "aiofastnet": ("aiofastnet", {}),  # skipped, with the reason, when aiofastnet is not installed
}
LOOPS = ("uvloop", "asyncio")
NO_UVLOOP = {"loop.sendfile"}  # uvloop's loop.sendfile raises NotImplementedError
STATES = ("warm", "cold")


def _size_label(n: int) -> str:
    return f"{n // MiB}MiB" if n % MiB == 0 else f"{n // KiB}KiB"


def _parse_size(text: str) -> int:
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = {"k": KiB, "m": MiB, "g": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if scale != 1 else t) * scale


def label(state: str, row: str, loop: str, max_chunk: int | None = None) -> str:
    name = f"{state}/{row}-{loop}"
    return name if max_chunk is None else f"{name} max_chunk={_size_label(max_chunk)}"


def build_cases(args: argparse.Namespace, base: Options) -> tuple[list[Case], dict[int, str]]:
    """The cases of one round, in run order, and the sweep's label for each max_chunk."""
    cases: list[Case] = []
    for state in args.states:
        for row in args.rows:
            strategy, overrides = ROWS[row]
            for loop in LOOPS:
                if loop == "uvloop" and row in NO_UVLOOP:
                    continue
                opts = replace(base, cold=state == "cold", **overrides)
                cases.append(Case(label(state, row, loop), f"{strategy}-{loop}", opts))
    sweep: dict[int, str] = {}
    default_row = label("warm", "aiosendfile", "uvloop")
    have_default_row = any(c.label == default_row for c in cases)
    for chunk in args.sweep:
        if chunk == base.max_chunk and have_default_row:
            sweep[chunk] = default_row  # the same trial: no need to run it twice
            continue
        name = label("warm", "aiosendfile", "uvloop", chunk)
        cases.append(Case(name, "aiosendfile-uvloop", replace(base, max_chunk=chunk)))
        sweep[chunk] = name
    return cases, sweep


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _ratio_per_round(samples: list[Sample], a: str, b: str) -> list[float]:
    """MB/s of *a* over *b*, one ratio per round where both ran (trials close together in time)."""
    by = {(s.contender, s.round): s for s in samples if s.ok and not s.discarded}
    return [
        by[a, r].mb_per_s / by[b, r].mb_per_s  # type: ignore[operator]
        for r in sorted({s.round for s in samples})
        if (a, r) in by and (b, r) in by
    ]


def _ratio_cell(samples: list[Sample], summary: dict[str, Any], a: str, b: str) -> tuple[str, float | None]:
    ra, rb = summary.get(a, {}), summary.get(b, {})
    if "mb_per_s_median" not in ra or "mb_per_s_median" not in rb:
        return "", None
    ratio = ra["mb_per_s_median"] / rb["mb_per_s_median"]
    per_round = _ratio_per_round(samples, a, b)
    spread = f" [{min(per_round):.2f}-{max(per_round):.2f}]" if len(per_round) > 1 else ""
    return f"{ratio:.2f}x{spread}", ratio


def _main_row(name: str, row: dict[str, Any], vs: str) -> list[str]:
    if not row.get("ok"):
        return [name, f"ERROR ({len(row['errors'])}/{row['runs']} runs failed)", "", "", "", "", ""]
    failed = f" ({row['runs'] - row['ok']} failed)" if row["ok"] < row["runs"] else ""
    chunks = (
        f"{median_range(row, 'zero_copy_cold', '.0f')} / {row['zero_copy_calls_median']:.0f}"
        if "zero_copy_cold_median" in row
        else "n/a"
    )
    return [
        name + failed,
        median_range(row, "mb_per_s", ".0f"),
        median_range(row, "cpu_total_s_per_gb", ".3f"),
        median_range(row, "loop_delay_worst_ms"),
        median_range(row, "loop_delay_p99_ms"),
        chunks,
        vs,
    ]


HEADER = [
    "",
    "MB/s",
    "CPU s/GB",
    "worst ms",
    "p99 ms",
    "cold chunks / calls",
]


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "PASS" if ok else "FAIL"


def report(
    summary: dict[str, Any], samples: list[Sample], cases: list[Case], sweep: dict[int, str], args: Any
) -> tuple[str, dict[str, Any]]:
    labels = [c.label for c in cases]
    out = [
        f"loop_stall: {args.size} MiB over loopback TCP, {args.rounds} interleaved round(s), 1 ms ticker "
        "on the server loop",
        "(each cell: median [min-max] over rounds; MB = 10^6 bytes, GB = 10^9 bytes)",
    ]
    targets: dict[str, Any] = {}
    for state in args.states:
        rows = []
        for row in args.rows:
            for loop in LOOPS:
                name = label(state, row, loop)
                if name not in labels:
                    continue
                vs, ratio = ("", None)
                if row == "aiosendfile":
                    unb = label(state, "aiosendfile-unbounded", loop)
                    vs, ratio = _ratio_cell(samples, summary, name, unb)
                    worst = summary[name].get("loop_delay_worst_ms")
                    targets[name] = {
                        "worst_ms": worst,
                        "worst_ok": worst is not None and worst <= TARGET_WORST_MS,
                        "throughput_vs_unbounded": ratio,
                        "throughput_ok": None if ratio is None else ratio >= TARGET_THROUGHPUT,
                    }
                rows.append(_main_row(f"{row}-{loop}", summary[name], vs))
        out += [
            "",
            f"{state.upper()} file"
            + (" (evicted before each trial)" if state == "cold" else " (in page cache)"),
            table([state, *HEADER[1:], "vs unbounded"], rows),
        ]
    if sweep:
        base = label("warm", "aiosendfile-unbounded", "uvloop")
        rows = []
        for chunk, name in sweep.items():
            vs, _ = _ratio_cell(samples, summary, name, base)
            rows.append(_main_row(_size_label(chunk), summary[name], vs))
        if base in summary:
            rows.append(_main_row("unbounded (1GiB, probe=False)", summary[base], ""))
        out += [
            "",
            "max_chunk sweep: aiosendfile, uvloop, warm (probe on)",
            table(["max_chunk", *HEADER[1:], "vs unbounded"], rows),
        ]
    out += [
        "",
        "worst: the largest ticker lateness in a round (the bracket's max is the worst of all rounds).",
        "p99: each round's nearest-rank p99. CPU: server process, all threads (the cold-read pool too).",
        "cold chunks / calls: aiosendfile._platform.counters: chunks sent from the cold-read pool /",
        "sendfile calls that moved bytes. vs unbounded: ratio of median MB/s [per-round ratios].",
    ]
    if targets:
        out += [
            "",
            f"Targets (aiosendfile defaults): worst <= {TARGET_WORST_MS:g} ms, MB/s >= "
            f"{TARGET_THROUGHPUT:.0%} of unbounded mode",
        ]
        for name, t in targets.items():
            worst = "n/a" if t["worst_ms"] is None else f"{t['worst_ms']:.2f} ms"
            ratio = t["throughput_vs_unbounded"]
            thr = "n/a" if ratio is None else f"{ratio:.2f}x"
            out.append(
                f"  {name:<28} worst {worst:>10} {_verdict(t['worst_ok'])}   "
                f"throughput {thr:>6} {_verdict(t['throughput_ok'])}"
            )
    detail_rows = []
    for name in labels:
        row = summary[name]
        if not row.get("ok"):
            continue
        mine = [s for s in samples if s.contender == name and s.ok and not s.discarded]
        resident = sorted({f"{s.cached_pages}/{s.file_pages}" for s in mine})
        steal = [
            s.host_steal_s * 1e3 / s.reader_seconds
            for s in mine
            if s.host_steal_s is not None and s.reader_seconds
        ]
        zc = row["zero_copy_bytes"]
        detail_rows.append(
            [
                name,
                f"{row['server_mb_per_s_median']:.0f}",
                f"{row['ttfb_ms_median']:.2f}",
                median_range(row, "zero_copy_waits", ".0f"),
                "n/a"
                if row["idle_delay_p99_ms_median"] is None
                else f"{row['idle_delay_p99_ms_median']:.2f}",
                "n/a" if row["other_load_cpus_median"] is None else f"{row['other_load_cpus_median']:.2f}",
                f"{statistics.median(steal):.0f}" if steal else "n/a",
                ",".join(resident),
                "n/a" if not zc else ("all" if zc == [args.size * MiB] else "MISMATCH"),
            ]
        )
    out += [
        "",
        table(
            [
                "details (medians)",
                "server MB/s",
                "ttfb ms",
                "socket waits",
                "idle p99 ms",
                "other load CPUs",
                "steal ms/s",
                "cached pages at go",
                "zero-copy bytes",
            ],
            detail_rows,
        ),
    ]
    loads = [v for row in summary.values() if (v := row.get("other_load_cpus_median")) is not None]
    return "\n".join(out + other_load_warning(loads)), targets


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loop_stall", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=None, help="file size in MiB (default 512; 128 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="128 MiB, 1 round: a smoke run")
    p.add_argument(
        "--mixed", action="store_true", help="serve on the cold mixed set instead (benchmarks.mixed_stall)"
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument("--dir", default=None, help="where to create the file (default: system temp; not tmpfs)")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {', '.join(ROWS)}")
    p.add_argument("--states", default=",".join(STATES), help="warm,cold or one of them")
    p.add_argument(
        "--sweep",
        default=",".join(_size_label(c) for c in DEFAULT_SWEEP),
        help="max_chunk values for the uvloop warm sweep, e.g. 256KiB,1MiB ('' for none)",
    )
    p.add_argument("--copy-chunk", type=int, default=256 * KiB, help="the copy rows' read size in bytes")
    p.add_argument("--timeout", type=float, default=300.0, help="per-trial timeout, seconds")
    p.add_argument(
        "--max-other-load", type=float, default=None, metavar="CPUS", help="re-run disturbed trials"
    )
    p.add_argument(
        "--max-steal-ms",
        type=float,
        default=None,
        metavar="MS",
        help="re-run trials the hypervisor stole more than MS of CPU from (/proc/stat: 10 ms ticks)",
    )
    p.add_argument("--retries", type=int, default=5, help="re-runs per disturbed trial")
    args = p.parse_args(argv)
    args.size = args.size if args.size is not None else (128 if args.quick else 512)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    args.rows = comma_list(p, args.rows, ROWS, "rows")
    args.states = comma_list(p, args.states, STATES, "states")
    args.sweep = [_parse_size(c) for c in args.sweep.split(",") if c.strip()]
    args.skipped = {r: why for r in args.rows if (why := unavailable(ROWS[r][0]))}
    args.rows = [r for r in args.rows if r not in args.skipped]
    if args.size <= 0 or args.rounds <= 0 or any(c <= 0 for c in args.sweep):
        p.error("--size, --rounds and --sweep values must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if "--mixed" in words:  # serve on the cold mixed set: its own benchmark, its own options
        from benchmarks import mixed_stall

        words.remove("--mixed")
        return mixed_stall.main(words)
    args = parse_args(argv)
    from aiosendfile._state import DEFAULT_MAX_CHUNK

    base = Options(
        size=args.size * MiB, max_chunk=DEFAULT_MAX_CHUNK, copy_chunk=args.copy_chunk, timeout=args.timeout
    )
    cases, sweep = build_cases(args, base)
    ctx = multiprocessing.get_context("spawn")
    log = sys.stderr
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="aiosendfile-stall-", dir=args.dir) as tmp:
        print(f"creating {args.size} MiB test file in {tmp} ...", file=log, flush=True)
        path = make_file(tmp, base.size)
        storage = storage_info(path)
        resident, pages = cache_state(path, evict=True)
        cached = "?" if resident is None else sum(resident)
        t0 = time.perf_counter()
        warm(path)
        cold_read = base.size / (time.perf_counter() - t0) / 1e6
        print(
            f"cold sequential read (after eviction, {cached}/{pages} pages cached): {cold_read:.0f} MB/s; "
            f"device {storage.get('name')} read_ahead_kb={storage.get('read_ahead_kb')}",
            file=log,
            flush=True,
        )
        t_bench = time.perf_counter()
        max_steal = None if args.max_steal_ms is None else args.max_steal_ms / 1e3
        samples = run_rounds(
            ctx, cases, path, args.rounds, args.retries, args.max_other_load, log, max_steal_s=max_steal
        )
        elapsed = time.perf_counter() - t_bench

    summary = summarize(samples, [c.label for c in cases])
    text, targets = report(summary, samples, cases, sweep, args)
    rerun = sum(s.discarded for s in samples)
    text += f"\n\n({len(samples)} trials in {elapsed:.1f} s; {rerun} disturbed and re-run, kept in the JSON)"
    text += "".join(f"\nskipped {row}: {why}" for row, why in args.skipped.items())

    document = {
        **document_head("loop_stall", started),
        "params": {
            "size_bytes": base.size,
            "rounds": args.rounds,
            "skipped": args.skipped,  # row -> why it could not run here
            "cases": [{"label": c.label, "server": c.contender, "options": asdict(c.opts)} for c in cases],
            "sweep": {str(k): v for k, v in sweep.items()},
            "reader_buffer": READ_BUFFER,
            "ticker_sleep_s": TICK_S,
            "idle_baseline_s": IDLE_S,
            "max_other_load": args.max_other_load,
            "max_steal_ms": args.max_steal_ms,
            "retries": args.retries,
            "elapsed_s": elapsed,
            "cold_sequential_read_mb_per_s": cold_read,
            "targets": {"worst_ms": TARGET_WORST_MS, "throughput_vs_unbounded": TARGET_THROUGHPUT},
        },
        "units": {
            "mb_per_s": "10^6 bytes per second, reader side: 'go' sent -> last byte received",
            "cpu_*_s_per_gb": "server process CPU seconds (RUSAGE_SELF, all threads) per 10^9 bytes",
            "loop_delay_*_ms": "1 ms asyncio.sleep ticker lateness on the server loop during the transfer",
            "zero_copy_cold": "chunks aiosendfile sent from its cold-read pool (counters.cold)",
        },
        "machine": machine_info() | {"storage": storage},
        "targets": targets,
        "summary": summary,
    }
    return finish_samples(text, document, Sample, samples, args.json, log)


if __name__ == "__main__":
    sys.exit(main())
