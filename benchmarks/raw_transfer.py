"""Raw transfer benchmark: one large file, server to a fast local reader over TCP.

Each contender is a server-side send strategy. Every trial runs the server in a
fresh ``spawn``ed process; the reader is this (parent) process, a blocking
``recv_into`` loop with a 1 MiB buffer. Contenders are interleaved
(A B C ... A B C ... for ``--rounds`` rounds) so drift on the machine hits them
all alike. The network is loopback TCP, or (``--network veth``, root only) TCP
across a veth pair between two network namespaces made for the run and removed
after it (``benchmarks/harness/netns.py``), or (``--network unix``) a Unix stream
socket; ``--network loopback,veth,unix`` (``both`` = ``loopback,veth``)
interleaves every contender over each. The server process runs on CPU 0 and the
reader on CPU 1 (``--server-cpus``, ``--client-cpus``; ``--no-pin`` lets the
scheduler place both). The trial itself is the harness's
(``benchmarks/harness/transfer.py``); this module is its contenders, networks,
report and command line. See ``benchmarks/README.md`` for what each number means.

Run from the repository root::

    python -m benchmarks.raw_transfer           # 1 GiB, 5 rounds, loopback
    python -m benchmarks.raw_transfer --quick   # 256 MiB, 3 rounds
    python -m benchmarks.raw_transfer --size 512 --rounds 7 --json /tmp/out.json
    python -m benchmarks.raw_transfer --network both --copy-chunk 65536,262144   # as root
    python -m benchmarks.raw_transfer --no-pin  # let the scheduler place server and reader
    python -m benchmarks.raw_transfer --congestion cubic  # the server socket's TCP congestion control
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from benchmarks.harness import MiB
from benchmarks.harness.cli import comma_list
from benchmarks.harness.files import make_file, warm
from benchmarks.harness.measure import IDLE_S, TICK_S, PerfSpec
from benchmarks.harness.report import (
    cpu_model,
    document_head,
    finish_samples,
    machine_info,
    ms,
    other_load_warning,
    table,
)
from benchmarks.harness.senders import COPY_ROWS, SENDERS, THREADS, Options, unavailable
from benchmarks.harness.servers import cpu_set
from benchmarks.harness.transfer import (
    BASELINE,
    READ_BUFFER,
    Case,
    Sample,
    other_loads,
    run_rounds,
    summarize,
)

CONTENDERS = (
    "aiosendfile-uvloop",
    "aiosendfile-asyncio",
    "loop.sendfile-asyncio",
    "copy-uvloop",
    "thread-os.sendfile",
    "aiofastnet-uvloop",  # skipped, with the reason, when aiofastnet is not installed
)
NETWORKS = ("loopback", "veth", "unix")  # --network: "auto", "both" (loopback,veth) or a list of these
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "raw_transfer.json"


# ---------------------------------------------------------------------------
# Networks, report, command line
# ---------------------------------------------------------------------------


def network(opts: Options) -> str:
    """What the bytes crossed: "loopback", the veth pair of the server's namespace, or a Unix socket."""
    if opts.unix_path:
        return "a Unix stream socket"
    return f"veth ({opts.host}, server netns {opts.netns}) TCP" if opts.netns else "loopback TCP"


def placement(opts: Options) -> str:
    """Where the server and the reader ran, for the report's title."""

    def on(cpus: str | None) -> str:
        return f"CPU{'s' if len(cpu_set(cpus)) > 1 else ''} {cpus}" if cpus else "unpinned"

    if not (opts.server_cpus or opts.client_cpus):
        return "server and reader unpinned"
    return f"server on {on(opts.server_cpus)}, reader on {on(opts.client_cpus)}"


