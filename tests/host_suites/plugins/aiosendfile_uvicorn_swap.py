"""pytest plugin (``-p aiosendfile_uvicorn_swap``): uvicorn's own tests with aiosendfile's
protocols in place of uvicorn's.

Loaded before uvicorn's ``conftest.py``: ``HttpToolsProtocol`` and ``H11Protocol`` of
``uvicorn.protocols.http.httptools_impl`` and ``h11_impl`` become ``aiosendfile.uvicorn``'s, so
the tests' direct imports, their ``http_protocol_cls`` fixture (import strings) and uvicorn's
``http="httptools"``/``"h11"`` all give ours. After collection (in each xdist worker) the plugin
checks that the test modules hold ours, and appends what it checked to the file
``$AIOSENDFILE_SWAP_REPORT``; a run that reports no check proves nothing.
Kept out of the ``tests`` package: uvicorn's tests are a package of that name.
"""

from __future__ import annotations

import sys

import pytest
import uvicorn.protocols.http.h11_impl as h11_impl
import uvicorn.protocols.http.httptools_impl as httptools_impl
from aiosendfile_swap_report import report

import aiosendfile.uvicorn as ours

httptools_impl.HttpToolsProtocol = ours.HttpToolsProtocol
h11_impl.H11Protocol = ours.H11Protocol

#: uvicorn's test modules that import the protocol classes by name.
_IMPORTERS = ("tests.protocols.test_http", "tests.test_server")


def pytest_collection_finish(session: pytest.Session) -> None:
    checked = []
    for name in _IMPORTERS:
        module = sys.modules.get(name)
        if module is None:
            continue
        if (
            module.HttpToolsProtocol is not ours.HttpToolsProtocol
            or module.H11Protocol is not ours.H11Protocol
        ):
            raise pytest.UsageError(f"SWAP NOT TAKEN: {name} does not hold aiosendfile.uvicorn's protocols")
        checked.append(name)
    report(checked)
