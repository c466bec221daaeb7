"""What the resumable-upload tests share (``test_serve_resumable``, ``test_serve_resumable_hostile``):
requests as bytes (an IETF append, an offset's ``HEAD``), one request's final answer on a
connection of its own (this loop's, or a blocking socket's to a server in another process), and
where an upload's partial file is and how much it holds."""

from __future__ import annotations

import asyncio
import base64
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from aiosendfile._serve import _resumable

from .processes import Server
from .raw_http import Response, SocketResponses, read_response

__all__ = (
    "TUS",
    "V8",
    "ask",
    "append_to",
    "field",
    "head_of",
    "http_exchange",
    "partial_of",
    "policy_of",
    "port_of",
    "request",
    "resolved",
    "size_of",
    "tus_metadata",
    "until_size",
)

V8 = "Upload-Draft-Interop-Version: 8"
TUS = "Tus-Resumable: 1.0.0"


def request(method: str, path: str, *fields: str, body: bytes = b"", length: int | None = None) -> bytes:
    """A request with a ``Content-Length`` (*length*, or the body's) and its *body*."""
    size = len(body) if length is None else length
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {size}\r\n"
    return (head + "".join(f + "\r\n" for f in fields) + "\r\n").encode() + body


def append_to(
    where: str, offset: str, complete: str, *fields: str, body: bytes = b"", length: int | None = None
) -> bytes:
    """An IETF append to the upload at *where*."""
    return request(
        "PATCH",
        where,
        "Content-Type: application/partial-upload",
        f"Upload-Offset: {offset}",
        f"Upload-Complete: {complete}",
        *fields,
        body=body,
        length=length,
    )


def head_of(path: str, *fields: str) -> bytes:
    lines = "".join(f + "\r\n" for f in fields)
    return f"HEAD {path} HTTP/1.1\r\nHost: localhost\r\n{lines}\r\n".encode()


async def ask(site: Any, data: bytes, method: str = "GET") -> Response:
    """One request on a connection of its own, and its final answer (1xx answers skipped), its
    ``Location`` resolved as a client resolves it (:func:`resolved`)."""
    reader, writer = await site.open()
    try:
        writer.write(data)
        while True:
            answer = await read_response(reader, method)
            if answer.status >= 200:
                return resolved(answer, data)
    finally:
        writer.close()


def http_exchange(port: int, data: bytes, method: str = "GET") -> Response:
    """One request to a server in another process, on a blocking socket of its own (its answer
    :func:`resolved`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        return resolved(SocketResponses(sock).next(method), data)


def resolved(answer: Response, data: bytes) -> Response:
    """*answer* to the request *data* with its ``Location`` (an upload's address, relative: right
    behind a proxy that strips a prefix) resolved against the request's target, as a client does:
    the path the next request asks for. The field as sent stays in ``answer.raw``."""
    target = data.split(b" ", 2)[1].decode("latin-1")
    pairs = answer.headers.pairs
    answer.headers.pairs = [(k, urljoin(target, v) if k == "location" else v) for k, v in pairs]
    return answer


def field(answer: Response, name: str) -> str:
    return answer.headers[name]


def tus_metadata(name: str) -> str:
    return f"Upload-Metadata: filename {base64.b64encode(name.encode()).decode()},private"


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1].strip("/"))


def policy_of(public: Path) -> Any:
    from aiosendfile._static._fs import directory_policy

    return directory_policy(public)


def partial_of(public: Path, where_to: str) -> Path:
    """The partial file of the upload at *where_to*, in ``public/sub``."""
    return public / "sub" / f".upload-{_resumable.id_of(where_to[-32:].encode())}.partial"


def size_of(path: Path) -> int:
    return path.stat().st_size if path.exists() else -1


async def until_size(partial: Path, size: int) -> None:
    """Wait (up to 10 s) until *partial* holds *size* bytes."""
    for _ in range(200):
        if size_of(partial) == size:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{partial} never held {size} bytes")
