"""TLS static-file benchmark: wrk over HTTPS against aiosendfile's plugin and aiohttp's static.

Over TLS there is no zero-copy (no kTLS here): ``aiosendfile`` takes its
bounded fallback path (read chunks in its executor, write them to the TLS
transport). The contenders, one process each on a uvloop loop, serving a 1 MiB
file with the same server certificate (made with ``trustme`` if installed,
else ``openssl req``):

* ``aiosendfile-plugin-tls``: ``aiosendfile.aiohttp.add_static`` + ``web.run_app(ssl_context=...)``.
* ``aiohttp-static-tls``: aiohttp's ``web.static()`` + ``web.run_app(ssl_context=...)``.

Trials reuse ``http_static``'s machinery (fresh server per trial, GET check
of the body, 1 s wrk warm-up, ``wrk --latency`` run, /proc CPU accounting,
other load, CPU pinning); wrk speaks HTTPS itself (Debian's wrk is built with OpenSSL).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

if not __package__:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.http_static import (
    REPO,
    WARMUP_S,
    Context,
    Sample,
    Server,
    TrialError,
    _free_port,
    _log_tail,
    _pin_prefix,
    _process_tree,
    _progress,
    _run_wrk,
    _tool_version,
    _tree_cpu,
    _wait_listening,
    ensure_tools,
    parse_wrk,
    stop_server,
    summarize,
)
from benchmarks.raw_transfer import (
    _CLK_TCK,
    GB,
    MB,
    MiB,
    _host_cpu,
    _json_default,
    _table,
    machine_info,
    warm,
)

PLUGIN_TLS = "aiosendfile-plugin-tls"
CONTENDERS = (PLUGIN_TLS, "aiohttp-static-tls")
FILE = ("1MiB", "1m.bin", MiB)
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "tls_static.json"

# argv: KIND DIR HOST PORT CERT KEY
TLS_SERVER = """\
import ssl
import sys

import uvloop
from aiohttp import web

kind, directory, host, port, cert, key = sys.argv[1:7]
app = web.Application()
if kind == "plugin":
    from aiosendfile.aiohttp import add_static

    add_static(app.router, "/", directory)
else:
    app.add_routes([web.static("/", directory)])
ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(cert, key)
web.run_app(
    app, host=host, port=int(port), ssl_context=ctx, access_log=None, print=None,
    shutdown_timeout=1.0, loop=uvloop.new_event_loop(),
)
"""


def make_cert(directory: str) -> tuple[str, str]:
    """A self-signed server certificate for 127.0.0.1: (cert file, key file)."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    try:
        import trustme

        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        leaf.private_key_and_cert_chain_pem.write_to_path(cert)
        leaf.private_key_pem.write_to_path(key)
    except ImportError:
        openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        subj = ["-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert]
        subprocess.run([*openssl, *subj], check=True, capture_output=True)
    return cert, key


def start_server(ctx: Context, name: str, cert: str, key: str) -> Server:
    port = _free_port()
    log = Path(ctx.tmp, f"server-{name}.log")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    kind = "plugin" if name == PLUGIN_TLS else "aiohttp"
    cmd = [sys.executable, "-c", TLS_SERVER, kind, ctx.root, "127.0.0.1", str(port), cert, key]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*_pin_prefix(ctx.server_cpus), *cmd],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        )
    server = Server(name, proc, port, log)
    try:
        _wait_listening(server)
        server.pids = _process_tree(proc.pid)
    except BaseException:
        stop_server(server)
        raise
    return server


def verify_tls(url: str, expected: bytes) -> None:
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=10, context=insecure) as resp:
            status, body = resp.status, resp.read()
    except OSError as exc:
        raise TrialError(f"GET {url}: {exc!r}") from exc
    if status != 200 or body != expected:
        raise TrialError(f"GET {url}: HTTP {status}, {len(body)} bytes, byte-exact: {body == expected}")


