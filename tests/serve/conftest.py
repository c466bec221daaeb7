"""Fixtures of the serve tests: the engine serving ``build()``'s tree (``www_site``), a tree to serve
and upload into (``public``), and ``serve_site``'s TLS keyword arguments (``site_kwargs``)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ..support.serve import ServeSite, serving


@pytest.fixture
async def www_site(tmp_path: Path) -> AsyncIterator[ServeSite]:
    """The engine serving ``build()``'s tree over TCP on this loop."""
    async with serving(tmp_path) as s:
        yield s


@pytest.fixture(params=["tcp", "tls"])
def site_kwargs(
    request: pytest.FixtureRequest, tls_server_ctx: ssl.SSLContext, tls_client_ctx: ssl.SSLContext
) -> dict[str, Any]:
    """``serve_site``'s keyword arguments: TLS contexts over TLS, none over TCP."""
    return {"server_ctx": tls_server_ctx, "client_ctx": tls_client_ctx} if request.param == "tls" else {}


@pytest.fixture
def public(tmp_path: Path) -> Path:
    """A tree to serve and upload into: an empty ``sub/`` directory and a file ``a-file`` (a module
    that needs another tree defines its own ``public``)."""
    root = tmp_path / "public"
    (root / "sub").mkdir(parents=True)
    (root / "a-file").write_text("not a directory")
    return root