def report(summary: dict[str, dict[str, Any]], opts: Options, rounds: int, over: str | None = None) -> str:
    """The tables; *over* names the network(s) in the title (default: ``network(opts)``)."""
    main_rows, detail_rows = [], []
    algorithms = sorted({a for row in summary.values() for a in row.get("congestion", [])})
    for name, row in summary.items():
        if not row["ok"]:
            main_rows.append(
                [name, f"ERROR ({len(row['errors'])}/{row['runs']} runs failed)", "", "", "", "", ""]
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
                "n/a" if (h := row.get("host_cpu_s_per_gb_median")) is None else f"{h:.3f}",
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
                ms(row["idle_delay_p99_ms_median"]),
                ms(row["other_load_cpus_median"]),
                "n/a" if not zc else ("all" if zc == [opts.size] else "MISMATCH " + ",".join(map(str, zc))),
            ]
        )
    out = [
        f"raw_transfer: {opts.size // MiB} MiB over {over or network(opts)}, {rounds} interleaved rounds "
        f"(medians [min-max]; MB = 10^6 bytes, GB = 10^9 bytes)",
        f"CPU: {cpu_model() or 'unknown'} ({os.cpu_count()} CPUs); {placement(opts)}"
        + (f"; TCP congestion control {'/'.join(algorithms)}" if algorithms else ""),
        "",
        table(
            [
                "contender",
                "MB/s median [min-max]",
                "server CPU s/GB user+sys",
                "machine CPU s/GB",
                "loop delay worst ms",
                "p99 ms",
                f"vs {BASELINE}",
            ],
            main_rows,
        ),
        "",
        "MB/s: reader side, 'go' byte sent -> last byte received. Server CPU: the server process (all",
        "threads), RUSAGE_SELF from 'go' seen to send + drain + close done. Machine CPU: every CPU's busy",
        "time (/proc/stat: server, reader, softirq, anyone else) over the reader's window. Loop delay:",
        "1 ms sleep ticker on the server loop during the transfer; worst over all rounds, p99 = median",
        "of per-round p99s.",
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
    p.add_argument(
        "--server-cpus", default="0", help="taskset -c CPU list for the server process (default 0)"
    )
    p.add_argument("--client-cpus", default="1", help="taskset -c CPU list for the reader (default 1)")
    p.add_argument(
        "--no-pin", action="store_true", help="no pinning: let the scheduler place the server and the reader"
    )
    p.add_argument(
        "--congestion",
        default=None,
        metavar="NAME",
        help="TCP congestion control of the server's socket, e.g. cubic (default: the machine's, "
        "net.ipv4.tcp_congestion_control; with bbr and no fq qdisc TCP paces itself, loopback included)",
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
    # CONTENDERS, plus the rows only run on request (copy-asyncio, thread-copy)
    args.contenders = comma_list(p, args.contenders, (*SENDERS, *THREADS))
    args.skipped = {c: why for c in args.contenders if (why := unavailable(c))}
    args.contenders = [c for c in args.contenders if c not in args.skipped]
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
    if args.no_pin:
        args.server_cpus = args.client_cpus = None
    elif not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        print("raw_transfer: fewer than 2 CPUs to pin to: running unpinned", file=sys.stderr)
        args.server_cpus = args.client_cpus = None
    else:
        allowed = os.sched_getaffinity(0)
        for flag, cpus in (("--server-cpus", args.server_cpus), ("--client-cpus", args.client_cpus)):
            try:
                wanted = cpu_set(cpus)
            except ValueError:
                p.error(f"{flag}: not a CPU list (e.g. 0, 0,2 or 0-3): {cpus!r}")
            if not wanted <= allowed:
                p.error(f"{flag} {cpus}: this process may only use CPUs {sorted(allowed)}")
    if args.congestion is not None:
        with contextlib.suppress(OSError):
            known = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
            if args.congestion not in known:
                p.error(
                    f"--congestion: {args.congestion!r} is not one of {', '.join(known)} (modprobe tcp_NAME?)"
                )
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
        server_cpus=args.server_cpus,
        client_cpus=args.client_cpus,
        congestion=args.congestion,
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
    text += "".join(f"\nskipped {name}: {why}" for name, why in args.skipped.items())
    if args.max_other_load is not None:
        kept_noisy = [
            f"{s.contender} round {s.round}"
            for s in samples
            if not s.discarded and any(v > args.max_other_load for v in other_loads([s]))
        ]
        if kept_noisy:
            text += f"\nkept after {args.retries} retries, still over --max-other-load: "
            text += ", ".join(kept_noisy)

    document = {
        **document_head("raw_transfer", started),
        "params": {
            "size_bytes": base.size,
            "network": over,
            "networks": net,
            "rounds": args.rounds,
            "contenders": args.contenders,
            "skipped": args.skipped,  # contender -> why it could not run here
            "labels": labels,
            "server_cpus": args.server_cpus,  # None: unpinned (--no-pin)
            "client_cpus": args.client_cpus,
            "congestion": args.congestion,  # None: each socket's default (samples[].congestion says which)
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
    }
    return finish_samples(text, document, Sample, samples, args.json, log)


if __name__ == "__main__":
    from benchmarks.harness.netns import Terminated

    try:
        sys.exit(main())
    except (KeyboardInterrupt, Terminated) as exc:  # the veth pair, if any, is already removed
        print(f"\ninterrupted ({exc!r})", file=sys.stderr)
        sys.exit(128 + getattr(exc, "signum", 2))
