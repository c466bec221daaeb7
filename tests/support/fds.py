"""Open file descriptors of this process, for the leak checks (``/proc/self/fd``)."""

from __future__ import annotations

import os


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def describe_fd(fd: int) -> str:
    """What *fd* refers to (its ``/proc`` link), or ``"?"`` once it is gone."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"
