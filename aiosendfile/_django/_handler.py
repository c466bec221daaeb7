"""Django's ASGI handler, but a ``FileResponse`` backed by a real file leaves as a file.

Django's own handler (5.x) sends a ``FileResponse`` as a streaming response: its iterator is
synchronous, so ``StreamingHttpResponse.__aiter__`` warns and reads it whole with
``sync_to_async(list)`` first; a 1 GiB file is 1 GiB of memory before the first byte leaves.

:class:`ASGIHandler` sends every other response as Django does (its own ``send_response``). A
``FileResponse`` whose ``file_to_stream`` has a descriptor of a regular file, and a
``Content-Length``, goes through the ASGI door's file sender (``_asgi._render.send_answer``): as
our uvicorn protocol's ``pathsend`` (zero-copy), standard ``http.response.pathsend`` for a whole
file (granian), ``zerocopysend``, or else body messages of at most ``chunk_size`` bytes read off
the loop where the pages are not cached. The fields are Django's, byte for byte (cookies too); the
bytes are the file's from its position when the response was made, as many as Django announced. A
file that ends early aborts the response (never a short body passed off as complete). ``HEAD``
sends the fields alone. The response (and its file) is closed where Django closes it: after
``send_response`` (5.0 and later), at its end (4.2; here also when sending failed). A client that
leaves is Django's to notice (5.0 and later: its disconnect task cancels the send).

Around the view, two changes of cost (the responses stay Django's own):

* a request's thread-sensitive code runs on a thread borrowed for the request and kept for the
  next one (:mod:`._threads`), where Django starts and joins a thread per request;
* a request for a sync view, in a project whose middleware can all run sync, runs its signal,
  Django's sync middleware chain and the view in one ``sync_to_async`` call (:mod:`._one_hop`),
  where Django's async chain makes one per sync middleware method (a dozen with ``startproject``'s
  middleware); around that call, it is Django's ``handle`` (listening for the client leaving,
  closing the response before returning). An async view goes through Django's async chain, as
  with Django's handler.
"""

from __future__ import annotations

import contextvars
from typing import Any

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler
from django.http import HttpResponseBase

from .._asgi._render import PATHSEND, file_mode, send_answer
from .._options import DEFAULT_FALLBACK_CHUNK
from .._static._answer import Answer, FileRange
from ._one_hop import SUPPORTED as ONE_HOP_SUPPORTED
from ._one_hop import OneHop, sync_chain
from ._response import django_headers, file_body
from ._threads import RequestThreads

__all__ = ("ASGIHandler", "get_asgi_application")

#: Django 4.2's ``send_response`` closes the response at its end; from 5.0 ``handle`` does (after
#: ``send_response``, unless the client left). Ours closes it where Django's would.
_SEND_CLOSES = django.VERSION < (5, 0)

#: The request's scope, for ``send_response`` (which Django calls without it).
_scope: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("aiosendfile_django_scope")


class ASGIHandler(DjangoASGIHandler):  # type: ignore[misc]  # (Django has no type hints)
    """Django's ``ASGIHandler`` (see the module): ``get_asgi_application()``'s, with file bodies
    that leave as files. *chunk_size*: the body messages' size where the server takes no file.
    *one_hop*: a sync view's request runs the sync middleware chain and the view in one call on
    its thread (False: Django's async chain, a call per sync middleware method)."""

    def __init__(self, chunk_size: int = DEFAULT_FALLBACK_CHUNK, *, one_hop: bool = True) -> None:
        super().__init__()
        self.file_chunk_size = chunk_size
        self._threads = RequestThreads()
        chain = sync_chain() if one_hop and ONE_HOP_SUPPORTED else None
        self._one_hop = OneHop(chain) if chain is not None else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # (Django's check and words)
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        token = _scope.set(scope)
        try:
            async with self._threads.context():
                await self.handle(scope, receive, send)
        finally:
            _scope.reset(token)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        one_hop = self._one_hop
        if one_hop is not None and one_hop.serves(scope):
            await one_hop.handle(self, scope, receive, send)
        else:
            await super().handle(scope, receive, send)

    async def send_response(self, response: HttpResponseBase, send: Any) -> None:
        body = file_body(response)
        scope = _scope.get(None)
        if body is None or scope is None:
            await super().send_response(response, send)
            return
        fd, offset, count, whole, path = body
        mode = file_mode(scope)
        if not whole:
            mode &= ~PATHSEND  # (a standard pathsend is the whole file)
        answer = Answer(
            response.status_code,
            [],
            count,
            head_only=scope.get("method") == "HEAD",
            body=FileRange(fd, offset, count),
            path=path,
        )
        try:
            await send_answer(answer, send, mode, django_headers(response), chunk_size=self.file_chunk_size)
        finally:
            if _SEND_CLOSES:
                await sync_to_async(response.close, thread_sensitive=True)()


def get_asgi_application() -> ASGIHandler:
    """``django.core.asgi.get_asgi_application``, with :class:`ASGIHandler`: Django set up, then
    the handler."""
    import django

    django.setup(set_prefix=False)
    return ASGIHandler()
