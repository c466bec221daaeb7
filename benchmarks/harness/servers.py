"""External server processes for the HTTP benchmarks, and the tools they need.

A trial starts a fresh server (a program of ``benchmarks/programs``, ``python -m aiosendfile
serve``, nginx, caddy) as a child process, pinned with ``taskset`` when asked,
waits until it accepts connections, and stops it cleanly afterwards (killing it
if it hangs); a failed trial quotes the tail of its log. wrk, nginx and caddy
are found on the machine, or installed with apt-get when running as root
(caddy is optional: without it, its row is skipped with the reason). Many
connections need many descriptors: ``raise_nofile`` lifts this process's soft
limit, which the servers and wrk inherit.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import TrialError
from benchmarks.harness.measure import process_tree
from benchmarks.harness.report import REPO  # the servers run from here, with the package importable

__all__ = [
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "Server",
    "can_pin",
    "cpu_list",
    "cpu_set",
    "ensure_caddy",
    "ensure_tools",
    "find_nginx",
    "free_port",
    "log_tail",
    "pin_prefix",
    "pin_threads",
    "pinned",
    "raise_nofile",
    "repo_env",
    "start_server",
    "stop_server",
    "tool_version",
    "wait_listening",
]

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_tools(need_nginx: bool, prog: str = "http_static") -> tuple[str, str | None]:
    """wrk (and nginx if needed): found, or installed with apt-get when running as root.

    ``prog`` names the benchmark in the messages.
    """
    missing = []
    if not shutil.which("wrk"):
        missing.append("wrk")
    if need_nginx and not find_nginx():
        missing.append("nginx")
    if missing:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise SystemExit(
                f"{prog}: {' and '.join(missing)} not found; install "
                f"(e.g. apt-get install -y {' '.join(missing)}) or run as root on Debian/Ubuntu"
            )
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
        print(f"{prog}: {', '.join(missing)} missing; running: {' '.join(install)}", flush=True)
        if subprocess.run(install, env=env, check=False).returncode != 0:
            print(f"{prog}: install failed; running: apt-get update, then the install again", flush=True)
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(install, env=env, check=True)
    wrk = shutil.which("wrk")
    nginx = find_nginx() if need_nginx else None
    if not wrk or (need_nginx and not nginx):
        raise SystemExit(f"{prog}: wrk/nginx still not found after installing")
    return wrk, nginx


def ensure_caddy(prog: str = "http_static") -> tuple[str | None, str]:
    """caddy: (its path, "") if found or installed with apt-get as root, else (None, why not)."""
    found = shutil.which("caddy")
    if found:
        return found, ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "caddy not found (apt-get install -y caddy, or run as root on Debian/Ubuntu)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", "caddy"]
    print(f"{prog}: caddy missing; running: {' '.join(install)}", flush=True)
    if subprocess.run(install, env=env, check=False).returncode != 0:
        print(f"{prog}: install failed; running: apt-get update, then the install again", flush=True)
        subprocess.run(["apt-get", "update"], env=env, check=False)
        if subprocess.run(install, env=env, check=False).returncode != 0:
            return None, "caddy not found and `apt-get install -y caddy` failed"
    found = shutil.which("caddy")
    return (found, "") if found else (None, "caddy still not found after apt-get install")


def raise_nofile(wanted: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to ``wanted`` (at most the hard limit); the (soft, hard) now.

    Children (servers, wrk) inherit it: 1,024 wrk connections need 1,024+ descriptors on both sides.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def tool_version(cmd: list[str]) -> str | None:
    """The first line a tool prints for ``cmd`` (e.g. ``[wrk, "-v"]``), or None."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        text = (out.stdout + out.stderr).strip()
        return text.splitlines()[0] if text else None
    return None


# ---------------------------------------------------------------------------
# Pinning, ports, environment
# ---------------------------------------------------------------------------


def pin_prefix(cpus: str | None) -> list[str]:
    """``taskset -c CPUS`` to put in front of a command, or nothing."""
    return ["taskset", "-c", cpus] if cpus else []


def can_pin() -> bool:
    """Whether servers and wrk can be pinned apart: ``taskset`` is there and this process may use 2+ CPUs."""
    return shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2


