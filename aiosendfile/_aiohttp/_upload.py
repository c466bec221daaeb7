"""``save_upload``: an aiohttp request body into a file, bounded and off the loop thread.

This path is not zero-copy. aiohttp's HTTP parser consumes the body itself:
it sits between the socket and ``request.content``, counts ``Content-Length``
and decodes chunked bodies. Splicing the body around it would leave the parser
waiting for bytes that never come, and would corrupt the next request on the
connection. So the body is read from ``request.content`` (aiohttp's flow
control bounds what is buffered) and written in the cold-read pool, so a
slow disk never blocks the loop. For zero-copy uploads, use
``aiosendfile.recvfile`` on a plain ``asyncio`` stream server.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor
from typing import IO, Any

from aiohttp import web

from .._errors import IncompleteTransferError
from .._options import default_cold_executor
from .._threads import shielded

__all__ = ("save_upload",)


async def save_upload(
    request: web.BaseRequest,
    destination: str | os.PathLike[str] | IO[bytes],
    *,
    max_size: int | None = None,
    executor: Executor | None = None,
) -> int:
    """Write the request body to *destination* (a path, or a binary file); return its length.

    A body longer than *max_size* raises ``HTTPRequestEntityTooLarge`` (413)
    before anything is written, if ``Content-Length`` says so, or as soon as it
    is exceeded. A body shorter than its ``Content-Length`` raises
    :class:`~aiosendfile.IncompleteTransferError`. Either way, the file holds
    exactly the bytes received. Chunked bodies work too.
    """
    length = request.content_length
    if max_size is not None and length is not None and length > max_size:
        raise web.HTTPRequestEntityTooLarge(max_size=max_size, actual_size=length)
    pool = executor or default_cold_executor()
    loop = asyncio.get_running_loop()
    own = not hasattr(destination, "write")
    file: Any = (
        await shielded(loop.run_in_executor(pool, _open_for_writing, destination), _close_if_opened)
        if own
        else destination
    )
    received = 0
    try:
        while chunk := await request.content.readany():
            received += len(chunk)
            if max_size is not None and received > max_size:
                raise web.HTTPRequestEntityTooLarge(max_size=max_size, actual_size=received)
            # A write still running when we are cancelled finishes before the file is closed.
            await shielded(loop.run_in_executor(pool, file.write, chunk), lambda written: None)
        if length is not None and received != length:
            raise IncompleteTransferError(
                f"the client sent {received} of {length} bytes", received=received, expected=length
            )
        await loop.run_in_executor(pool, file.flush)
    finally:
        if own:
            await loop.run_in_executor(pool, file.close)
    return received


def _close_if_opened(file: IO[bytes] | None) -> None:
    """A cancelled upload must not leak the file a thread opened meanwhile."""
    if file is not None:
        file.close()


def _open_for_writing(path: Any) -> IO[bytes]:
    return open(path, "wb")