def run_trial(ctx: Context, contender: str, rnd: int, cert: str, key: str) -> Sample:
    label, name, size = FILE
    sample = Sample(contender=contender, file=label, size=size, round=rnd)
    server: Server | None = None
    try:
        server = start_server(ctx, contender, cert, key)
        sample.server_pids = server.pids
        url = f"https://127.0.0.1:{server.port}/{name}"
        verify_tls(url, ctx.bodies[name])
        _run_wrk(ctx, url, WARMUP_S)
        u0, h0 = _tree_cpu(server.pids), _host_cpu()
        c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        text = _run_wrk(ctx, url, ctx.duration)
        t1 = time.perf_counter()
        c1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        u1, h1 = _tree_cpu(server.pids), _host_cpu()
        sample.wrk_output = text
        if server.proc.poll() is not None:
            raise TrialError(f"{contender} died during the wrk run (status {server.proc.returncode})")
        verify_tls(url, ctx.bodies[name])
        parsed = parse_wrk(text)
    except TrialError as exc:
        sample.error = str(exc) + (_log_tail(server) if server else "")
        return sample
    finally:
        if server is not None:
            sample.server_exit = stop_server(server)
    for k, v in parsed.items():
        if hasattr(sample, k):
            setattr(sample, k, v)
    if sample.non_2xx or not sample.requests or not sample.duration_s:
        sample.error = f"wrk: {sample.requests} requests, {sample.non_2xx} non-2xx"
        return sample
    sample.req_per_s = sample.req_per_s or sample.requests / sample.duration_s
    sample.mb_per_s = sample.req_per_s * size / MB
    sample.wall_s = t1 - t0
    sample.server_cpu_user_s, sample.server_cpu_sys_s = u1[0] - u0[0], u1[1] - u0[1]
    cpu = sample.server_cpu_s = sample.server_cpu_user_s + sample.server_cpu_sys_s
    sample.server_cpu_us_per_req = cpu / sample.requests * 1e6
    sample.server_cpu_s_per_gb = cpu / (sample.requests * size) * GB
    sample.server_cpus_busy = cpu / sample.wall_s
    sample.wrk_cpu_s = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    sample.wrk_cpus_busy = sample.wrk_cpu_s / sample.wall_s
    self_cpu = (s1.ru_utime - s0.ru_utime) + (s1.ru_stime - s0.ru_stime)
    sample.host_busy_s, sample.host_steal_s = h1[0] - h0[0], h1[1] - h0[1]
    sample.other_cpu_s = sample.host_busy_s - cpu - sample.wrk_cpu_s - self_cpu
    slack = 2 * (os.cpu_count() or 1) / _CLK_TCK
    sample.other_load_cpus = max(0.0, sample.other_cpu_s - slack) / sample.wall_s
    sample.ok = True
    return sample


def _ratios(rows: dict[str, Any], samples: list[Sample]) -> dict[str, Any]:
    a, b = rows.get(PLUGIN_TLS, {}), rows.get("aiohttp-static-tls", {})
    if "mb_per_s_median" not in a or "mb_per_s_median" not in b:
        return {}
    by_round = {
        name: {s.round: s.mb_per_s for s in samples if s.ok and s.contender == name and s.mb_per_s}
        for name in CONTENDERS
    }
    mine, theirs = by_round[PLUGIN_TLS], by_round["aiohttp-static-tls"]
    return {
        "mb_per_s": a["mb_per_s_median"] / b["mb_per_s_median"],
        "mb_per_s_paired": [mine[r] / theirs[r] for r in sorted(mine.keys() & theirs.keys())],
        "server_cpu_s_per_gb": a["server_cpu_s_per_gb_median"] / b["server_cpu_s_per_gb_median"],
    }


def report(summary: dict[str, Any], rat: dict[str, Any], ctx: Context, rounds: int) -> str:
    rows = []
    for contender, r in summary[FILE[0]].items():
        if not r.get("ok"):
            rows.append([contender, f"ERROR ({len(r.get('errors', []))}/{r.get('runs')})", "", "", "", ""])
            continue
        rows.append(
            [
                contender,
                f"{r['mb_per_s_median']:.0f} [{r['mb_per_s_min']:.0f}-{r['mb_per_s_max']:.0f}]",
                f"{r['req_per_s_median']:.0f}",
                f"{r['latency_p99_ms_median']:.1f}",
                f"{r['server_cpu_s_per_gb_median']:.3f}",
                f"{r['other_load_cpus_median']:.2f}"
                if r.get("other_load_cpus_median") is not None
                else "n/a",
            ]
        )
    out = [
        f"tls_static: wrk over HTTPS, 1 MiB file, {ctx.connections} connections, {ctx.duration} s trials, "
        f"{rounds} interleaved rounds (medians [min-max])",
        "",
        _table(["server", "MB/s", "req/s", "p99 latency ms", "server CPU s/GB", "other load CPUs"], rows),
    ]
    if rat:
        out += [
            "",
            f"{PLUGIN_TLS} / aiohttp-static-tls: MB/s x{rat['mb_per_s']:.2f} (ratio of medians; per round "
            + ", ".join(f"{v:.2f}" for v in rat["mb_per_s_paired"])
            + f"), server CPU per GB x{rat['server_cpu_s_per_gb']:.2f}",
        ]
    return "\n".join(out)


