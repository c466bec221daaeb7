"""Django's files under each way of serving them: wrk against one Django project, interleaved.

Contenders (``benchmarks/programs/django_site.py``), each server pinned to CPU 0, wrk to CPU 1:

* ``whitenoise-gunicorn``: WSGI, gunicorn (``gthread``, 1 worker, 16 threads), WhiteNoise's
  middleware for static files, ``wsgi.file_wrapper`` (``sendfile``) for ``FileResponse``;
* ``servestatic-uvicorn``: ASGI, stock uvicorn (uvloop, httptools), ServeStatic's middleware;
* ``stock-uvicorn``: ASGI, stock uvicorn, Django's own handler (static files by
  ``django.views.static.serve``);
* ``ours``: ASGI, uvicorn with ``aiosendfile.uvicorn:HttpToolsProtocol``,
  ``aiosendfile.django.StaticFiles(get_asgi_application())``.

The project has ``startproject``'s middleware (sessions, auth, messages, CSRF, security,
clickjacking; WhiteNoise's and ServeStatic's right after ``SecurityMiddleware``, as their docs
say); ``--middleware none`` leaves only theirs.

Cases: a 4 KiB and a 1 MiB static file (``/static/...``), a 1 MiB ``FileResponse`` from a
view (``/file/...``), all in the page cache, and a sync view's 6-byte ``HttpResponse`` (``/hello``:
what the handler costs around any view). Every round starts each server once, checks each
case's body once (byte-exact), then runs ``wrk -t1 -c64`` for each case (a 1 s warm-up, then
``--duration`` s), the contender order rotating from round to round. Figures: requests per
second, the server's CPU per request (user + system of its process tree over the run) and its
peak RSS (the largest ``VmHWM`` of its processes at the end of the round); medians over the rounds,
and each contender's ratio to the best ASGI peer and to WhiteNoise under gunicorn.

``--baseline DIR`` adds ``ours-baseline``: ``ours`` importing the ``aiosendfile`` package of the
tree *DIR* (``git worktree add DIR REV``), for a change measured before and after in one run.

With ``--together`` every server is started once and kept up, and each round alternates among
them case by case (wrk windows back to back): on a machine whose speed drifts from minute to
minute, the contenders share the drift.

Run from the repository root::

    python -m benchmarks.django_files --rounds 3 --duration 5 [--together] [--middleware none]
    python -m benchmarks.django_files --together --baseline /tmp/before --contenders ours
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import servers
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.measure import process_tree, tree_cpu
from benchmarks.harness.report import cpu_model
from benchmarks.harness.wrk import parse_wrk, run_wrk, wrk_command

CONTENDERS = ("whitenoise-gunicorn", "servestatic-uvicorn", "stock-uvicorn", "ours")
#: ``--baseline DIR``'s contender: ``ours`` with the ``aiosendfile`` package of another tree.
BASELINE = "ours-baseline"
CASES = {
    "4KiB static": "/static/4k.bin",
    "1MiB static": "/static/1m.bin",
    "1MiB FileResponse": "/file/1m.bin",
    "small view": "/hello",
}
SERVER_CPU, CLIENT_CPU = "0", "1"
SITE = "benchmarks.programs.django_site"


def make_tree(root: Path) -> dict[str, bytes]:
    (root / "static").mkdir(parents=True)
    (root / "files").mkdir()
    bodies = {"/static/4k.bin": os.urandom(4096), "/static/1m.bin": os.urandom(2**20)}
    bodies["/file/1m.bin"] = bodies["/static/1m.bin"]
    bodies["/hello"] = b"hello\n"
    (root / "static" / "4k.bin").write_bytes(bodies["/static/4k.bin"])
    (root / "static" / "1m.bin").write_bytes(bodies["/static/1m.bin"])
    (root / "files" / "1m.bin").write_bytes(bodies["/file/1m.bin"])
    return bodies


def _uvicorn(work: Path, baseline: Path | None) -> list[str]:
    """The command that runs uvicorn; with *baseline*, importing that tree's ``aiosendfile`` (a
    folder holding only a link to it, first on the path: the site module stays this tree's)."""
    if baseline is None:
        return [sys.executable, "-m", "uvicorn"]
    shadow = work / "baseline-path"
    shadow.mkdir(exist_ok=True)
    link = shadow / "aiosendfile"
    if not link.exists():
        link.symlink_to((baseline / "aiosendfile").resolve())
    code = f"import sys; sys.path.insert(0, {str(shadow)!r}); from uvicorn.main import main; main()"
    return [sys.executable, "-c", code]


