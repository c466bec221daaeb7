"""Fixtures of the pair's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..support.pair import receivers


@pytest.fixture(autouse=True)
def _no_receiver_outlives_its_test() -> Iterator[None]:
    """A failed or hung test must not leave a receiver process running (spinning) behind."""
    yield
    while receivers:
        proc = receivers.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
