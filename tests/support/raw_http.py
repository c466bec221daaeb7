"""HTTP/1.1 as bytes on a socket: the tests' one response reader, a raw client (no library
normalises the request), its connection (``connect``: TCP, TLS or a Unix socket) and reading to the
end (``read_to_eof``), and a strict multipart/byteranges reader.

The reader makes a :class:`Response` (status, header fields, body, the bytes as they came) and
frames a body as its head says: ``Content-Length``, chunked (``chunks`` keeps the sizes), or up to
the end of the connection; none for ``HEAD``, 1xx, 204 and 304. It has one face per source, all on
the same parsing:

* ``read_response(reader, method)``: the next answer on an asyncio stream (keep-alive, pipelining);
* ``split_responses(data, methods)``: the whole answers (to requests of *methods*, in order) at the
  start of bytes already read, and what follows them; ``all_responses`` when nothing may follow;
* ``SocketResponses(sock).next(method)``: the next answer on a blocking socket;
* ``parse_response(raw)``: bytes read until the server closed, as one answer whose body is the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any


class Fields:
    """A head's fields in order; names are case-insensitive. ``fields[name]`` is the one value of a
    field that must appear once (a field repeated fails the test), ``get`` the first, ``getall`` each."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = [(name.lower(), value) for name, value in pairs]

    def getall(self, name: str) -> list[str]:
        name = name.lower()
        return [value for key, value in self.pairs if key == name]

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self.getall(name)
        return values[0] if values else default

    def __getitem__(self, name: str) -> str:
        values = self.getall(name)
        if not values:
            raise KeyError(name)
        assert len(values) == 1, f"repeated {name}: {values}"
        return values[0]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.getall(name))

    def __len__(self) -> int:
        return len(self.pairs)

    def __repr__(self) -> str:
        return f"Fields({self.pairs!r})"


@dataclass
class Response:
    """One HTTP/1.x answer: *head* is its status line and fields with the blank line, *body* the
    payload (chunked bodies joined), *raw* the bytes as they came (head and framed body)."""

    status: int
    headers: Fields
    body: bytes
    raw: bytes
    head: bytes = b""
    chunks: list[int] = field(default_factory=list)  # chunk sizes, when chunked

    def header(self, name: str) -> str | None:
        """The first value of field *name*, or None."""
        return self.headers.get(name)


def parse_head(head: bytes) -> tuple[int, Fields]:
    """The status and fields of *head* (a status line and fields, with or without the blank line)."""
    lines = head.removesuffix(b"\r\n\r\n").split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1."), lines[0][:200]
    pairs = []
    for line in lines[1:]:
        if line:
            name, _, value = line.decode("latin-1").partition(":")
            pairs.append((name.strip(), value.strip()))
    return int(lines[0].split(b" ", 2)[1]), Fields(pairs)


def _framing(status: int, fields: Fields, method: str | bytes) -> int | str:
    """How the body after this head ends: its length, "chunked", or "close" (at the end of the connection)."""
    if method in ("HEAD", b"HEAD") or status in (204, 304) or 100 <= status < 200:
        return 0
    if "content-length" in fields:
        return int(fields["content-length"])
    if (fields.get("transfer-encoding") or "").lower() == "chunked":
        return "chunked"
    return "close"


def _chunked(data: bytes, pos: int) -> tuple[bytes, list[int], int] | None:
    """The chunked body starting at *pos* in *data*: (payload, chunk sizes, end), or None if not all there."""
    parts: list[bytes] = []
    sizes: list[int] = []
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(data[pos:line_end].split(b";", 1)[0], 16)
        sizes.append(size)
        pos = line_end + 2
        if len(data) < pos + size + 2:
            return None
        if size == 0:
            assert data[pos : pos + 2] == b"\r\n", data[pos : pos + 200]  # no trailer fields
            return b"".join(parts), sizes, pos + 2
        parts.append(data[pos : pos + size])
        assert data[pos + size : pos + size + 2] == b"\r\n", data[pos : pos + size + 200]
        pos += size + 2


