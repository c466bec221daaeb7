"""A request for a sync view in one thread call, where Django's ASGI handler makes a dozen.

Django's ``ASGIHandler.handle`` (5.x) runs the ``request_started`` signal in one ``sync_to_async``
call, then its async middleware chain: every sync middleware method (``process_request``,
``process_response``... of ``startproject``'s seven) and the view in a call each, every call a
round trip to the request's thread. :class:`OneHop` runs the signal, the request's making,
Django's *sync* middleware chain (``WSGIHandler``'s) and the view in one call on that thread,
then sends and closes the response: the same middleware, code paths and thread as under WSGI.
Three differences of cost from Django's ``handle``, none in what is answered:

* Django's listener for the client leaving (a task per request) watches only a send that could
  outlast the client without it (see :meth:`OneHop.handle`): a sync view cannot be cancelled.
* The close (Django's ``request_finished``) runs on the request's thread after the response is
  sent, as under Django, but handed over (:meth:`._threads.RequestThreads.run_later`), not waited
  for: the response is complete by then, and the thread is lent again once the close is done.
* Where the server offers it (our uvicorn protocol, ``aiosendfile.thread_write``), a file
  response is written by the request's thread itself, head and file, as a WSGI server writes it,
  and closed there when it all went: no round trip to the loop to send it, and the request's
  objects die young. What the socket does not take at once, the loop sends, then the close is
  handed over as above.

It is used when every ``MIDDLEWARE`` entry can run sync (else Django's chain serves every
request) and the request's view, by ``ROOT_URLCONF``, is not a coroutine function (an async view
goes through Django's async chain and runs on the loop). A middleware that changes the URLconf
makes that a guess; either way answers alike. Django 4.2 (past its support) keeps Django's way.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import django
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import asgi as django_asgi
from django.core.handlers.base import BaseHandler
from django.http import FileResponse, HttpResponseBase
from django.urls import Resolver404, get_resolver, set_script_prefix
from django.utils.module_loading import import_string

from .._asgi._thread_send import THREAD_WRITE
from ._response import django_headers, file_body
from ._threads import RequestThreads, run_logged

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


#: What a request's thread wrote of its response: part of it (the loop sends the rest, then the
#: close is handed over), or all of it (closed on the thread).
_PART = "part"
_WHOLE = "whole"


def _thread_writer(scope: dict[str, Any]) -> Any:
    """The server's offer to write a file response from the request's thread, opened for this
    request (on the loop's thread), or None."""
    extensions = scope.get("extensions")
    offer = extensions.get(THREAD_WRITE) if extensions else None
    return offer["open"]() if offer else None


async def _send_listening(handler: Any, response: HttpResponseBase, send: Any, receive: Any) -> None:
    """``send_response``, cancelled when the client leaves (Django's listener and its handling)."""

    async def sending() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # (the client left while it was sent)
            await handler.send_response(response, send)

    tasks = [asyncio.create_task(handler.listen_for_disconnect(receive)), asyncio.create_task(sending())]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:  # (Django's order and handling)
        if task.done():
            with contextlib.suppress(RequestAborted):
                task.result()
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class OneHop:
    """One ``sync_to_async`` call per request for sync views (see the module)."""

    def __init__(self, chain: BaseHandler, threads: RequestThreads) -> None:
        self._chain = chain
        self._threads = threads
        self._kinds: dict[Any, bool] = {}
        self._respond_on_thread = sync_to_async(self._respond, thread_sensitive=True)

    def serves(self, scope: dict[str, Any]) -> bool:
        """Whether the view ``ROOT_URLCONF`` gives the path is sync (no view: Django's 404, sync;
        a failing URLconf: False, Django's own chain reports it)."""
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
        """Django 5's ``ASGIHandler.handle``, with the request's sync work in one call.

        Django listens for the client leaving in a task of its own for the whole request, to
        cancel the view and the send. A sync view cannot be cancelled (its thread runs on, and
        the request's ``request_finished`` waits for it on that thread), so here the listener
        watches the send alone, and only a send that could outlast the client without it: a
        streaming response, but for a file our protocol or the server's ``pathsend`` sends whole
        (they stop by themselves). A client that left during the view gets its response sent to
        nowhere (the server drops it) and closed, where Django skips the close and sends the
        signal itself."""
        try:
            body_file = await handler.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(django_asgi.get_script_prefix(scope))
        writer = _thread_writer(scope)
        try:
            response, made, written = await self._respond_on_thread(handler, scope, body_file, writer)
        except asyncio.CancelledError:
            raise  # (the thread may be writing: the cycle stays claimed, the server closes it)
        except BaseException:
            if writer is not None:
                writer.release()
            raise
        if not written and writer is not None:
            writer.release()  # (nothing written from the thread: the response is sent below)
        if written:  # (the thread wrote the response, whole or in part: the loop completes it)
            try:
                await writer.finish()
            finally:
                if response is not None:  # (written in part: closed once the loop sent the rest)
                    await self._close(response, body_file)
            return
        assert response is not None  # (only a response written whole is not handed back)
        try:
            if not made or handler.sends_alone(response):
                await handler.send_response(response, send)
            else:
                await _send_listening(handler, response, send, receive)
        except asyncio.CancelledError:
            await self._close(response, body_file)
            raise
        await self._close(response, body_file)

    async def _close(self, response: HttpResponseBase, body_file: Any) -> None:
        """Django's close after the send, on the request's thread: handed over, or awaited where
        the request borrowed no thread of ours."""

        def finish() -> None:  # (Django's order: the response, then the request's body)
            response.close()
            body_file.close()

        if not self._threads.run_later(finish):
            await sync_to_async(finish)()

    def _respond(
        self, handler: Any, scope: dict[str, Any], body_file: Any, writer: Any
    ) -> tuple[HttpResponseBase | None, bool, object]:
        """On the request's thread: the signal, the request, the chain and the view; with a
        *writer*, a file response written (and, written whole, closed) here. Returns the
        response (None once written whole and closed), whether it is the view's, and what the
        thread wrote (None, :data:`_PART`, :data:`_WHOLE`)."""
        signals.request_started.send(sender=handler.__class__, scope=scope)
        request, error_response = handler.create_request(scope, body_file)
        if request is None:
            return error_response, False, None
        response = self._chain.get_response(request)
        response._handler_class = handler.__class__
        if not isinstance(response, FileResponse):
            return response, True, None
        response.block_size = handler.chunk_size
        body = file_body(response) if writer is not None else None
        if body is None or not writer.write(response.status_code, django_headers(response), *body[:3]):
            return response, True, None
        if not writer.complete:
            return response, True, _PART
        run_logged(response.close)  # (Django's order: the response, then the request's body)
        run_logged(body_file.close)
        # Not handed back: the response is a reference cycle of Django's (its file iterator), so
        # dropping it here lets the collector free it young, not after the hop back to the loop.
        return None, True, _WHOLE
