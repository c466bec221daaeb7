"""Fixtures of the static core's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aiosendfile._static import _hot, _listing


@pytest.fixture
def fresh_caches() -> Iterator[None]:
    """The static core's hot-file and listing caches empty before the test and after it."""
    _hot.hot_files.clear()
    _listing.listings.clear()
    yield
    _hot.hot_files.clear()
    _listing.listings.clear()
