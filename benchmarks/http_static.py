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

Files: a 4 KiB and a 1 MiB file of random bytes. Every trial starts a fresh
server, checks one plain GET for status 200 and a byte-exact body, warms up
with a 1 s wrk run, measures with ``wrk --latency`` and checks the GET again.
Trials are interleaved (each round runs every file x contender once, the
contender order rotating from round to round). By default the servers are
pinned to CPU 0 and wrk to CPU 1 with ``taskset``. See ``benchmarks/README.md``.

Run from the repository root::

    python benchmarks/http_static.py --quick
    python benchmarks/http_static.py                 # 10 s trials, 3 rounds
    python benchmarks/http_static.py --rounds 5 --connections 128 --json /tmp/out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.raw_transfer import (
    _CLK_TCK,
    GB,
    MB,
    MiB,
    _host_cpu,
    _table,
    machine_info,
    warm,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "http_static.json"

PLUGIN = "aiosendfile-plugin"
CONTENDERS = (PLUGIN, "aiosendfile-app", "aiohttp-static", "aiohttp-memory", "nginx")
# label, file name in the served directory, size in bytes
FILES = (("4KiB", "4k.bin", 4 * 1024), ("1MiB", "1m.bin", MiB))
# The project's targets: plugin / aiohttp-static on req/s (4 KiB) and MB/s (1 MiB).
TARGETS = {"4KiB": 5.0, "1MiB": 2.0}

WARMUP_S = 1  # wrk -d takes whole seconds
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
OTHER_LOAD_WARN = 0.25  # median CPUs of other load that makes the report warn

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


class TrialError(RuntimeError):
    pass


# ---------------------------------------------------------------------------
# Tools, pinning, processes
# ---------------------------------------------------------------------------


def _find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_tools(need_nginx: bool) -> tuple[str, str | None]:
    """wrk (and nginx if needed): found, or installed with apt-get when running as root."""
    missing = []
    if not shutil.which("wrk"):
        missing.append("wrk")
    if need_nginx and not _find_nginx():
        missing.append("nginx")
    if missing:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise SystemExit(
                f"http_static: {' and '.join(missing)} not found; install "
                f"(e.g. apt-get install -y {' '.join(missing)}) or run as root on Debian/Ubuntu"
            )
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
        print(f"http_static: {', '.join(missing)} missing; running: {' '.join(install)}", flush=True)
        if subprocess.run(install, env=env, check=False).returncode != 0:
            print("http_static: install failed; running: apt-get update, then the install again", flush=True)
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(install, env=env, check=True)
    wrk = shutil.which("wrk")
    nginx = _find_nginx() if need_nginx else None
    if not wrk or (need_nginx and not nginx):
        raise SystemExit("http_static: wrk/nginx still not found after installing")
    return wrk, nginx


def _tool_version(cmd: list[str]) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        text = (out.stdout + out.stderr).strip()
        return text.splitlines()[0] if text else None
    return None


def _pin_prefix(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from field 3 (state) on; None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _process_tree(root: int) -> list[int]:
    """root and all its descendants (nginx: the master and its worker)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _proc_stat(int(entry))) is not None:
            children.setdefault(int(stat[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(tree)


def _tree_cpu(pids: list[int]) -> tuple[float, float]:
    """(user, sys) CPU seconds of these processes so far (/proc/PID/stat utime, stime)."""
    user = system = 0
    for pid in pids:
        stat = _proc_stat(pid)
        if stat is not None:
            user += int(stat[11])
            system += int(stat[12])
    return user / _CLK_TCK, system / _CLK_TCK


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Context:
    """What every trial needs."""

    root: str  # the served directory
    tmp: str
    wrk: str
    nginx: str | None
    threads: int
    connections: int
    duration: int
    server_cpus: str | None
    client_cpus: str | None
    bodies: dict[str, bytes]  # file name -> expected body


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    pids: list[int] = field(default_factory=list)


def start_server(ctx: Context, name: str) -> Server:
    port = _free_port()
    log = Path(ctx.tmp, f"server-{name}.log")
    env = dict(os.environ)
    pin = _pin_prefix(ctx.server_cpus)
    if name == PLUGIN:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "aiosendfile", "serve", ctx.root, "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--loop", "uvloop", "--workers", "1"]
    elif name == "aiosendfile-app":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-c", PLUGIN_APP_SERVER, ctx.root, "127.0.0.1", str(port)]
    elif name == "aiohttp-static":
        cmd = [sys.executable, "-c", AIOHTTP_STATIC_SERVER, ctx.root, "127.0.0.1", str(port)]
    elif name == "aiohttp-memory":
        cmd = [sys.executable, "-c", AIOHTTP_MEMORY_SERVER, ctx.root, "127.0.0.1", str(port)]
    elif name == "nginx":
        assert ctx.nginx is not None
        ngx = Path(ctx.tmp, "nginx")
        ngx.mkdir(exist_ok=True)
        # As root the worker would switch to "nobody", who cannot read the 0700 temp dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf = ngx / "nginx.conf"
        conf.write_text(NGINX_CONF.format(user=user, tmp=ngx, port=port, root=ctx.root))
        cmd = [ctx.nginx, "-p", str(ngx), "-c", str(conf), "-e", str(ngx / "error.log")]
    else:
        raise ValueError(name)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*pin, *cmd], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env
        )
    server = Server(name, proc, port, log)
    try:
        _wait_listening(server)
        server.pids = _process_tree(proc.pid)
        deadline = time.monotonic() + 5
        while name == "nginx" and len(server.pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the master accepts into its backlog before the worker exists
            server.pids = _process_tree(proc.pid)
    except BaseException:
        stop_server(server)
        raise
    return server


def _wait_listening(server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if server.proc.poll() is not None:
            raise TrialError(f"{server.name} exited with status {server.proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TrialError(
                    f"{server.name} not listening on port {server.port} after {START_TIMEOUT_S} s"
                ) from None
            time.sleep(0.05)


def stop_server(server: Server) -> int | None:
    """Stop cleanly (nginx: SIGQUIT, graceful; Python servers: SIGTERM); kill if it hangs."""
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGQUIT if server.name == "nginx" else signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def _log_tail(server: Server, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        text = server.log.read_text(errors="replace").strip()
        if server.name == "nginx":
            with contextlib.suppress(OSError):
                text += "\n" + Path(server.log.parent, "nginx", "error.log").read_text(errors="replace")
        tail = text.strip().splitlines()[-lines:]
        if tail:
            return "\n  server log: " + "\n  ".join(tail)
    return ""


def verify(url: str, expected: bytes) -> None:
    """One plain GET: status 200 and a byte-exact body, or TrialError."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        raise TrialError(f"GET {url}: HTTP {exc.code}, expected 200") from exc
    except OSError as exc:
        raise TrialError(f"GET {url}: {exc!r}") from exc
    if status != 200:
        raise TrialError(f"GET {url}: HTTP {status}, expected 200")
    if body != expected:
        first = next(
            (i for i, (a, b) in enumerate(zip(body, expected, strict=False)) if a != b),
            min(len(body), len(expected)),
        )
        raise TrialError(
            f"GET {url}: body NOT byte-exact: {len(body)} bytes, expected {len(expected)}; "
            f"first difference at byte {first}"
        )


# ---------------------------------------------------------------------------
# wrk
# ---------------------------------------------------------------------------

_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_BYTE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}  # wrk's are binary
_T = r"([\d.]+)(us|ms|s|m|h)"


def _seconds(value: str, unit: str) -> float:
    return float(value) * _TIME_UNITS[unit]


def parse_wrk(text: str) -> dict[str, Any]:
    """The numbers of one ``wrk --latency`` report (times in ms, bytes in bytes)."""
    out: dict[str, Any] = {}
    if m := re.search(r"^\s*Latency\s+" + _T + r"\s+" + _T + r"\s+" + _T, text, re.M):
        out["latency_avg_ms"] = _seconds(m[1], m[2]) * 1e3
        out["latency_stdev_ms"] = _seconds(m[3], m[4]) * 1e3
        out["latency_max_ms"] = _seconds(m[5], m[6]) * 1e3
    for pct, value, unit in re.findall(r"^\s*(50|75|90|99)%\s+" + _T + r"\s*$", text, re.M):
        out[f"latency_p{pct}_ms"] = _seconds(value, unit) * 1e3
    m = re.search(r"(\d+) requests in " + _T + r", ([\d.]+)(B|KB|MB|GB|TB) read", text)
    if not m:
        raise TrialError("cannot parse wrk output:\n" + text)
    out["requests"] = int(m[1])
    out["duration_s"] = _seconds(m[2], m[3])
    out["bytes_read_approx"] = float(m[4]) * _BYTE_UNITS[m[5]]
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text):
        out["socket_errors"] = dict(
            zip(("connect", "read", "write", "timeout"), map(int, m.groups()), strict=True)
        )
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non_2xx"] = int(m[1]) if m else 0
    if m := re.search(r"Requests/sec:\s+([\d.]+)", text):
        out["req_per_s"] = float(m[1])
    if m := re.search(r"Transfer/sec:\s+([\d.]+)(B|KB|MB|GB|TB)", text):
        out["wire_mb_per_s"] = float(m[1]) * _BYTE_UNITS[m[2]] / MB
    return out


