"""Fixtures of the ASGI door's tests: the golden tree (``public``), our uvicorn protocol classes
(``proto``), a file of 3 MiB and a bit (``data_file``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiosendfile._static import _hot

from ..support.files import pattern
from ..support.static_requests import build_tree


@pytest.fixture
def public(tmp_path: Path) -> Iterator[Path]:
    """The golden requests' tree (``static_requests.build_tree``), the hot-file cache empty before
    and after the test (a module that needs another tree defines its own ``public``)."""
    _hot.hot_files.clear()
    yield build_tree(tmp_path)
    _hot.hot_files.clear()


@pytest.fixture(params=["httptools", "h11"])
def proto(request: pytest.FixtureRequest) -> Any:
    """Our uvicorn protocol class: ``HttpToolsProtocol`` or ``H11Protocol``."""
    from aiosendfile.uvicorn import H11Protocol, HttpToolsProtocol

    return {"httptools": HttpToolsProtocol, "h11": H11Protocol}[request.param]


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = pattern(3 * 2**20 + 17)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data