def start(name: str, root: Path, work: Path, middleware: str, baseline: Path | None = None) -> servers.Server:
    port = servers.free_port()
    mode = name.split("-")[0]
    env = {**servers.repo_env(), "BENCH_DJANGO_MODE": mode, "BENCH_DJANGO_ROOT": str(root)}
    env["BENCH_DJANGO_MIDDLEWARE"] = middleware
    log = work / f"{name}.log"
    if name == "whitenoise-gunicorn":
        cmd = [sys.executable, "-m", "gunicorn", f"{SITE}:wsgi", "-b", f"127.0.0.1:{port}"]
        cmd += ["-w", "1", "-k", "gthread", "--threads", "16", "--keep-alive", "75"]
        return servers.start_server(name, cmd, port, log, cpus=SERVER_CPU, env=env, processes=2)
    cmd = [*_uvicorn(work, baseline if name == BASELINE else None), f"{SITE}:asgi"]
    cmd += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--loop",
        "uvloop",
        "--lifespan",
        "off",
        "--no-access-log",
    ]
    cmd += ["--http", "aiosendfile.uvicorn:HttpToolsProtocol" if mode == "ours" else "httptools"]
    return servers.start_server(name, cmd, port, log, cpus=SERVER_CPU, env=env, reraises_stop_signal=True)


def peak_rss(pids: list[int]) -> int:
    peak = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except OSError:
            continue
    return peak


def check(port: int, target: str, body: bytes) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{target}", timeout=30) as response:
        got = response.read()
    if got != body:
        raise RuntimeError(f"{target}: {len(got)} bytes, not the file's {len(body)}")


def measure(
    server: servers.Server, case: str, bodies: dict[str, bytes], wrk: str, duration: int
) -> dict[str, Any]:
    """One case against a running server: the body checked, a 1 s warm-up, then *duration* s of
    wrk with the server's CPU over it."""
    target = CASES[case]
    check(server.port, target, bodies[target])
    url = f"http://127.0.0.1:{server.port}{target}"
    run_wrk(wrk_command(wrk, url, 1, threads=1, connections=64, cpus=CLIENT_CPU), 1)
    pids = process_tree(server.proc.pid)
    before = tree_cpu(pids)
    report = parse_wrk(
        run_wrk(wrk_command(wrk, url, duration, threads=1, connections=64, cpus=CLIENT_CPU), duration)
    )
    after = tree_cpu(pids)
    cpu = after[0] - before[0] + after[1] - before[1]
    requests = report["requests"]
    return {
        "req_s": report.get("req_per_s", requests / duration),
        "cpu_us": cpu / requests * 1e6 if requests else float("nan"),
        "errors": report["non_2xx"] + sum((report.get("socket_errors") or {}).values()),
    }


def _print(name: str, rows: dict[str, dict[str, Any]], rss: float) -> None:
    print(
        f"  {name}: "
        + "; ".join(f"{c} {r['req_s']:,.0f} req/s, {r['cpu_us']:.0f} us CPU" for c, r in rows.items())
        + f"; peak RSS {rss / 2**20:.0f} MB",
        flush=True,
    )


def one_round(
    names: list[str],
    cases: list[str],
    root: Path,
    work: Path,
    bodies: dict[str, bytes],
    wrk: str,
    args: argparse.Namespace,
) -> dict[str, dict[str, Any]]:
    """Each contender started, measured on every case, stopped, one after the other."""
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        server = start(name, root, work, args.middleware, args.baseline)
        try:
            rows = {case: measure(server, case, bodies, wrk, args.duration) for case in cases}
            rss = peak_rss(process_tree(server.proc.pid))
            for row in rows.values():
                row["rss_mb"] = rss / 2**20
            results[name] = rows
        finally:
            servers.stop_server(server)
        _print(name, rows, rss)
    return results


def rounds_together(
    names: list[str],
    cases: list[str],
    root: Path,
    work: Path,
    bodies: dict[str, bytes],
    wrk: str,
    args: argparse.Namespace,
) -> list[dict[str, dict[str, Any]]]:
    """``--together``: every contender started once and kept up (idle ones cost nothing), the
    rounds alternating among them case by case, so that a slow minute of a noisy machine falls
    on all of them; RSS is each one's peak at the end."""
    running: dict[str, servers.Server] = {}
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        for name in names:
            running[name] = start(name, root, work, args.middleware, args.baseline)
        for rnd in range(1, args.rounds + 1):
            print(f"round {rnd}", flush=True)
            results: dict[str, dict[str, Any]] = {name: {} for name in names}
            for case in cases:
                for name in rotated(names, rnd):
                    results[name][case] = measure(running[name], case, bodies, wrk, args.duration)
            for name in names:
                _print(name, results[name], peak_rss(process_tree(running[name].proc.pid)))
            rounds.append(results)
        for name in names:
            rss = peak_rss(process_tree(running[name].proc.pid))
            for results in rounds:
                for row in results[name].values():
                    row["rss_mb"] = rss / 2**20
    finally:
        for server in running.values():
            servers.stop_server(server)
    return rounds


