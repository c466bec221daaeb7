"""HTTP static-file benchmark: wrk against static file servers on loopback.

Contenders, each one process (one worker) serving the same temporary directory:

* ``aiosendfile-plugin``: ``python -m aiosendfile serve DIR --loop uvloop``
  (the plugin's static resource on aiohttp's low-level ``web.Server``).
* ``aiosendfile-app``: the plugin as a user mounts it, ``aiosendfile.aiohttp.static()``
  in a ``web.Application`` on uvloop: the router and signals cost per request.
* ``aiohttp-static``: aiohttp's own ``web.static()`` on a uvloop loop.
* ``aiohttp-memory``: a reference, not a file server: the files' bytes held in
  memory and answered with ``web.Response`` on uvloop. It is what aiohttp's
  own request/response machinery costs, the ceiling for any aiohttp handler.
* ``nginx``: nginx with one worker process, ``sendfile on; tcp_nopush on;``.

Files: a 4 KiB and a 1 MiB file of random bytes. Every trial
(``benchmarks.harness.http_trial``, which ``tls_static`` runs over HTTPS)
starts a fresh server, checks one plain GET for status 200 and a byte-exact
body, warms up with a 1 s wrk run, measures with ``wrk --latency`` and checks
the GET again. Trials are interleaved (each round runs every file x contender
once, the contender order rotating from round to round). By default the
servers are pinned to CPU 0 and wrk to CPU 1 with ``taskset``. See
``benchmarks/README.md``.

Run from the repository root::

    python -m benchmarks.http_static --quick
    python -m benchmarks.http_static                 # 10 s trials, 3 rounds
    python -m benchmarks.http_static --rounds 5 --connections 128 --json /tmp/out.json
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.harness import MiB, servers
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.files import warm
from benchmarks.harness.http_trial import WARMUP_S, Context, Sample, progress_line, run_trial, summarize
from benchmarks.harness.report import (
    OTHER_LOAD_WARN,
    document_head,
    finish_samples,
    machine_info,
    median_or_none,
    median_range,
    table,
)
from benchmarks.harness.servers import Server, can_pin, ensure_tools, free_port, repo_env, tool_version

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "http_static.json"

PLUGIN = "aiosendfile-plugin"
CONTENDERS = (PLUGIN, "aiosendfile-app", "aiohttp-static", "aiohttp-memory", "nginx")
# label, file name in the served directory, size in bytes
FILES = (("4KiB", "4k.bin", 4 * 1024), ("1MiB", "1m.bin", MiB))
# The project's targets: plugin / aiohttp-static on req/s (4 KiB) and MB/s (1 MiB).
TARGETS = {"4KiB": 5.0, "1MiB": 2.0}

# A static directory in a web.Application on uvloop, one process. argv: DIR HOST PORT.
# The module's static(): aiohttp's built-in handler, or the plugin as its users mount it.
_APP_SERVER = """\
import sys

import uvloop
from aiohttp import web

import {module} as static_module

directory, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
app = web.Application()
app.add_routes([static_module.static("/", directory)])
web.run_app(
    app, host=host, port=port, access_log=None, print=None, shutdown_timeout=1.0,
    loop=uvloop.new_event_loop(),
)
"""
AIOHTTP_STATIC_SERVER = _APP_SERVER.format(module="aiohttp.web")
PLUGIN_APP_SERVER = _APP_SERVER.format(module="aiosendfile.aiohttp")

# The ceiling for any handler inside aiohttp: the files' bytes in memory, answered with web.Response
# (no stat, no open, no validators). What aiohttp's own machinery costs per request.
AIOHTTP_MEMORY_SERVER = """\
import os
import sys

import uvloop
from aiohttp import web

directory, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
bodies = {}
for entry in os.scandir(directory):
    if entry.is_file():
        with open(entry.path, "rb") as f:
            bodies[entry.name] = f.read()