def wrk_command(ctx: Context, url: str, duration: int) -> list[str]:
    return [
        *_pin_prefix(ctx.client_cpus),
        ctx.wrk,
        "-t",
        str(ctx.threads),
        "-c",
        str(ctx.connections),
        "-d",
        f"{duration}s",
        "--latency",
        url,
    ]


def _run_wrk(ctx: Context, url: str, duration: int) -> str:
    cmd = wrk_command(ctx, url, duration)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    except subprocess.TimeoutExpired as exc:
        raise TrialError(f"wrk did not finish: {' '.join(cmd)}") from exc
    if out.returncode != 0:
        raise TrialError(f"wrk failed with status {out.returncode}:\n{out.stdout}{out.stderr}")
    return out.stdout


# ---------------------------------------------------------------------------
# Trials
# ---------------------------------------------------------------------------


@dataclass
class Sample:
    """One trial: one contender, one file, one round. Latencies in ms."""

    contender: str
    file: str
    size: int
    round: int
    ok: bool = False
    discarded: bool = False  # re-run for other load on the machine (--max-other-load); not summarized
    error: str | None = None
    requests: int | None = None
    duration_s: float | None = None  # wrk's measured duration
    req_per_s: float | None = None  # wrk's Requests/sec
    mb_per_s: float | None = None  # body bytes: req/s * file size / 10^6
    wire_mb_per_s: float | None = None  # wrk's Transfer/sec (headers included), in 10^6 bytes/s
    latency_avg_ms: float | None = None
    latency_stdev_ms: float | None = None
    latency_max_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p75_ms: float | None = None
    latency_p90_ms: float | None = None
    latency_p99_ms: float | None = None
    socket_errors: dict[str, int] | None = None
    non_2xx: int | None = None
    server_pids: list[int] | None = None
    server_cpu_user_s: float | None = None  # /proc/PID/stat deltas over the wrk run, process tree
    server_cpu_sys_s: float | None = None
    server_cpu_s: float | None = None
    server_cpu_us_per_req: float | None = None
    server_cpu_s_per_gb: float | None = None  # per 10^9 body bytes
    server_cpus_busy: float | None = None  # server CPU seconds / wall seconds
    wrk_cpu_s: float | None = None  # RUSAGE_CHILDREN delta (wrk is the only child reaped meanwhile)
    wrk_cpus_busy: float | None = None  # wrk CPU seconds / wall seconds (1.00: wrk is the limit)
    wall_s: float | None = None  # around the wrk process, start to exit
    host_busy_s: float | None = None  # /proc/stat, whole machine
    host_steal_s: float | None = None
    other_cpu_s: float | None = None  # host busy - server - wrk - this process
    other_load_cpus: float | None = None  # other_cpu_s / wall_s, minus /proc/stat tick slack
    server_exit: int | None = None  # exit status after the clean stop (None: had to be killed)
    wrk_output: str | None = None


