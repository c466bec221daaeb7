"""What both ends of ``send``/``recv`` share at run time: the loop and its signals, hashing off
the loop, the progress bar and the one-line summary.

:func:`run` runs a command's coroutine on the chosen loop; SIGINT/SIGTERM cancel it, set
:data:`STOP` (hashing threads give up) and end the command with 130/143 and one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from .._cli._common import announce, fail, in_words, loop_factory, pair_stop_signals
from ._protocol import TransferFailed, encode

T = TypeVar("T")

__all__ = (
    "STOP",
    "Idle",
    "Progress",
    "finish",
    "hash_file",
    "in_thread",
    "run",
    "send_message",
    "summary",
    "until_idle",
)

STOP = threading.Event()  # set on SIGINT/SIGTERM: hashing threads give up


def hash_file(path: str, length: int | None = None) -> str:
    digest = hashlib.sha256()
    remaining = length
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            if STOP.is_set():
                raise OSError("interrupted")
            block = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest.hexdigest()


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def send_message(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(encode(message))


class Idle(Exception):
    """A transfer made no progress for its idle timeout."""


async def until_idle(aw: Awaitable[T], idle: float, last_activity: Callable[[], float]) -> T:
    """Await *aw*; if *last_activity()* (a loop time) falls *idle* seconds behind, cancel it and
    raise :class:`Idle`. *aw* has always settled when this returns or raises (a cancelled
    ``recvfile`` leaves OUT consistent only once it has)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    try:
        while True:
            left = last_activity() + idle - loop.time()
            if left <= 0:
                raise Idle()
            await asyncio.wait({task}, timeout=left)
            if task.done():
                return task.result()
    except BaseException:
        if not task.done():
            task.cancel()
        while not task.done():
            # Through every cancellation: a signal's, then the loop's shutdown cancelling every
            # task again cut this wait short, and OUT was settled (its length told: 0 of 1 GB
            # kept) before the receive had settled and put its position there.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: an error raced with the verdict is not logged as lost
        raise


class Progress:
    """A tqdm bar on a terminal, nothing otherwise; a one-line summary either way."""

    def __init__(self, total: int, initial: int, label: str) -> None:
        self.start = time.monotonic()
        self.initial = initial
        self.bar: Any = None
        if sys.stdout is not None and sys.stdout.isatty():  # (None: closed, `send ... >&-`)
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=label)
        self.done = initial

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done

    def close(self) -> float:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        return time.monotonic() - self.start


def summary(verb: str, moved: int, elapsed: float, extra: str) -> str:
    rate = moved / elapsed / 1e6 if elapsed > 0 else 0.0
    return f"{verb} {moved} bytes in {elapsed:.2f}s ({rate:.0f} MB/s){extra}"


def run(prog: str, loop: str, main: Coroutine[Any, Any, str], interrupted: Callable[[], str]) -> int:
    """Run *main* on the chosen loop. SIGINT/SIGTERM/SIGHUP cancel every task; once they have
    settled (a receiver has flushed OUT), *interrupted()* is printed in one line and the exit
    status is 130/143/129."""
    factory, _ = loop_factory(loop)
    event_loop = factory()
    signalled: list[int] = []
    stopping = pair_stop_signals()

    def on_signal(signum: int) -> None:
        if signalled:
            return  # already stopping
        signalled.append(signum)
        STOP.set()
        for task in asyncio.all_tasks(event_loop):
            task.cancel()

    async def with_handlers() -> str:
        # Installed from inside the running loop: uvloop keeps a signal that comes while it is not
        # running for its next wakeup, and a send waiting on a silent receiver has none. Until
        # then the quiet-exit handlers (_cli._common) still end the command.
        for signum in stopping:
            event_loop.add_signal_handler(signum, on_signal, signum)
        return await main

    outcome: str | BaseException
    try:
        task = event_loop.create_task(with_handlers())
        try:
            outcome = event_loop.run_until_complete(task)
        except (asyncio.CancelledError, TransferFailed) as exc:
            if not signalled and not isinstance(exc, TransferFailed):
                raise
            outcome = exc
        except Exception as exc:  # one we did not foresee: still one line, never a traceback
            outcome = TransferFailed(f"unexpected error: {in_words(exc)} ({type(exc).__name__})")
        finally:
            finish(event_loop)
            main.close()  # (never started if cancelled first: no "never awaited" warning)
            for signum in stopping:
                event_loop.remove_signal_handler(signum)
    except KeyboardInterrupt:  # before our handler was installed
        signalled[:] = [signal.SIGINT]
        outcome = asyncio.CancelledError()
    finally:
        event_loop.close()
    if isinstance(outcome, str):
        announce(outcome)  # (done and verified: a closed or full stdout changes nothing)
        return 0
    if signalled:
        return fail(prog, interrupted(), 128 + signalled[0])
    return fail(prog, str(outcome))


def finish(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does on the way out: cancel what is left, wait for it and the threads."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
