"""The ASGI apps of ``http_static``'s ASGI rows (issue #16): a static directory in Starlette or FastAPI.

Each ASGI server in the benchmark (uvicorn stock, uvicorn with ``aiosendfile.uvicorn``'s protocol,
granian) loads one of these by name, e.g. ``uvicorn benchmarks.asgi_apps:starlette_app``. The
served directory comes from the environment variable ``AIOSENDFILE_BENCH_ROOT`` (the server's
command line has no room for it). Every app mounts its static files at ``/`` the way a user does:

* ``starlette_app``: ``Starlette(routes=[Mount("/", app=starlette.staticfiles.StaticFiles(directory=...))])``.
* ``fastapi_app``: ``FastAPI()`` with ``app.mount("/", starlette.staticfiles.StaticFiles(directory=...))``
  (FastAPI's ``StaticFiles`` is Starlette's).
* ``aiosendfile_app``: ``Starlette(routes=[Mount("/", app=aiosendfile.asgi.StaticFiles(directory=...))])``.
* ``memory_app``: a reference, not a file server: a bare ASGI app (no framework) answering each file
  of the directory's top level from bytes read at start (``http.response.start`` + one
  ``http.response.body``): what the server's own per-request machinery costs.

The apps are built on first access (a module ``__getattr__``), so that importing this module
needs neither the directory nor ``aiosendfile.asgi``, and loading one app does not build the
others.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["APPS", "ROOT_ENV"]

ROOT_ENV = "AIOSENDFILE_BENCH_ROOT"


def _root() -> str:
    try:
        return os.environ[ROOT_ENV]
    except KeyError:
        raise RuntimeError(f"benchmarks.asgi_apps: set {ROOT_ENV} to the directory to serve") from None


def _starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    return Starlette(routes=[Mount("/", app=StaticFiles(directory=_root()))])


def _fastapi_app() -> Any:
    from fastapi import FastAPI
    from fastapi.staticfiles import StaticFiles

    app = FastAPI()
    app.mount("/", StaticFiles(directory=_root()))
    return app


def _aiosendfile_app() -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    static_files = importlib.import_module("aiosendfile.asgi").StaticFiles
    return Starlette(routes=[Mount("/", app=static_files(directory=_root()))])


def _memory_app() -> Any:
    bodies: dict[str, bytes] = {}
    for entry in os.scandir(_root()):
        if entry.is_file():
            with open(entry.path, "rb") as f:
                bodies["/" + entry.name] = f.read()
    missing = [(b"content-type", b"text/plain"), (b"content-length", b"9")]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: nothing to set up
            return
        body = bodies.get(scope["path"])
        if body is None:
            await send({"type": "http.response.start", "status": 404, "headers": missing})
            await send({"type": "http.response.body", "body": b"not found"})
            return
        headers = [(b"content-type", b"application/octet-stream"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


APPS: dict[str, Callable[[], Any]] = {
    "starlette_app": _starlette_app,
    "fastapi_app": _fastapi_app,
    "aiosendfile_app": _aiosendfile_app,
    "memory_app": _memory_app,
}
_built: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name not in APPS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        _built[name] = APPS[name]()
    return _built[name]
