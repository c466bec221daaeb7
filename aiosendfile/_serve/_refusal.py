"""What a connection makes of the gate's verdicts and of its jobs in the pool (pure helpers)."""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any

from ._auth import BUSY, MISSING, REALM

__all__ = ("failure", "refusal", "verdict_of")

_CHALLENGE = ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')  # (a 401's)


def refusal(verdict: float) -> tuple[int, tuple[tuple[str, str], ...]]:
    """The answer to a request the gate did not allow (``Gate.check``'s *verdict*: MISSING, BUSY
    or a lock's seconds): 401 with a Basic challenge, 503 or 429 with ``Retry-After``."""
    if verdict == MISSING:
        return 401, (_CHALLENGE,)
    if verdict == BUSY:
        return 503, (("Retry-After", "1"),)
    return 429, (("Retry-After", str(math.ceil(verdict))),)


def verdict_of(job: concurrent.futures.Future[float]) -> float:
    """The gate's verdict in *job* (``Gate.verify_later``'s): MISSING if the check failed."""
    if job.cancelled() or job.exception() is not None:
        return MISSING
    return job.result()


def failure(job: concurrent.futures.Future[Any]) -> BaseException | None:
    """What a pool job failed with (a cancelled one: CancelledError), or None."""
    return concurrent.futures.CancelledError() if job.cancelled() else job.exception()