def cpu_set(cpus: str) -> set[int]:
    """The CPUs of a ``taskset -c`` list such as ``0``, ``0,2`` or ``0-3,6``; ValueError if malformed."""
    out: set[int] = set()
    for part in cpus.split(","):
        lo, dash, hi = part.strip().partition("-")
        first, last = int(lo), int(hi) if dash else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"not a CPU list: {cpus!r}")
        out.update(range(first, last + 1))
    return out


def pin_threads(cpus: str) -> None:
    """``taskset -c CPUS -p`` for this process from inside it: every thread it has now, and so the
    threads they start (for a ``multiprocessing`` child, which no ``pin_prefix`` can reach)."""
    wanted = cpu_set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, wanted)


@contextlib.contextmanager
def pinned(cpus: str | None) -> Iterator[None]:
    """Run the block with this thread on *cpus* (a ``taskset -c`` list), then put its affinity back.

    Nothing happens without *cpus*.
    """
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpu_set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpu_list(cpus: set[int]) -> str:
    """``cpu_set``'s inverse, runs folded: {0, 1, 2, 5} -> ``0-2,5``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def repo_env() -> dict[str, str]:
    """This process's environment with the repository on PYTHONPATH (the server imports aiosendfile)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    pids: list[int] = field(default_factory=list)
    stop_signal: int = signal.SIGTERM  # the clean stop (nginx: SIGQUIT, graceful)
    error_log: Path | None = None  # a second log the server writes itself (nginx's error.log)
    # The server ends its clean stop by re-raising the stop signal (uvicorn does, after its graceful
    # shutdown): death by that signal is its status 0.
    reraises_stop_signal: bool = False


def start_server(
    name: str,
    cmd: list[str],
    port: int,
    log: Path,
    *,
    cpus: str | None = None,
    env: dict[str, str] | None = None,
    processes: int = 1,
    stop_signal: int = signal.SIGTERM,
    error_log: Path | None = None,
    reraises_stop_signal: bool = False,
    wrap: Sequence[str] = (),
    cwd: Path | str = REPO,
) -> Server:
    """Start ``cmd`` (output to ``log``, on CPUs ``cpus``), wait until it listens on ``port``.

    ``wrap``: a prefix the command runs under, inside the CPU pinning (a slow disk's cgroup:
    ``throttle.ReadThrottle.prefix``).

    ``cwd``: where it runs (``python -m`` and ``-c`` import from there first, before
    ``PYTHONPATH``).

    ``processes``: wait up to 5 s for the process tree to have that many members
    (nginx's master accepts into its backlog before its worker exists).
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*pin_prefix(cpus), *wrap, *cmd],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
        )
    server = Server(
        name,
        proc,
        port,
        log,
        stop_signal=stop_signal,
        error_log=error_log,
        reraises_stop_signal=reraises_stop_signal,
    )
    try:
        wait_listening(server)
        server.pids = process_tree(proc.pid)
        deadline = time.monotonic() + 5
        while len(server.pids) < processes and time.monotonic() < deadline:
            time.sleep(0.05)
            server.pids = process_tree(proc.pid)
    except BaseException:
        stop_server(server)
        raise
    return server


def wait_listening(server: Server) -> None:
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
    """Stop cleanly (the server's stop signal); kill if it hangs. The exit status, None if killed.

    A server that ends its clean stop by re-raising the signal (``reraises_stop_signal``) and died of
    it reports 0.
    """
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(server.stop_signal)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    if server.reraises_stop_signal and proc.returncode == -server.stop_signal:
        return 0
    return proc.returncode


def log_tail(server: Server, lines: int = 20) -> str:
    """The last lines of the server's logs, formatted to follow an error message (or "")."""
    with contextlib.suppress(OSError):
        text = server.log.read_text(errors="replace").strip()
        if server.error_log is not None:
            with contextlib.suppress(OSError):
                text += "\n" + server.error_log.read_text(errors="replace")
        tail = text.strip().splitlines()[-lines:]
        if tail:
            return "\n  server log: " + "\n  ".join(tail)
    return ""
