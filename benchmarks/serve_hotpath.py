"""The Python cost of one request on ``serve``'s hot path, without sockets or a load generator.

A memoised ``GET`` of a small file is fed to ``HttpProtocol.data_received`` over a fake transport
that only counts bytes; the figure is the best of several batches, in µs per request. It is the
engine's own work (parse, memo, ``stat``, the write call), the part a change to the protocol moves;
wrk's figures add the kernel's and the client's. Run it from two trees to compare them:

    PYTHONPATH=. python -m benchmarks.serve_hotpath [--loop uvloop] [--requests 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from typing import Any


class CountingTransport:
    """What the protocol calls on a transport, doing nothing but counting what is written."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


async def measure(directory: str, requests: int, batches: int) -> float:
    from aiosendfile._serve._server import Engine, ServeConfig

    engine = Engine(ServeConfig(directory), asyncio.get_running_loop())
    try:
        # (one batch runs without yielding to the loop: the engine's iteration budget would hold
        # every read past its first 0.5 ms for a next iteration that never comes)
        engine.spent = lambda: False  # type: ignore[method-assign]
        protocol = engine.protocol()
        transport = CountingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        request = b"GET /f4k.txt HTTP/1.1\r\nHost: x\r\nUser-Agent: wrk\r\n\r\n"
        for _ in range(5):  # a first sight (the pool), then inline, then memoised
            protocol.data_received(request)
            await asyncio.sleep(0.05)
        best = float("inf")
        gc.disable()
        try:
            for _ in range(batches):
                start = time.perf_counter()
                for _ in range(requests):
                    protocol.data_received(request)
                best = min(best, (time.perf_counter() - start) / requests)
        finally:
            gc.enable()
        assert transport.written > requests * 4096
        return best * 1e6
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--requests", type=int, default=200_000, help="requests per batch")
    parser.add_argument("--batches", type=int, default=7, help="batches (the best is reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "f4k.txt"), "wb") as f:
            f.write(b"x" * 4096)
        coro = measure(directory, args.requests, args.batches)
        if args.loop == "uvloop":
            import uvloop

            us = uvloop.run(coro)
        else:
            us = asyncio.run(coro)
    runs = f"{args.loop}, best of {args.batches} x {args.requests}"
    print(f"serve's hot path: {us:.2f} µs per request ({runs})")


if __name__ == "__main__":
    main()
