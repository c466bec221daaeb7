"""Waiting out work already handed to a thread.

A call submitted to an executor runs to its end once a thread has picked it
up: cancelling the task that awaits it does not stop the write or open it
does. Code that must account for such a call (bytes that landed in a file, a
file that was opened) awaits it with :func:`shielded`, which on cancellation
waits for it (:func:`settled`) and hands over its result before re-raising.
A call that only needs its inputs to stay valid (a read from a descriptor the
caller closes next) is run with :func:`in_pool`: dropped if no thread has
picked it up yet, waited for if one has.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

__all__ = ("in_pool", "settled", "shielded")

_T = TypeVar("_T")


async def settled(pending: asyncio.Future[_T]) -> _T | None:
    """Wait for *pending* to finish, whatever cancels us meanwhile; its result, or None if it failed."""
    while not pending.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([pending])
    if pending.cancelled() or pending.exception() is not None:
        return None
    return pending.result()


async def shielded(pending: asyncio.Future[_T], if_cancelled: Callable[[_T | None], object]) -> _T:
    """Await *pending*. If we are cancelled meanwhile, let it finish, pass its result (None
    if it failed) to *if_cancelled* (count it, close it), then re-raise."""
    try:
        return await asyncio.shield(pending)
    except asyncio.CancelledError:
        result = await settled(pending)
        if_cancelled(result)
        raise


async def in_pool(
    executor: Executor,
    fn: Callable[..., _T],
    *args: Any,
    if_cancelled: Callable[[_T | None], object] | None = None,
) -> _T:
    """``fn(*args)`` in *executor*. If we are cancelled meanwhile, a call no thread has picked
    up yet is dropped, and one already running is waited for before re-raising: it may be
    using a descriptor the caller closes as soon as we return. Its result (None if it failed)
    then goes to *if_cancelled* (close what it opened)."""
    job = executor.submit(fn, *args)
    pending = asyncio.wrap_future(job)
    try:
        return await asyncio.shield(pending)
    except asyncio.CancelledError:
        if not job.cancel():
            late = await settled(pending)
            if if_cancelled is not None:
                if_cancelled(late)
        raise