def run_trial(ctx: Context, contender: str, label: str, name: str, size: int, rnd: int) -> Sample:
    sample = Sample(contender=contender, file=label, size=size, round=rnd)
    server: Server | None = None
    try:
        server = start_server(ctx, contender)
        sample.server_pids = server.pids
        url = f"http://127.0.0.1:{server.port}/{name}"
        verify(url, ctx.bodies[name])
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
        verify(url, ctx.bodies[name])
        parsed = parse_wrk(text)
    except TrialError as exc:
        sample.error = str(exc) + (_log_tail(server) if server else "")
        return sample
    finally:
        if server is not None:
            sample.server_exit = stop_server(server)

    for key, value in parsed.items():
        if hasattr(sample, key) and key != "bytes_read_approx":
            setattr(sample, key, value)
    if sample.non_2xx:
        sample.error = f"wrk saw {sample.non_2xx} non-2xx/3xx responses"
        return sample
    if not sample.requests or not sample.duration_s:
        sample.error = "wrk completed no requests"
        return sample
    sample.req_per_s = sample.req_per_s or sample.requests / sample.duration_s
    sample.mb_per_s = sample.req_per_s * size / MB
    sample.wall_s = t1 - t0
    sample.server_cpu_user_s, sample.server_cpu_sys_s = u1[0] - u0[0], u1[1] - u0[1]
    cpu = sample.server_cpu_user_s + sample.server_cpu_sys_s
    sample.server_cpu_s = cpu
    sample.server_cpu_us_per_req = cpu / sample.requests * 1e6
    sample.server_cpu_s_per_gb = cpu / (sample.requests * size) * GB
    sample.server_cpus_busy = cpu / sample.wall_s
    wrk_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    self_cpu = (s1.ru_utime - s0.ru_utime) + (s1.ru_stime - s0.ru_stime)
    sample.wrk_cpu_s = wrk_cpu
    sample.wrk_cpus_busy = wrk_cpu / sample.wall_s
    if not math.isnan(h0[0]):
        sample.host_busy_s, sample.host_steal_s = h1[0] - h0[0], h1[1] - h0[1]
        sample.other_cpu_s = sample.host_busy_s - cpu - wrk_cpu - self_cpu
        # /proc/stat and /proc/PID/stat count whole ticks: forgive two per CPU.
        slack = 2 * (os.cpu_count() or 1) / _CLK_TCK
        sample.other_load_cpus = max(0.0, sample.other_cpu_s - slack) / sample.wall_s
    sample.ok = True
    return sample


