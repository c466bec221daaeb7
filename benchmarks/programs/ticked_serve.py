"""``python -m aiosendfile serve`` with a 1 ms ticker on its event loop (the mixed-set stall benchmark).

``python -m benchmarks.programs.ticked_serve OUT.json [--no-probe] -- SERVE-ARGS...``

Runs the serve command exactly as the CLI does (one process: no ``--workers``), after two changes
made from outside: every engine the process starts gets a ticker on its loop (a callback every
1 ms that records how late it ran), and every cyclic garbage collection is timed. ``--no-probe``
turns the page-cache probe off (``sendfile`` then waits for the disk on the loop, as stock
``loop.sendfile`` and nginx do): the benchmark's proof that it sees a stall when there is one.

On a clean stop (SIGTERM, SIGINT) it writes OUT.json: ``ticks`` (``[sleep start, wake-up]`` of
every 1 ms tick, as ``loop_stall`` records them, in ``perf_counter`` seconds: on Linux that clock
is ``CLOCK_MONOTONIC``, the same in every process, so the caller keeps the ticks inside its
window) and ``gc`` (``[when, generation, seconds]`` for every cyclic collection).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from typing import Any

ticks: list[tuple[float, float]] = []
collections: list[tuple[float, int, float]] = []


def _install_ticker() -> None:
    """Every engine gets ``loop_stall``'s ticker (``benchmarks.harness.measure.ticker``) as a task
    on its loop, cancelled when the engine stops."""
    from aiosendfile._serve import _server
    from benchmarks.harness.measure import ticker

    made, stopped = _server.Engine.__init__, _server.Engine.stop
    tasks: dict[int, asyncio.Task[None]] = {}

    def init(self: Any, config: Any, loop: Any) -> None:
        made(self, config, loop)
        tasks[id(self)] = loop.create_task(ticker(ticks))

    def stop(self: Any) -> None:
        task = tasks.pop(id(self), None)
        if task is not None:
            task.cancel()
        stopped(self)

    _server.Engine.__init__ = init  # type: ignore[method-assign]
    _server.Engine.stop = stop  # type: ignore[method-assign]


def _no_probe() -> None:
    from aiosendfile import _bodies, _options, _outlet
    from aiosendfile._serve import _tls_body

    options = dataclasses.replace(_options.DEFAULT_OPTIONS, probe=False)
    # (Each module imported the name: it is replaced where it is read.)
    for module in (_outlet, _bodies, _tls_body):
        module.__dict__["DEFAULT_OPTIONS"] = options


def main(argv: list[str]) -> int:
    out, rest = argv[0], argv[1:]
    if rest[:1] == ["--no-probe"]:
        rest = rest[1:]
        _no_probe()
    if rest[:1] == ["--"]:
        rest = rest[1:]
    _install_ticker()
    from benchmarks.harness.measure import time_collections

    time_collections(collections)
    from aiosendfile._cli._main import main as serve

    try:
        status = serve(["serve", *rest])
    finally:
        with open(out, "w") as f:
            json.dump({"ticks": ticks, "gc": collections}, f)
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
