"""Waiting on the event loop for our own fd, and giving way to others: shared by both drivers.

The send driver (``_writer``) waits for a dup'd socket fd to be writable, the
splice driver (``_splice``) for one to be readable; both wait the same way,
with the registration removed however the wait ends and the leased
connection's loss waking the waiter. A zero-delay timer (``yield_to_others``,
``behind_timers``) queues the waiter behind the callbacks that came due with it.
"""

from __future__ import annotations

import asyncio

from . import _platform
from ._lease import TransportLease

__all__ = ("wait_ready", "yield_to_others")


async def yield_to_others(loop: asyncio.AbstractEventLoop) -> None:
    """Give way after a full chunk to every callback that came due meanwhile and what it wakes.

    ``asyncio.sleep(0)`` resumes us in the next loop iteration ahead of the
    timers and I/O callbacks that iteration finds due, and a task waiting on
    one of those needs one more iteration (the callback sets its future, the
    future's callback resumes it): it waited for the chunk in progress and two
    more on stock asyncio, one more on uvloop.
    A zero-delay timer queues us behind them instead (stock asyncio runs due
    timers in deadline order, after I/O callbacks; uvloop turns a zero delay
    into ``call_soon``, one hop more than the woken task needs), so such a
    task waits for at most the chunk in progress. Cost: one loop iteration.
    """
    woken: asyncio.Future[None] = loop.create_future()
    timer = loop.call_later(0, _wake, woken)
    try:
        await woken
    finally:
        timer.cancel()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_ready(
    loop: asyncio.AbstractEventLoop,
    fd: int,
    lease: TransportLease | None,
    *,
    writable: bool,
    behind_timers: bool = False,
) -> None:
    """Wait until our own (dup'd) *fd* is writable/readable, or the leased connection is lost.

    With *behind_timers* the readiness is passed on through a zero-delay timer
    (see :func:`yield_to_others`): stock asyncio runs I/O callbacks before the
    timers that came due in the same iteration, so a task woken by one of
    those timers would otherwise wait for the chunk we send next.
    The registration is removed in ``finally``, on success, error and cancellation alike.
    """
    _platform.counters.waits += 1
    fut: asyncio.Future[None] = loop.create_future()
    passed_on = False

    def on_ready() -> None:
        nonlocal passed_on
        if fut.done() or passed_on:
            return
        if behind_timers:
            passed_on = True
            loop.call_later(0, _wake, fut)  # a no-op if we are cancelled meanwhile
        else:
            fut.set_result(None)

    add, remove = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    add(fd, on_ready)
    if lease is not None:
        lease.wake_on_loss(fut)
    try:
        await fut
    finally:
        remove(fd)
        if lease is not None:
            lease.wake_on_loss(None)