def _next_response(data: bytes, pos: int, method: str | bytes, at_eof: bool) -> tuple[Response, int] | None:
    """The answer starting at *pos* in *data* and where it ends, or None if it is not all there
    (an answer that ends with the connection is all there only *at_eof*)."""
    end = data.find(b"\r\n\r\n", pos)
    if end < 0:
        return None
    end += 4
    head = data[pos:end]
    status, fields = parse_head(head)
    framing = _framing(status, fields, method)
    chunks: list[int] = []
    if framing == "chunked":
        found = _chunked(data, end)
        if found is None:
            return None
        body, chunks, stop = found
    elif framing == "close":
        if not at_eof:
            return None
        body, stop = data[end:], len(data)
    else:
        assert isinstance(framing, int)
        stop = end + framing
        if stop > len(data):
            return None
        body = data[end:stop]
    return Response(status, fields, body, data[pos:stop], head, chunks), stop


def split_responses(data: bytes, methods: list[str] | list[bytes]) -> tuple[list[Response], bytes]:
    """The whole answers at the start of *data* (to requests of *methods*, in order), and the rest:
    an answer cut short ends the list, and is in the rest."""
    out = []
    pos = 0
    for method in methods:
        found = _next_response(data, pos, method, at_eof=True)
        if found is None:
            break
        response, pos = found
        out.append(response)
    return out, data[pos:]


def all_responses(data: bytes, methods: list[str] | list[bytes]) -> list[Response]:
    """The answers to requests of *methods* that *data* holds, each whole, and nothing after them."""
    out, rest = split_responses(data, methods)
    assert len(out) == len(methods), f"an answer cut short: {rest[:200]!r}"
    assert rest == b"", f"bytes after the last answer: {rest[:200]!r}"
    return out


def parse_response(raw: bytes) -> Response:
    """*raw*, read until the server closed, as one answer whose body is everything after the head
    (status 0 and no fields if *raw* does not start with one)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1."):
        return Response(0, Fields([]), b"", raw)
    status, fields = parse_head(head)
    return Response(status, fields, body, raw, head + sep)


async def read_response(
    reader: asyncio.StreamReader, method: str | bytes = b"GET", timeout: float = 20
) -> Response:
    """The next answer on *reader*, framed as its head says (each read given *timeout* seconds)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    status, fields = parse_head(head)
    framing = _framing(status, fields, method)
    chunks: list[int] = []
    if framing == "chunked":
        data = b""
        while (found := _chunked(data, 0)) is None:
            line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
            size = int(line[:-2].split(b";", 1)[0], 16)
            data += line + await asyncio.wait_for(reader.readexactly(size + 2), timeout)
        body, chunks, _ = found
        return Response(status, fields, body, head + data, head, chunks)
    if framing == "close":
        body = await asyncio.wait_for(reader.read(), timeout)
    else:
        assert isinstance(framing, int)
        body = await asyncio.wait_for(reader.readexactly(framing), timeout)
    return Response(status, fields, body, head + body, head, chunks)


class SocketResponses:
    """Answers read in order off one keep-alive blocking *sock* (``buffer``: what came after them)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.at_eof = False

    def next(self, method: str | bytes = b"GET") -> Response:
        while (found := _next_response(self.buffer, 0, method, self.at_eof)) is None:
            assert not self.at_eof, f"the server closed mid-answer: {self.buffer[:300]!r}"
            chunk = self.sock.recv(1 << 20)
            self.at_eof = not chunk
            self.buffer += chunk
        response, end = found
        self.buffer = self.buffer[end:]
        return response


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


class Blob:
    """Bytes compared by value but shown by length and digest: an assertion on a multi-MiB body
    fails at once instead of making pytest diff it (which takes minutes)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        head = self.data[:60]
        return f"<{len(self.data)} bytes sha256:{hashlib.sha256(self.data).hexdigest()[:16]} {head!r}...>"


DATE = re.compile(rb"\r\nDate: [^\r]*", re.IGNORECASE)


def without_date(raw: bytes) -> bytes:
    """*raw* with its Date field's value blanked (formatted once a second: two answers may differ)."""
    return DATE.sub(b"\r\nDate: -", raw)


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
