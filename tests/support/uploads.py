"""What the upload tests share (``test_serve_upload``, ``test_serve_form``; their fixtures ``public``
and ``site_kwargs`` are ``tests/serve/conftest.py``'s): what a directory holds afterwards, and a
``serve --upload`` process stopped mid-body."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from .processes import Server

__all__ = ("left", "stopped_mid_body")


def left(directory: Path) -> list[str]:
    """Names in *directory* (temporary files included: a hidden one would show here)."""
    return sorted(os.listdir(directory))


def stopped_mid_body(public: Path, request: bytes) -> None:
    """A ``serve --upload`` process stopped by SIGTERM while *request* (a head announcing more
    than it sends, and part of the body) is on its way: it exits 0 and ``sub/`` stays empty."""
    server = Server(str(public), "--port", "0", "--upload")
    try:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(request)
            time.sleep(0.5)
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=10) == 0
        assert left(public / "sub") == []
    finally:
        server.close()
