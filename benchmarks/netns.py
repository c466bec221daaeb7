"""A veth pair between two network namespaces the benchmark makes and removes itself (root only).

``veth_pair()`` creates namespaces ``asfb-srv-PID`` and ``asfb-cli-PID``, a veth
pair made directly inside them (``ip -n SRV link add ... peer ... netns CLI``,
so no interface ever appears in the caller's namespace), private addresses
``SERVER_ADDR``/``CLIENT_ADDR`` on it and ``lo`` up in both. It touches
nothing outside those two namespaces, and deletes both in ``finally`` (which
removes the veth pair too). ``entered(name)`` moves the calling thread into a
namespace for a block (``setns``), and back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
SERVER_ADDR = "10.213.77.1"
CLIENT_ADDR = "10.213.77.2"
PREFIX = 30


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
def veth_pair(mtu: int = 65535) -> Iterator[Veth]:
    tag = str(os.getpid())
    srv, cli = f"asfb-srv-{tag}", f"asfb-cli-{tag}"
    made: list[str] = []
    try:
        for ns in (srv, cli):
            _ip("netns", "add", ns)
            made.append(ns)
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
            "netns",
            cli,
        )
        _ip("-n", srv, "addr", "add", f"{SERVER_ADDR}/{PREFIX}", "dev", "asfb-s")
        _ip("-n", cli, "addr", "add", f"{CLIENT_ADDR}/{PREFIX}", "dev", "asfb-c")
        for ns, dev in ((srv, "asfb-s"), (cli, "asfb-c")):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
        _wait_up(((srv, "asfb-s"), (cli, "asfb-c")))
        yield Veth(srv, cli, SERVER_ADDR, CLIENT_ADDR, mtu)
    finally:
        for ns in reversed(made):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                _ip("netns", "del", ns)
