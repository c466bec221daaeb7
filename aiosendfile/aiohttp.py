"""aiohttp integration: zero-copy static files and file responses.

Needs the ``aiohttp`` extra (``pip install aiosendfile[aiohttp]``)::

    from aiohttp import web
    import aiosendfile.aiohttp as sf

    app = web.Application()
    app.add_routes([sf.static("/static", "./public")])
    # or: sf.add_static(app.router, "/static", "./public", show_index=True)
    # or, in a handler: return sf.FileResponse(path)
    # and for uploads:   await sf.save_upload(request, "/srv/uploads/x.bin", max_size=2**30)

Unlike aiohttp's own ``add_static``, dotfiles (``/.env``, ``/.git/config``) are
hidden (404, not listed) unless ``show_dotfiles=True``; ``/.well-known/`` is served.
"""

from __future__ import annotations

from ._aiohttp._fileresponse import FileResponse
from ._aiohttp._static import StaticResource, add_static, static
from ._aiohttp._upload import save_upload

__all__ = ("FileResponse", "StaticResource", "add_static", "save_upload", "static")