def run(
    duration: int,
    rounds: int,
    contenders: list[str],
    *,
    connections: int = 16,
    threads: int = 1,
    pin: bool = True,
    directory: str | None = None,
    log: IO[str] = sys.stderr,
    progress: Any = None,
) -> dict[str, Any]:
    wrk, _nginx = ensure_tools(False)
    server_cpus = client_cpus = None
    if pin and shutil.which("taskset") and len(os.sched_getaffinity(0)) >= 2:
        server_cpus, client_cpus = "0", "1"
    started = datetime.now(timezone.utc)
    samples: list[Sample] = []
    label, name, size = FILE
    with tempfile.TemporaryDirectory(prefix="aiosendfile-tls-", dir=directory) as tmp:
        root = Path(tmp, "www")
        root.mkdir()
        body = os.urandom(size)
        (root / name).write_bytes(body)
        warm(str(root / name))
        cert, key = make_cert(tmp)
        ctx = Context(
            root=str(root),
            tmp=tmp,
            wrk=wrk,
            nginx=None,
            threads=threads,
            connections=connections,
            duration=duration,
            server_cpus=server_cpus,
            client_cpus=client_cpus,
            bodies={name: body},
        )
        t_bench = time.perf_counter()
        for rnd in range(1, rounds + 1):
            shift = (rnd - 1) % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                s = run_trial(ctx, contender, rnd, cert, key)
                samples.append(s)
                line = f"round {rnd}/{rounds}  {contender:<23} {_progress(s)}"
                if progress is not None:
                    progress(line)
                else:
                    print(line, file=log, flush=True)
        elapsed = time.perf_counter() - t_bench
    summary = summarize(samples, contenders, [label])
    rat = _ratios(summary[label], samples)
    doc = {
        "benchmark": "tls_static",
        "date": started.isoformat(timespec="seconds"),
        "params": {
            "file_bytes": size,
            "rounds": rounds,
            "duration_s": duration,
            "warmup_s": WARMUP_S,
            "connections": connections,
            "threads": threads,
            "server_cpus": server_cpus,
            "client_cpus": client_cpus,
            "contenders": contenders,
            "elapsed_s": elapsed,
            "wrk": _tool_version([wrk, "-v"]),
            "openssl": ssl.OPENSSL_VERSION,
        },
        "summary": summary,
        "ratios": rat,
        "report": report(summary, rat, ctx, rounds),
        "samples": [asdict(s) for s in samples],
    }
    return doc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python benchmarks/tls_static.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 s trials, 1 round")
    p.add_argument("--duration", type=int, default=None, help="seconds per wrk trial (default 5; 2 --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument("--connections", type=int, default=16, help="wrk -c (default 16)")
    p.add_argument("--threads", type=int, default=1, help="wrk -t (default 1)")
    p.add_argument(
        "--no-pin", action="store_true", help="no taskset pinning (default: server CPU 0, wrk CPU 1)"
    )
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    args.duration = args.duration or (2 if args.quick else 5)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if unknown := set(args.contenders) - set(CONTENDERS):
        p.error(f"unknown contenders {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = run(
        args.duration,
        args.rounds,
        args.contenders,
        connections=args.connections,
        threads=args.threads,
        pin=not args.no_pin,
        directory=args.dir,
    )
    print(doc["report"])
    doc["machine"] = machine_info()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2, default=_json_default) + "\n")
    print(f"results: {args.json}", file=sys.stderr)
    return 0 if all(s["ok"] for s in doc["samples"]) else 1


if __name__ == "__main__":
    sys.exit(main())
