"""aiosendfile: zero-copy file transfer for asyncio and uvloop.

``await aiosendfile.sendfile(writer, file)`` sends a file with ``sendfile(2)``
driven by the event loop, on the loop's own transports (stock asyncio and
uvloop alike). Where zero-copy is impossible (TLS, pipes, in-memory files)
a bounded userspace copy takes over.

The public names are imported with the package, so that a server's first
``sendfile()`` does not import the core on its event loop's thread (~15 ms). Only
while ``python -m aiosendfile`` starts are they left to load on first use (PEP 562),
so that the command line takes over Ctrl-C and SIGTERM before asyncio is imported.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._api import sendfile, sock_sendfile
    from ._capabilities import capabilities
    from ._errors import (
        ConnectionLostError,
        FileTruncatedError,
        IncompleteTransferError,
        SendfileError,
        SendfileNotAvailableError,
    )
    from ._patch import loop_factory, patch_loop
    from ._recv import recvfile

__version__ = "0.1.0"

__all__ = (
    "ConnectionLostError",
    "FileTruncatedError",
    "IncompleteTransferError",
    "SendfileError",
    "SendfileNotAvailableError",
    "__version__",
    "capabilities",
    "loop_factory",
    "patch_loop",
    "recvfile",
    "sendfile",
    "sock_sendfile",
)

_HOME = {
    "sendfile": "._api",
    "sock_sendfile": "._api",
    "capabilities": "._capabilities",
    "ConnectionLostError": "._errors",
    "FileTruncatedError": "._errors",
    "IncompleteTransferError": "._errors",
    "SendfileError": "._errors",
    "SendfileNotAvailableError": "._errors",
    "loop_factory": "._patch",
    "patch_loop": "._patch",
    "recvfile": "._recv",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'aiosendfile' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _our_command_line_is_starting() -> bool:
    """``python -m aiosendfile`` is importing the package (runpy sets ``argv[0]`` to "-m" meanwhile)."""
    return getattr(sys, "argv", [""])[:1] == ["-m"] and "aiosendfile" in getattr(sys, "orig_argv", ())


if not _our_command_line_is_starting():
    for _name in _HOME:
        __getattr__(_name)
    del _name
