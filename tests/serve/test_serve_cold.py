"""Cold files end to end: the page reader's thread sends a cold body (``_bodies.ColdWhole``), or a
transfer goes on where it could not; every answer whole and in order, keep-alive and pipelined,
over TCP, a Unix socket and TLS in the server's own loop, and from a server in its own process
(both loops) to clients in this one. Nothing left behind: no descriptor, nothing on stderr."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from ..support.files import evict, pattern
from ..support.raw_http import all_responses, read_response
from ..support.serve import close_writer, engine, get, serve_process, serve_site

SIZES = (1, 3_000, 16_384, 16_385, 70_000, 262_144, 262_145, 1_500_000)


def drop(root: Path, files: dict[str, bytes]) -> None:
    """Drop the files' pages again (a read of them may still be under way: not checked)."""
    for name in files:
        fd = os.open(root / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_tree(root: Path) -> dict[str, bytes]:
    """Files of every size class (a byte, read whole, sent by the reader's thread, larger than
    what it sends), written then evicted."""
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, size in enumerate(SIZES):
        name = f"f{i}.bin"
        files[name] = pattern(size, seed=40 + i)
        (root / name).write_bytes(files[name])
        evict(root / name)
    return files


@pytest.mark.parametrize("kind", ["tcp", "unix", "tls"])
async def test_cold_files_are_answered_whole_in_order(
    tmp_path: Path,
    kind: str,
    tls_server_ctx: Any,
    tls_client_ctx: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cold files, each asked on its own and then all pipelined on one connection, twice (first
    sights, then kept answers): byte-exact, in order; over plain sockets the cold ones that the
    reader's thread can send go without a transfer."""
    from aiosendfile import _bodies, _outlet

    files = cold_tree(tmp_path / "www")
    where: dict[str, Any] = {}
    if kind == "unix":
        where["unix_path"] = str(tmp_path / "s.sock")
    elif kind == "tls":
        where.update(server_ctx=tls_server_ctx, client_ctx=tls_client_ctx)
    whole: list[int] = []
    real_run = _bodies.ColdWhole.run

    def run(self: Any) -> None:
        whole.append(self.size)
        real_run(self)

    monkeypatch.setattr(_bodies.ColdWhole, "run", run)
    async with serve_site(tmp_path / "www", limit=2**22, **where) as site:
        has_reader = engine()._engines[site.server].pages is not None
        for name, data in files.items():
            answer = await site.fetch(get(f"/{name}", "Connection: close\r\n"))
            assert (answer.status, answer.body) == (200, data), name
        for round_ in range(2):
            drop(tmp_path / "www", files)
            reader, writer = await site.open()
            try:
                writer.write(b"".join(get(f"/{name}") for name in files))
                for name, data in files.items():
                    answer = await read_response(reader)
                    assert (answer.status, answer.body) == (200, data), (round_, name)
            finally:
                await close_writer(writer)
    if kind != "tls" and has_reader:
        assert whole, "no cold body went by the reader's thread"
        assert max(whole) <= _outlet.READ_AHEAD_MAX
    else:
        assert whole == []


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_cold_files_from_a_server_in_its_own_process(tmp_path: Path, loop: str) -> None:
    """Eight clients at once, each pipelining every file twice, the files evicted before each
    round: every answer whole and in order; the server's descriptors back where they were, and
    it stops cleanly (exit 0, nothing on stderr)."""
    files = cold_tree(tmp_path)
    names = list(files) * 2
    requests = b"".join(get(f"/{name}") for name in names)

    async def client(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port, limit=2**22)
        try:
            writer.write(requests)
            for name in names:
                answer = await read_response(reader)
                assert (answer.status, answer.body) == (200, files[name]), name
        finally:
            writer.close()

    async def round_(host: str, port: int) -> None:
        await asyncio.gather(*(client(host, port) for _ in range(8)))

    with serve_process(tmp_path, loop=loop) as server:
        before: set[str] = set()
        for i in range(3):
            drop(tmp_path, files)
            asyncio.run(round_(server.host, server.port))
            if i == 0:  # (the page reader's eventfd, made at the first cold body, stays)
                before = settled_fds(server)
        assert settled_fds(server, before) == before


def test_a_client_gone_while_its_cold_files_are_sent_leaves_nothing(tmp_path: Path) -> None:
    """Clients that reset their connections while the reader's thread sends their cold files: the
    server goes on serving, holds no descriptor of them, and says nothing on stderr."""
    files = cold_tree(tmp_path)
    with serve_process(tmp_path) as server:
        drop(tmp_path, files)
        assert all_responses(fetch(server, "/f3.bin"), ["GET"])[0].body == files["f3.bin"]
        before = settled_fds(server)
        for _ in range(5):
            drop(tmp_path, files)
            socks = []
            for _ in range(16):
                sock = socket.create_connection((server.host, server.port))
                sock.sendall(b"".join(get(f"/{name}") for name in files))
                socks.append(sock)
            for sock in socks:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.close()  # (a reset)
        answer = all_responses(fetch(server, "/f0.bin"), ["GET"])[0]
        assert answer.body == files["f0.bin"]
        assert settled_fds(server, before) == before


def settled_fds(server: Any, want: set[str] | None = None) -> set[str]:
    """The server's descriptors (what each names), once they are *want* (within 10 s), or after
    they stop changing."""
    deadline = time.monotonic() + 10
    last: set[str] = set()
    while time.monotonic() < deadline:
        fds = set()
        for fd in os.listdir(f"/proc/{server.pid}/fd"):
            with contextlib.suppress(FileNotFoundError):  # (closed meanwhile)
                fds.add(os.readlink(f"/proc/{server.pid}/fd/{fd}"))
        if fds == want or (want is None and fds == last):
            return fds
        last = fds
        time.sleep(0.1)
    return last


def fetch(server: Any, path: str) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(get(path, "Connection: close\r\n"))
        out = b""
        while chunk := sock.recv(1 << 20):
            out += chunk
    return out
