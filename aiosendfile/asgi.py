"""ASGI static files answered by aiosendfile's static-file core: ``StaticFiles`` and ``FileResponse``.

Plain ASGI apps (no framework needed), for Starlette, FastAPI or any ASGI server::

    from fastapi import FastAPI
    from aiosendfile.asgi import StaticFiles, FileResponse

    app = FastAPI()
    app.mount("/static", StaticFiles(directory="public"), name="static")

    @app.get("/report")
    async def report():
        return FileResponse("report.pdf", filename="report.pdf")

They answer as ``aiosendfile.aiohttp``'s ``static`` and ``FileResponse`` do (same statuses, fields
and bodies): single and multiple ranges, ``If-*`` preconditions, ``.br``/``.gz`` siblings, a hot
cache of small files, listings, and hidden dotfiles. File bodies leave zero-copy under uvicorn with
``--http aiosendfile.uvicorn:HttpToolsProtocol`` (ranges too), as ``pathsend`` where a server lists
it (granian), else as body messages read off the event loop.

``StaticFiles(directory=..., *, html=False, check_dir=True, follow_symlink=False, index="index.html",
listings=False, dotfiles=False, follow_symlinks=None, precompressed=True, hot_cache=True,
inline_limit=65536, max_ranges=16, chunk_size=262144)``: Starlette's keywords keep their meaning
(``html=True`` also serves the directory's ``404.html`` for a missing path; ``follow_symlink`` is
``follow_symlinks``); ``packages=`` is not supported.

``FileResponse(path, status_code=200, headers=None, media_type=None, background=None, filename=None,
stat_result=None, content_disposition_type="attachment", *, precompressed=True, hot_cache=True,
inline_limit=65536, chunk_size=262144, root=None, follow_symlinks=False)``: Starlette's arguments;
``root`` confines the file to a directory (symlinks out of it → 404).
"""

from __future__ import annotations

from ._asgi._app import FileResponse, StaticFiles

__all__ = ("FileResponse", "StaticFiles")
