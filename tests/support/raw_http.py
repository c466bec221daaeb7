"""HTTP as bytes on a socket: a raw client (no library normalises the request), its connection
(``connect``: TCP, TLS or a Unix socket) and reading to the end (``read_to_eof``), and a strict
multipart/byteranges reader."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from dataclasses import dataclass
from typing import Any


@dataclass
class Response:
    status: int
    headers: dict[str, list[str]]
    body: bytes
    raw: bytes

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None


def parse_response(raw: bytes) -> Response:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1."):
        return Response(0, {}, b"", raw)
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return Response(status, headers, body, raw)


def request_bytes(target: bytes, extra: bytes = b"", method: bytes = b"GET") -> bytes:
    return method + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + extra + b"\r\n"


async def connect(
    host: str,
    port: int,
    ctx: ssl.SSLContext | None,
    unix_path: str | None = None,
    limit: int = 2**20,
    **kw: Any,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection: to *unix_path* if given, else TCP to *host*:*port* (TLS through *ctx*,
    checked as "localhost"; *kw* to ``asyncio.open_connection``)."""
    if unix_path is not None:
        return await asyncio.open_unix_connection(unix_path, limit=limit)
    return await asyncio.open_connection(
        host, port, ssl=ctx, server_hostname="localhost" if ctx else None, limit=limit, **kw
    )


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the connection ends: EOF, a reset or a TLS error (no timeout of its own)."""
    chunks = []
    while True:
        try:
            chunk = await reader.read(2**20)
        except (ConnectionError, ssl.SSLError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def raw_async(
    host: str, port: int, data: bytes, ctx: ssl.SSLContext | None, timeout: float = 20
) -> bytes:
    reader, writer = await connect(host, port, ctx)
    try:
        writer.write(data)
        async with asyncio.timeout(timeout) if hasattr(asyncio, "timeout") else contextlib.nullcontext():
            return await read_to_eof(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


def raw_sync(host: str, port: int, data: bytes, timeout: float = 20) -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(2**20)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def parse_multipart(body: bytes, boundary: bytes) -> list[tuple[bytes | None, bytes, bytes]]:
    """A strict multipart/byteranges reader: [(content_type, content_range, payload)].

    Each part has a Content-Range and at most a Content-Type besides; its payload length
    comes from the Content-Range; nothing may follow the closing delimiter.
    """
    delimiter = b"\r\n--" + boundary
    out: list[tuple[bytes | None, bytes, bytes]] = []
    pos = 0
    while True:
        assert body.startswith(delimiter, pos), f"no delimiter at {pos}"
        pos += len(delimiter)
        if body.startswith(b"--\r\n", pos):
            assert pos + 4 == len(body), "bytes after the closing delimiter"
            return out
        assert body.startswith(b"\r\n", pos)
        end = body.index(b"\r\n\r\n", pos + 2)
        fields = dict(line.split(b": ", 1) for line in body[pos + 2 : end].split(b"\r\n"))
        assert set(fields) <= {b"Content-Type", b"Content-Range"}, fields
        m = re.fullmatch(rb"bytes (\d+)-(\d+)/(\d+)", fields[b"Content-Range"])
        assert m, fields[b"Content-Range"]
        length = int(m[2]) - int(m[1]) + 1
        pos = end + 4
        out.append((fields.get(b"Content-Type"), fields[b"Content-Range"], body[pos : pos + length]))
        pos += length
