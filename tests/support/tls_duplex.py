"""A blocking TLS client whose ``sendall`` and ``recv`` may run in two threads at once.

An ``ssl.SSLSocket`` may not: OpenSSL's connection object is used by one thread at a time, and a
reader thread beside a writer thread can corrupt what either sees (seen: a response read twice).
Here TLS runs over memory BIOs under a lock held only while OpenSSL works, never while the socket
blocks; the bytes OpenSSL produces leave in the order it produced them (a second lock around
taking them and sending them).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading


class TLSDuplex:
    """TLS over *raw* (connected), the handshake done at creation."""

    def __init__(self, raw: socket.socket, ctx: ssl.SSLContext, server_hostname: str = "localhost") -> None:
        self.raw = raw
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._incoming, self._outgoing, server_hostname=server_hostname)
        self._lock = threading.Lock()  # (OpenSSL's object)
        self._send_lock = threading.Lock()  # (the order of the records on the wire)
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._feed()
        self._flush()

    def _flush(self) -> None:
        with self._send_lock:
            with self._lock:
                data = self._outgoing.read()
            if data:
                self.raw.sendall(data)

    def _feed(self) -> bool:
        data = self.raw.recv(2**20)
        with self._lock:
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
        return bool(data)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), 2**16):
            with self._lock:
                self._tls.write(view[start : start + 2**16])
            self._flush()

    def close_notify(self) -> None:
        """Send our ``close_notify``; the peer's may come later (``recv`` reads on until it does).
        OpenSSL's shutdown on a socket would also read, and fail on application data already
        there (``APPLICATION_DATA_AFTER_CLOSE_NOTIFY``); here it reads nothing."""
        with self._lock, contextlib.suppress(ssl.SSLWantReadError):
            self._tls.unwrap()
        self._flush()

    def recv(self, size: int) -> bytes:
        """Up to *size* bytes; b"" at the end (the peer's close_notify or end of stream)."""
        while True:
            try:
                with self._lock:
                    return self._tls.read(size)
            except ssl.SSLWantReadError:
                self._flush()
                if not self._feed():
                    with self._lock:
                        if not self._incoming.pending:
                            return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def __enter__(self) -> TLSDuplex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.raw.close()
