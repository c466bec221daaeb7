"""The floor: the least a Python file server on uvloop can spend per request (a reference, not a server).

``python -m benchmarks.programs.floor_server DIR HOST PORT [--probe]``

It owns its sockets (``add_reader``/``add_writer``), reads a request with one ``recv``, takes the
path from the request line, and answers with ``open``, ``fstat``, the head sent with ``MSG_MORE``,
``sendfile`` of the whole file and ``close``: the system calls nginx makes, and no more Python
than that. Nothing else: no parser, no validators or ranges, no caches, no timeouts, no bound on
what a client queues, no access log. It waits for the disk inside ``sendfile`` like nginx, so a
cold file stalls its loop.

``--probe`` adds what a server that never stalls must pay before each ``sendfile``: the
page-cache probe ``serve`` makes (``cachestat`` over the file's pages, then a 1-byte
``RWF_NOWAIT`` read of the last page, from ``aiosendfile._platform``). Its answer is not used (a
warm file is sent the same way): the row shows the probe's price, not a cold path.

``http_static`` runs it by name (``--contenders serve,nginx,py-floor,py-floor+probe``): on any machine
the two rows say how close to nginx Python can come there, with and without the probe.
SIGTERM or SIGINT stop it with status 0.
"""

from __future__ import annotations

import argparse
import email.utils
import os
import signal
import socket
from typing import Any

import uvloop

__all__ = ["main"]

_HEAD = (
    b"HTTP/1.1 200 OK\r\nServer: floor\r\nDate: %s\r\n"
    b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class _Connection:
    __slots__ = ("buf", "end", "fd", "file", "pos", "server", "sock")

    def __init__(self, server: _Server, sock: socket.socket) -> None:
        self.server, self.sock, self.fd = server, sock, sock.fileno()
        self.buf = b""
        self.file = -1
        self.pos = self.end = 0
        server.loop.add_reader(self.fd, self.readable)

    def close(self) -> None:
        loop = self.server.loop
        loop.remove_reader(self.fd)
        if self.file >= 0:
            loop.remove_writer(self.fd)
            os.close(self.file)
            self.file = -1
        self.sock.close()

    def readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        self.buf += data
        self.answer()

    def answer(self) -> None:
        buf = self.buf
        while self.file < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            line = buf[: buf.find(b"\r\n")]
            buf = buf[end + 4 :]
            try:
                self.respond(line.split(b" ", 2)[1])
            except OSError:
                self.buf = b""
                self.close()
                return
        self.buf = buf

    def respond(self, target: bytes) -> None:
        path = target.partition(b"?")[0]
        if b".." in path:
            self.sock.send(_NOT_FOUND)
            return
        try:
            f = os.open(self.server.root + path, os.O_RDONLY)
        except OSError:
            self.sock.send(_NOT_FOUND)
            return
        size = os.fstat(f).st_size
        if self.server.probe is not None and size:
            self.server.probe(f, size)
        # (A head goes whole into the empty send buffer of a client that waits for its answer, as
        # wrk does; a pipelining client that fills it is not this reference's case.)
        self.sock.send(_HEAD % (self.server.date, size), socket.MSG_MORE)
        pos = 0
        try:
            while pos < size:
                pos += os.sendfile(self.fd, f, pos, size - pos)
        except BlockingIOError:
            self.file, self.pos, self.end = f, pos, size
            self.server.loop.remove_reader(self.fd)
            self.server.loop.add_writer(self.fd, self.writable)
            return
        except OSError:
            os.close(f)
            raise
        os.close(f)

    def writable(self) -> None:
        try:
            while self.pos < self.end:
                self.pos += os.sendfile(self.fd, self.file, self.pos, self.end - self.pos)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        loop = self.server.loop
        loop.remove_writer(self.fd)
        os.close(self.file)
        self.file = -1
        loop.add_reader(self.fd, self.readable)
        if self.buf:
            self.answer()


class _Server:
    def __init__(self, loop: Any, root: str, sock: socket.socket, probe: bool) -> None:
        self.loop, self.root, self.sock = loop, os.fsencode(os.path.abspath(root)), sock
        self.probe = _probe() if probe else None
        self.date = b""
        self._tick()
        loop.add_reader(sock.fileno(), self.accept)

    def _tick(self) -> None:
        self.date = email.utils.formatdate(usegmt=True).encode("ascii")
        self.loop.call_later(1.0, self._tick)

    def accept(self) -> None:
        for _ in range(64):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: try again at the next readiness
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _Connection(self, conn)


def _probe() -> Any:
    """``serve``'s page-cache probe of a whole file (imported only with ``--probe``)."""
    from aiosendfile._platform import page_cached, range_cached

    def probe(fd: int, size: int) -> None:
        range_cached(fd, 0, size) and page_cached(fd, size - 1)

    return probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("directory")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--probe", action="store_true", help="probe the page cache before each sendfile")
    args = parser.parse_args()
    loop = uvloop.new_event_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(4096)
    sock.setblocking(False)
    _Server(loop, args.directory, sock, args.probe)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, loop.stop)
    try:
        loop.run_forever()
    finally:
        sock.close()
        loop.close()


if __name__ == "__main__":
    main()
