"""HTTP static-file benchmark: wrk against static file servers on loopback, one interleaved run.

Contenders, each serving the same temporary directory:

* ``serve``: the serve command, ``python -m aiosendfile serve DIR --workers N``
  (whatever engine it runs; its default loop).
* ``nginx``: nginx with ``worker_processes N``, ``sendfile on; tcp_nopush on;``.
* ``caddy``: ``caddy file-server --root DIR --listen HOST:PORT`` (skipped, with the
  reason, when caddy is missing and cannot be installed).
* ``http.server``: ``python -m http.server``, the standard library's (HTTP/1.0, a thread
  per connection).
* ``aiohttp-static``: aiohttp's own ``app.router.add_static`` in a ``web.Application`` on uvloop.
* ``aiosendfile-app``: the plugin as a user mounts it, ``aiosendfile.aiohttp.add_static``
  in a ``web.Application`` on uvloop: the router and signals cost per request.
* ``aiohttp-memory`` (not run by default): a reference, not a file server: the files' bytes
  held in memory and answered with ``web.Response``; what aiohttp's machinery costs.
* ``py-floor`` and ``py-floor+probe`` (not run by default): references, not file servers: the least a
  Python server on uvloop spends per request (``benchmarks.programs.floor_server``: its own
  sockets, ``open``, ``fstat``, ``sendfile``, nothing else), without and with ``serve``'s
  page-cache probe. What Python can reach against nginx on the machine at hand.
* The ASGI rows (issue #16; not run by default, ``--asgi`` runs them with nginx), named
  ``SERVER/APP``. Servers: ``uvicorn`` (stock: uvloop, httptools), ``uvicorn+asf`` (the same
  with ``--http aiosendfile.uvicorn:HttpToolsProtocol``), ``granian`` (``--interface asgi``, one
  worker, one runtime thread, uvloop). Apps (``benchmarks/asgi_apps.py``): ``starlette``
  (Starlette's ``StaticFiles`` mounted in a Starlette app), ``fastapi`` (the same in a FastAPI
  app), ``asf.asgi`` (``aiosendfile.asgi.StaticFiles`` mounted in a Starlette app); and, asked
  for by name, ``memory`` (a bare ASGI app answering from bytes in memory: the server's own cost).

The grid: sets ``4KiB`` and ``1MiB`` (one file each, in the page cache) and ``mixed``
(10,000 files of log-normal sizes from 1 KiB to 1 MiB, fixed seed, requested in a seeded
random order by a wrk Lua script, page cache evicted before every measured run), each at
every ``--connections`` (wrk ``-t1 -cN``). Two more sets, with one worker at the first
connection count only:

* ``probe`` (issue #24, "another client's latency under load"): wrk loads the mixed set,
  cold, as above, while a separate client process (``benchmarks.programs.hot_probe``, stdlib
  only, pinned to wrk's CPU) GETs a hot 1 KiB file every 10 ms over one keep-alive HTTP/1.1
  connection and times each request; the report gives its p50, p99 and max beside the wrk
  figures of the same trial, and each contender's probe p99 over nginx's.
* ``4KiB-tls`` and ``1MiB-tls`` (issue #24): the single files over HTTPS, ``serve --tls-cert
  --tls-key`` against nginx ``listen ... ssl`` with the same self-signed certificate and key
  (``tls_static.make_cert``); with them (issue #25), when named or with ``--asgi``, uvicorn over
  HTTPS (``--ssl-certfile``/``--ssl-keyfile``): ``uvicorn+asf/asf.asgi`` (aiosendfile's uvicorn
  protocol and ``aiosendfile.asgi.StaticFiles``) and stock ``uvicorn/starlette``.
* ``4KiB-close`` (issue #53): the 4 KiB file, one request per connection (``wrk -H "Connection:
  close"``): the cost of accepting, setting up and closing a connection. ``4KiB-tls-close``: the
  same over HTTPS, a full handshake a connection (wrk resumes no session), ``serve`` and nginx.
* ``4KiB-browser``: the 4 KiB file asked with a browser's fields (Firefox's ``Accept-Encoding``,
  ``Accept``, ``Accept-Language``, ``User-Agent``): every browser's request names the encodings
  it takes, which a server with pre-compressed siblings reads.
* ``probe-slow`` (issue #53): the ``probe`` set on a slow disk. The server runs in a cgroup that
  holds its reads of the disk under the set to ``--slow-read-iops`` a second (default 200:
  ``benchmarks.harness.throttle``; root and a blkio or io controller, else the set is skipped with
  the reason); wrk and the probe wait up to 60 s for an answer. Whether one client's cold files
  hold up another's hot one: the case for ``nginx-aio`` (nginx with ``aio threads``) beside nginx.

Then the ``--workers 2`` cases: ``serve --workers 2`` against nginx with ``worker_processes 2``
on the plain sets at the first connection count, the servers on both CPUs (wrk shares one of them).

Every trial (``benchmarks.harness.http_trial``, which ``tls_static`` runs over HTTPS)
starts a fresh server, checks one plain GET for status 200 and a byte-exact body, warms up
with a 1 s wrk run, measures with ``wrk --latency`` and checks the GET again. Trials are
interleaved: each round runs every case x contender once, the contender order rotating from
round to round. Servers are pinned to CPU 0 and wrk to CPU 1 with ``taskset``. See
``benchmarks/README.md``.

This module is the grid, the run and the JSON. The contenders and how each is started are
``benchmarks.http_contenders`` (the aiohttp ones run ``benchmarks.programs.aiohttp_app``), the
ratios and tables ``benchmarks.http_report``, the issues' targets ``benchmarks.http_targets``.

Run from the repository root::

    python -m benchmarks.http_static --quick         # smoke run, under 2 minutes
    python -m benchmarks.http_static                 # the full grid: 10 s trials, 3 rounds
    python -m benchmarks.http_static --rounds 3 --duration 5 --json /tmp/out.json
    python -m benchmarks.http_static --sets 4KiB,1MiB --connections 64 --workers 1
    python -m benchmarks.http_static --asgi          # the ASGI rows and nginx: 4KiB, 1MiB at 64 connections
    python -m benchmarks.http_static --sets probe --contenders serve,nginx --workers 1
    python -m benchmarks.http_static --sets probe-slow --contenders serve,nginx,nginx-aio --workers 1
    python -m benchmarks.http_static --sets 4KiB-tls,1MiB-tls --workers 1
    python -m benchmarks.http_static --sets 4KiB-tls,1MiB-tls --workers 1 \
        --contenders serve,nginx,uvicorn+asf/asf.asgi,uvicorn/starlette
"""

