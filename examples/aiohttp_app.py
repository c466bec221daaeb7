"""An aiohttp app that serves static files through aiosendfile, next to ordinary routes.

    python examples/aiohttp_app.py [DIRECTORY] [--port 8080]

- ``/static/...`` serves DIRECTORY zero-copy (ranges, conditional requests,
  pre-compressed ``.br``/``.gz`` siblings, HEAD);
- ``/download/{name}`` returns a ``FileResponse`` from a handler, here with a
  ``Content-Disposition`` header;
- ``/`` is an ordinary aiohttp handler.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web

import aiosendfile.aiohttp as sf


def make_app(directory: Path) -> web.Application:
    async def index(request: web.Request) -> web.Response:
        url = request.app.router["static"].url_for(filename="README.md")
        return web.Response(text=f"Try {url} or /download/README.md\n")

    async def download(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if "/" in name or name.startswith("."):
            raise web.HTTPNotFound()
        return sf.FileResponse(
            directory / name, headers={"Content-Disposition": f'attachment; filename="{name}"'}
        )

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/download/{name}", download)
    sf.add_static(app.router, "/static", directory, name="static", show_index=True, append_version=True)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default=".", type=Path)
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    loop = None
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        pass
    web.run_app(make_app(args.directory.resolve()), host="127.0.0.1", port=args.port, loop=loop)


if __name__ == "__main__":
    main()
