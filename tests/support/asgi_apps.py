"""ASGI app factories the ASGI door's tests serve in a server subprocess (``asgi_servers``).

Each factory takes no argument (servers call "module:factory") and serves the directory named by
the environment variable ``PUBLIC_ENV``. The same routes in every app:

* ``/static/...``: a static-files app over the directory; ``/file``: a file response for its
  ``file.bin``; both again under ``/gz`` (behind ``GZipMiddleware``) and ``/mw`` (behind a
  pass-through ``BaseHTTPMiddleware``) in the Starlette apps; the FastAPI apps have an
  ``@app.middleware("http")`` around everything instead.
* ``/_counters``: the server process's ``aiosendfile._platform.counters`` as JSON, so a test
  proves zero-copy in another process by the bytes that went through the shim's ``sendfile``.

``starlette_app``/``fastapi_app`` use Starlette's own ``StaticFiles``/``FileResponse`` (the
unchanged apps users have); ``ours_starlette_app``/``ours_fastapi_app`` the same with
``aiosendfile.asgi``'s.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from .asgi_servers import PUBLIC_ENV

#: The file the ``/file`` routes answer with, in the served directory.
FILE_NAME = "file.bin"

#: A header the FastAPI apps' ``@app.middleware("http")`` adds: the middleware ran.
THROUGH = "x-through"


def _public() -> Path:
    return Path(os.environ[PUBLIC_ENV])


async def _counters(request: Any) -> Any:
    from starlette.responses import JSONResponse

    from aiosendfile import _platform

    return JSONResponse(dataclasses.asdict(_platform.counters))


async def _pass_through(request: Any, call_next: Any) -> Any:
    return await call_next(request)


def _kinds(ours: bool) -> tuple[Any, Any]:
    if ours:
        from aiosendfile import asgi

        return asgi.StaticFiles, asgi.FileResponse
    from starlette.responses import FileResponse
    from starlette.staticfiles import StaticFiles

    return StaticFiles, FileResponse


def _starlette(ours: bool) -> Any:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.middleware.gzip import GZipMiddleware
    from starlette.routing import Mount, Route

    static_files, file_response = _kinds(ours)
    public = _public()

    async def one_file(request: Any) -> Any:
        return file_response(public / FILE_NAME)

    def routes() -> list[Any]:
        return [Mount("/static", app=static_files(directory=public)), Route("/file", one_file)]

    gzip = Middleware(GZipMiddleware, minimum_size=1)
    base = Middleware(BaseHTTPMiddleware, dispatch=_pass_through)
    return Starlette(
        routes=[
            *routes(),
            Mount("/gz", routes=routes(), middleware=[gzip]),
            Mount("/mw", routes=routes(), middleware=[base]),
            Route("/_counters", _counters),
        ]
    )


def _fastapi(ours: bool) -> Any:
    from fastapi import FastAPI, Request

    static_files, file_response = _kinds(ours)
    public = _public()
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def through(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers[THROUGH] = "fastapi"
        return response

    async def one_file(request: Request) -> Any:
        return file_response(public / FILE_NAME)

    # a plain Starlette route: FastAPI would serialise a returned object that is not its Response
    app.add_route("/file", one_file)
    app.add_route("/_counters", _counters)
    app.mount("/static", static_files(directory=public))
    return app


def starlette_app() -> Any:
    """Starlette with its own StaticFiles and FileResponse (plain, behind GZip, behind BaseHTTPMiddleware)."""
    return _starlette(ours=False)


def fastapi_app() -> Any:
    """FastAPI with Starlette's StaticFiles and FileResponse, behind an ``@app.middleware("http")``."""
    return _fastapi(ours=False)


def ours_starlette_app() -> Any:
    """:func:`starlette_app` with ``aiosendfile.asgi.StaticFiles`` and ``FileResponse``."""
    return _starlette(ours=True)


def ours_fastapi_app() -> Any:
    """:func:`fastapi_app` with ``aiosendfile.asgi.StaticFiles`` and ``FileResponse``."""
    return _fastapi(ours=True)


def ours_available() -> bool:
    """Whether ``aiosendfile.asgi`` (A's apps) is in the tree yet."""
    import importlib.util

    return importlib.util.find_spec("aiosendfile.asgi") is not None


def counted_static_app() -> Any:
    """Starlette's StaticFiles on ``$AIOSENDFILE_TEST_ROOT``, and the shim's counters at /counters."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from aiosendfile import _platform

    def counters(request: Any) -> Any:
        return PlainTextResponse(f"{_platform.counters.calls} {_platform.counters.bytes}")

    return Starlette(
        routes=[
            Route("/counters", counters),
            Mount("/", StaticFiles(directory=os.environ["AIOSENDFILE_TEST_ROOT"])),
        ]
    )
