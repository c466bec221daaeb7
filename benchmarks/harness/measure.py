"""Measuring a trial: loop delay, CPU (process, process tree, whole machine), other load, perf windows.

The server loop's 1 ms ticker and its statistics, ``getrusage`` snapshots of a process, ``/proc``
CPU counters of a process tree (an external server) and of the whole machine, the other load
they leave over (``ClientWindow``: seen from the reader's or sender's side), and ``perf`` over
one trial's transfer window. Each benchmark composes these
into its own samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import TrialError

TICK_S = 0.001  # the ticker's sleep
IDLE_S = 0.2  # the ticker runs this long on an idle loop before the transfer (baseline)
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ---------------------------------------------------------------------------
# Loop delay: a 1 ms ticker on the server loop
# ---------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted, non-empty values (q in 0..100)."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def delay_stats(delays: list[float]) -> dict[str, float | int | None]:
    """Tick count, worst, p99 and p50 of *delays* (seconds) in milliseconds."""
    ordered = sorted(delays)
    if not ordered:
        return {"ticks": 0, "worst_ms": None, "p99_ms": None, "p50_ms": None}
    return {
        "ticks": len(ordered),
        "worst_ms": ordered[-1] * 1e3,
        "p99_ms": percentile(ordered, 99) * 1e3,
        "p50_ms": percentile(ordered, 50) * 1e3,
    }


def time_collections(collections: list[tuple[float, int, float]]) -> None:
    """Record every cyclic garbage collection from now on in *collections*: (when it ended, in
    ``perf_counter`` seconds; its generation; how long it took, in seconds)."""
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            now = time.perf_counter()
            collections.append((now, info["generation"], now - started[0]))

    gc.callbacks.append(callback)


async def ticker(ticks: list[tuple[float, float]]) -> None:
    """Record (sleep start, wake-up time) for back-to-back 1 ms sleeps."""
    clock = time.perf_counter
    while True:
        start = clock()
        await asyncio.sleep(TICK_S)
        ticks.append((start, clock()))


class LoopTicker:
    """``ticker`` as a task on the running loop, and the delays of its ticks before and during a window."""

    def __init__(self) -> None:
        self.ticks: list[tuple[float, float]] = []
        self.task = asyncio.create_task(ticker(self.ticks))

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    def idle(self, t0: float) -> dict[str, float | int | None]:
        """The ticks that woke before *t0* (the idle-loop baseline)."""
        return delay_stats([w - s - TICK_S for s, w in self.ticks if w < t0])

    def busy(self, t0: float, t1: float) -> dict[str, float | int | None]:
        """The ticks whose sleep overlaps [t0, t1] at all.

        So a loop blocked for the whole window still shows up as one huge delay.
        """
        return delay_stats([w - s - TICK_S for s, w in self.ticks if w >= t0 and s <= t1])


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """The loop's class, e.g. ``uvloop.Loop`` or ``asyncio.unix_events._UnixSelectorEventLoop``."""
    return type(loop).__module__ + "." + type(loop).__qualname__


# ---------------------------------------------------------------------------
# CPU of this process (getrusage)
# ---------------------------------------------------------------------------


Usage = tuple[float, float, resource.struct_rusage]


def usage() -> Usage:
    """(perf_counter, process_time, RUSAGE_SELF) now: one end of a ``measured`` window."""
    return time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)


def measured(start: Usage, end: Usage, sent: int) -> dict[str, Any]:
    """The window between two ``usage()`` snapshots: its times, CPU and context switches, and *sent*."""
    (t0, p0, r0), (t1, p1, r1) = start, end
    return {
        "sent": sent,
        "t_start": t0,
        "t_end": t1,
        "cpu_process_time_s": p1 - p0,
        "cpu_user_s": r1.ru_utime - r0.ru_utime,
        "cpu_sys_s": r1.ru_stime - r0.ru_stime,
        "vol_ctx_switches": r1.ru_nvcsw - r0.ru_nvcsw,
        "invol_ctx_switches": r1.ru_nivcsw - r0.ru_nivcsw,
    }


def zero_copy_counters() -> Any:
    """``aiosendfile._platform.counters`` if aiosendfile is loaded in this process, else None."""
    if "aiosendfile" not in sys.modules:
        return None
    from aiosendfile import _platform

    return _platform.counters


# ---------------------------------------------------------------------------
# CPU of other processes and of the whole machine (/proc)
# ---------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from field 3 (state) on; None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def process_tree(root: int) -> list[int]:
    """root and all its descendants (nginx: the master and its worker)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            children.setdefault(int(stat[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(tree)


def tree_cpu(pids: list[int]) -> tuple[float, float]:
    """(user, sys) CPU seconds of these processes so far (/proc/PID/stat utime, stime)."""
    user = system = 0
    for pid in pids:
        stat = proc_stat(pid)
        if stat is not None:
            user += int(stat[11])
            system += int(stat[12])
    return user / CLK_TCK, system / CLK_TCK


def host_cpu() -> tuple[float, float]:
    """Whole-machine (busy, steal) CPU seconds so far, from /proc/stat; (nan, nan) elsewhere.

    Used to spot other load on the machine during a trial: busy time that is
    neither the server's nor the reader's belongs to someone else.
    """
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan, math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def host_split() -> tuple[float, float, float]:
    """Whole-machine (user + nice, system, irq + softirq) CPU seconds so far, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan, math.nan, math.nan
    user, nice, system, _idle, _iowait, irq, softirq = (ticks + [0] * 7)[:7]
    return (user + nice) / CLK_TCK, system / CLK_TCK, (irq + softirq) / CLK_TCK