async def handle(request):
    body = bodies.get(request.match_info["name"])
    if body is None:
        raise web.HTTPNotFound()
    return web.Response(body=body, content_type="application/octet-stream")


app = web.Application()
app.router.add_get("/{name}", handle)
web.run_app(
    app, host=host, port=port, access_log=None, print=None, shutdown_timeout=1.0,
    loop=uvloop.new_event_loop(),
)
"""

NGINX_CONF = """\
{user}worker_processes 1;
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    # The default (1000 since nginx 1.19.10) would make wrk reconnect every
    # 1000 requests; aiohttp has no such limit.
    keepalive_requests 100000000;
    default_type application/octet-stream;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
}}
"""


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------


def start_server(ctx: Context, name: str) -> Server:
    """Start contender ``name`` on a free port, serving ``ctx.root``, and wait until it listens."""
    port = free_port()
    log = Path(ctx.tmp, f"server-{name}.log")
    if name == PLUGIN:
        cmd = [sys.executable, "-m", "aiosendfile", "serve", ctx.root, "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--loop", "uvloop", "--workers", "1"]
        return servers.start_server(name, cmd, port, log, cpus=ctx.server_cpus, env=repo_env())
    if name == "aiosendfile-app":
        cmd = [sys.executable, "-c", PLUGIN_APP_SERVER, ctx.root, "127.0.0.1", str(port)]
        return servers.start_server(name, cmd, port, log, cpus=ctx.server_cpus, env=repo_env())
    if name == "aiohttp-static":
        cmd = [sys.executable, "-c", AIOHTTP_STATIC_SERVER, ctx.root, "127.0.0.1", str(port)]
        return servers.start_server(name, cmd, port, log, cpus=ctx.server_cpus)
    if name == "aiohttp-memory":
        cmd = [sys.executable, "-c", AIOHTTP_MEMORY_SERVER, ctx.root, "127.0.0.1", str(port)]
        return servers.start_server(name, cmd, port, log, cpus=ctx.server_cpus)
    if name == "nginx":
        assert ctx.nginx is not None
        ngx = Path(ctx.tmp, "nginx")
        ngx.mkdir(exist_ok=True)
        # As root the worker would switch to "nobody", who cannot read the 0700 temp dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf = ngx / "nginx.conf"
        conf.write_text(NGINX_CONF.format(user=user, tmp=ngx, port=port, root=ctx.root))
        cmd = [ctx.nginx, "-p", str(ngx), "-c", str(conf), "-e", str(ngx / "error.log")]
        # The master accepts into its backlog before the worker exists: wait for both processes.
        # SIGQUIT is nginx's graceful stop.
        return servers.start_server(
            name,
            cmd,
            port,
            log,
            cpus=ctx.server_cpus,
            processes=2,
            stop_signal=signal.SIGQUIT,
            error_log=ngx / "error.log",
        )
    raise ValueError(name)


# ---------------------------------------------------------------------------
# Summary and report
# ---------------------------------------------------------------------------


def _by_round(samples: list[Sample], name: str, label: str, key: str) -> dict[int, float]:
    """round -> value of one (contender, file)'s kept, successful trials."""
    return {
        s.round: v
        for s in samples
        if s.ok
        and not s.discarded
        and s.contender == name
        and s.file == label
        and (v := getattr(s, key)) is not None
    }


