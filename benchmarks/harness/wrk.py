"""wrk, the HTTP load generator: its command line, one run, and the numbers of its report.

The HTTP and TLS benchmarks drive their servers with ``wrk --latency``; this
module builds that command (pinned with ``taskset`` when asked, with a Lua
script when one picks the paths), runs it with a timeout and turns its text
report into numbers (times in ms, bytes in bytes). ``paths_script`` writes the
Lua script that requests a list of paths in a seeded random order.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

from benchmarks.harness import MB, TrialError
from benchmarks.harness.servers import pin_prefix

__all__ = ["parse_wrk", "paths_script", "run_wrk", "wrk_command"]

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


def paths_script(path: str, paths: list[str], seed: int) -> str:
    """Write a wrk Lua script to ``path`` that GETs ``paths`` in random order; return ``path``.

    Every wrk thread seeds Lua's generator with ``seed`` when it starts, so every run
    (warm-up and measured, every contender) requests the same sequence. The requests are
    formatted once per thread (``init``, after wrk has set the Host header), so each
    request costs wrk a random number and a table lookup.
    """
    quoted = ",\n".join('"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in paths)
    with open(path, "w") as f:
        f.write(
            f"local paths = {{\n{quoted}\n}}\n"
            "local requests = {}\n"
            "local n = #paths\n"
            "init = function(args)\n"
            '  for i = 1, n do requests[i] = wrk.format("GET", paths[i]) end\n'
            f"  math.randomseed({seed})\n"
            "end\n"
            "request = function()\n"
            "  return requests[math.random(n)]\n"
            "end\n"
        )
    return path


def wrk_command(
    wrk: str,
    url: str,
    duration: int,
    *,
    threads: int,
    connections: int,
    cpus: str | None,
    script: str | None = None,
    headers: tuple[str, ...] = (),
    timeout: int | None = None,
) -> list[str]:
    """``wrk --latency`` for ``duration`` whole seconds, on the CPUs ``cpus`` (taskset list) if given.

    ``script``: a Lua script (``wrk -s``), e.g. one that picks the paths (:func:`paths_script`);
    ``headers``: request fields (``wrk -H``), e.g. ``Connection: close`` (a connection per request);
    ``timeout``: wrk's ``--timeout`` in seconds (its default, 2 s, counts a slow disk's answers as
    socket errors and leaves them out of the latencies).
    """
    return [
        *pin_prefix(cpus),
        wrk,
        "-t",
        str(threads),
        "-c",
        str(connections),
        "-d",
        f"{duration}s",
        "--latency",
        *(["-s", script] if script else []),
        *(arg for field in headers for arg in ("-H", field)),
        *(["--timeout", f"{timeout}s"] if timeout else []),
        url,
    ]


def run_wrk(cmd: list[str], duration: int) -> str:
    """Run a :func:`wrk_command` of ``duration`` seconds; its report, or TrialError."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    except subprocess.TimeoutExpired as exc:
        raise TrialError(f"wrk did not finish: {' '.join(cmd)}") from exc
    if out.returncode != 0:
        raise TrialError(f"wrk failed with status {out.returncode}:\n{out.stdout}{out.stderr}")
    return out.stdout