from __future__ import annotations

import argparse
import os
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from benchmarks.asgi_apps import ROOT_ENV
from benchmarks.harness import MiB, TrialError
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.files import cold_read_us, evict_files, make_mixed_set, mixed_sizes, warm
from benchmarks.harness.http_trial import WARMUP_S, Context, Sample, progress_line, run_trial, summarize
from benchmarks.harness.probe import PROBE_PROGRAM, ProbeSpec
from benchmarks.harness.report import document_head, finish_samples, machine_info
from benchmarks.harness.servers import can_pin, ensure_caddy, ensure_tools, raise_nofile, tool_version
from benchmarks.harness.throttle import ReadThrottle, read_throttle
from benchmarks.harness.wrk import paths_script
from benchmarks.http_contenders import (
    AIOHTTP_APP_SOURCE,
    ALIASES,
    ASGI_APPS_SOURCE,
    ASGI_CONTENDERS,
    BASE,
    BEFORE_SUFFIX,
    CONTENDERS,
    DEFAULT_CONTENDERS,
    MULTI_WORKER,
    NGINX_AIO,
    NGINX_CONF,
    NGINX_TLS,
    SINGLE_FILE_ONLY,
    TLS_CONTENDERS,
    asgi_command,
    asgi_versions,
    is_asgi,
    start_server,
)
from benchmarks.http_report import pair_ratios, probe_ratios, ratios, report
from benchmarks.tls_static import make_cert

# What suite.py and others take from here, the contenders' names included.
__all__ = [
    "CONTENDERS",
    "DEFAULT_CONTENDERS",
    "DEFAULT_JSON",
    "FILES",
    "MIXED",
    "PROBE",
    "SETS",
    "TLS_SETS",
    "Case",
    "FileSet",
    "main",
    "make_sets",
    "parse_args",
    "plan",
]

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "http_static.json"