def ratios(samples: list[Sample], contenders: list[str], labels: list[str]) -> dict[str, Any]:
    """plugin / other, on req/s (= body MB/s for a fixed file size) and server CPU per request.

    ``median`` is the ratio of the medians; ``paired`` are per-round ratios (the
    two trials of a round ran minutes apart at most, under similar machine load).
    """
    out: dict[str, Any] = {}
    if PLUGIN not in contenders:
        return out
    for label in labels:
        for other in contenders:
            if other == PLUGIN:
                continue

            entry: dict[str, Any] = {}
            for key in ("req_per_s", "server_cpu_us_per_req"):
                mine = _by_round(samples, PLUGIN, label, key)
                theirs = _by_round(samples, other, label, key)
                if not mine or not theirs:
                    continue
                paired = [mine[r] / theirs[r] for r in sorted(mine.keys() & theirs.keys()) if theirs[r]]
                entry[key] = {
                    "median": statistics.median(mine.values()) / statistics.median(theirs.values()),
                    "paired": paired,
                    "paired_median": median_or_none(paired),
                }
            if other == "aiohttp-static" and label in TARGETS and "req_per_s" in entry:
                entry["target"] = TARGETS[label]
                entry["meets_target"] = entry["req_per_s"]["median"] >= TARGETS[label]
            out.setdefault(label, {})[other] = entry
    return out


