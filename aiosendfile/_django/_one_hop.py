"""A request for a sync view in one thread call, where Django's ASGI handler makes a dozen.

Django's ``ASGIHandler.handle`` (5.x, 6.x) runs the ``request_started`` signal in one
``sync_to_async`` call, then its async middleware chain: every sync middleware method
(``process_request``, ``process_response``... of ``startproject``'s seven) and the view in a call
each, every call a round trip to the request's thread. :class:`OneHop` runs the signal, the
request's making, Django's *sync* middleware chain (``WSGIHandler``'s) and the view in one call on
that thread: the same middleware, code paths and thread as under WSGI. Around that call it is
Django's ``handle`` (Django's own ASGI tests run against it: ``tests/host_suites``): a listener for
the client leaving beside the request, the view not run for a client that left before it, the
wait for the view cancelled for one that leaves during it, the response closed on the request's
thread before the application returns.

Where the server offers it (our uvicorn protocol, ``aiosendfile.thread_write``), a file response
is written by the request's thread itself, head and file, as a WSGI server writes it, and closed
there when it all went: no round trip to the loop to send or to close it, and the request's
objects die young. What the socket does not take at once, the loop sends, then closes.

It is used when every ``MIDDLEWARE`` entry can run sync (else Django's chain serves every
request) and the request's view, by ``ROOT_URLCONF``, is not a coroutine function (an async view
goes through Django's async chain and runs on the loop). Where a request class or a middleware
sets ``request.urlconf``, that is a guess: an async view reached that way runs on the loop through
the sync chain's ``async_to_sync``, and is cancelled with its request as under Django. Django 4.2
(its ``handle`` sends and closes differently) keeps Django's way.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import asgi as django_asgi
from django.core.handlers.base import BaseHandler
from django.http import FileResponse
from django.urls import Resolver404, get_resolver, set_script_prefix
from django.utils.module_loading import import_string

from .. import _compat
from .._asgi._thread_send import THREAD_WRITE
from ._response import django_headers, file_body
from ._threads import run_logged

__all__ = ("SUPPORTED", "OneHop")

#: Django's ``handle`` this mirrors is 5.0's to 5.2's (4.2's sends and closes differently).
SUPPORTED = django.VERSION >= (5, 0)

#: Views whose kind is remembered (a URLconf's views are a fixed set; this bounds a strange one).
_KINDS_KEPT = 1024


def sync_chain() -> BaseHandler | None:
    """Django's sync middleware chain (``WSGIHandler``'s), or None when some ``MIDDLEWARE`` entry
    cannot run sync."""
    for path in settings.MIDDLEWARE:
        if not getattr(import_string(path), "sync_capable", True):
            return None
    handler = BaseHandler()
    handler.load_middleware(is_async=False)
    return handler


#: What a request's thread wrote of its response: part of it (the loop sends the rest, then
#: closes it), or all of it (closed on the thread).
_PART = "part"
_WHOLE = "whole"

#: What the thread hands back for a response it wrote whole and closed itself.
_CLOSED = "closed"

#: What the loop finds when it gives up a request whose response the thread had begun to write:
#: the thread closes it (as Django closes a response whose send its client cut short).
_THREAD_CLOSES = "thread closes"


def _thread_writer(scope: dict[str, Any]) -> Any:
    """The server's offer to write a file response from the request's thread, opened for this
    request (on the loop's thread), or None."""
    extensions = scope.get("extensions")
    offer = extensions.get(THREAD_WRITE) if extensions else None
    return offer["open"]() if offer else None


def _close_file_quietly(response: Any) -> None:
    """A response nobody will send or close: its file closed, no ``request_finished`` (the
    request already had its own; Django drops such a response unclosed)."""
    f = getattr(response, "file_to_stream", None) if isinstance(response, FileResponse) else None
    if f is not None:
        with contextlib.suppress(Exception):
            f.close()


class _Hop:
    """One request's state shared by the loop and the request's thread.

    ``gone`` is set on the loop when the client leaves (or the request is given up): read on the
    thread, it keeps a view from starting and a response from being written. What the thread
    makes of the request is handed over under ``_lock``: to the loop (``outcome``) until the loop
    gives the request up (:meth:`abandon`); after that the thread disposes of it itself. Once the
    thread has begun to write the response (:meth:`start_writing`), giving the request up leaves
    the response the thread's to close, and the loop waits for that (``thread_done``, made then:
    no request that ends otherwise pays for it)."""

    __slots__ = (
        "_lock",
        "abandoned",
        "body_file",
        "finished",
        "gone",
        "handler",
        "outcome",
        "scope",
        "thread_done",
        "writer",
        "writing",
    )

    def __init__(self, handler: Any, scope: dict[str, Any], body_file: Any, writer: Any) -> None:
        self.handler = handler
        self.scope = scope
        self.body_file = body_file
        self.writer = writer
        self.gone = False
        self.abandoned = False
        self.writing = False
        self.finished = False
        self.outcome: Any = None
        self._lock = threading.Lock()
        self.thread_done: asyncio.Future[None] | None = None

    def start_writing(self) -> bool:
        """On the thread, before it writes the response: from here on the response is the
        thread's to close if the loop gives the request up. False: the loop gave it up already."""
        with self._lock:
            if self.abandoned:
                return False
            self.writing = True
            return True

    def hand_over(self, outcome: Any) -> bool:
        """On the thread: *outcome* (a response, or :data:`_CLOSED`) is the loop's; False when
        the loop gave the request up (the thread disposes of it)."""
        with self._lock:
            if self.abandoned:
                return False
            self.outcome = outcome
            return True

    def abandon(self) -> Any:
        """On the loop, its wait for the thread cancelled: what the thread handed over by now (a
        response, :data:`_CLOSED`), :data:`_THREAD_CLOSES` if the thread writes the response and
        will close it, or None: the thread disposes of what it makes later."""
        with self._lock:
            self.abandoned = self.gone = True
            if self.outcome is None and self.writing:
                if self.thread_done is None:
                    self.thread_done = asyncio.get_running_loop().create_future()
                    if self.finished:  # (the thread stopped without handing anything over: it failed)
                        self.thread_done.set_result(None)
                return _THREAD_CLOSES
            return self.outcome

    def thread_finished(self) -> None:
        """On the thread, its part of the request over: the loop waiting for it (if it gave the
        request up meanwhile) goes on."""
        with self._lock:
            self.finished = True
            done = self.thread_done
        if done is not None:
            with contextlib.suppress(RuntimeError):  # (the loop is closed: nobody waits)
                done.get_loop().call_soon_threadsafe(_set_done, done)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class OneHop:
    """One ``sync_to_async`` call per request for sync views (see the module)."""

    def __init__(self, chain: BaseHandler) -> None:
        self._chain = chain
        self._kinds: dict[Any, bool] = {}
        self._respond_on_thread = sync_to_async(self._respond, thread_sensitive=True)

    def serves(self, scope: dict[str, Any]) -> bool:
        """Whether the view ``ROOT_URLCONF`` gives the path is sync (no view: Django's 404, sync;
        a failing URLconf: False, Django's own chain reports it). A guess where a request class
        or a middleware sets ``request.urlconf``: an async view reached that way is run by the
        sync chain on the loop (``async_to_sync``) and cancelled with its request all the same."""
        path = scope["path"]
        prefix = django_asgi.get_script_prefix(scope)
        if prefix:
            path = path.removeprefix(prefix)  # (as ASGIRequest makes path_info)
        try:
            func = get_resolver().resolve(path).func
        except Resolver404:
            return True
        except Exception:  # (Django's chain answers it)
            return False
        is_async = self._kinds.get(func)
        if is_async is None:
            if len(self._kinds) >= _KINDS_KEPT:
                self._kinds.clear()
            is_async = self._kinds[func] = bool(iscoroutinefunction(func))
        return not is_async

    async def handle(self, handler: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's ``ASGIHandler.handle``, with the request's sync work in one call.

        As Django: the body read, then a task listening for the client leaving beside the one
        that makes and sends the response; whichever ends first ends the other. A client that
        left before its view started has no view run; one that left during the view has the
        wait for it cancelled (an async view reached through the sync chain is cancelled, as
        asgiref cancels what a cancelled ``sync_to_async`` call started; a sync view's thread
        runs on) and ``request_finished`` sent; one that leaves during the send has the send
        cancelled. The response is closed (``request_finished``) on the request's thread before
        this returns. A server's message other than ``http.disconnect`` after the body fails the
        request with Django's ``AssertionError``."""
        try:
            body_file = await handler.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(django_asgi.get_script_prefix(scope))
        hop = _Hop(handler, scope, body_file, _thread_writer(scope))
        listener = asyncio.create_task(self._listen(hop, receive))
        process = asyncio.create_task(self._process(hop, send))
        try:
            try:
                await asyncio.wait((listener, process), return_when=asyncio.FIRST_COMPLETED)
            finally:  # (what did not end is ended: the other task, or both when cancelled)
                for task in (listener, process):
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
            if not listener.cancelled():
                error = listener.exception()
                if error is not None and not isinstance(error, RequestAborted):
                    raise error  # (Django's AssertionError for an invalid message)
            # Cancelled while the thread worked: what it handed over by then is closed as any response;
            # if nothing, it disposes of what it makes itself, and Django's signal is sent here.
            response = hop.abandon() if process.cancelled() else process.result()
            if response is None:  # (no response to close: the client left before there was one)
                await signals.request_finished.asend(sender=handler.__class__)
            elif response is _THREAD_CLOSES:  # (written, or being written: closed on its thread)
                assert hop.thread_done is not None
                await hop.thread_done
            elif response is not _CLOSED:
                await sync_to_async(response.close)()
        except BaseException:  # (cancelled, or the listener's error: nothing of the request is sent)
            outcome = hop.abandon()
            if outcome is not _CLOSED and outcome is not _THREAD_CLOSES:
                _close_file_quietly(outcome)
            raise
        finally:
            body_file.close()

    async def _listen(self, hop: _Hop, receive: Any) -> None:
        try:
            await hop.handler.listen_for_disconnect(receive)
        except RequestAborted:
            hop.gone = True
            raise

    async def _process(self, hop: _Hop, send: Any) -> Any:
        """The request's response made on its thread and sent; returns it, or :data:`_CLOSED`.
        Cancelled while the thread works, the thread's outcome is :meth:`_Hop.abandon`'s."""
        writer = hop.writer
        try:
            response, written = await self._respond_on_thread(hop)
        except asyncio.CancelledError:
            raise  # (the thread may be writing: the cycle stays claimed, the server closes it)
        except BaseException:
            if writer is not None:
                writer.release()
            raise
        if writer is not None and not written:
            writer.release()  # (nothing written from the thread: the response is sent below)
        if response is None:
            return None  # (the client left before the view)
        try:
            if written:  # (the thread wrote the response, whole or in part: the loop completes it)
                await writer.finish()
            else:
                await hop.handler.send_response(response, send)
        except asyncio.CancelledError:
            pass  # (Django's: the client left during the send)
        return response

    def _respond(self, hop: _Hop) -> tuple[Any, object]:
        """On the request's thread: the signal, the request, the chain and the view; with a
        writer, a file response written (and, written whole, closed) here. Returns the response
        (:data:`_CLOSED` once written whole and closed) and what the thread wrote (None,
        :data:`_PART`, :data:`_WHOLE`)."""
        try:
            return self._make_and_write(hop)
        finally:
            if hop.writing:
                hop.thread_finished()

    def _make_and_write(self, hop: _Hop) -> tuple[Any, object]:
        handler = hop.handler
        signals.request_started.send(sender=handler.__class__, scope=hop.scope)
        request, error_response = handler.create_request(hop.scope, hop.body_file)
        if request is None:
            return self._hand_over(hop, error_response), None
        if hop.gone:  # (the client left before the view: as Django, it is not run)
            return self._hand_over(hop, None), None
        response = self._chain.get_response(request)
        _compat.set_handler_class(response, handler.__class__)
        if not isinstance(response, FileResponse):
            return self._hand_over(hop, response), None
        response.block_size = handler.chunk_size
        writer = hop.writer
        body = file_body(response) if writer is not None and not hop.gone else None
        if (
            body is None
            or not hop.start_writing()
            or not writer.write(response.status_code, django_headers(response), *body[:3])
        ):
            return self._hand_over(hop, response), None
        if not writer.complete:
            return self._hand_over(hop, response), _PART
        if not hop.hand_over(_CLOSED):  # (the client left once it had the response: Django closes it)
            run_logged(response.close)
            return _CLOSED, _WHOLE
        run_logged(response.close)  # (Django's order: the response, then the request's body)
        run_logged(hop.body_file.close)
        # Not handed back: the response is a reference cycle of Django's (its file iterator), so
        # dropping it here lets the collector free it young, not after the hop back to the loop.
        return _CLOSED, _WHOLE

    @staticmethod
    def _hand_over(hop: _Hop, response: Any) -> Any:
        if not hop.hand_over(response):
            if hop.writing:  # (the loop left it to this thread: closed as Django closes it)
                run_logged(response.close)
            else:
                _close_file_quietly(response)
        return response
