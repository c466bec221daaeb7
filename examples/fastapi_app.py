"""A FastAPI app that serves files zero-copy through aiosendfile, next to ordinary routes.

    python examples/fastapi_app.py [DIRECTORY] [--port 8000] [--loop uvloop|asyncio]

or with uvicorn's own command line (DIRECTORY from the environment, default: the current one)::

    AIOSENDFILE_DIR=DIRECTORY uvicorn examples.fastapi_app:app --http aiosendfile.uvicorn:HttpToolsProtocol

- ``/static/...`` is ``aiosendfile.asgi.StaticFiles``: ranges, conditional requests,
  pre-compressed ``.br``/``.gz`` siblings, HEAD, a listing of directories;
- ``/download/{name}`` returns ``aiosendfile.asgi.FileResponse`` from a handler, confined to
  DIRECTORY (``root=``), with a ``Content-Disposition`` header;
- ``/`` is an ordinary FastAPI route.

uvicorn runs with ``aiosendfile.uvicorn.HttpToolsProtocol``: its protocol, plus the two ASGI
extensions (``pathsend``, ``zerocopysend``) that let the file bodies leave with ``sendfile(2)``.
Without it the same app still works, the bodies going as ordinary body messages.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fastapi import FastAPI

from aiosendfile.asgi import FileResponse, StaticFiles


def make_app(directory: Path) -> FastAPI:
    app = FastAPI()

    @app.get("/")
    async def index() -> dict[str, str]:
        return {"try": "/static/ or /download/README.md"}

    @app.get("/download/{name}")
    async def download(name: str) -> FileResponse:
        # root= keeps the name inside DIRECTORY: "../x" or a symlink out of it is a 404.
        return FileResponse(directory / name, filename=name, root=directory)

    app.mount("/static", StaticFiles(directory=directory, listings=True), name="static")
    return app


def _directory(arg: str) -> Path:
    path = Path(arg).resolve()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {arg}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve DIRECTORY with FastAPI, zero-copy.")
    parser.add_argument("directory", nargs="?", default=".", type=_directory, help="default: .")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()

    import uvicorn

    from aiosendfile.uvicorn import HttpToolsProtocol

    print(f"serving {args.directory} on http://{args.host}:{args.port}/ (Ctrl-C to stop)", flush=True)
    uvicorn.run(
        make_app(args.directory), host=args.host, port=args.port, loop=args.loop, http=HttpToolsProtocol
    )


if __name__ == "__main__":
    main()
else:  # uvicorn examples.fastapi_app:app
    _root = os.environ.get("AIOSENDFILE_DIR", ".")
    if not os.path.isdir(_root):
        sys.exit(f"AIOSENDFILE_DIR is not a directory: {_root}")
    app = make_app(Path(_root).resolve())
