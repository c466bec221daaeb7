"""Fixtures and hooks: every async test runs on stock asyncio and on uvloop.

* ``pytest_asyncio_loop_factories`` parametrizes each async test over both loops.
* ``_guards`` puts the guards on every test: ``_no_loop_errors`` fails an async test if
  the loop's exception handler was called, ``_no_fd_leak`` fails a test that leaves file
  descriptors open. A sync test gets the fd check alone, and no event loop.
* ``connect`` makes a connected server-side ``StreamWriter`` and a client over
  TCP, a Unix socket or TLS (certificates from trustme).

Each folder's ``conftest.py`` adds its own fixtures (``tests/serve``, ``tests/static``,
``tests/asgi``, ``tests/pair``). The helpers tests import live in ``tests.support``; nothing imports
this module.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import signal
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import trustme
import uvloop

from aiosendfile import _platform
from aiosendfile._splice import close_idle_pipes

from .support.connections import Connector, trusting
from .support.fds import describe_fd, open_fds
from .support.files import pattern

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def pytest_sessionstart(session: Any) -> None:
    """A uvloop loop made and closed before any test: libuv opens a pipe for the whole process with
    its first loop (signal delivery) and keeps it, which the fd-leak check would otherwise blame on
    whichever test makes the first one (a sync test making a loop, alone or early in a worker)."""
    uvloop.new_event_loop().close()


def pytest_report_header(config: Any) -> str:
    """Which system-call path the run tests: the compiled ``_syscalls`` (cachestat, openat2) or
    the pure-Python one (no compiler at install, ``AIOSENDFILE_NO_EXTENSIONS``)."""
    found = "compiled" if _platform.HAS_SYSCALLS_MODULE else "pure Python (no compiled _syscalls)"
    return f"aiosendfile: {Path(_platform.__file__).parent}, system calls {found}"


def pytest_asyncio_loop_factories(
    config: Any, item: Any
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    return LOOPS


# When the suite runs in the background of a shell without job control (CI runners, `cmd &`
# in a script), SIGINT arrives ignored, and every subprocess would inherit that: a Ctrl-C sent
# to a CLI under test before its own handler is in place would then be dropped instead of
# having Python's default effect. Tests see what a user at a terminal sees.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- guards ------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _guards(request: pytest.FixtureRequest) -> Iterator[None]:
    """The loop and fd guards inside an async test's loop; for a sync test, the fd check alone.

    Only an async test has a loop to watch. Asking a sync test for the async guards would
    make pytest-asyncio start a loop for it (and its fds would then need the loop's
    accounting); the fd check needs no loop, so sync tests (CLI subprocesses, pure rules)
    keep it at the cost of two ``gc.collect()``.
    """
    if pytest_asyncio.is_async_test(request.node):
        request.getfixturevalue("_no_loop_errors")
        request.getfixturevalue("_no_fd_leak")
        yield
        return
    before = _fds_before()
    yield
    _assert_no_fd_leaked(before)


@pytest.fixture
async def _no_loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    yield errors
    await asyncio.sleep(0)
    assert not errors, f"the loop's exception handler was called: {errors}"


@pytest.fixture
async def _no_fd_leak() -> AsyncIterator[None]:
    """Measured inside the test's loop, so the loop's own fds are there before and after."""
    before = _fds_before()
    yield
    await asyncio.sleep(0)  # let transports finish their scheduled connection_lost
    _assert_no_fd_leaked(before)


def _fds_before() -> set[int]:
    close_idle_pipes()
    return open_fds()


def _assert_no_fd_leaked(before: set[int]) -> None:
    """A leak is a descriptor still open once garbage is collected. ``gc.collect()`` costs ~0.1 s
    with the whole suite loaded, so it runs only when a descriptor is found open (then the check
    is the same as collecting first)."""
    close_idle_pipes()  # recvfile's pipe pool is a cache, not a leak
    if not _opened_since(before):
        return
    gc.collect()
    close_idle_pipes()
    leaked = _opened_since(before)
    assert not leaked, f"file descriptors leaked: {leaked}"


def _opened_since(before: set[int]) -> dict[int, str]:
    """The descriptors opened since *before*, but the loop's own: libuv opens ``/dev/null``
    once per loop as its reserve for EMFILE (so nearly every uvloop test would otherwise pay a
    ``gc.collect()``)."""
    opened = {fd: describe_fd(fd) for fd in open_fds() - before}
    return {fd: what for fd, what in opened.items() if what != "/dev/null"}


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    _platform.counters.reset()


# -- TLS -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tls_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def tls_server_ctx(tls_ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_ca.issue_cert("localhost", "127.0.0.1").configure_cert(ctx)
    return ctx


@pytest.fixture(scope="session")
def tls_client_ctx(tls_ca: trustme.CA) -> ssl.SSLContext:
    return trusting(tls_ca)


# -- files -----------------------------------------------------------------------


@pytest.fixture
def make_file(tmp_path: Path) -> Callable[..., Path]:
    def make(size: int, name: str = "data.bin", seed: int = 0) -> Path:
        path = tmp_path / name
        path.write_bytes(pattern(size, seed))
        return path

    return make


# -- connections -----------------------------------------------------------------


@pytest.fixture(params=["tcp", "unix", "tls"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def connect(
    kind: str, tmp_path: Path, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> AsyncIterator[Connector]:
    connector = Connector(kind, tmp_path, tls_server_ctx, tls_client_ctx)
    yield connector
    await connector.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (mounted as root), or the test is skipped."""
    path = tmp_path / "small"
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
