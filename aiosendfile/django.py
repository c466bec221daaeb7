"""Django under ASGI: static files and ``FileResponse`` sent as files, where WhiteNoise and
gunicorn's ``wsgi.file_wrapper`` do it under WSGI.

In ``asgi.py``, the two lines a Django project changes::

    from aiosendfile.django import StaticFiles, get_asgi_application

    application = StaticFiles(get_asgi_application())

``get_asgi_application()`` is Django's, but a ``FileResponse`` of a real file leaves as a file
(zero-copy under ``uvicorn --http aiosendfile.uvicorn:HttpToolsProtocol``, ``pathsend`` under
granian, bounded chunks elsewhere) instead of being read whole into memory first, as Django's
own ASGI handler does; every other response is Django's, byte for byte. ``StaticFiles`` answers
``STATIC_URL`` from ``STATIC_ROOT`` (ranges, conditional requests, ``.br``/``.gz`` siblings,
WhiteNoise's ``Cache-Control``) and passes anything else on. Needs Django (the ``django`` extra).
"""

from __future__ import annotations

from ._django._handler import ASGIHandler, get_asgi_application
from ._django._static import StaticFiles

__all__ = ("ASGIHandler", "StaticFiles", "get_asgi_application")