def _progress(s: Sample) -> str:
    if not s.ok:
        return "ERROR: " + (s.error or "?")
    msg = (
        f"{s.req_per_s:9.0f} req/s {s.mb_per_s:8.1f} MB/s  p50 {s.latency_p50_ms:6.2f} ms"
        f"  p99 {s.latency_p99_ms:6.2f} ms  cpu {s.server_cpu_us_per_req:6.1f} us/req"
        f" ({s.server_cpus_busy:.2f} CPUs, wrk {s.wrk_cpus_busy:.2f})"
    )
    if s.other_load_cpus is not None:
        msg += f"  other load {s.other_load_cpus:.2f}"
    if s.socket_errors and any(s.socket_errors.values()):
        msg += f"  socket errors {s.socket_errors}"
    if s.server_exit not in (0, None):
        msg += f"  server exit status {s.server_exit}"
    if s.discarded:
        msg += "  -> discarded (other load), retrying"
    return msg


# ---------------------------------------------------------------------------
# Summary and report
# ---------------------------------------------------------------------------


def _values(samples: list[Sample], name: str) -> list[float]:
    return [v for s in samples if s.ok and (v := getattr(s, name)) is not None]


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(samples: list[Sample], contenders: list[str], labels: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for label in labels:
        for name in contenders:
            mine = [s for s in samples if s.contender == name and s.file == label and not s.discarded]
            ok = [s for s in mine if s.ok]
            row: dict[str, Any] = {
                "runs": len(mine),
                "ok": len(ok),
                "discarded": sum(s.discarded for s in samples if s.contender == name and s.file == label),
                "errors": [s.error for s in mine if not s.ok],
                "socket_errors_total": sum(sum((s.socket_errors or {}).values()) for s in ok),
                "unclean_server_exits": sum(s.server_exit != 0 for s in mine),
            }
            for key in (
                "req_per_s",
                "mb_per_s",
                "wire_mb_per_s",
                "latency_p50_ms",
                "latency_p99_ms",
                "server_cpu_us_per_req",
                "server_cpu_s_per_gb",
                "server_cpus_busy",
                "wrk_cpus_busy",
                "other_load_cpus",
            ):
                vals = _values(ok, key)
                if vals:
                    row[key + "_median"] = statistics.median(vals)
                    row[key + "_min"] = min(vals)
                    row[key + "_max"] = max(vals)
            summary.setdefault(label, {})[name] = row
    return summary


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
                    "paired_median": _med(paired),
                }
            if other == "aiohttp-static" and label in TARGETS and "req_per_s" in entry:
                entry["target"] = TARGETS[label]
                entry["meets_target"] = entry["req_per_s"]["median"] >= TARGETS[label]
            out.setdefault(label, {})[other] = entry
    return out


