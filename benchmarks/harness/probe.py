"""The hot-file probe: another client's latency while wrk loads the server.

A trial with a :class:`ProbeSpec` starts ``benchmarks.programs.hot_probe`` (its own process,
pinned to the client CPUs like wrk) right before the measured wrk run: it opens one keep-alive
connection, GETs the hot file once untimed, says ``ready``, then GETs it on every tick (10 ms)
and times each request. After wrk ends, the trial closes the probe's stdin and reads its JSON:
only the requests that started inside wrk's window count (both sides use ``CLOCK_MONOTONIC``). A
request still unanswered at the stop counts with the time it had waited: a lower bound, so a server
that answers the hot file once a minute shows a p99 of at least that long, not no figures at all.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import TrialError
from benchmarks.harness.measure import percentile
from benchmarks.harness.report import REPO
from benchmarks.harness.servers import pin_prefix, repo_env

__all__ = ["PROBE_PROGRAM", "Probe", "ProbeSpec", "probe_stats"]

PROBE_PROGRAM = "benchmarks.programs.hot_probe"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ProbeSpec:
    """What the probe requests and how often: ``path`` (no leading /) every ``interval_ms``."""

    path: str
    size: int  # the hot file's bytes
    interval_ms: float = 10.0
    timeout_s: float = 10.0  # a request's socket timeout (an error and a new connection after it)


class Probe:
    """One running probe process; :meth:`finish` stops it and returns its JSON result."""

    def __init__(self, spec: ProbeSpec, port: int, cpus: str | None) -> None:
        cmd = [sys.executable, "-m", PROBE_PROGRAM, "127.0.0.1", str(port), "/" + spec.path]
        cmd += ["--interval-ms", str(spec.interval_ms), "--timeout", str(spec.timeout_s)]
        self.proc = subprocess.Popen(
            [*pin_prefix(cpus), *cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=repo_env(),
        )
        assert self.proc.stdout is not None
        # The first line is "ready" (or nothing, if the untimed GET failed and the probe exited).
        line = _readline(self.proc, READY_TIMEOUT_S)
        if line.strip() != b"ready":
            self.kill()
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            raise TrialError(f"hot-file probe did not start: {line!r}\n{err.strip()[-2000:]}")

    def finish(self) -> dict[str, Any]:
        """Close the probe's stdin (its stop), wait for its JSON result; TrialError if it has none."""
        try:
            out, err = self.proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TrialError("hot-file probe did not stop") from None
        if self.proc.returncode != 0:
            raise TrialError(
                f"hot-file probe exited with status {self.proc.returncode}: {err.decode()[-2000:]}"
            )
        try:
            result: dict[str, Any] = json.loads(out)
        except ValueError as exc:
            raise TrialError(f"hot-file probe: unreadable result {out[:200]!r}") from exc
        return result

    def kill(self) -> None:
        """Kill the probe if it still runs (a failed trial's clean-up)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _readline(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """One line of ``proc``'s stdout, or b"" after ``timeout`` seconds or at end of file."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else b""


def probe_stats(result: dict[str, Any], t0: float, t1: float) -> dict[str, Any]:
    """The probe's figures over the window [t0, t1] (``perf_counter`` seconds), latencies in ms."""
    window = [lat for start, lat in result["samples"] if t0 <= start <= t1]
    unfinished: list[float] | None = result.get("unfinished")
    waiting = unfinished is not None and t0 <= unfinished[0] <= t1
    if unfinished is not None and waiting:
        window.append(unfinished[1])
    window.sort()
    out: dict[str, Any] = {
        "probe_requests": len(window) - waiting,  # answered
        "probe_errors": result["errors"],
        "probe_reconnects": result["reconnects"],
        "probe_late_ticks": result["late_ticks"],
        "probe_cpu_s": result["cpu_s"],
        "probe_unfinished": int(waiting),
        "probe_first_errors": result["first_errors"] or None,
    }
    if window:
        out["probe_p50_ms"] = percentile(window, 50) * 1e3
        out["probe_p99_ms"] = percentile(window, 99) * 1e3
        out["probe_max_ms"] = window[-1] * 1e3
    return out
