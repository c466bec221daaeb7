"""Give a loop (uvloop included) a zero-copy ``loop.sendfile`` and ``loop.sock_sendfile``.

uvloop raises ``NotImplementedError`` from both, so libraries that call them
(aiohttp's ``FileResponse``) copy through userspace there. Stock asyncio has
them, but they run one unbounded ``os.sendfile`` per wakeup and send short
without an error when the file shrinks. Patching replaces both methods on the
loop *instance* with ours. The class and other loops are untouched, and
patching twice is harmless.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import IO, Any

from ._api import sendfile, sock_sendfile

__all__ = ("loop_factory", "patch_loop")

_MARK = "_aiosendfile_patched"


def patch_loop(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.AbstractEventLoop:
    """Install aiosendfile's ``sendfile``/``sock_sendfile`` on *loop* (default: the running one)."""
    if loop is None:
        loop = asyncio.get_running_loop()
    if getattr(loop, _MARK, False):
        return loop

    async def loop_sendfile(
        transport: asyncio.BaseTransport,
        file: IO[bytes],
        offset: int = 0,
        count: int | None = None,
        *,
        fallback: bool = True,
    ) -> int:
        return await sendfile(transport, file, offset, count, fallback=fallback)

    async def loop_sock_sendfile(
        sock: socket.socket,
        file: IO[bytes],
        offset: int = 0,
        count: int | None = None,
        *,
        fallback: bool = True,
    ) -> int:
        return await sock_sendfile(sock, file, offset, count, fallback=fallback)

    try:
        loop.sendfile = loop_sendfile  # type: ignore[method-assign]
        loop.sock_sendfile = loop_sock_sendfile  # type: ignore[method-assign,assignment]
        setattr(loop, _MARK, True)
    except AttributeError as exc:  # a loop class with __slots__
        raise TypeError(f"cannot patch a loop of type {type(loop).__name__}") from exc
    return loop


def loop_factory(
    base_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> Callable[[], asyncio.AbstractEventLoop]:
    """A loop factory (for ``asyncio.run(..., loop_factory=...)``/``asyncio.Runner``) that patches.

    *base_factory* makes the loop (default ``asyncio.new_event_loop``; pass
    ``uvloop.new_event_loop`` for uvloop).
    """
    make = base_factory or asyncio.new_event_loop

    def factory() -> asyncio.AbstractEventLoop:
        return patch_loop(make())

    return factory


def unpatch(loop: Any) -> None:
    """Remove the patch (tests)."""
    for name in ("sendfile", "sock_sendfile", _MARK):
        loop.__dict__.pop(name, None)
