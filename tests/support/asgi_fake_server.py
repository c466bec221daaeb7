"""A fake ASGI server in process, for ``aiosendfile.asgi``'s tests (``tests/asgi/test_asgi_static*.py``).

:class:`FakeServer` builds the scope a server would (``scope_of``: uvicorn's spelling: path
decoded, ``raw_path`` as sent without the query, lowercase header names), lists one set of
``EXTENSIONS``, collects the messages, checks their order, and carries out ``pathsend`` (ours with
a descriptor and ranges, or a plain path) and ``zerocopysend`` by reading the file the way a server
would; ``raw()`` renders the response those messages make. ``call`` runs an app through it and
checks every descriptor the app handed over is closed; ``app_for`` makes ``StaticFiles`` for a
golden-table policy, ``comparable`` compares its answers, ``no_core`` fails a test that asks the
static core.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import pytest

from aiosendfile import asgi
from aiosendfile._asgi import _app

from .static_requests import (
    POLICIES,
)

#: The extension sets a server may list: none (hypercorn, stock uvicorn), pathsend (granian),
#: zerocopysend, and ours (aiosendfile.uvicorn's protocols list all three).
EXTENSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "none": {},
    "pathsend": {"http.response.pathsend": {}},
    "zerocopysend": {"http.response.zerocopysend": {}},
    "ours": {"http.response.pathsend": {}, "http.response.zerocopysend": {}, "aiosendfile.pathsend": {}},
}


def scope_of(raw_request: bytes, extensions: str = "none", root_path: str = "") -> dict[str, Any]:
    """The http scope uvicorn builds for *raw_request* (root_path: what a ``Mount`` adds)."""
    head = raw_request.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    method, target, _ = head[0].split(" ")
    raw_path, _, query = target.encode("latin-1").partition(b"?")
    headers = [
        (name.strip().lower().encode("latin-1"), value.strip().encode("latin-1"))
        for name, _, value in (line.partition(":") for line in head[1:])
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path.decode("ascii")),
        "raw_path": raw_path,
        "query_string": query,
        "root_path": root_path,
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
        "extensions": dict(EXTENSIONS[extensions]),
    }


class FakeServer:
    """Collects one response's messages, checks their order, carries out pathsend/zerocopysend."""

    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.kinds: list[str] = []
        self.done = False
        self.asked = False
        self.fds: list[int] = []  # descriptors the app handed over (closed after, checked by tests)

    async def receive(self) -> dict[str, Any]:
        """The request (no body), then, as servers do, nothing until the client leaves."""
        if not self.asked:
            self.asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()  # (anyio: the trio test uses this server too)
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        assert not self.done, f"{kind} after the response was complete"
        self.kinds.append(kind)
        if self.status is None:
            assert kind == "http.response.start", kind
            self.status = message["status"]
            self.headers = [(bytes(n), bytes(v)) for n, v in message["headers"]]
            for name, _ in self.headers:
                assert name == name.lower(), name
            return
        assert kind != "http.response.start"
        ext = self.scope["extensions"]
        if kind == "http.response.body":
            assert isinstance(message.get("body", b""), bytes)
            self.body += message.get("body", b"")
            self.done = not message.get("more_body", False)
        elif kind == "http.response.pathsend":
            assert "http.response.pathsend" in ext
            fd = message.get("aiosendfile.fd")
            if fd is None:
                assert not any(k.startswith("aiosendfile.") for k in message), message
                with open(message["path"], "rb") as f:
                    self.body += f.read()
            else:
                assert "aiosendfile.pathsend" in ext
                os.fstat(fd)  # open while send runs
                self.fds.append(fd)
                if "aiosendfile.parts" in message:
                    for head, offset, count in message["aiosendfile.parts"]:
                        self.body += head + os.pread(fd, count, offset)
                    self.body += message["aiosendfile.closing"]
                else:
                    offset = message.get("aiosendfile.offset", 0)
                    count = message.get("aiosendfile.count", os.fstat(fd).st_size - offset)
                    self.body += os.pread(fd, count, offset)
            self.done = True
        elif kind == "http.response.zerocopysend":
            assert "http.response.zerocopysend" in ext
            fd = message["file"].fileno()
            self.fds.append(fd)
            self.body += os.pread(fd, message["count"], message["offset"])
            self.done = not message.get("more_body", False)
        else:
            raise AssertionError(f"unexpected message {message!r}")

    def raw(self) -> bytes:
        assert self.done
        assert self.status is not None
        lines = [f"HTTP/1.1 {self.status} X".encode()]
        lines += [n + b": " + v for n, v in self.headers]
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n" + bytes(self.body)


async def call(app: Any, raw_request: bytes, extensions: str = "none", root_path: str = "") -> FakeServer:
    scope = scope_of(raw_request, extensions, root_path)
    server = FakeServer(scope)
    await app(scope, server.receive, server.send)
    for fd in server.fds:  # every descriptor the app handed over is closed once it returned
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)
    return server


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """A normalised answer with the status code only and header names lowercase."""
    return {
        "status": answer["status"].split()[1],
        "headers": [[name.lower(), value] for name, value in answer["headers"]],
        "body": answer["body"],
    }


def app_for(public: Path, policy: str, **kwargs: Any) -> asgi.StaticFiles:
    options = POLICIES[policy]
    return asgi.StaticFiles(
        directory=public,
        listings=options.get("show_index", False),
        dotfiles=options.get("show_dotfiles", False),
        follow_symlinks=options.get("follow_symlinks", False),
        **kwargs,
    )


GET_LARGE = b"GET /large.bin HTTP/1.1\r\nHost: x\r\n\r\n"


RANGE_LARGE = b"GET /large.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=10-19\r\n\r\n"


MULTI_LARGE = b"GET /large.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0,100-199\r\n\r\n"


HEAD_LARGE = b"HEAD /large.bin HTTP/1.1\r\nHost: x\r\n\r\n"


START, BODY, PATHSEND, ZEROCOPY = (
    "http.response.start",
    "http.response.body",
    "http.response.pathsend",
    "http.response.zerocopysend",
)


def no_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry into the static core fails the test (``_app``'s names for it patched)."""

    def asked(*args: Any) -> Any:
        raise AssertionError("the core was asked")

    for name in ("answer", "_off_loop", "first_look", "look_again", "decide_looked", "respond"):
        monkeypatch.setattr(_app, name, asked)
