"""TLS static-file benchmark: wrk over HTTPS against aiosendfile's plugin and aiohttp's static.

Over TLS there is no zero-copy (no kTLS here): ``aiosendfile`` takes its
bounded fallback path (read chunks in its executor, write them to the TLS
transport). The contenders, one process each on a uvloop loop, serving a 1 MiB
file with the same server certificate (made with ``trustme`` if installed,
else ``openssl req``):

* ``aiosendfile-plugin-tls``: ``aiosendfile.aiohttp.add_static`` + ``web.run_app(ssl_context=...)``.
* ``aiohttp-static-tls``: aiohttp's ``web.static()`` + ``web.run_app(ssl_context=...)``.

Trials are ``http_static``'s (``benchmarks.harness.http_trial`` with ``scheme="https"``:
fresh server per trial, GET check of the body, 1 s wrk warm-up, ``wrk --latency``
run, /proc CPU accounting, other load, CPU pinning); wrk speaks HTTPS itself
(Debian's wrk is built with OpenSSL).

Run from the repository root::

    python -m benchmarks.tls_static --quick
    python -m benchmarks.tls_static                  # 5 s trials, 3 rounds
"""

from __future__ import annotations

import argparse
import os
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import IO, Any

from benchmarks.harness import MiB, servers
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.files import warm
from benchmarks.harness.http_trial import WARMUP_S, Context, Sample, progress_line, run_trial, summarize
from benchmarks.harness.report import finish_section, table
from benchmarks.harness.servers import Server, can_pin, ensure_tools, free_port, repo_env, tool_version

PLUGIN_TLS = "aiosendfile-plugin-tls"
CONTENDERS = (PLUGIN_TLS, "aiohttp-static-tls")
FILE = ("1MiB", "1m.bin", MiB)
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "tls_static.json"

# Both servers: python -m benchmarks.programs.aiohttp_app KIND DIR HOST PORT --cert CERT --key KEY.
TLS_APP = "benchmarks.programs.aiohttp_app"
KINDS = {PLUGIN_TLS: "plugin", "aiohttp-static-tls": "static"}


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
    """Start contender ``name`` over TLS on a free port, serving ``ctx.root``, and wait until it listens."""
    port = free_port()
    log = Path(ctx.tmp, f"server-{name}.log")
    cmd = [sys.executable, "-m", TLS_APP, KINDS[name], ctx.root, "127.0.0.1", str(port)]
    cmd += ["--cert", cert, "--key", key]
    return servers.start_server(name, cmd, port, log, cpus=ctx.server_cpus, env=repo_env())


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
        table(["server", "MB/s", "req/s", "p99 latency ms", "server CPU s/GB", "other load CPUs"], rows),
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
    wrk, _nginx = ensure_tools(False, "tls_static")
    server_cpus = client_cpus = None
    if pin and can_pin():
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
        start = partial(start_server, ctx, cert=cert, key=key)
        t_bench = time.perf_counter()
        for rnd in range(1, rounds + 1):
            for contender in rotated(contenders, rnd):
                s = run_trial(ctx, start, contender, label, name, size, rnd, scheme="https")
                samples.append(s)
                line = f"round {rnd}/{rounds}  {contender:<23} {progress_line(s)}"
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
            "wrk": tool_version([wrk, "-v"]),
            "openssl": ssl.OPENSSL_VERSION,
        },
        "summary": summary,
        "ratios": rat,
        "report": report(summary, rat, ctx, rounds),
        "samples": [asdict(s) for s in samples],
    }
    return doc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tls_static", description=__doc__.split("\n\n")[0])
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
    args.contenders = comma_list(p, args.contenders, CONTENDERS)
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
    return finish_section(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