def _range(row: dict[str, Any], key: str, fmt: str) -> str:
    if key + "_median" not in row:
        return "n/a"
    med, lo, hi = row[key + "_median"], row[key + "_min"], row[key + "_max"]
    return f"{med:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


def _num(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "n/a" if value is None else f"{value:{fmt}}"


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
                    _range(row, "req_per_s", ".0f"),
                    _range(row, "mb_per_s", ".1f"),
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
        _table(
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
            _table(
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
    sock_errs = [
        f"{name} {label}: {row['socket_errors_total']}"
        for label, by_name in summary.items()
        for name, row in by_name.items()
        if row["socket_errors_total"]
    ]
    if sock_errs:
        out += ["", "wrk socket errors (connect/read/write/timeout, all rounds): " + ", ".join(sock_errs)]
    unclean = [
        f"{name} {label}: {row['unclean_server_exits']}"
        for label, by_name in summary.items()
        for name, row in by_name.items()
        if row["unclean_server_exits"]
    ]
    if unclean:
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
        prog="python benchmarks/http_static.py", description=(__doc__ or "").split("\n\n")[0]
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
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    args.files = [f.strip() for f in args.files.split(",") if f.strip()]
    if unknown := set(args.contenders) - set(CONTENDERS):
        p.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    if unknown := set(args.files) - {f[0] for f in FILES}:
        p.error(f"unknown files {sorted(unknown)}; choose from {', '.join(f[0] for f in FILES)}")
    if args.duration < 1 or args.rounds < 1 or args.threads < 1 or args.connections < args.threads:
        p.error("--duration, --rounds and --threads must be >= 1, and --connections >= --threads")
    if args.no_pin:
        args.server_cpus = args.client_cpus = None
    elif not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2:
        print("http_static: no taskset or fewer than 2 CPUs: running unpinned", file=sys.stderr)
        args.server_cpus = args.client_cpus = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = sys.stderr
    wrk, nginx = ensure_tools("nginx" in args.contenders)
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
        n = len(args.contenders)
        print(
            f"{args.rounds} rounds x {len(files)} files x {n} contenders, "
            f"{args.duration} s + {WARMUP_S} s warm-up per trial; example: "
            + " ".join(wrk_command(ctx, "http://127.0.0.1:PORT/FILE", args.duration)),
            file=log,
            flush=True,
        )
        t_bench = time.perf_counter()
        for rnd in range(1, args.rounds + 1):
            shift = (rnd - 1) % n  # rotate the order so no contender always runs first
            order = args.contenders[shift:] + args.contenders[:shift]
            for label, name, size in files:
                for contender in order:
                    for attempt in range(args.retries + 1):
                        s = run_trial(ctx, contender, label, name, size, rnd)
                        samples.append(s)
                        noisy = (
                            args.max_other_load is not None
                            and s.other_load_cpus is not None
                            and s.other_load_cpus > args.max_other_load
                        )
                        if noisy and attempt < args.retries:
                            s.discarded = True
                        print(
                            f"round {rnd}/{args.rounds}  {label:<5} {contender:<19} {_progress(s)}",
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
    print(report(summary, rat, ctx, args.rounds))
    print(f"\n({len(samples)} trials in {elapsed:.0f} s)")

    machine = machine_info()
    machine["tools"] = {
        "wrk": _tool_version([wrk, "-v"]),
        "nginx": _tool_version([nginx, "-v"]) if nginx else None,
    }
    document = {
        "benchmark": "http_static",
        "date": started.isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
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
            "wrk_command": wrk_command(ctx, "URL", args.duration),
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
        "samples": [asdict(s) for s in samples],
        "sample_fields": [f.name for f in fields(Sample)],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    print(f"results: {args.json}", file=log)
    return 0 if all(s.ok for s in samples) else 1


if __name__ == "__main__":
    sys.exit(main())
