"""A ``serve`` engine in this process, and raw HTTP/1.1 against it: the harness of the engine's
socket tests (``test_serve_engine``, ``test_serve_tls``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import pattern
from .raw_http import connect, read_to_eof

__all__ = (
    "BIG",
    "SMALL",
    "Answer",
    "Site",
    "at_eof",
    "build",
    "close_writer",
    "engine",
    "get",
    "read_answer",
    "reported",
    "serving",
    "split_answers",
)

SMALL = 4096
BIG = 3 * 1024 * 1024 + 17  # above the inline limit: sent by aiosendfile.sendfile


def engine() -> Any:
    from aiosendfile._serve import _server

    return _server


@dataclass
class Site:
    root: Path
    server: Any
    host: str = "127.0.0.1"
    port: int = 0
    unix: str | None = None
    ctx: ssl.SSLContext | None = None

    async def open(self, **kw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await connect(self.host, self.port, self.ctx, self.unix, limit=2**22, **kw)

    async def exchange(self, data: bytes) -> bytes:
        """Send *data*, read until the server closes."""
        reader, writer = await self.open()
        try:
            writer.write(data)
            return await asyncio.wait_for(read_to_eof(reader), 20)
        finally:
            await close_writer(writer)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 5)


def build(root: Path) -> Path:
    root.mkdir()
    (root / "small.txt").write_bytes(pattern(SMALL, seed=1))
    (root / "big.bin").write_bytes(pattern(BIG, seed=2))
    (root / "sp ace.txt").write_bytes(b"space")
    (root / "a%20b.txt").write_bytes(b"literal percent")
    (root / "sub").mkdir()
    (root / "sub" / "index.html").write_bytes(b"<p>index</p>")
    return root


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, *, kind: str = "tcp", tls: Any = None, **config: Any
) -> AsyncIterator[Site]:
    mod = engine()
    root = build(tmp_path / "www")
    cfg = mod.ServeConfig(str(root), **config)
    if kind == "unix":
        path = str(tmp_path / "s.sock")
        server = await mod.start_server(cfg, path=path)
        site = Site(root, server, unix=path)
    else:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        try:
            server = await mod.start_server(cfg, sock=sock, ssl=tls[0] if tls else None)
        except BaseException:
            sock.close()
            raise
        site = Site(root, server, port=sock.getsockname()[1], ctx=tls[1] if tls else None)
    try:
        yield site
    finally:
        await mod.shutdown(server, 5.0)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    head: bytes


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), lines[0]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"repeated {name}"
            headers[name.lower()] = value.strip()
    return int(lines[0].split(" ")[1]), headers


async def read_answer(reader: asyncio.StreamReader, method: str = "GET") -> Answer:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    status, headers = _parse_head(head)
    n = 0 if method == "HEAD" or status in (100, 304) else int(headers["content-length"])
    body = await asyncio.wait_for(reader.readexactly(n), 20)
    return Answer(status, headers, body, head)


def split_answers(data: bytes, methods: list[str]) -> list[Answer]:
    out = []
    pos = 0
    for method in methods:
        end = data.index(b"\r\n\r\n", pos) + 4
        status, headers = _parse_head(data[pos:end])
        n = 0 if method == "HEAD" or status in (100, 304) else int(headers["content-length"])
        assert end + n <= len(data), "an answer cut short"
        out.append(Answer(status, headers, data[end : end + n], data[pos:end]))
        pos = end + n
    assert pos == len(data), f"bytes after the last answer: {data[pos : pos + 200]!r}"
    return out


def get(target: str, extra: str = "", method: str = "GET", version: str = "1.1") -> bytes:
    return f"{method} {target} HTTP/{version}\r\nHost: localhost\r\n{extra}\r\n".encode("latin-1")


async def at_eof(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed: EOF (or a reset) with nothing more to read."""
    try:
        return await asyncio.wait_for(reader.read(1), 20) == b""
    except (ConnectionError, ssl.SSLError):
        return True


@contextlib.contextmanager
def reported() -> Iterator[list[dict[str, Any]]]:
    """What reaches the loop's exception handler meanwhile (instead of failing the test)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    try:
        yield errors
    finally:
        loop.set_exception_handler(previous)