# label, file name in the served directory, size in bytes
FILES = (("4KiB", "4k.bin", 4 * 1024), ("1MiB", "1m.bin", MiB))
MIXED = "mixed"
# The mixed set, cold, with the hot-file probe beside wrk (one worker, first --connections).
PROBE = "probe"
# The single files over HTTPS, serve and nginx only (one worker, first --connections): label -> file label.
TLS_SETS = {f"{f[0]}-tls": f[0] for f in FILES}
# The 4 KiB file over HTTPS with a new connection (a full handshake) for every request.
TLS_CLOSE = "4KiB-tls-close"
TLS_SETS[TLS_CLOSE] = "4KiB"
# The 4 KiB file with a new connection for every request (wrk -H "Connection: close"): what a
# connection's set-up and close cost (health checks, scripts, every browser's first request).
CLOSE = "4KiB-close"
# The 4 KiB file asked as a browser asks (wrk -H with Firefox's fields): Accept-Encoding in every
# request, which a server with pre-compressed siblings must read (serve, nginx's gzip_static).
BROWSER = "4KiB-browser"
BROWSER_FIELDS = (
    "Accept: */*",
    "Accept-Encoding: gzip, deflate, br, zstd",
    "Accept-Language: en-US,en;q=0.5",
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
)
# The probe set with the server's disk reads throttled (a slow device): --slow-read-iops.
SLOW = "probe-slow"
SLOW_READ_IOPS = 200
SLOW_TIMEOUT_S = 60  # wrk's and the probe's wait for one answer on the slow disk
SETS = (*(f[0] for f in FILES), MIXED, PROBE, *TLS_SETS, CLOSE, BROWSER, SLOW)
# Run with one worker at the first connection count only:
ONE_CASE_SETS = (PROBE, *TLS_SETS, CLOSE, BROWSER, SLOW)
PROBE_SETS = (PROBE, SLOW)  # the mixed set, cold, with the hot-file probe beside wrk
HOT_NAME, HOT_SIZE = "hot.bin", 1024  # the probe's file, kept in the page cache
PROBE_INTERVAL_MS = 10.0
MIXED_SEED = 15
# Log-normal sizes: median 16 KiB, sigma 1.3 (ln), clamped to 1 KiB - 1 MiB: mostly small
# files with a long tail, about 37 KiB on average (about 370 MB for 10,000 files).
MIXED_MEDIAN, MIXED_SIGMA, MIXED_LOW, MIXED_HIGH = 16 * 1024, 1.3, 1024, MiB
NOFILE = 65536  # wanted soft RLIMIT_NOFILE: 1,024 connections on each side, plus files


@dataclass(frozen=True)
class Case:
    """One cell of the grid: a file set at a connection count with N server workers."""

    set: str
    connections: int
    workers: int = 1

    @property
    def label(self) -> str:
        return f"{self.set} c{self.connections}" + (f" w{self.workers}" if self.workers > 1 else "")


