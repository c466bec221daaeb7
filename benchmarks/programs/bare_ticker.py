"""A loop with nothing on it but the 1 ms ticker: the machine's own floor of loop delay.

``python -m benchmarks.programs.bare_ticker OUT.json PORT LOOP``

``mixed_stall``'s ``floor`` row runs it on the server's CPU while the cold set is read from wrk's
CPU: no server, no Python request handling, so a late tick there is the machine's (a virtual
CPU the host did not run, an interrupt storm), and ``serve``'s worst delay can be read against it.
It listens on PORT (accepting and closing: only so the harness sees it ready), runs until SIGTERM
or SIGINT, then writes OUT.json as ``ticked_serve`` does (``ticks``: ``[sleep start, wake-up]``,
``perf_counter`` seconds; ``gc``: every cyclic collection, ``[when, generation, seconds]``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

from benchmarks.harness.measure import ticker, time_collections


async def _run(port: int, ticks: list[tuple[float, float]]) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()

    def stopped() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
    task = asyncio.create_task(ticker(ticks))
    try:
        await stop
    finally:
        task.cancel()
        server.close()


def main(argv: list[str]) -> int:
    out, port, loop = argv[0], int(argv[1]), argv[2]
    ticks: list[tuple[float, float]] = []
    collections: list[tuple[float, int, float]] = []
    time_collections(collections)
    try:
        if loop == "uvloop":
            import uvloop

            uvloop.run(_run(port, ticks))
        else:
            asyncio.run(_run(port, ticks))
    finally:
        with open(out, "w") as f:
            json.dump({"ticks": ticks, "gc": collections}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