def _num(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "n/a" if value is None else f"{value:{fmt}}"


def _nonzero(summary: dict[str, Any], key: str) -> list[str]:
    """``"contender file: N"`` for each summary row whose count ``key`` is not 0."""
    return [
        f"{name} {label}: {row[key]}"
        for label, by_name in summary.items()
        for name, row in by_name.items()
        if row[key]
    ]


def report(summary: dict[str, Any], rat: dict[str, Any], ctx: Context, rounds: int) -> str:
    rows = []
    for label, by_name in summary.items():
        for name, row in by_name.items():
            tag = name + (f" ({row['runs'] - row['ok']} failed)" if row["ok"] < row["runs"] else "")
            if not row["ok"]:
                rows.append([tag, label, "ERROR", "", "", "", "", "", "", "", ""])
                continue
            rows.append(
                [
                    tag,
                    label,
                    median_range(row, "req_per_s", ".0f"),
                    median_range(row, "mb_per_s", ".1f"),
                    _num(row, "latency_p50_ms_median", ".2f"),
                    _num(row, "latency_p99_ms_median", ".2f")
                    + " / "
                    + _num(row, "latency_p99_ms_max", ".2f"),
                    _num(row, "server_cpu_us_per_req_median", ".1f"),
                    _num(row, "server_cpu_s_per_gb_median", ".2f"),
                    _num(row, "server_cpus_busy_median", ".2f"),
                    _num(row, "wrk_cpus_busy_median", ".2f"),
                    _num(row, "other_load_cpus_median", ".2f"),
                ]
            )
    pin = (
        f"servers on CPU {ctx.server_cpus}, wrk on CPU {ctx.client_cpus}"
        if ctx.server_cpus or ctx.client_cpus
        else "no CPU pinning"
    )
    out = [
        f"http_static: wrk -t {ctx.threads} -c {ctx.connections} -d {ctx.duration}s, {rounds} interleaved "
        f"rounds, {pin} (medians [min-max]; MB = 10^6 bytes)",
        "",
        table(
            [
                "contender",
                "file",
                "req/s",
                "MB/s (body)",
                "p50 ms",
                "p99 ms med/max",
                "CPU us/req",
                "CPU s/GB",
                "server CPUs",
                "wrk CPUs",
                "other load",
            ],
            rows,
        ),
        "",
        "MB/s: body bytes (req/s x file size). p99: median over rounds / worst round. CPU: the server's",
        "process tree (utime+stime from /proc/PID/stat) over the wrk run, per request and per 10^9 body",
        "bytes. server CPUs, wrk CPUs: CPU seconds / wall seconds; 1.00 = that side's pinned core is",
        "saturated, so it is the limit.",
        "Other load: CPUs' worth of busy time on the machine (/proc/stat) that was neither server nor wrk.",
        "p99 and max include each run's connection ramp-up (see benchmarks/README.md, caveats).",
    ]
    ratio_rows = []
    for label, by_other in rat.items():
        for other, entry in by_other.items():
            rps, cpu = entry.get("req_per_s"), entry.get("server_cpu_us_per_req")
            if rps is None:
                continue
            paired = rps["paired"]
            target = ""
            if "target" in entry:
                target = f">= {entry['target']:.0f}x: " + ("met" if entry["meets_target"] else "NOT MET")
            ratio_rows.append(
                [
                    f"{PLUGIN} / {other}",
                    label,
                    f"{rps['median']:.2f}x",
                    f"{min(paired):.2f}-{max(paired):.2f}" if paired else "n/a",
                    "n/a" if cpu is None else f"{cpu['median']:.2f}x",
                    target,
                ]
            )
    if ratio_rows:
        out += [
            "",
            table(
                [
                    "ratio",
                    "file",
                    "req/s = MB/s",
                    "per-round range",
                    "CPU us/req",
                    "target",
                ],
                ratio_rows,
            ),
            "",
            "req/s = MB/s: ratio of the medians (for one file size the req/s and MB/s ratios are the same).",
            "CPU us/req: the plugin's server CPU per request / the other's (below 1: the plugin is cheaper).",
        ]
    errors = [
        f"  {name} {label}: {err}"
        for label, by_name in summary.items()
        for name, row in by_name.items()
        for err in row["errors"]
    ]
    if errors:
        out += ["", "FAILED TRIALS:", *errors]
    if sock_errs := _nonzero(summary, "socket_errors_total"):
        out += ["", "wrk socket errors (connect/read/write/timeout, all rounds): " + ", ".join(sock_errs)]
    if unclean := _nonzero(summary, "unclean_server_exits"):
        out += ["", "servers that did not exit with status 0 on the clean stop: " + ", ".join(unclean)]
    loads = [
        v
        for by_name in summary.values()
        for row in by_name.values()
        if (v := row.get("other_load_cpus_median")) is not None
    ]
    if loads and max(loads) > OTHER_LOAD_WARN:
        out += [
            "",
            f"WARNING: a median of up to {max(loads):.2f} CPUs of other load on this machine during the",
            "trials (other_load_cpus in the JSON samples): these numbers are not from a quiet machine.",
        ]
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.http_static", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="3 s trials, 2 rounds: a smoke run (about a minute)")
    p.add_argument("--duration", type=int, default=None, help="seconds per wrk trial (default 10; 3 --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 2 with --quick)")
    p.add_argument("--connections", type=int, default=64, help="wrk -c (default 64)")
    p.add_argument("--threads", type=int, default=2, help="wrk -t (default 2)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma-separated subset, in run order (default: all)",
    )
    p.add_argument(
        "--files", default=",".join(f[0] for f in FILES), help="comma-separated subset of 4KiB,1MiB"
    )
    p.add_argument("--server-cpus", default="0", help="taskset CPU list for the servers (default 0)")
    p.add_argument("--client-cpus", default="1", help="taskset CPU list for wrk (default 1)")
    p.add_argument("--no-pin", action="store_true", help="no taskset: let the scheduler place everything")
    p.add_argument(
        "--max-other-load",
        type=float,
        default=None,
        metavar="CPUS",
        help="re-run a trial during which other processes used more than CPUS of CPU (default: keep all)",
    )
    p.add_argument("--retries", type=int, default=3, help="re-runs per trial with --max-other-load")
    p.add_argument(
        "--dir", default=None, help="where to create the temporary directory (default: system temp)"
    )
    args = p.parse_args(argv)
    args.duration = args.duration if args.duration is not None else (3 if args.quick else 10)
    args.rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    args.contenders = comma_list(p, args.contenders, CONTENDERS)
    args.files = comma_list(p, args.files, (f[0] for f in FILES), "files")
    if args.duration < 1 or args.rounds < 1 or args.threads < 1 or args.connections < args.threads:
        p.error("--duration, --rounds and --threads must be >= 1, and --connections >= --threads")
    if args.no_pin:
        args.server_cpus = args.client_cpus = None
    elif not can_pin():
        print("http_static: no taskset or fewer than 2 CPUs: running unpinned", file=sys.stderr)
        args.server_cpus = args.client_cpus = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = sys.stderr
    wrk, nginx = ensure_tools("nginx" in args.contenders, "http_static")
    started = datetime.now(timezone.utc)
    files = [f for f in FILES if f[0] in args.files]
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="aiosendfile-http-", dir=args.dir) as tmp:
        root = Path(tmp, "www")
        root.mkdir()
        bodies = {}
        for _label, name, size in files:
            bodies[name] = os.urandom(size)
            (root / name).write_bytes(bodies[name])
            warm(str(root / name))
        ctx = Context(
            root=str(root),
            tmp=tmp,
            wrk=wrk,
            nginx=nginx,
            threads=args.threads,
            connections=args.connections,
            duration=args.duration,
            server_cpus=args.server_cpus,
            client_cpus=args.client_cpus,
            bodies=bodies,
        )
        start = partial(start_server, ctx)
        print(
            f"{args.rounds} rounds x {len(files)} files x {len(args.contenders)} contenders, "
            f"{args.duration} s + {WARMUP_S} s warm-up per trial; example: "
            + " ".join(ctx.wrk_command("http://127.0.0.1:PORT/FILE", args.duration)),
            file=log,
            flush=True,
        )
        t_bench = time.perf_counter()
        for rnd in range(1, args.rounds + 1):
            for label, name, size in files:
                for contender in rotated(args.contenders, rnd):
                    for attempt in range(args.retries + 1):
                        s = run_trial(ctx, start, contender, label, name, size, rnd)
                        samples.append(s)
                        noisy = (
                            args.max_other_load is not None
                            and s.other_load_cpus is not None
                            and s.other_load_cpus > args.max_other_load
                        )
                        if noisy and attempt < args.retries:
                            s.discarded = True
                        print(
                            f"round {rnd}/{args.rounds}  {label:<5} {contender:<19} {progress_line(s)}",
                            file=log,
                            flush=True,
                        )
                        if not s.discarded:
                            break
                        time.sleep(2 * (attempt + 1))  # let a burst of other load pass
        elapsed = time.perf_counter() - t_bench

    labels = [f[0] for f in files]
    summary = summarize(samples, args.contenders, labels)
    rat = ratios(samples, args.contenders, labels)
    text = report(summary, rat, ctx, args.rounds) + f"\n\n({len(samples)} trials in {elapsed:.0f} s)"

    machine = machine_info()
    machine["tools"] = {
        "wrk": tool_version([wrk, "-v"]),
        "nginx": tool_version([nginx, "-v"]) if nginx else None,
    }
    document = {
        **document_head("http_static", started),
        "params": {
            "rounds": args.rounds,
            "duration_s": args.duration,
            "warmup_s": WARMUP_S,
            "threads": args.threads,
            "connections": args.connections,
            "contenders": args.contenders,
            "files": {label: size for label, _name, size in files},
            "server_cpus": args.server_cpus,
            "client_cpus": args.client_cpus,
            "max_other_load": args.max_other_load,
            "retries": args.retries,
            "wrk_command": ctx.wrk_command("URL", args.duration),
            "aiohttp_static_server": AIOHTTP_STATIC_SERVER,
            "nginx_conf": NGINX_CONF,
            "elapsed_s": elapsed,
        },
        "units": {
            "req_per_s": "wrk Requests/sec",
            "mb_per_s": "body bytes per second / 10^6 (req/s x file size)",
            "wire_mb_per_s": "wrk Transfer/sec (headers included; wrk's binary MB) / 10^6",
            "latency_*_ms": "wrk latency distribution, milliseconds",
            "server_cpu_*": "server process tree utime+stime (/proc/PID/stat) over the wrk run",
            "other_load_cpus": "whole-machine busy CPU (/proc/stat) not from the server or wrk, / wall time",
        },
        "machine": machine,
        "summary": summary,
        "ratios": rat,
    }
    return finish_samples(text, document, Sample, samples, args.json, log)


if __name__ == "__main__":
    sys.exit(main())
