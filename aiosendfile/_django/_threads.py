"""One thread per request for Django's thread-sensitive code, kept for the next request.

Django's ASGI handler enters ``ThreadSensitiveContext()`` per request: every
``sync_to_async(thread_sensitive=True)`` call of that request (its signals, its sync middleware, a
sync view, ``response.close``) runs on one thread of its own, so thread-bound state (a database
connection) stays with the request. asgiref makes that thread for the request and joins it at
its end: a thread started and joined per request.

:class:`RequestThreads` keeps the guarantee and drops the cost, with asgiref's public
``ThreadSensitiveContext(executor=...)`` (asgiref 3.13): a request borrows a one-thread executor
for its life and gives it back. An executor still running something when its request ends
(work the request left behind: a sync view still running after its client left and its caller
was cancelled) is not lent again until that work is done: the thread that finishes it gives the
executor back. At most ``IDLE`` executors wait between requests; more
are shut down. With an older asgiref, requests get Django's own context (a thread each).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext

__all__ = ("IDLE", "RequestThreads", "run_logged")

#: Idle executors kept between requests (each one thread): about what a burst leaves behind.
IDLE = 64

#: Whether this asgiref lends a context a caller's executor (3.13 and later).
_LENDS = "executor" in inspect.signature(ThreadSensitiveContext).parameters


_log = logging.getLogger("aiosendfile.django")


class _RequestExecutor(ThreadPoolExecutor):
    """A one-thread executor that knows whether it is running or holding anything, and can say
    when it no longer is."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="aiosendfile-django")
        self._lock = threading.Lock()
        self._pending = 0
        self._on_idle: Callable[[_RequestExecutor], None] | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self._pending += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future[Any] | None) -> None:
        with self._lock:
            self._pending -= 1
            callback = self._on_idle if self._pending == 0 else None
            if callback is not None:
                self._on_idle = None
        if callback is not None:
            callback(self)

    def when_idle(self, callback: Callable[[_RequestExecutor], None]) -> None:
        """``callback(self)`` now if nothing is pending, else on this executor's thread once the
        last pending call is done."""
        with self._lock:
            if self._pending:
                self._on_idle = callback
                return
        callback(self)


def run_logged(close: Callable[[], Any]) -> None:
    """``close()``, an error logged to ``aiosendfile.django`` (for a close after the response
    went out, where nothing can report it)."""
    try:
        close()
    except Exception:
        _log.error("Closing a Django response failed", exc_info=True)


class RequestThreads:
    """The executors requests borrow (see the module). Used from one event loop's thread."""

    def __init__(self, idle: int = IDLE) -> None:
        self._idle: list[_RequestExecutor] = []
        self._keep = idle
        self._lock = threading.Lock()  # (executors come back on their own threads too)
        self._closed = False

    @contextlib.asynccontextmanager
    async def context(self) -> AsyncIterator[None]:
        """A request's thread-sensitive context: a borrowed thread, given back at the end."""
        if not _LENDS:
            async with ThreadSensitiveContext():
                yield
            return
        with self._lock:
            executor = self._idle.pop() if self._idle else None
        if executor is None:
            executor = _RequestExecutor()
        try:
            async with ThreadSensitiveContext(executor=executor):
                yield
        finally:
            executor.when_idle(self._give_back)

    def _give_back(self, executor: _RequestExecutor) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)

    def close(self) -> None:
        """Shut the idle executors down (their threads end), and those given back later."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for executor in idle:
            executor.shutdown(wait=False)
