"""aiosendfile: zero-copy file transfer for asyncio and uvloop.

``await aiosendfile.sendfile(writer, file)`` sends a file with ``sendfile(2)``
driven by the event loop, on the loop's own transports (stock asyncio and
uvloop alike). Where zero-copy is impossible (TLS, pipes, in-memory files)
a bounded userspace copy takes over.

The public names are imported on first use (PEP 562), so ``python -m aiosendfile``
can take over Ctrl-C and SIGTERM before asyncio is even imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._api import sendfile, sock_sendfile
    from ._capabilities import capabilities
    from ._errors import (
        ConnectionLostError,
        FileTruncatedError,
        SendfileError,
        SendfileNotAvailableError,
    )
    from ._patch import loop_factory, patch_loop
    from ._recv import IncompleteTransferError, recvfile

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
    "SendfileError": "._errors",
    "SendfileNotAvailableError": "._errors",
    "loop_factory": "._patch",
    "patch_loop": "._patch",
    "IncompleteTransferError": "._recv",
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
