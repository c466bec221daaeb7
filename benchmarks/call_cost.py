"""The fixed cost of one public call: ``await aiosendfile.sendfile(writer, f)`` for a small file.

The library's first user is an asyncio server that calls ``sendfile`` per response. Here a server
process (pinned to one core) sends a 4 KiB file ``--calls`` times over one TCP connection on
loopback to a reader in another process (pinned to the other core), one call after another, and
reports the server's CPU time (user + system, ``getrusage``) per call. Contenders, interleaved
round by round:

* ``aiosendfile-uvloop`` / ``aiosendfile-asyncio``: ``await aiosendfile.sendfile(writer, f, 0, size)``;
* ``pread-write-uvloop`` / ``pread-write-asyncio``: ``writer.write(os.pread(fd, size, 0))`` then
  ``await writer.drain()`` (the userspace floor for a small file);
* ``loop.sendfile-asyncio``: stock ``await loop.sendfile(transport, f, 0, size)`` (uvloop has none).

Run from the repository root::

    python -m benchmarks.call_cost [--calls 20000] [--size 4096] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import socket
import statistics
import tempfile
import time
from typing import Any

CONTENDERS = (
    "aiosendfile-uvloop",
    "aiosendfile-asyncio",
    "pread-write-uvloop",
    "pread-write-asyncio",
    "loop.sendfile-asyncio",
)


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _reader(port: int, total: int, cpu: int | None) -> None:
    _pin(cpu)
    sock = socket.create_connection(("127.0.0.1", port))
    got = 0
    while got < total:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    sock.close()


async def _serve(kind: str, path: str, calls: int, size: int, listener: socket.socket) -> tuple[float, float]:
    import aiosendfile

    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[float, float]] = loop.create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with open(path, "rb") as f:
            fd = f.fileno()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            if kind.startswith("aiosendfile"):
                for _ in range(calls):
                    await aiosendfile.sendfile(writer, f, 0, size)
            elif kind.startswith("pread-write"):
                for _ in range(calls):
                    writer.write(os.pread(fd, size, 0))
                    await writer.drain()
            else:
                transport = writer.transport
                for _ in range(calls):
                    await loop.sendfile(transport, f, 0, size)
            await writer.drain()
            r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        writer.close()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        done.set_result((cpu, t1 - t0))

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        return await done


def _server(
    kind: str, path: str, calls: int, size: int, listener: socket.socket, cpu: int | None, out: Any
) -> None:
    _pin(cpu)
    coro = _serve(kind, path, calls, size, listener)
    if kind.endswith("uvloop"):
        import uvloop

        result = uvloop.run(coro)
    else:
        result = asyncio.run(coro)
    out.send(result)


def trial(
    kind: str, path: str, calls: int, size: int, cpus: tuple[int | None, int | None]
) -> tuple[float, float]:
    """One contender once: (server CPU µs per call, wall µs per call)."""
    ctx = mp.get_context("spawn")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_server, args=(kind, path, calls, size, listener, cpus[0], child))
    server.start()
    listener.close()
    reader = ctx.Process(target=_reader, args=(port, calls * size, cpus[1]))
    reader.start()
    cpu, wall = parent.recv()
    server.join()
    reader.join()
    return cpu / calls * 1e6, wall / calls * 1e6


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--reader-cpu", type=int, default=1)
    p.add_argument("--no-pin", action="store_true")
    args = p.parse_args()
    names = args.contenders.split(",")
    unknown = set(names) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    cpus = (None, None) if args.no_pin else (args.server_cpu, args.reader_cpu)
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    with tempfile.NamedTemporaryFile(prefix="call-cost-") as f:
        f.write(os.urandom(args.size))
        f.flush()
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                results[name].append(trial(name, f.name, args.calls, args.size, cpus))
                cpu, wall = results[name][-1]
                print(f"round {r + 1}/{args.rounds}  {name:24s} {cpu:7.1f} µs CPU/call  {wall:7.1f} µs wall")
    pin = "unpinned" if args.no_pin else f"server on CPU {args.server_cpu}, reader on CPU {args.reader_cpu}"
    print(f"\ncall_cost: {args.size}-byte file, {args.calls} calls per trial, {args.rounds} rounds, {pin}")
    print(f"CPU: {_cpu_model()}")
    print(f"{'contender':24s} {'CPU µs/call median [min-max]':>32s} {'wall µs/call':>14s}")
    floor = None
    if "pread-write-uvloop" in results:
        floor = statistics.median(c for c, _ in results["pread-write-uvloop"])
    for name in names:
        cpus_ = [c for c, _ in results[name]]
        wall = statistics.median(w for _, w in results[name])
        ratio = f"  {statistics.median(cpus_) / floor:.2f}x pread+write (uvloop)" if floor else ""
        spread = f"{statistics.median(cpus_):12.1f} [{min(cpus_):.1f}-{max(cpus_):.1f}]"
        print(f"{name:24s} {spread} {wall:14.1f}{ratio}")


if __name__ == "__main__":
    main()
