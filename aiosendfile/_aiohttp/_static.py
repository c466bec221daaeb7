"""Static directory serving for aiohttp with aiosendfile's ``FileResponse``.

``StaticResource`` subclasses aiohttp's, so prefix routing, ``url_for`` and
``append_version`` work as users know them. It replaces the request handler
only. aiohttp's handler resolves every path in the thread pool; ours asks the
static core (``aiosendfile._static``) inline: lexical checks and one ``stat``
(microseconds on a hot cache); only a directory listing to build goes to the
cold-read pool. The file's containment is then checked on the opened
descriptor when ``FileResponse`` prepares.

The rules are the core's (``_static._paths`` and ``_static._core``): a request
never reaches outside ``directory`` (NUL, backslash, absolute and ``..`` → 404,
after percent-decoding exactly once; symlinks out of it → 404 unless
``follow_symlinks=True``); dotfiles are hidden unless ``show_dotfiles=True``
(``/.well-known/`` is served); a name that is not UTF-8 is decoded from the raw
request bytes; a directory without its trailing slash → 301 (query kept), with
it → ``index.html``, a listing if ``show_index=True``, else 403.

This door renders the core's answers through aiohttp: its errors are raised as
``web.HTTPException`` (middlewares see them), a hot small file is aiohttp's plain
``Response`` built from headers memoised on the cache entry, a listing is a
``Response``, anything else a ``FileResponse``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.typedefs import PathLike
from multidict import CIMultiDict

from .. import _compat
from .._options import DEFAULT_FALLBACK_CHUNK, default_cold_executor
from .._static._answer import Answer
from .._static._core import Located, resolve, route
from .._static._fs import POOL_FS, REAL_FS, DecideInPool, directory_policy
from .._static._policy import DEFAULT_INLINE_LIMIT
from .._static._request import Request
from ._fileresponse import FileResponse

__all__ = ("StaticResource", "add_static", "static")


@_compat.route_static_requests("_routed")
class StaticResource(web.StaticResource):
    """aiohttp's static resource, answering with aiosendfile's ``FileResponse``."""

    def __init__(
        self,
        prefix: str,
        directory: PathLike,
        *,
        name: str | None = None,
        expect_handler: Any = None,
        chunk_size: int = DEFAULT_FALLBACK_CHUNK,
        show_index: bool = False,
        follow_symlinks: bool = False,
        append_version: bool = False,
        index: str | None = "index.html",
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        precompressed: bool = True,
        hot_cache: bool = True,
        show_dotfiles: bool = False,
    ) -> None:
        super().__init__(
            prefix,
            directory,
            name=name,
            expect_handler=expect_handler,
            chunk_size=chunk_size,
            show_index=show_index,
            follow_symlinks=follow_symlinks,
            append_version=append_version,
        )
        self._file_chunk = chunk_size
        self._policy = directory_policy(
            self.get_info()["directory"],
            index=index,
            listings=show_index,
            dotfiles=show_dotfiles,
            follow_symlinks=follow_symlinks,
            precompressed=precompressed,
            hot_cache=hot_cache,
            inline_limit=inline_limit,
        )

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer *request* with no ``Application`` around: a handler for aiohttp's low-level
        ``web.Server``, which has no router, middlewares or signals to run. The path is matched
        by aiohttp's own ``resolve`` (same decoding, same 404/405) and ``Expect`` is handled as
        the application would."""
        match_info, allowed = await self.resolve(request)  # type: ignore[arg-type]  # uses path+method only
        if match_info is None:
            if allowed:
                raise web.HTTPMethodNotAllowed(request.method, allowed)
            raise web.HTTPNotFound()
        if request.headers.get(hdrs.EXPECT):
            expected = await match_info.expect_handler(request)  # type: ignore[arg-type]
            await request.writer.drain()
            if expected is not None:
                return expected
        return await self._answer(request, match_info["filename"])

    async def _routed(self, request: web.Request) -> web.StreamResponse:
        """The handler of the resource's GET/HEAD routes in an ``Application``."""
        return await self._answer(request, request.match_info["filename"])

    async def _answer(self, request: web.BaseRequest, filename: str) -> web.StreamResponse:
        """The response for *filename*: decided inline (stat and lookups only), but a listing to
        build, which is decided in the cold-read pool."""
        url = request.rel_url
        req = Request(
            request.method,
            url.raw_path.encode("utf-8", "surrogateescape"),
            url.raw_query_string.encode("utf-8", "surrogateescape"),
            request.headers,
            self.canonical,
            filename,
        )
        policy = self._policy
        path = route(req, policy)
        if isinstance(path, Answer):
            raise _http_error(path)
        try:
            found = resolve(req, path, policy, REAL_FS)
        except DecideInPool:  # (a listing holds no descriptor: nothing to close if we are cancelled)
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(default_cold_executor(), resolve, req, path, policy, POOL_FS)
        if isinstance(found, Located):
            return self._file_response(found.path, found.st, found.siblings)
        entry = found.entry
        if entry is not None:  # a plain GET/HEAD of a hot small file
            rendering = entry.rendering(self._policy.precompressed)
            headers = cast("CIMultiDict[str] | None", rendering.headers)
            if headers is None:
                headers = CIMultiDict(found.fields)
                rendering.headers = headers
            return web.Response(body=entry.body, headers=headers.copy())  # aiohttp adds to its copy
        if found.status == 200:  # a listing (a page or JSON)
            return web.Response(body=found.body, headers=CIMultiDict(found.fields))
        raise _http_error(found)

    def _file_response(
        self, path: str, st: os.stat_result | None = None, siblings: list[tuple[str, str]] | None = None
    ) -> FileResponse:
        policy = self._policy
        response = FileResponse(
            path,
            self._file_chunk,
            inline_limit=policy.inline_limit,
            precompressed=policy.precompressed,
            root=policy.root,
            follow_symlinks=policy.follow_symlinks,
            hot_cache=policy.hot_cache,
        )
        response._located = Located(path, st, siblings)
        return response


