"""Transfer bookkeeping, with no I/O: offsets, remaining bytes, chunk sizes.

Rules kept here:

* ``total`` is fixed at the start: the requested ``count``, or the file's
  size minus ``offset`` when ``count`` is None (a file that grows during the
  transfer is sent as it was when the transfer started, as nginx does).
  It is None only for files of unknown size (pipes), which are sent to EOF.
* A chunk never exceeds ``max_chunk`` (bounded work per event-loop wakeup)
  nor what is left.
* End of file before ``total`` bytes is truncation, never a short success.
* A caller's ``offset`` and ``count`` (``sendfile``, ``sock_sendfile``,
  ``recvfile``) are checked by one rule, ``loop.sendfile``'s: not an int (a
  bool is not one either) is ``TypeError``, a negative is ``ValueError``
  (``check_int``; ``recvfile`` checks its file between its count and its offset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._errors import FileTruncatedError

__all__ = ("DEFAULT_MAX_CHUNK", "TransferState", "check_int", "check_offset_count")

#: Most bytes one transfer moves per event-loop wakeup (nginx's sendfile_max_chunk).
DEFAULT_MAX_CHUNK = 4 * 1024 * 1024


def check_offset_count(offset: Any, count: Any) -> None:
    """``sendfile``'s and ``sock_sendfile``'s checks: an int *offset*, an int or None *count*."""
    check_int("offset", offset)
    check_int("count", count, optional=True)


def check_int(name: str, value: Any, *, optional: bool = False) -> None:
    """The one rule for an offset or a count; None passes where it is *optional*."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer (got {value!r})")


@dataclass
class TransferState:
    """Where a transfer stands. ``sent`` only grows; ``position`` is where the file is."""

    offset: int
    total: int | None
    max_chunk: int = DEFAULT_MAX_CHUNK
    sent: int = 0

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError(f"offset must be a non-negative integer (got {self.offset!r})")
        if self.total is not None and self.total < 0:
            raise ValueError(f"total must be non-negative (got {self.total!r})")
        if self.max_chunk <= 0:
            raise ValueError(f"max_chunk must be positive (got {self.max_chunk!r})")

    @property
    def position(self) -> int:
        """The file offset of the next byte to send."""
        return self.offset + self.sent

    @property
    def remaining(self) -> int | None:
        """Bytes still to send, or None when sending to an unknown EOF."""
        return None if self.total is None else self.total - self.sent

    @property
    def done(self) -> bool:
        return self.total is not None and self.sent >= self.total

    def next_chunk(self, limit: int | None = None) -> int:
        """Size of the next attempt: at most ``max_chunk``, ``limit`` and what is left."""
        size = self.max_chunk if limit is None else min(limit, self.max_chunk)
        if self.total is not None:
            size = min(size, self.total - self.sent)
        return size

    def advance(self, n: int) -> None:
        """Record *n* more bytes sent."""
        if n < 0:
            raise ValueError("cannot send a negative byte count")
        if self.total is not None and self.sent + n > self.total:
            raise ValueError("sent more than the transfer's total")
        self.sent += n

    def hit_eof(self) -> bool:
        """Called when the file returned end-of-file; True if that is truncation."""
        return self.total is not None and self.sent < self.total

    def truncated(self) -> FileTruncatedError:
        """The error for an end of file before ``total`` bytes."""
        return FileTruncatedError(
            f"file ended at offset {self.position}, "
            f"{self.remaining} bytes short of the {self.total} requested",
            sent=self.sent,
            expected=self.total or 0,
        )
