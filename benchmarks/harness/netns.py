"""A veth pair between two network namespaces the benchmark makes and removes itself (root only).

``veth_pair()`` creates namespaces ``asfb-srv-PID`` and ``asfb-cli-PID``, a veth
pair made directly inside them (``ip -n SRV link add ... peer ... netns CLI``,
so no interface ever appears in the caller's namespace), private addresses
``SERVER_ADDR``/``CLIENT_ADDR`` on it and ``lo`` up in both. It touches
nothing outside those two namespaces, and deletes both in ``finally`` (which
removes the veth pair too): on errors, on Ctrl-C (KeyboardInterrupt), and on
SIGTERM or SIGHUP, which it turns into an exception for as long as the pair
exists (when it runs in the main thread). A SIGKILLed run cannot clean up:
``remove_stale()`` (called by ``veth_pair()``) deletes the namespaces of
earlier runs whose process is gone. ``entered(name)`` moves the calling thread
into a namespace for a block (``setns``), and back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
SERVER_ADDR = "10.213.77.1"
CLIENT_ADDR = "10.213.77.2"
PREFIX = 30
DEFAULT_MTU = 1500
_NAME = re.compile(r"^asfb-(?:srv|cli)-(\d+)$")  # asfb-srv-PID, asfb-cli-PID


@dataclass(frozen=True)
class Veth:
    server_ns: str
    client_ns: str
    server_addr: str
    client_addr: str
    mtu: int


def available() -> str | None:
    """Why veth mode cannot run here, or None if it can be tried."""
    if os.geteuid() != 0:
        return "not running as root"
    if not shutil.which("ip"):
        return "no `ip` command (iproute2)"
    if not os.path.exists("/proc/self/ns/net"):
        return "no network namespaces"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def names() -> list[str]:
    """The network namespaces this module made (``asfb-srv-PID``, ``asfb-cli-PID``) that still exist."""
    with contextlib.suppress(FileNotFoundError):
        return sorted(n for n in os.listdir("/run/netns") if _NAME.match(n))
    return []


def remove_stale() -> list[str]:
    """Delete namespaces left by earlier runs that were killed (their PID is gone); return their names."""
    removed = []
    for name in names():
        m = _NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                _ip("netns", "del", name)
                removed.append(name)
    return removed


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived while a veth pair existed (raised so that ``finally`` removes it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception for the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def _wait_up(links: tuple[tuple[str, str], ...], timeout: float = 3.0) -> None:
    """Wait until each (namespace, device) reports operational state UP."""
    deadline = time.monotonic() + timeout
    for ns, dev in links:
        while True:
            out = subprocess.run(
                ["ip", "-n", ns, "-br", "link", "show", "dev", dev],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            if len(out) > 1 and out[1] == "UP":
                break
            if time.monotonic() > deadline:
                raise OSError(f"{dev} in netns {ns} not up after {timeout} s: {' '.join(out)}")
            time.sleep(0.05)


def _mtu(ns: str, dev: str) -> int:
    out = subprocess.run(
        ["ip", "-n", ns, "-o", "link", "show", "dev", dev], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[out.index("mtu") + 1])


def setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the block (this thread, and processes it starts) inside network namespace *name*."""
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    try:
        setns(f"/run/netns/{name}")
        try:
            yield
        finally:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original network namespace")
    finally:
        os.close(home)


@contextlib.contextmanager
def veth_pair(mtu: int = DEFAULT_MTU) -> Iterator[Veth]:
    """Both ends get *mtu*; the TCP MSS follows from it (MTU - 52 with timestamps: 1448 at 1500)."""
    remove_stale()
    tag = str(os.getpid())
    srv, cli = f"asfb-srv-{tag}", f"asfb-cli-{tag}"
    made: list[str] = []
    with _signals_raise():
        try:
            for ns in (srv, cli):
                made.append(ns)  # before `ip netns add`: an interrupted add may still have made it
                _ip("netns", "add", ns)
            _ip(
                "-n",
                srv,
                "link",
                "add",
                "asfb-s",
                "mtu",
                str(mtu),
                "type",
                "veth",
                "peer",
                "name",
                "asfb-c",
                "mtu",  # the peer's own MTU: without it the reader's end would get the default 1500
                str(mtu),
                "netns",
                cli,
            )
            _ip("-n", srv, "addr", "add", f"{SERVER_ADDR}/{PREFIX}", "dev", "asfb-s")
            _ip("-n", cli, "addr", "add", f"{CLIENT_ADDR}/{PREFIX}", "dev", "asfb-c")
            for ns, dev in ((srv, "asfb-s"), (cli, "asfb-c")):
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", dev, "up")
            _wait_up(((srv, "asfb-s"), (cli, "asfb-c")))
            for ns, dev in ((srv, "asfb-s"), (cli, "asfb-c")):
                if (got := _mtu(ns, dev)) != mtu:
                    raise OSError(f"{dev} in netns {ns} has MTU {got}, not {mtu}")
            yield Veth(srv, cli, SERVER_ADDR, CLIENT_ADDR, mtu)
        finally:
            # Deleting a namespace removes its end of the pair (and so the pair). Ignore
            # SIGINT meanwhile: a second Ctrl-C must not leave a namespace behind.
            old_int = None
            if threading.current_thread() is threading.main_thread():
                old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                for ns in reversed(made):
                    if os.path.exists(f"/run/netns/{ns}"):
                        with contextlib.suppress(subprocess.SubprocessError, OSError):
                            _ip("netns", "del", ns)
            finally:
                if old_int is not None:
                    signal.signal(signal.SIGINT, old_int)