def _http_error(answer: Answer) -> web.HTTPException:
    """The core's error answer as aiohttp's exception (same status, same text body)."""
    status = answer.status
    if status == 404:
        return web.HTTPNotFound()
    if status == 403:
        return web.HTTPForbidden()
    fields = dict(answer.fields)
    if status == 301:
        # The raw path's bytes, as the request sent them (the core spells them latin-1).
        location = fields["Location"].encode("latin-1").decode("utf-8", "surrogateescape")
        return web.HTTPMovedPermanently(location=location)
    if status == 405:
        return web.HTTPMethodNotAllowed("", fields["Allow"].split(","))
    raise AssertionError(f"no aiohttp exception for {answer!r}")


def add_static(router: web.UrlDispatcher, prefix: str, directory: PathLike, **kwargs: Any) -> StaticResource:
    """Like ``router.add_static``, serving through aiosendfile. Returns the resource."""
    if not prefix.startswith("/"):
        raise ValueError("prefix must start with '/'")
    resource = StaticResource(prefix.rstrip("/"), directory, **kwargs)
    router.register_resource(resource)
    return resource


class _StaticDef(web.AbstractRouteDef):
    def __init__(self, prefix: str, directory: PathLike, kwargs: dict[str, Any]) -> None:
        self.prefix, self.directory, self.kwargs = prefix, Path(directory), kwargs

    def __repr__(self) -> str:
        return f"<aiosendfile.aiohttp.static {self.prefix} -> {self.directory}>"

    def register(self, router: web.UrlDispatcher) -> list[web.AbstractRoute]:
        resource = add_static(router, self.prefix, self.directory, **self.kwargs)
        return list(resource)


def static(prefix: str, directory: PathLike, **kwargs: Any) -> web.AbstractRouteDef:
    """A route definition for ``app.add_routes([...])``, like ``aiohttp.web.static``."""
    return _StaticDef(prefix, directory, kwargs)
