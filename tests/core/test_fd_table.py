"""``_serve._listener.grow_fd_table``: a server sizes its descriptor table before it serves.

The kernel grows the table by doubling as descriptors are opened, and in a process with threads
each growth waits for an RCU grace period on the thread that opened one (6-20 ms measured on a
2-vCPU VM: a stall of the loop as it accepts). Sizes are read from ``/proc/self/status``
(``FDSize``), in a fresh process each time (the table never shrinks); no timing is asserted.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from aiosendfile import _platform

pytestmark = pytest.mark.skipif(_platform.PLATFORM != "linux", reason="FDSize is Linux's /proc")


def run(code: str) -> str:
    """*code* (after ``PRELUDE``) in a fresh Python: what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


PRELUDE = """
import os, resource, threading
from aiosendfile._serve import _listener

def fd_size():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("FDSize:")).split()[1])
"""


def test_the_table_is_sized_once_without_touching_an_open_descriptor() -> None:
    """Sized for the soft limit (at most ``FD_TABLE_MAX``); a descriptor open where the probe
    goes is left as it was, nothing is left open, and a second call does nothing."""
    out = run(
        """
        resource.setrlimit(resource.RLIMIT_NOFILE, (3000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        before = fd_size()
        r, w = os.pipe()
        os.dup2(w, 2999)  # (open where the probe would go)
        fds = set(os.listdir("/proc/self/fd"))
        grown = _listener.grow_fd_table()
        os.write(2999, b"x")
        assert os.read(r, 1) == b"x"
        assert set(os.listdir("/proc/self/fd")) == fds
        print(before, grown, fd_size(), _listener.grow_fd_table())
        """
    )
    before, grown, size, again = map(int, out.split())
    assert before < 3000
    assert grown == again == 3000
    assert size >= 3000


def test_a_soft_limit_below_the_start_leaves_the_table_as_it_is() -> None:
    out = run(
        """
        resource.setrlimit(resource.RLIMIT_NOFILE, (50, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        before = fd_size()
        print(_listener.grow_fd_table(), before == fd_size())
        """
    )
    assert out == "0 True"


def test_a_forked_child_sizes_its_own_table() -> None:
    """``fork`` copies a table sized for the descriptors open, not the parent's: the child grows
    its own (and is not told it is done already)."""
    out = run(
        """
        resource.setrlimit(resource.RLIMIT_NOFILE, (5000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        _listener.grow_fd_table()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            small = fd_size()
            grown = _listener.grow_fd_table()
            os.write(w, f"{small} {grown} {fd_size()}".encode())
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(r, 100).decode())
        """
    )
    small, grown, size = map(int, out.split())
    assert small < 5000
    assert grown == 5000
    assert size >= 5000


def test_a_server_sizes_the_table_as_it_starts(tmp_path: object) -> None:
    out = run(
        f"""
        import asyncio
        from aiosendfile._serve import _server
        resource.setrlimit(resource.RLIMIT_NOFILE, (4000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        before = fd_size()

        async def main():
            config = _server.ServeConfig({str(tmp_path)!r})
            server = await _server.start_server(config, host="127.0.0.1", port=0)
            await _server.shutdown(server)

        asyncio.run(main())
        print(before, fd_size())
        """
    )
    before, size = map(int, out.split())
    assert before < 4000 <= size
