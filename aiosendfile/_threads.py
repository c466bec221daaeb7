"""Waiting out work already handed to a thread.

A call submitted to an executor runs to its end once a thread has picked it
up: cancelling the task that awaits it does not stop the write or open it
does. Code that must account for such a call (bytes that landed in a file, a
file that was opened) shields it, and on cancellation waits with
:func:`settled` before re-raising.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

__all__ = ("settled",)

_T = TypeVar("_T")


async def settled(pending: asyncio.Future[_T]) -> _T | None:
    """Wait for *pending* to finish, whatever cancels us meanwhile; its result, or None if it failed."""
    while not pending.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([pending])
    if pending.cancelled() or pending.exception() is not None:
        return None
    return pending.result()
