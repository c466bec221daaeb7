"""Another client's latency under load: GET one hot file at a fixed rate over one keep-alive connection.

``python -m benchmarks.programs.hot_probe HOST PORT PATH [--interval-ms 10] [--timeout S]``

Standard library only, raw socket (``TCP_NODELAY``), HTTP/1.1. It connects, sends one untimed
GET (which must answer 200 with a ``Content-Length`` body), prints ``ready`` on stdout, then
sends a GET on every tick of a fixed schedule (every ``--interval-ms``) and times each one with
``time.perf_counter`` from the first byte sent to the last byte of the body (read by
``Content-Length``). A request that ends after later ticks skips them (counted as ``late_ticks``):
the next request goes out on the next tick still ahead. A server that closes the connection
(``Connection: close``, HTTP/1.0 without keep-alive) or an error makes the next request connect
again, its connect time included in its latency (counted as ``reconnects``; errors as ``errors``).

It stops when its stdin reaches end of file and prints one JSON object on stdout: ``samples``
(``[start, latency]`` pairs in ``perf_counter`` seconds; on Linux that clock is ``CLOCK_MONOTONIC``,
the same in every process, so the caller keeps the requests that started inside its own window),
``errors``, ``first_errors``, ``reconnects``, ``late_ticks``, ``cpu_s`` (this process's CPU from
``ready`` to the stop) and ``unfinished``: the request still waiting for its answer when the stop
came, as ``[start, waited so far]`` (or null). A server that holds the hot file up for longer than
the caller's window (nginx behind a slow disk) is so seen waiting, not missing.
``benchmarks.harness.probe`` runs it beside wrk.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import socket
import sys
import time

__all__ = ["Connection", "Stopped", "main"]


class Stopped(Exception):
    """The stop (end of file on the stop descriptor) came while a response was awaited."""


class Connection:
    """One keep-alive HTTP/1.1 connection that GETs one path and reads each response by Content-Length.

    *stop_fd*: a descriptor whose end of file, seen while a response is awaited, raises
    :class:`Stopped` (None: wait on until *timeout*)."""

    def __init__(self, host: str, port: int, path: str, timeout: float, stop_fd: int | None = None) -> None:
        self.address = (host, port)
        self.request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: hot_probe\r\n\r\n".encode()
        self.timeout = timeout
        self.stop_fd = stop_fd
        self.sock: socket.socket | None = None
        self.buffer = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buffer = b""

    def _recv(self) -> bytes:
        assert self.sock is not None
        if self.stop_fd is not None:
            deadline = time.monotonic() + self.timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer in {self.timeout} s")
                ready, _, _ = select.select([self.sock.fileno(), self.stop_fd], [], [], left)
                if self.sock.fileno() in ready:
                    break
                if ready and not os.read(self.stop_fd, 4096):
                    raise Stopped
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection mid-response")
        return data

    def get(self) -> tuple[int, bool]:
        """One GET: (body bytes, whether it connected first). Raises OSError or ValueError."""
        connected = False
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connected = True
        self.sock.sendall(self.request)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self.buffer += self._recv()
            if len(self.buffer) > 65536:
                raise ValueError("response head over 64 KiB")
        head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + 4 :]
        status_line, *lines = head.split("\r\n")
        version, status, *_ = [*status_line.split(" ", 2), ""]
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        if status != "200":
            raise ValueError(f"status line {status_line!r}")
        if "content-length" not in headers:
            raise ValueError("no Content-Length")
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self.buffer += self._recv()
        self.buffer = self.buffer[length:]
        connection = headers.get("connection", "")
        keep = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
        if not keep:
            self.close()
        return length, connected


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.programs.hot_probe", description=__doc__)
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("path", help="the URL path, with its leading /")
    p.add_argument("--interval-ms", type=float, default=10.0, help="one GET per interval (default 10)")
    p.add_argument("--timeout", type=float, default=10.0, help="socket timeout per request, s (default 10)")
    args = p.parse_args(argv)
    stdin = sys.stdin.fileno()
    conn = Connection(args.host, args.port, args.path, args.timeout)
    conn.get()  # untimed: the connection is open and the file is hot before "ready"
    print("ready", flush=True)
    conn.stop_fd = stdin
    interval = args.interval_ms / 1e3
    samples: list[tuple[float, float]] = []
    first_errors: list[str] = []
    errors = reconnects = late = 0
    unfinished: tuple[float, float] | None = None
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    next_tick = time.perf_counter()
    while True:
        wait = next_tick - time.perf_counter()
        readable, _, _ = select.select([stdin], [], [], max(0.0, wait))
        if readable and not os.read(stdin, 4096):
            break  # end of file: the caller's window is over
        if time.perf_counter() < next_tick:
            continue  # stdin had bytes, not end of file: wait on
        t = time.perf_counter()
        try:
            _, connected = conn.get()
        except Stopped:
            unfinished = (t, time.perf_counter() - t)
            break
        except (OSError, ValueError) as exc:
            errors += 1
            if len(first_errors) < 5:
                first_errors.append(f"{type(exc).__name__}: {exc}")
            conn.close()
        else:
            samples.append((t, time.perf_counter() - t))
            reconnects += connected
        next_tick += interval
        now = time.perf_counter()
        while next_tick < now:
            next_tick += interval
            late += 1
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    conn.close()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    result = {
        "samples": samples,
        "errors": errors,
        "first_errors": first_errors,
        "reconnects": reconnects,
        "late_ticks": late,
        "cpu_s": cpu,
        "unfinished": unfinished,
    }
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