@dataclass
class FileSet:
    """What a trial of one set requests: the verify path, the body size per request, the wrk script."""

    label: str
    path: str  # the GET the trial checks (and wrk's URL path without a script), without the leading /
    size: float  # body bytes per request (the mean file size for the mixed set)
    script: str | None = None
    files: list[str] | None = None  # the mixed set's files on disk (evicted before each run)
    scheme: str = "http"  # "https": the *-tls sets
    headers: tuple[str, ...] = ()  # more request fields (the 4KiB-close set's Connection: close)
    probe: ProbeSpec | None = None  # the probe sets: the hot-file probe beside wrk
    slow: bool = False  # the probe-slow set: the server's disk reads throttled


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def _ints(p: argparse.ArgumentParser, value: str, what: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        p.error(f"{what}: a comma-separated list of whole numbers, not {value!r}")
    if not out or min(out) < 1:
        p.error(f"{what}: numbers >= 1")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.http_static", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run under 2 minutes: 2 s trials, 1 round, 64 connections, sets 4KiB, mixed "
        "(1,000 files), probe and 4KiB-tls, unless given",
    )
    p.add_argument("--duration", type=int, default=None, help="seconds per wrk trial (default 10; 2 --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    p.add_argument(
        "--asgi",
        action="store_true",
        help="the ASGI rows (issue #16) and nginx, on 4KiB and 1MiB at 64 connections, one worker, "
        "unless --contenders, --sets, --connections or --workers say otherwise",
    )
    p.add_argument(
        "--connections", default=None, help="wrk -c, comma-separated (default 64,1024; 64 --quick or --asgi)"
    )
    p.add_argument("--threads", type=int, default=1, help="wrk -t (default 1)")
    p.add_argument(
        "--workers",
        default=None,
        help="server workers, comma-separated (default 1,2; 1 --asgi): N > 1 runs serve --workers N "
        "and nginx worker_processes N on every set at the first --connections, the servers on "
        "--multi-server-cpus",
    )
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument(
        "--contenders",
        default=None,
        help="comma-separated subset, in run order (default: all but aiohttp-memory, the py-floor rows "
        "and the ASGI rows; "
        f"--asgi: nginx and the ASGI rows; of {', '.join(CONTENDERS)})",
    )
    p.add_argument(
        "--sets",
        "--files",
        dest="sets",
        default=None,
        help=f"comma-separated subset of {','.join(SETS)} "
        f"(default: all but {SLOW}; 4KiB,{MIXED},{PROBE},4KiB-tls --quick; 4KiB,1MiB --asgi). {PROBE}: the "
        f"mixed set with the hot-file probe beside wrk; {SLOW}: the same with the server's disk reads "
        "throttled (--slow-read-iops); *-tls: the file over HTTPS (serve, nginx and the uvicorn rows "
        "uvicorn+asf/asf.asgi, uvicorn/starlette); these "
        "run with one worker at the first --connections",
    )
    p.add_argument(
        "--mixed-files", type=int, default=None, help="files in the mixed set (default 10000; 1000 --quick)"
    )
    p.add_argument(
        "--slow-read-iops",
        type=int,
        default=SLOW_READ_IOPS,
        help=f"the {SLOW} set's disk: reads per second the server may make (default {SLOW_READ_IOPS})",
    )
    p.add_argument("--server-cpus", default="0", help="taskset CPU list for the servers (default 0)")
    p.add_argument("--client-cpus", default="1", help="taskset CPU list for wrk (default 1)")
    p.add_argument(
        "--multi-server-cpus",
        default=None,
        help="taskset CPU list for the servers of the wN > 1 cases (default: every CPU this process may use)",
    )
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
    q, asgi = args.quick, args.asgi
    if args.contenders is None:
        args.contenders = ",".join((BASE, *ASGI_CONTENDERS) if asgi else DEFAULT_CONTENDERS)
    args.duration = args.duration if args.duration is not None else (2 if q else 10)
    args.rounds = args.rounds if args.rounds is not None else (1 if q else 3)
    args.connections = _ints(p, args.connections or ("64" if q or asgi else "64,1024"), "--connections")
    args.workers = _ints(p, args.workers or ("1" if asgi else "1,2"), "--workers")
    args.mixed_files = args.mixed_files if args.mixed_files is not None else (1000 if q else 10_000)
    named = ",".join(ALIASES.get(c.strip(), c.strip()) for c in args.contenders.split(","))
    args.contenders = list(dict.fromkeys(comma_list(p, named, CONTENDERS)))
    every = ",".join(s for s in SETS if s != SLOW)
    default_sets = "4KiB,1MiB" if asgi else f"4KiB,{MIXED},{PROBE},4KiB-tls" if q else every
    args.sets = comma_list(p, args.sets or default_sets, SETS, "sets")
    if args.duration < 1 or args.rounds < 1 or args.threads < 1 or min(args.connections) < args.threads:
        p.error("--duration, --rounds and --threads must be >= 1, and --connections >= --threads")
    if args.mixed_files < 1 or args.slow_read_iops < 1:
        p.error("--mixed-files and --slow-read-iops must be >= 1")
    if args.no_pin:
        args.server_cpus = args.client_cpus = args.multi_server_cpus = None
    elif not can_pin():
        print("http_static: no taskset or fewer than 2 CPUs: running unpinned", file=sys.stderr)
        args.server_cpus = args.client_cpus = args.multi_server_cpus = None
    elif args.multi_server_cpus is None:
        args.multi_server_cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    return args


def plan(args: argparse.Namespace) -> list[tuple[Case, list[str]]]:
    """Each case in run order, with its contenders (in the order of --contenders)."""
    out: list[tuple[Case, list[str]]] = []
    for workers in args.workers:
        conns = args.connections if workers == 1 else args.connections[:1]
        names = args.contenders if workers == 1 else [c for c in args.contenders if c in MULTI_WORKER]
        for label in args.sets:
            if label in ONE_CASE_SETS and workers != 1:
                continue
            for n in conns[:1] if label in ONE_CASE_SETS else conns:
                if label in TLS_SETS:
                    mine = [c for c in names if c in TLS_CONTENDERS]
                else:
                    mine = [c for c in names if not (label in (MIXED, *PROBE_SETS) and c in SINGLE_FILE_ONLY)]
                if mine:
                    out.append((Case(label, n, workers), mine))
    return out


