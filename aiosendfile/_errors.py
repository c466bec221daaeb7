"""The exception hierarchy, and the one place where OS errors are translated.

::

    SendfileError                 .sent: bytes that reached the socket before the error
    ├── SendfileNotAvailableError also asyncio.SendfileNotAvailableError
    ├── FileTruncatedError        the file ended before the promised byte count
    ├── IncompleteTransferError   also EOFError: the peer closed before ``count`` bytes arrived
    └── ConnectionLostError       also ConnectionError (an OSError): the peer or
                                  the transport went away mid-transfer

Any other exception raised once the transfer has begun (``EIO`` from the
disk, cancellation) keeps its type and gets a ``.sent`` attribute.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = (
    "ConnectionLostError",
    "Counted",
    "FileTruncatedError",
    "IncompleteTransferError",
    "SendfileError",
    "SendfileNotAvailableError",
    "map_exceptions",
)

_CONNECTION_ERRNOS = frozenset(
    e
    for e in (
        errno.EPIPE,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ENOTCONN,
        getattr(errno, "ESHUTDOWN", None),
        getattr(errno, "ETIMEDOUT", None),
    )
    if e is not None
)


class SendfileError(Exception):
    """Base class of aiosendfile's errors. ``sent`` is the byte count already sent."""

    sent: int

    def __init__(self, *args: Any, sent: int = 0) -> None:
        super().__init__(*args)
        self.sent = sent


class SendfileNotAvailableError(SendfileError, asyncio.SendfileNotAvailableError):
    """Zero-copy is impossible for this target or file, and ``fallback=False`` was given."""


class FileTruncatedError(SendfileError):
    """The file ended before the requested byte count was sent.

    The receiver has got a short body. Treat the connection as broken: do not
    reuse it for another response.
    """

    expected: int

    def __init__(self, message: str, *, sent: int, expected: int) -> None:
        super().__init__(message, sent=sent)
        self.expected = expected


class IncompleteTransferError(SendfileError, EOFError):
    """The peer closed the connection before ``count`` bytes arrived.

    ``received`` bytes (also ``.sent``) are in the file, at ``offset``.
    """

    expected: int

    def __init__(self, message: str, *, received: int, expected: int) -> None:
        super().__init__(message, sent=received)
        self.expected = expected

    @property
    def received(self) -> int:
        return self.sent


class ConnectionLostError(SendfileError, ConnectionError):
    """The connection went away during the transfer (peer reset, broken pipe, local close)."""

    def __init__(self, *args: Any, sent: int = 0) -> None:
        super().__init__(*args, sent=sent)


class Counted(Protocol):
    """What ``map_exceptions`` reads ``.sent`` from: the transfer's one byte counter
    (``TransferState`` for a send, ``FileSink.state`` for a receive)."""

    @property
    def sent(self) -> int: ...


@contextmanager
def map_exceptions(counter: Counted) -> Iterator[None]:
    """Translate OS errors into the hierarchy above and stamp ``.sent`` on everything."""
    try:
        yield
    except SendfileError as exc:
        exc.sent = counter.sent
        raise
    except OSError as exc:
        if isinstance(exc, ConnectionError) or exc.errno in _CONNECTION_ERRNOS:
            if exc.errno is not None:
                raise ConnectionLostError(exc.errno, exc.strerror, sent=counter.sent) from exc
            raise ConnectionLostError(str(exc), sent=counter.sent) from exc
        exc.sent = counter.sent  # type: ignore[attr-defined]
        raise
    except BaseException as exc:
        exc.sent = counter.sent  # type: ignore[attr-defined]
        raise
