"""pytest plugin (``-p aiosendfile_aiohttp_swap``): aiohttp's own static-file and
``FileResponse`` tests with ``aiosendfile.aiohttp`` in place of aiohttp's classes.

Loaded before aiohttp's ``conftest.py`` and test modules: ``FileResponse`` (``aiohttp.web`` and
``aiohttp.web_fileresponse``), ``StaticResource`` (``aiohttp.web`` and
``aiohttp.web_urldispatcher``), ``web.static`` and ``UrlDispatcher.add_static`` become
``aiosendfile.aiohttp``'s, so ``web.FileResponse(...)``, ``from aiohttp.web_fileresponse import
FileResponse``, ``app.router.add_static(...)`` and ``web.static(...)`` in the tests all give ours.
After collection (in each xdist worker) the plugin checks that the names the tests use hold ours,
and appends what it checked to the file ``$AIOSENDFILE_SWAP_REPORT``; a run that reports no check
proves nothing. Kept out of the ``tests`` package, as aiohttp's tests live beside it.

aiohttp's ``conftest.py`` runs every test under ``blockbuster``, which fails any blocking call
made on the loop below aiohttp's code, and allows aiohttp's ``add_static`` its ``stat`` and path
resolution. The plugin gives the same allowance to ours, and one more, which is the design
(``docs/aiohttp.md``): the static core decides inline, its ``stat`` and ``open`` (and a read
with ``RWF_NOWAIT``, which cannot block) in ``route``, ``resolve`` and ``respond``. Everything
else stays watched: a body sent, a listing built, a cold read made on the loop still fails.
A socket call counts as blocking when it can block: blockbuster asks the Python object
(``getblocking()``), and the object ``_platform.borrow_socket`` puts over a transport's
non-blocking descriptor (without the ``ioctl`` that would tell it) reports blocking; the plugin
asks the descriptor as well (``os.get_blocking``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import aiohttp.web as web
import aiohttp.web_fileresponse as web_fileresponse
import aiohttp.web_routedef as web_routedef
import aiohttp.web_urldispatcher as web_urldispatcher
import blockbuster
import pytest
from aiosendfile_swap_report import report

import aiosendfile.aiohttp as ours


def _add_static(self: web.UrlDispatcher, prefix: str, path: Any, **kwargs: Any) -> ours.StaticResource:
    """``UrlDispatcher.add_static``, answered by ``aiosendfile.aiohttp.add_static``."""
    return ours.add_static(self, prefix, path, **kwargs)


web.FileResponse = web_fileresponse.FileResponse = ours.FileResponse  # type: ignore[misc]
web.StaticResource = web_urldispatcher.StaticResource = ours.StaticResource  # type: ignore[misc]
web.static = web_routedef.static = ours.static
web.UrlDispatcher.add_static = _add_static  # type: ignore[method-assign]

#: Where aiosendfile blocks on purpose: the static core's inline decision, and (as aiohttp's
#: ``add_static``) the resource's making.
_MAY_BLOCK = (
    ("aiosendfile/_static/_core.py", {"route", "resolve", "respond"}),
    ("aiosendfile/_aiohttp/_static.py", {"add_static"}),
)

_stock_blockbuster_ctx = blockbuster.blockbuster_ctx


@contextlib.contextmanager
def _blockbuster_ctx(*args: Any, **kwargs: Any) -> Iterator[blockbuster.BlockBuster]:
    with _stock_blockbuster_ctx(*args, **kwargs) as bb:
        for name, function in bb.functions.items():
            for filename, names in _MAY_BLOCK:
                function.can_block_in(filename, names)
            if name.startswith(("socket.socket.", "ssl.SSLSocket.")):
                function.deactivate()
                function.can_block_predicate = _cannot_block
                function.activate()
        yield bb


def _cannot_block(sock: Any, *_: Any, **__: Any) -> bool:
    """True when a call on *sock* cannot wait: its timeout is 0, or it has none and its
    descriptor is non-blocking (Python then makes the system call once, as asked)."""
    timeout = sock.gettimeout()
    return timeout == 0 or (timeout is None and not os.get_blocking(sock.fileno()))


blockbuster.blockbuster_ctx = _blockbuster_ctx

#: aiohttp's test modules that import a swapped name, and the names.
_IMPORTERS = {
    "test_web_sendfile": {"FileResponse": ours.FileResponse},
    "test_urldispatch": {"StaticResource": ours.StaticResource},
}


def pytest_collection_finish(session: pytest.Session) -> None:
    checked = []
    held = {
        "aiohttp.web.FileResponse": web.FileResponse is ours.FileResponse,
        "aiohttp.web.static": web.static is ours.static,
        "UrlDispatcher.add_static": web.UrlDispatcher.add_static is _add_static,
    }
    for name, module in list(sys.modules.items()):
        expected = _IMPORTERS.get(name.rpartition(".")[2])
        if expected is None or not hasattr(module, "__file__") or "aiohttp" in name.split(".")[0]:
            continue
        for attribute, value in expected.items():
            held[f"{name}.{attribute}"] = getattr(module, attribute, None) is value
    for name, ok in held.items():
        if not ok:
            raise pytest.UsageError(f"SWAP NOT TAKEN: {name} is not aiosendfile.aiohttp's")
        checked.append(name)
    report(checked)
