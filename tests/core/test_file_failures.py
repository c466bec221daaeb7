"""The file fails or changes during a transfer: truncated, unreadable, renamed over or unlinked.

A truncated file is a ``FileTruncatedError`` (never a short body passed off as whole), a
read error keeps its type and carries ``.sent``; an open file renamed over or unlinked is
sent whole, as its descriptor still holds the inode.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _platform

from ..support.connections import Connector, zero_copy_expected
from ..support.files import pattern
from ..support.waiting import stalled

MiB = 2**20


# -- the file shrinks or cannot be read --------------------------------------------------------------


async def test_file_truncated_during_transfer(connect: Connector, kind: str, make_file: Any) -> None:
    size = 16 * 2**20
    path = make_file(size)
    conn = await connect(rcvbuf=4096)
    with open(path, "rb") as f:
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f))
        os.truncate(path, 65536)  # far less than what is already on its way
        reader = asyncio.create_task(conn.read_all())
        with pytest.raises(aiosendfile.FileTruncatedError) as exc_info:
            await task
        err = exc_info.value
        assert err.expected == size
        assert 0 < err.sent < size
        assert f.tell() == err.sent
    # The HTTP-layer rule: close the connection rather than pass off a short body.
    conn.writer.close()
    data = await reader
    assert len(data) == err.sent
    if zero_copy_expected(kind):
        # Bytes already queued on the socket reference page-cache pages that the
        # truncation zeroed: only what is still in the file is guaranteed. (The
        # kernel's rule, as with nginx; the error tells the body is short.)
        assert data[:65536] == pattern(65536)
    else:
        assert data == pattern(size)[: err.sent]


async def test_disk_read_error_keeps_its_type_and_carries_sent(
    connect: Connector, kind: str, make_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulated EIO after 1 MiB: raised as OSError(EIO) with .sent, position consistent."""

    conn = await connect()
    real_sendfile, real_pread = os.sendfile, os.pread
    limit = 2**20  # the "bad sector": every read at or past it fails

    def sendfile(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        if offset >= limit:
            raise OSError(errno.EIO, "Input/output error")
        return real_sendfile(out_fd, in_fd, offset, min(count, limit - offset))

    def pread(fd: int, n: int, offset: int) -> bytes:
        if offset >= limit:
            raise OSError(errno.EIO, "Input/output error")
        return real_pread(fd, min(n, limit - offset), offset)

    monkeypatch.setattr(os, "sendfile", sendfile)
    monkeypatch.setattr(os, "pread", pread)  # (the fallback's reads: aiosendfile._coldread)
    # A failing disk is never "cached": the fallback's reads go to the pool, through pread.
    monkeypatch.setattr(_platform, "pread_cached", lambda fd, size, offset: None)
    reader = asyncio.create_task(conn.read_all())
    with open(make_file(4 * 2**20), "rb") as f:
        with pytest.raises(OSError, match="Input/output") as exc_info:
            await aiosendfile.sendfile(conn.writer, f, max_chunk=2**18)
        assert exc_info.value.errno == errno.EIO
        sent = exc_info.value.sent  # type: ignore[attr-defined]
        assert sent == limit
        assert f.tell() == sent
    conn.writer.close()
    assert await reader == pattern(4 * 2**20)[:limit]


# -- the file changes name or disappears -------------------------------------------------------------


@pytest.mark.parametrize("change", ["replaced-by-rename", "unlinked"])
@pytest.mark.parametrize("kind", ["tcp", "tls"], indirect=True)  # zero-copy and the fallback
async def test_file_renamed_over_or_unlinked_mid_transfer(
    connect: Connector, kind: str, make_file: Any, tmp_path: Path, change: str
) -> None:
    """The open descriptor keeps its inode: its bytes go out, whole and consistent (nginx's advice)."""
    size = 6 * MiB
    path = make_file(size)
    conn = await connect(rcvbuf=4096)
    with open(path, "rb") as f:
        task = await stalled(conn, aiosendfile.sendfile(conn.writer, f))
        if change == "unlinked":
            path.unlink()
        else:
            new = tmp_path / "new.bin"
            new.write_bytes(pattern(size + 4096, seed=99))
            os.replace(new, path)
        reader = asyncio.create_task(conn.read_all())
        assert await asyncio.wait_for(task, 30) == size
        assert f.tell() == size
    conn.writer.close()
    data = await asyncio.wait_for(reader, 30)
    assert len(data) == size
    assert data == pattern(size)
