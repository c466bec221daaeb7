"""Waiting until something holds, with a deadline: on the loop by polling it (a condition, an event, a
stuck transfer), or off any loop (``wait_for``, for a server in another process).

Polling keeps the loop running (nothing here blocks it), and every wait has a deadline so
a test that goes wrong fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from aiosendfile import _platform


async def until(predicate: Any, timeout: float = 10.0) -> None:
    """Wait (by polling the loop) until *predicate()* holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def until_set(event: threading.Event, timeout: float = 30.0) -> None:
    """Wait (without blocking the loop) until another thread sets *event*."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        assert time.monotonic() < deadline, "the event was never set"
        await asyncio.sleep(0.01)


async def stalled(conn: Any, coro: Any) -> asyncio.Task[Any]:
    """Run *coro* (a transfer to a client that does not read) until it is stuck."""
    task = asyncio.ensure_future(coro)
    await until(
        lambda: _platform.counters.waits > 0 or conn.transport.get_write_buffer_size() > 0 or task.done()
    )
    await asyncio.sleep(0.05)
    assert not task.done(), "the transfer should be waiting for the slow peer"
    return task


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    """Poll *predicate* (sync, off any loop) until it holds, or fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        time.sleep(0.05)