def write_mixed_set(root: Path, tmp: str, count: int) -> tuple[list[int], list[str], str, list[str]]:
    """The mixed set of *count* files written under *root*: their sizes, URL paths, the wrk script
    that picks them at random (in *tmp*) and their paths on disk (``mixed_stall`` uses it too)."""
    sizes = mixed_sizes(
        count, MIXED_SEED, median=MIXED_MEDIAN, sigma=MIXED_SIGMA, low=MIXED_LOW, high=MIXED_HIGH
    )
    paths = make_mixed_set(str(root), sizes, MIXED_SEED)
    script = paths_script(str(Path(tmp, "mixed.lua")), paths, MIXED_SEED)
    return sizes, paths, script, [str(root / p.lstrip("/")) for p in paths]


def make_sets(
    root: Path, tmp: str, labels: list[str], mixed_files: int
) -> tuple[dict[str, FileSet], dict[str, bytes]]:
    """Write the files of every set in ``labels`` under ``root``; the sets and the bodies a trial checks.

    The sets that reuse another's files (``probe``: the mixed set's; ``4KiB-tls``: ``4KiB``'s) bring
    that set along in the result.
    """
    sets: dict[str, FileSet] = {}
    bodies: dict[str, bytes] = {}
    for label, name, size in FILES:
        tls = f"{label}-tls"
        close = CLOSE if label == "4KiB" else None
        tls_close = TLS_CLOSE if label == "4KiB" else None
        browser = BROWSER if label == "4KiB" else None
        if any(x in labels for x in (label, tls, close, tls_close, browser) if x is not None):
            bodies[name] = os.urandom(size)
            (root / name).write_bytes(bodies[name])
            warm(str(root / name))
            sets[label] = FileSet(label, name, size)
            sets[tls] = FileSet(tls, name, size, scheme="https")
            if close is not None:
                sets[close] = FileSet(close, name, size, headers=("Connection: close",))
            if tls_close is not None:
                sets[tls_close] = FileSet(
                    tls_close, name, size, scheme="https", headers=("Connection: close",)
                )
            if browser is not None:
                sets[browser] = FileSet(browser, name, size, headers=BROWSER_FIELDS)
    if MIXED in labels or any(label in labels for label in PROBE_SETS):
        sizes, paths, script, files = write_mixed_set(root, tmp, mixed_files)
        check = paths[0].lstrip("/")
        bodies[check] = (root / check).read_bytes()
        sets[MIXED] = FileSet(MIXED, check, statistics.fmean(sizes), script, files)
    if any(label in labels for label in PROBE_SETS):
        bodies[HOT_NAME] = os.urandom(HOT_SIZE)
        (root / HOT_NAME).write_bytes(bodies[HOT_NAME])
        warm(str(root / HOT_NAME))
        spec = ProbeSpec(HOT_NAME, HOT_SIZE, PROBE_INTERVAL_MS)
        sets[PROBE] = replace(sets[MIXED], label=PROBE, probe=spec)
        slow_spec = replace(spec, timeout_s=SLOW_TIMEOUT_S)
        sets[SLOW] = replace(sets[MIXED], label=SLOW, probe=slow_spec, slow=True)
    return sets, bodies


