"""Django's static files under ASGI, where WhiteNoise sits under WSGI: ``StaticFiles(application)``.

A request for ``STATIC_URL`` (``GET`` or ``HEAD``) is answered from ``STATIC_ROOT`` by the ASGI
door's ``StaticFiles`` (the shared static core: ranges, conditional requests, ``.br``/``.gz``
siblings, files sent as the server allows: zero-copy under our uvicorn protocol, ``pathsend``
under granian, bounded chunks elsewhere). Anything else, and any request for a static path that
is not a file there (404, a directory, ...), goes to the wrapped application untouched, as
WhiteNoise passes it on to Django.

As WhiteNoise: ``Cache-Control: max-age=315360000, public, immutable`` for the hashed names
``ManifestStaticFilesStorage`` writes (a name whose unhashed form the storage maps back to it),
``max-age=60, public`` for the others (``max_age``; 0 with ``DEBUG``); with ``DEBUG``, a file not
in ``STATIC_ROOT`` is looked up with the staticfiles finders (the apps' ``static/`` folders, as
``runserver`` does), off the loop. The settings are read at the first request, from
``django.conf.settings``: none is needed beyond ``STATIC_URL`` and ``STATIC_ROOT``. A
``STATIC_URL`` on another host (a CDN) or no ``STATIC_ROOT`` passes everything on.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from typing import Any
from urllib.parse import quote, urlsplit

from .._asgi._app import FileResponse
from .._asgi._app import StaticFiles as DirectoryApp
from .._options import DEFAULT_FALLBACK_CHUNK

__all__ = ("IMMUTABLE", "StaticFiles")

#: WhiteNoise's field for a hashed name, and its default ``max-age`` for the others.
IMMUTABLE = "max-age=315360000, public, immutable"
DEFAULT_MAX_AGE = 60
#: Names whose "hashed or not" answer is kept (each is a file that exists under STATIC_ROOT).
_MEMO_ENTRIES = 4096
#: The answers about the file itself; any other status passes the request on to the application.
_SERVED = frozenset((200, 206, 304, 412, 416))
_HASHED = re.compile(r"^(?P<stem>.+)\.[0-9a-f]{12}(?P<suffix>(\.[^./]+)*)$")


class StaticFiles:
    """Wrap a Django ASGI *application* (see the module). *max_age*: seconds for files that are
    not hashed (default 60, 0 with ``DEBUG``); *chunk_size*: body messages where the server takes
    no file."""

    def __init__(
        self, application: Any, *, max_age: int | None = None, chunk_size: int = DEFAULT_FALLBACK_CHUNK
    ) -> None:
        self.application = application
        self.max_age = max_age
        self.chunk_size = chunk_size
        self._ready = False
        self._prefix = ""  # STATIC_URL's path ("/static/"); "" passes everything on
        self._relative = False  # (STATIC_URL without a leading "/": under the script prefix)
        self._files: DirectoryApp | None = None
        self._debug = False
        self._plain = ""
        self._immutable: OrderedDict[str, bool] = OrderedDict()

    def _setup(self) -> None:
        from django.conf import settings

        url, root = settings.STATIC_URL, settings.STATIC_ROOT
        self._debug = bool(settings.DEBUG)
        age = self.max_age if self.max_age is not None else (0 if self._debug else DEFAULT_MAX_AGE)
        self._plain = f"max-age={age}, public"
        parts = urlsplit(url or "")
        if not url or parts.netloc or parts.scheme:
            self._ready = True  # elsewhere (a CDN), or unset: nothing to serve here
            return
        path = parts.path if parts.path.endswith("/") else parts.path + "/"
        self._relative = not path.startswith("/")
        self._prefix = path if not self._relative else "/" + path
        if root:
            self._files = DirectoryApp(  # (no index page: a folder goes on to Django, as WhiteNoise)
                directory=str(root), check_dir=False, chunk_size=self.chunk_size, index=None
            )
        self._ready = True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not self._ready:
            self._setup()
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD") or not self._prefix:
            await self.application(scope, receive, send)
            return
        root_path = scope.get("root_path", "")
        prefix = (root_path.rstrip("/") + self._prefix) if self._relative else self._prefix
        path = scope["path"]
        if not path.startswith(prefix) or len(path) == len(prefix):
            await self.application(scope, receive, send)
            return
        name = path[len(prefix) :]
        inner = {**scope, "root_path": prefix.rstrip("/")}
        if self._files is not None and await self._try(self._files, inner, receive, send, name):
            return
        if self._debug:
            found = await asyncio.to_thread(_find, name)
            if found is not None:
                response = FileResponse(found, chunk_size=self.chunk_size)
                if await self._try(response, scope, receive, send, name):
                    return
        await self.application(scope, receive, send)

    async def _try(self, app: Any, scope: dict[str, Any], receive: Any, send: Any, name: str) -> bool:
        """Run *app*; True if it answered about the file (sent, with Cache-Control added), False
        if it did not find one (nothing was sent: the caller passes the request on)."""
        missed = False
        field: bytes | None = None

        async def sending(message: dict[str, Any]) -> None:
            nonlocal missed, field
            if missed:
                return
            if message["type"] == "http.response.start":
                if message["status"] not in _SERVED:
                    missed = True
                    return
                headers = list(message.get("headers", ()))
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    value = IMMUTABLE if await self._is_hashed(name) else self._plain
                    headers.append((b"cache-control", value.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, sending)
        return not missed

    async def _is_hashed(self, name: str) -> bool:
        """Whether *name* is a hashed name the static storage wrote (WhiteNoise's test: the
        storage's URL for its unhashed form ends with it)."""
        known = self._immutable.get(name)
        if known is not None:
            self._immutable.move_to_end(name)
            return known
        match = _HASHED.match(name)
        hashed = match is not None and await asyncio.to_thread(
            _storage_names, match["stem"] + match["suffix"], name
        )
        self._immutable[name] = hashed
        if len(self._immutable) > _MEMO_ENTRIES:
            self._immutable.popitem(last=False)
        return hashed


def _find(name: str) -> str | None:
    """The staticfiles finders' file for *name* (ASGI's path: decoded), or None (a name they
    refuse, ``..`` out of a folder, counts as none)."""
    from django.contrib.staticfiles import finders

    try:
        found = finders.find(name)
    except Exception:  # (SuspiciousFileOperation from safe_join, an unreadable folder)
        return None
    return found if isinstance(found, str) else None


def _storage_names(unhashed: str, name: str) -> bool:
    from django.contrib.staticfiles.storage import staticfiles_storage

    try:
        return bool(staticfiles_storage.url(unhashed).endswith(quote(name)))
    except Exception:  # (a manifest without the name, a storage without hashes: not immutable)
        return False
