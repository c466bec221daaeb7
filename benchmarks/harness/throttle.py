"""A slow disk for one server: its reads of one block device held to N per second by a cgroup.

The machine's own disk is fast; the case that matters on a slow one (a network volume, a busy
disk, a small board's SD card) is whether one client's cold file holds up every other client. A
:class:`ReadThrottle` makes such a device out of the real one without touching anything else: a
cgroup whose members may read the device that holds a directory at most ``iops`` times per second
(cgroup v1 ``blkio.throttle.read_iops_device``, or cgroup v2 ``io.max`` ``riops=``). Only the
server runs in it (:meth:`ReadThrottle.prefix` starts a command inside it); the client, the
probe and this process read at the device's own speed.

Needs root and a blkio (v1) or io (v2) controller; :func:`read_throttle` says why not otherwise.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from pathlib import Path

__all__ = ["ReadThrottle", "read_throttle"]

V1_ROOT = Path("/sys/fs/cgroup/blkio")
V2_ROOT = Path("/sys/fs/cgroup")


class ReadThrottle:
    """One cgroup whose members read one block device at most ``iops`` times a second."""

    def __init__(self, group: Path, device: str, iops: int) -> None:
        self.group, self.device, self.iops = group, device, iops

    def prefix(self) -> list[str]:
        """A command prefix that moves the command's process into the group before it runs
        (``sh`` writes its own pid, then ``exec``s: the command keeps that pid, its children
        and threads are born inside)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.group / "cgroup.procs")]

    def describe(self) -> str:
        return f"reads of block device {self.device} held to {self.iops}/s (cgroup {self.group})"

    def close(self) -> None:
        """Remove the group (its processes must have exited; a leftover one is moved out first)."""
        try:
            stuck = (self.group / "cgroup.procs").read_text().split()
            for pid in stuck:
                with contextlib.suppress(OSError):
                    (self.group.parent / "cgroup.procs").write_text(pid)
            self.group.rmdir()
        except OSError:
            pass


def block_device(path: str) -> str:
    """``MAJOR:MINOR`` of the whole disk that holds *path* (a partition's parent: throttling
    applies per disk)."""
    dev = os.stat(path).st_dev
    name = f"{os.major(dev)}:{os.minor(dev)}"
    sys_dir = Path("/sys/dev/block", name)
    if (sys_dir / "partition").exists():
        return (sys_dir.resolve().parent / "dev").read_text().strip()
    if not sys_dir.exists():
        raise OSError(f"{path} is not on a block device ({name}: a tmpfs or an overlay?)")
    return name


def read_throttle(path: str, iops: int) -> ReadThrottle | str:
    """A :class:`ReadThrottle` for the device that holds *path*, or why there cannot be one. The
    group is removed when this process exits (an interrupted run leaves none behind)."""
    if os.geteuid() != 0:
        return "needs root (a cgroup of its own)"
    try:
        device = block_device(path)
    except OSError as exc:
        return str(exc)
    name = f"aiosendfile-bench-{os.getpid()}"
    if (V1_ROOT / "blkio.throttle.read_iops_device").exists():
        group, limit_file, limit = V1_ROOT / name, "blkio.throttle.read_iops_device", f"{device} {iops}"
    elif "io" in _read(V2_ROOT / "cgroup.controllers").split():
        if "io" not in _read(V2_ROOT / "cgroup.subtree_control").split():
            try:
                (V2_ROOT / "cgroup.subtree_control").write_text("+io")
            except OSError as exc:
                return f"cgroup v2: cannot enable the io controller ({exc})"
        group, limit_file, limit = V2_ROOT / name, "io.max", f"{device} riops={iops}"
    else:
        return "no cgroup blkio (v1) or io (v2) controller"
    try:
        group.mkdir(exist_ok=True)
        (group / limit_file).write_text(limit)
    except OSError as exc:
        ReadThrottle(group, device, iops).close()
        return f"cannot set {limit_file} to {limit!r}: {exc}"
    made = ReadThrottle(group, device, iops)
    atexit.register(made.close)
    return made


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
