"""uvicorn HTTP protocols that send files zero-copy: ``--http aiosendfile.uvicorn:HttpToolsProtocol``.

Drop-in subclasses of uvicorn's ``httptools`` and ``h11`` protocols. They list
``http.response.pathsend`` and ``http.response.zerocopysend`` (and ``aiosendfile.pathsend``, the
private keys :mod:`aiosendfile.asgi` sends) in ``scope["extensions"]`` and carry those messages out
with :func:`aiosendfile.sendfile` on uvicorn's own transport; everything else is uvicorn's.
Unchanged Starlette/FastAPI ``FileResponse`` and ``StaticFiles`` then send whole files zero-copy::

    uvicorn app:app --http aiosendfile.uvicorn:HttpToolsProtocol      # uvicorn >= 0.36
    uvicorn.run(app, http=aiosendfile.uvicorn.HttpToolsProtocol)      # uvicorn >= 0.30
"""

from __future__ import annotations

from ._asgi._uvicorn import H11Protocol, HttpToolsProtocol

__all__ = ["H11Protocol", "HttpToolsProtocol"]
