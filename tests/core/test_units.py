"""Loop-free unit tests: transfer bookkeeping, the platform shim, the error mapping."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from pathlib import Path

import pytest

from aiosendfile import (
    ConnectionLostError,
    FileTruncatedError,
    SendfileError,
    SendfileNotAvailableError,
    _platform,
)
from aiosendfile._errors import map_exceptions
from aiosendfile._state import TransferState

# -- TransferState ------------------------------------------------------------------------


def test_state_chunks_are_bounded_by_max_chunk_limit_and_remaining() -> None:
    state = TransferState(offset=10, total=2500, max_chunk=1000)
    assert state.next_chunk() == 1000
    assert state.next_chunk(limit=300) == 300
    state.advance(1000)
    state.advance(1000)
    assert (state.sent, state.position, state.remaining) == (2000, 2010, 500)
    assert state.next_chunk() == 500
    state.advance(500)
    assert state.done
    assert state.next_chunk() == 0


def test_state_unknown_total_never_done_until_eof() -> None:
    state = TransferState(offset=0, total=None, max_chunk=64)
    state.advance(10**9)
    assert not state.done
    assert state.remaining is None
    assert state.next_chunk() == 64
    assert not state.hit_eof()  # EOF on an unknown size is the end, not truncation


def test_state_truncation() -> None:
    state = TransferState(offset=5, total=100)
    state.advance(40)
    assert state.hit_eof()
    err = state.truncated()
    assert isinstance(err, FileTruncatedError)
    assert (err.sent, err.expected) == (40, 100)
    assert "offset 45" in str(err)


@pytest.mark.parametrize(
    "kwargs",
    [{"offset": -1, "total": 1}, {"offset": 0, "total": -1}, {"offset": 0, "total": 1, "max_chunk": 0}],
)
def test_state_rejects_bad_values(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be"):
        TransferState(**kwargs)


def test_state_cannot_overshoot() -> None:
    state = TransferState(offset=0, total=10)
    with pytest.raises(ValueError, match="more than"):
        state.advance(11)
    with pytest.raises(ValueError, match="negative"):
        state.advance(-1)


# -- the shim -------------------------------------------------------------------------------


def test_shim_sends_counts_and_reports_eagain(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(4 * 2**20))
    a, b = socket.socketpair()
    with a, b, open(path, "rb") as f:
        a.setblocking(False)
        total = 0
        with pytest.raises(BlockingIOError):  # noqa: PT012 - the loop must end in EAGAIN
            while True:
                total += _platform.sendfile_once(a.fileno(), f.fileno(), total, 2**20)
        assert 0 < total < 4 * 2**20
        assert _platform.counters.bytes == total
        assert _platform.counters.eagain == 1
        received = b""
        while len(received) < total:
            received += b.recv(2**20)
        assert received == path.read_bytes()[:total]


def test_shim_zero_at_eof_and_rejects_zero_count(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    a, b = socket.socketpair()
    with a, b, open(path, "rb") as f:
        assert _platform.sendfile_once(a.fileno(), f.fileno(), 3, 10) == 0
        with pytest.raises(ValueError, match="positive"):
            _platform.sendfile_once(a.fileno(), f.fileno(), 0, 0)  # 0 means "to EOF" on BSD


@pytest.mark.parametrize("err", [errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP])
def test_shim_maps_unsupported_errnos(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    def refuse(*args: int) -> int:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "sendfile", refuse)
    with pytest.raises(_platform.NotSupportedBySendfile) as exc_info:
        _platform.sendfile_once(1, 2, 0, 10)
    assert exc_info.value.errno == err


def test_shim_passes_other_errors_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "sendfile", fail)
    with pytest.raises(OSError, match="Input/output") as exc_info:
        _platform.sendfile_once(1, 2, 0, 10)
    assert not isinstance(exc_info.value, _platform.NotSupportedBySendfile)


def test_shim_has_no_asyncio_import() -> None:
    import ast

    tree = ast.parse(Path(_platform.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "os" in imported
    assert not any(name.startswith("asyncio") for name in imported)


# -- errors ---------------------------------------------------------------------------------


def test_error_hierarchy() -> None:
    assert issubclass(SendfileNotAvailableError, asyncio.SendfileNotAvailableError)
    assert issubclass(ConnectionLostError, ConnectionError)
    assert issubclass(ConnectionLostError, SendfileError)
    assert issubclass(FileTruncatedError, SendfileError)


@pytest.mark.parametrize("err", [errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN])
def test_map_exceptions_translates_connection_errnos(err: int) -> None:
    state = TransferState(offset=0, total=100)
    state.advance(77)
    with pytest.raises(ConnectionLostError) as exc_info, map_exceptions(state):
        raise OSError(err, os.strerror(err))
    assert exc_info.value.errno == err
    assert exc_info.value.sent == 77
    assert isinstance(exc_info.value.__cause__, OSError)


def test_map_exceptions_stamps_sent_and_keeps_types() -> None:
    state = TransferState(offset=0, total=100)
    state.advance(5)
    with pytest.raises(OSError, match="Input/output") as exc_info, map_exceptions(state):
        raise OSError(errno.EIO, "Input/output error")
    assert type(exc_info.value) is OSError
    assert exc_info.value.sent == 5  # type: ignore[attr-defined]
    with pytest.raises(FileTruncatedError) as trunc_info, map_exceptions(state):
        raise FileTruncatedError("short", sent=0, expected=9)
    assert trunc_info.value.sent == 5


def test_import_loads_the_core_but_the_command_line_defers_it() -> None:
    """``import aiosendfile`` loads the core, so a server's first sendfile() does not import it on
    the loop's thread (~15 ms stall); ``python -m aiosendfile`` defers it until its Ctrl-C
    handling is in place."""
    import subprocess
    import sys

    probe = "import sys, aiosendfile; print('aiosendfile._api' in sys.modules, 'asyncio' in sys.modules)"
    library = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert library.stdout.split() == ["True", "True"], library.stderr
    # The command line: the signal handlers are in place before asyncio is imported.
    check = (
        "import runpy, signal, sys; sys.argv = ['-m', '--version']; sys.orig_argv = ['python', '-m', "
        "'aiosendfile', '--version']; import aiosendfile, aiosendfile._cli._common as c; "
        "print('asyncio' in sys.modules)"
    )
    cli = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert cli.stdout.split() == ["False"], cli.stderr


def test_hot_cache_admits_read_backs_while_it_has_room_then_one_in_n(tmp_path: Path) -> None:
    """A full hot-file cache takes back one dropped file in ``READMIT_EVERY``: a working set larger
    than the cache is sent from its files instead of copied in and evicted on every request; the
    bounds hold whatever is admitted."""
    from aiosendfile._static._hot import READMIT_EVERY, HotFiles, identity

    hot = HotFiles(max_entries=4, max_bytes=1 << 20)
    files = []
    for i in range(6):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 100)
        files.append(p)
    for p in files[:4]:
        assert hot.admits(100)
        assert hot.put(str(p), None, identity(p.stat()), p.read_bytes()) is not None
    answers = [hot.admits(100) for _ in range(3 * READMIT_EVERY)]
    assert answers.count(True) == 3
    assert answers[READMIT_EVERY - 1]
    assert not any(answers[: READMIT_EVERY - 1])
    for p in files[4:]:
        hot.put(str(p), None, identity(p.stat()), p.read_bytes())
    assert len(hot._entries) == 4
    assert hot._bytes <= hot.max_bytes


def test_a_hot_entry_makes_its_renderings_at_the_first_asking() -> None:
    """A hot-file entry holds no rendering objects until a door asks for one (``serve`` never
    does): then one per ``precompressed`` setting, each the same object at every later asking."""
    import gc

    from aiosendfile._static._hot import HotEntry

    entry = HotEntry((1, 2, 3, 4, 5), b"body", "/srv/a")
    assert entry._renderings is None
    gc.collect()
    held = [o for o in gc.get_referents(entry) if not isinstance(o, type)]  # (not its class)
    assert not any(gc.is_tracked(o) for o in held), held  # (the identity untracked after a pass)
    plain, compressed = entry.rendering(False), entry.rendering(True)
    assert plain is not compressed
    assert entry.rendering(False) is plain
    assert entry.rendering(True) is compressed
    plain.fields = [("Content-Type", "text/plain")]
    assert entry.rendering(False).fields == [("Content-Type", "text/plain")]
