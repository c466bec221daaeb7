"""The public call's straight line (issue #24): a transport found plain by a first call is sent on
with one ``sendfile`` and no machinery while its buffer is empty; the contract holds (bytes,
return value, file position), also when the socket takes only part and the rest goes the general
way. Both loops (conftest)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

import aiosendfile
from aiosendfile import _api

from ..support.files import pattern


async def _pair() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, socket.socket]:
    a, b = socket.socketpair()
    b.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=a)
    return reader, writer, b


async def _drain_into(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < n:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 10)
        if not chunk:
            break
        got += chunk
    return bytes(got)


async def test_later_calls_on_a_plain_transport_take_the_straight_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.bin"
    data = pattern(4096, seed=3)
    path.write_bytes(data)
    resolved: list[Any] = []
    real = _api.resolve_target

    def counting(target: Any) -> Any:
        resolved.append(target)
        return real(target)

    monkeypatch.setattr(_api, "resolve_target", counting)
    _, writer, peer = await _pair()
    try:
        with open(path, "rb") as f:
            for i in range(5):
                assert await aiosendfile.sendfile(writer, f, 10, 100 + i) == 100 + i
                assert f.tell() == 110 + i
                assert await _drain_into(peer, 100 + i) == data[10 : 110 + i]
        assert len(resolved) == 1  # the first call only
    finally:
        writer.close()
        peer.close()


async def test_a_partial_straight_send_is_finished_by_the_general_path(tmp_path: Path) -> None:
    size = 3 * 2**20 + 5
    path = tmp_path / "big.bin"
    data = pattern(size, seed=4)
    path.write_bytes(data)
    _, writer, peer = await _pair()
    try:
        with open(path, "rb") as f:
            assert await aiosendfile.sendfile(writer, f, 0, 10) == 10  # now known plain
            assert await _drain_into(peer, 10) == data[:10]
            receive = asyncio.ensure_future(_drain_into(peer, size - 7))
            assert await aiosendfile.sendfile(writer, f, 7) == size - 7  # more than the socket holds
            assert f.tell() == size
            assert await receive == data[7:]
    finally:
        writer.close()
        peer.close()
