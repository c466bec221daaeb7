"""aiosendfile: zero-copy file transfer for asyncio and uvloop.

``await aiosendfile.sendfile(writer, file)`` sends a file with ``sendfile(2)``
driven by the event loop, on the loop's own transports (stock asyncio and
uvloop alike). Where zero-copy is impossible (TLS, pipes, in-memory files)
a bounded userspace copy takes over.
"""

from __future__ import annotations

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
