"""``python -m aiosendfile`` as a subprocess: its environment, its start and end, signals, ``serve``.

Every CLI test starts the command line from this checkout (``cli_env``), and makes sure the
process is gone when the test ends (``cli_process``, ``Server.close``). ``children`` and ``alive``
look at ``serve --workers``' processes in /proc.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BANNER = re.compile(
    r"serving (?P<dir>.+) at (?P<url>https?://\S+) \((?P<loop>\w+), (?P<workers>\d+) workers?"
)


def catches(pid: int, signum: int) -> bool:
    """Whether *pid* has a handler for *signum* (SigCgt in /proc): aiosendfile's own code is running."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def cli_env() -> dict[str, str]:
    """The environment for ``python -m aiosendfile`` subprocesses: this checkout first on the path."""
    root = Path(__file__).resolve().parent.parent.parent
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def children(pid: int) -> set[int]:
    """The live child processes of *pid* (of any of its threads): ``serve --workers``' workers."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.update(int(child) for child in (task / "children").read_text().split())
        except OSError:  # a thread that ended meanwhile
            continue
    return {child for child in found if alive(child)}


def alive(pid: int) -> bool:
    """Whether *pid* exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def aiosendfile_process(*argv: str, **popen: Any) -> subprocess.Popen[str]:
    """``python -m aiosendfile *argv`` from this checkout, stdout/stderr piped (text), no stdin;
    *popen* goes to ``subprocess.Popen`` (``preexec_fn``, for one)."""
    return subprocess.Popen(
        [sys.executable, "-m", "aiosendfile", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=cli_env(),
        **popen,
    )


@contextlib.contextmanager
def cli_process(*argv: str) -> Iterator[subprocess.Popen[str]]:
    """:func:`aiosendfile_process`, killed (and reaped) on the way out if it is still running."""
    proc = aiosendfile_process(*argv)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def signal_while_starting(argv: list[str], signum: int, delay: float) -> tuple[bool, int, str]:
    """Start ``python -m aiosendfile *argv``, send *signum* after *delay* s, wait for the end.

    Returns (ours, exit status, stderr). *ours* says whether the process had a SIGTERM
    handler when the signal was sent: without one, the signal landed before any
    aiosendfile code ran (the interpreter's start) and has Python's default effect.
    """
    with cli_process(*argv) as proc:
        time.sleep(delay)
        ours = catches(proc.pid, signal.SIGTERM)
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=30 if ours else 5)
        except subprocess.TimeoutExpired:
            if ours:
                raise
            # Before our handler, Python's default SIGINT handler raises KeyboardInterrupt where the
            # signal lands; inside a weakref callback of the import machinery (a module lock's) the
            # interpreter prints "Exception ignored" and goes on: the program starts as if no
            # signal had come. That is the interpreter's start, not ours: end it here.
            proc.kill()
            _, err = proc.communicate()
    return ours, proc.returncode, err


class Server:
    def __init__(self, *args: str, **popen: Any) -> None:
        self.proc = aiosendfile_process("serve", *args, **popen)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = BANNER.search(line)
        if not match:
            self.proc.kill()
            raise AssertionError(f"no banner: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.banner = match
        self.url = match["url"]

    def get(
        self, path: str, context: ssl.SSLContext | None = None, **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path.lstrip("/"), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def interrupt(self, timeout: float = 5.0) -> int:
        """SIGINT, as Ctrl-C sends; returns the exit status (fails if it hangs)."""
        self.proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        code = self.proc.wait(timeout=timeout)
        self.stopped_after = time.monotonic() - start
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
