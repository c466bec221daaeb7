"""``python -m aiosendfile serve`` starting: the process it sets itself up as (its open-file
limit), and an engine that cannot start (one line, exit 1, no banner), alone and with workers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.processes import BANNER, cli_env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/limits")
def test_serve_raises_its_open_file_limit_to_the_hard_one(tmp_path: Path) -> None:
    """A server's connections, the files it sends and an archive's batch each take a descriptor,
    and the usual soft limit, 1,024, is a few hundred clients (a review: 16 clients reading no
    archive took a 512-descriptor server's every one; then every request was 500). ``serve``
    raises its soft limit to the hard one at start, as Go's runtime does for every program."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("a hard limit of 256 descriptors or fewer")
    low = (
        "import os, resource, sys; "
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); "
        "os.execv(sys.executable, [sys.executable, '-m', 'aiosendfile', *sys.argv[1:]])"
    )
    argv = [sys.executable, "-c", low, "serve", str(tmp_path), "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert proc.stdout is not None
        assert BANNER.search(proc.stdout.readline())
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft = next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3]
        assert soft == str(1 << 20 if hard == resource.RLIM_INFINITY else hard)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


_START_FAILS = """\
import errno, runpy, sys
from aiosendfile._serve import _server

async def start_server(*args, **kwargs):
    raise OSError(errno.EMFILE, "Too many open files")

_server.start_server = start_server
sys.argv = ["aiosendfile", *sys.argv[1:]]
runpy.run_module("aiosendfile", run_name="__main__")
"""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_server_that_cannot_start_says_so_in_a_line_and_exits_1(tmp_path: Path, workers: str) -> None:
    """The banner promises a working server: it was printed (and with ``--workers``, each worker
    said it was ready) once the port was bound, before the engine started. An engine that could
    not start (out of descriptors: a review ran ``prlimit --nofile=16``) then gave a traceback,
    and with workers a restart every few seconds for ever, and exit status 0 at Ctrl-C."""
    argv = [sys.executable, "-c", _START_FAILS, "serve", str(tmp_path), "--port", "0", "--workers", workers]
    done = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=60)
    assert done.returncode == 1, done
    assert done.stdout == ""  # (no banner)
    assert "Traceback" not in done.stderr
    assert "too many open files" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