def _ratio(rounds: list[dict[str, dict[str, Any]]], case: str, name: str, peer: str | None) -> str:
    """The median over the rounds of *name*'s req/s over *peer*'s in *case*."""
    if peer is None or peer not in rounds[0]:
        return "-"
    per_round = [r[name][case]["req_s"] / r[peer][case]["req_s"] for r in rounds]
    return f"{statistics.median(per_round):.2f}x ({peer})"


def report(rounds: list[dict[str, dict[str, Any]]], names: list[str], cases: list[str]) -> str:
    lines = []
    asgi_peers = [n for n in names if n in ("servestatic-uvicorn", "stock-uvicorn")]
    head = "| contender | req/s (range) | CPU us/request | peak RSS MB | x best ASGI peer | x WhiteNoise |"
    for case in cases:
        lines += [f"\n{case}", head, "|---|---|---|---|---|---|"]
        medians = {n: statistics.median(r[n][case]["req_s"] for r in rounds) for n in names}
        best_peer = max(asgi_peers, key=lambda n: medians[n]) if asgi_peers else None
        for n in names:
            speeds = [r[n][case]["req_s"] for r in rounds]
            cpus = [r[n][case]["cpu_us"] for r in rounds]
            rss = max(r[n][case]["rss_mb"] for r in rounds)
            spread = f"{statistics.median(speeds):,.0f} ({min(speeds):,.0f}-{max(speeds):,.0f})"
            peers = f"{_ratio(rounds, case, n, best_peer)} | {_ratio(rounds, case, n, 'whitenoise-gunicorn')}"
            lines.append(f"| {n} | {spread} | {statistics.median(cpus):.0f} | {rss:.0f} | {peers} |")
        if "ours" in names and BASELINE in names:
            speed = [r["ours"][case]["req_s"] / r[BASELINE][case]["req_s"] for r in rounds]
            cpu = [r["ours"][case]["cpu_us"] / r[BASELINE][case]["cpu_us"] for r in rounds]
            lines.append(
                f"ours / {BASELINE}: req/s {statistics.median(speed):.2f}x "
                f"({', '.join(f'{x:.2f}' for x in speed)}), CPU per request {statistics.median(cpu):.2f}x "
                f"({', '.join(f'{x:.2f}' for x in cpu)})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.django_files", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=5)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    p.add_argument("--middleware", choices=("default", "none"), default="default")
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--baseline", type=Path, help=f"a tree whose aiosendfile {BASELINE} runs (before a change)"
    )
    p.add_argument(
        "--together",
        action="store_true",
        help="start every contender once and alternate among them within each round",
    )
    args = p.parse_args(argv)
    names = comma_list(p, args.contenders, (*CONTENDERS, BASELINE))
    if args.baseline is not None and BASELINE not in names:
        names.append(BASELINE)
    if BASELINE in names and args.baseline is None:
        p.error(f"{BASELINE} needs --baseline DIR")
    cases = comma_list(p, args.cases, tuple(CASES), "cases")
    wrk = servers.ensure_tools(False, "django_files")[0]
    work = Path(tempfile.mkdtemp(prefix="aiosendfile-django-bench-"))
    rounds = []
    try:
        root = work / "site"
        bodies = make_tree(root)
        if args.together:
            rounds = rounds_together(names, cases, root, work, bodies, wrk, args)
        else:
            for rnd in range(1, args.rounds + 1):
                print(f"round {rnd}", flush=True)
                rounds.append(one_round(rotated(names, rnd), cases, root, work, bodies, wrk, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\nCPU: {cpu_model()}; wrk -t1 -c64, {args.duration} s a run, {args.rounds} rounds"
        f"{' (servers kept up together)' if args.together else ''}; middleware: {args.middleware}"
    )
    print(report(rounds, names, cases))
    if args.json:
        record = {"cpu": cpu_model(), "middleware": args.middleware, "rounds": rounds}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