def other_load(other_cpu_s: float, seconds: float) -> float:
    """Other processes' load over a window, in CPUs, beyond what /proc/stat can resolve.

    /proc/stat counts in 1/CLK_TCK ticks per CPU, so *other_cpu_s* (the machine's
    busy CPU minus what the trial's own processes used) is only good to about two
    ticks per CPU: that much is forgiven, and a quiet window reads 0.
    """
    slack = 2 * (os.cpu_count() or 1) / CLK_TCK
    return max(0.0, other_cpu_s - slack) / seconds


class ClientWindow:
    """This process's side of a trial (the reader or sender): wall time, its CPU, the machine's busy CPU.

    Made when this side starts its transfer, ``stop()``ed when it ends. What the machine was busy
    with that was neither this process nor the server is the window's other load (``others``).
    """

    def __init__(self) -> None:
        self.host0 = host_cpu()
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()
        self.t1 = self.cpu_s = self.host_busy_s = math.nan

    def stop(self) -> None:
        """End the window: take the clock first, then this process's and the machine's CPU."""
        self.t1 = time.perf_counter()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        host1 = host_cpu()
        self.cpu_s = (r1.ru_utime - self.r0.ru_utime) + (r1.ru_stime - self.r0.ru_stime)
        self.host_busy_s = host1[0] - self.host0[0]

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def others(self, server_cpu_s: float) -> tuple[float | None, float | None]:
        """(other_cpu_s, other_load_cpus) beside this process and a server that used *server_cpu_s*.

        (None, None) where /proc/stat is not there to tell.
        """
        if math.isnan(self.host_busy_s):
            return None, None
        other_cpu_s = self.host_busy_s - self.cpu_s - server_cpu_s
        return other_cpu_s, other_load(other_cpu_s, self.seconds)


# ---------------------------------------------------------------------------
# perf over a trial's transfer window
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfSpec:
    """``--perf``: run ``perf ARGS`` over each trial's transfer window (see ``PerfWindow``)."""

    args: tuple[str, ...]  # e.g. ("stat", "-e", "task-clock") or ("record", "-g", "-e", "cpu-clock")
    directory: Path
    scope: str = "system"  # "system": perf -a; "server": perf -p SERVER_PID (its threads and children)


class PerfWindow:
    """``perf ARGS`` started disabled, enabled right before the reader's "go", disabled after its last byte.

    Uses perf's control FIFOs (``-D -1 --control fifo:CTL,ACK``), so perf's own start-up and the
    trial's set-up are outside the measured window. One output file per trial (``-o``).
    """

    def __init__(self, spec: PerfSpec, target_pid: int, out: Path) -> None:
        self.spec, self.target_pid, self.out = spec, target_pid, out
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp = tempfile.mkdtemp(prefix="aiosendfile-perf-")
        self.ctl = self.ack = -1

    def _command(self, ctl: str, ack: str) -> list[str]:
        target = ["-a"] if self.spec.scope == "system" else ["-p", str(self.target_pid)]
        sub, *rest = self.spec.args
        return [
            "perf",
            sub,
            *target,
            "-D",
            "-1",
            "--control",
            f"fifo:{ctl},{ack}",
            "-o",
            str(self.out),
            *rest,
        ]

    def _command_ack(self, word: bytes, timeout: float = 10.0) -> None:
        assert self.proc is not None
        os.write(self.ctl, word + b"\n")
        deadline = time.monotonic() + timeout
        got = b""
        while b"ack" not in got:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TrialError(f"perf did not acknowledge {word.decode()!r} (exit {self.proc.poll()})")
            if select.select([self.ack], [], [], 0.05)[0]:
                chunk = os.read(self.ack, 64)
                if not chunk:  # EOF: perf has not opened the ACK FIFO for writing yet
                    time.sleep(0.01)
                got += chunk

    def start(self) -> None:
        ctl, ack = os.path.join(self.tmp, "ctl"), os.path.join(self.tmp, "ack")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.ack = os.open(ack, os.O_RDONLY | os.O_NONBLOCK)
        self.proc = subprocess.Popen(
            self._command(ctl, ack), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while self.ctl < 0:
            try:
                self.ctl = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO until perf opens it
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    raise TrialError(
                        f"perf failed to start: {' '.join(self._command(ctl, ack))}: {err}"
                    ) from None
                time.sleep(0.01)
        self._command_ack(b"enable")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError, TrialError):
            if self.proc.poll() is None:
                self._command_ack(b"disable")
        self.close()

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(2)  # SIGINT: perf writes its output and exits
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
            self.proc = None
        for fd in (self.ctl, self.ack):
            if fd >= 0:
                os.close(fd)
        self.ctl = self.ack = -1
        with contextlib.suppress(OSError):
            for name in os.listdir(self.tmp):
                os.unlink(os.path.join(self.tmp, name))
            os.rmdir(self.tmp)