def _evict(files: list[str], sample: Sample) -> None:
    """before_run of the mixed set: every file out of the page cache (a trial error if pages stay)."""
    resident, total = evict_files(files)
    sample.cache_resident_pages, sample.cache_pages = resident, total
    if resident > total // 100:
        raise TrialError(f"page cache not cold: {resident} of {total} pages of the mixed set still cached")
    sample.cold_read_us = cold_read_us(files)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = sys.stderr
    skipped: dict[str, str] = {}
    wrk, nginx = ensure_tools(any(c in args.contenders for c in ("nginx", NGINX_AIO)), "http_static")
    caddy = None
    if "caddy" in args.contenders:
        caddy, why = ensure_caddy("http_static")
        if caddy is None:
            skipped["caddy"] = why
            args.contenders.remove("caddy")
    tools = {"nginx": nginx, "caddy": caddy}
    nofile = raise_nofile(NOFILE)
    if max(args.connections) + 64 > nofile[0]:
        print(
            f"http_static: RLIMIT_NOFILE is {nofile[0]}: too low for {max(args.connections)} connections",
            file=log,
        )
    started = datetime.now(timezone.utc)
    machine = machine_info()  # before the trials: the git HEAD and sources they ran
    cases = plan(args)
    if not cases:
        raise SystemExit(
            f"http_static: no case to run ({', '.join(ONE_CASE_SETS)} run with --workers 1 only; "
            f"*-tls with {' or '.join(TLS_CONTENDERS)} only)"
        )
    samples: list[Sample] = []
    t_setup = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aiosendfile-http-", dir=args.dir) as tmp:
        root = Path(tmp, "www")
        root.mkdir()
        sets, bodies = make_sets(root, tmp, args.sets, args.mixed_files)
        throttle: ReadThrottle | None = None
        if SLOW in args.sets:
            made = read_throttle(str(root), args.slow_read_iops)
            if isinstance(made, str):
                skipped[SLOW] = made
                print(f"http_static: no {SLOW} set: {made}", file=log)
                cases = [(case, names) for case, names in cases if case.set != SLOW]
            else:
                throttle = made
        tls = make_cert(tmp) if any(label in TLS_SETS for label in args.sets) else None
        mixed_info = None
        if MIXED in sets:
            files = sets[MIXED].files or []
            sizes = [os.path.getsize(f) for f in files]
            mixed_info = {
                "files": len(sizes),
                "seed": MIXED_SEED,
                "total_bytes": sum(sizes),
                "min": min(sizes),
                "max": max(sizes),
                "median": statistics.median(sizes),
                "mean": statistics.fmean(sizes),
                "distribution": f"log-normal, median {MIXED_MEDIAN} B, sigma {MIXED_SIGMA}, "
                f"clamped to {MIXED_LOW}-{MIXED_HIGH} B",
            }
        base = Context(
            root=str(root),
            tmp=tmp,
            wrk=wrk,
            nginx=nginx,
            threads=args.threads,
            connections=args.connections[0],
            duration=args.duration,
            server_cpus=args.server_cpus,
            client_cpus=args.client_cpus,
            bodies=bodies,
        )
        trials = args.rounds * sum(len(names) for _case, names in cases)
        print(
            f"{args.rounds} rounds x {len(cases)} cases, {trials} trials of {args.duration} s + {WARMUP_S} s "
            f"warm-up (files made in {time.perf_counter() - t_setup:.0f} s); example: "
            + " ".join(base.wrk_command("http://127.0.0.1:PORT/FILE", args.duration)),
            file=log,
            flush=True,
        )
        t_bench = time.perf_counter()
        for rnd in range(1, args.rounds + 1):
            for case, names in cases:
                fs = sets[case.set]
                ctx = replace(
                    base,
                    connections=case.connections,
                    workers=case.workers,
                    script=fs.script,
                    headers=fs.headers,
                    server_cpus=args.server_cpus if case.workers == 1 else args.multi_server_cpus,
                    wrap=tuple(throttle.prefix()) if fs.slow and throttle is not None else (),
                    wrk_timeout=SLOW_TIMEOUT_S if fs.slow else None,
                )
                start = partial(start_server, ctx, tools, tls=tls if fs.scheme == "https" else None)
                before = partial(_evict, fs.files) if fs.files else None
                for contender in rotated(names, rnd):
                    for attempt in range(args.retries + 1):
                        s = run_trial(
                            ctx,
                            start,
                            contender,
                            case.set,
                            fs.path,
                            round(fs.size),
                            rnd,
                            fs.scheme,
                            case=case.label,
                            before_run=before,
                            probe=fs.probe,
                        )
                        samples.append(s)
                        noisy = (
                            args.max_other_load is not None
                            and s.other_load_cpus is not None
                            and s.other_load_cpus > args.max_other_load
                        )
                        if noisy and attempt < args.retries:
                            s.discarded = True
                        print(
                            f"round {rnd}/{args.rounds}  {case.label:<14} {contender:<21} {progress_line(s)}",
                            file=log,
                            flush=True,
                        )
                        if not s.discarded:
                            break
                        time.sleep(2 * (attempt + 1))  # let a burst of other load pass
        elapsed = time.perf_counter() - t_bench

    labels = [case.label for case, _names in cases]
    summary = summarize(samples, args.contenders, labels, key="case")
    rat = ratios(samples, args.contenders, labels)
    pairs = pair_ratios(samples, args.contenders, labels)
    probe_rat = probe_ratios(samples, args.contenders, labels)
    probe_info = (
        {
            "path": "/" + HOT_NAME,
            "bytes": HOT_SIZE,
            "interval_ms": PROBE_INTERVAL_MS,
            "cpus": args.client_cpus,
            "program": PROBE_PROGRAM,
            "load": f"wrk on the {MIXED} set ({args.mixed_files} files), evicted before each measured run",
            "slow_disk": throttle and f"{SLOW}: {throttle.describe()}; wrk --timeout {SLOW_TIMEOUT_S}s",
        }
        if any(label in args.sets for label in PROBE_SETS)
        else None
    )
    tls_info = (
        {
            "contenders": list(TLS_CONTENDERS),
            "certificate": "self-signed (tls_static.make_cert)",
            "python_openssl": ssl.OPENSSL_VERSION,
        }
        if any(label in TLS_SETS for label in args.sets)
        else None
    )
    text = report(
        summary,
        rat,
        base,
        args.rounds,
        multi_cpus=args.multi_server_cpus,
        skipped=skipped,
        mixed=mixed_info,
        pairs=pairs,
        cpu_model=machine.get("cpu_model"),
        probe=probe_info,
        probe_rat=probe_rat,
        tls=tls_info,
    )
    text += f"\n\n({len(samples)} trials in {elapsed:.0f} s)"

    machine["tools"] = {
        "wrk": tool_version([wrk, "-v"]),
        "nginx": tool_version([nginx, "-v"]) if nginx else None,
        "caddy": tool_version([caddy, "version"]) if caddy else None,
    }
    if asgi_rows := [c for c in args.contenders if is_asgi(c)]:
        machine["tools"].update(asgi_versions(asgi_rows))
    document = {
        **document_head("http_static", started),
        "params": {
            "rounds": args.rounds,
            "duration_s": args.duration,
            "warmup_s": WARMUP_S,
            "threads": args.threads,
            "connections": args.connections,
            "workers": args.workers,
            "contenders": args.contenders,
            "skipped": skipped,
            "files": {label: size for label, _name, size in FILES if label in args.sets},
            "sets": args.sets,
            "mixed": mixed_info,
            "cases": {case.label: names for case, names in cases},
            "server_cpus": args.server_cpus,
            "multi_server_cpus": args.multi_server_cpus,
            "client_cpus": args.client_cpus,
            "rlimit_nofile": list(nofile),
            "max_other_load": args.max_other_load,
            "retries": args.retries,
            "wrk_command": base.wrk_command("URL", args.duration),
            # Both run benchmarks/programs/aiohttp_app.py (KIND static, plugin): its source.
            "aiohttp_static_server": AIOHTTP_APP_SOURCE,
            "plugin_app_server": AIOHTTP_APP_SOURCE,
            "nginx_conf": NGINX_CONF,
            "nginx_tls": NGINX_TLS,
            "probe": probe_info,
            "tls": tls_info,
            "asgi_commands": {
                name: [
                    *asgi_command(*name.removesuffix(BEFORE_SUFFIX).split("/")),
                    "--host",
                    "H",
                    "--port",
                    "P",
                ]
                for name in args.contenders
                if is_asgi(name)
            },
            "asgi_apps": ASGI_APPS_SOURCE,
            "asgi_root_env": ROOT_ENV,
            "elapsed_s": elapsed,
        },
        "units": {
            "req_per_s": "wrk Requests/sec",
            "mb_per_s": "body bytes per second / 10^6 (req/s x file size; mixed: x the mean file size)",
            "wire_mb_per_s": "wrk Transfer/sec (headers included; wrk's binary MB) / 10^6",
            "latency_*_ms": "wrk latency distribution, milliseconds",
            "server_cpu_*": "server process tree utime+stime (/proc/PID/stat) over the wrk run",
            "other_load_cpus": "whole-machine busy CPU (/proc/stat) not from the server or wrk, / wall time",
            "probe_*_ms": "the hot-file probe's requests that started in wrk's window: first byte sent "
            "to last body byte, milliseconds",
        },
        "machine": machine,
        "summary": summary,
        "ratios": rat,
        "pair_ratios": pairs,
        "probe_ratios": probe_rat,
    }
    return finish_samples(text, document, Sample, samples, args.json, log)


if __name__ == "__main__":
    sys.exit(main())
