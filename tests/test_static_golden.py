"""The plugin's static answers, byte for byte, against a recorded table (tests/data/static_golden.json).

``tests/support/static_requests.py`` holds the requests and the fixture tree. Each runs against the
plugin both ways ``serve`` and applications mount it: ``add_static`` under ``/static`` in an
``Application``, and ``StaticResource("", ...).handle`` on aiohttp's ``web.Server``. The status
line, every header but ``Date``/``Server`` (in order) and the body must equal the recorded ones
(multipart boundaries normalised). The table was recorded before the plugin moved onto the
IO-free core; re-record it deliberately with ``AIOSENDFILE_GOLDEN_WRITE=1`` when an answer is
meant to change, and read the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import RawTestServer, TestServer

import aiosendfile.aiohttp as sf
from aiosendfile._aiohttp import _fileresponse

from .support.raw_http import raw_async
from .support.static_requests import POLICIES, build_tree, normalise, requests

GOLDEN = Path(__file__).parent / "data" / "static_golden.json"
DOORS = {"app": b"/static", "server": b""}


async def _answers(public: Path, door: str, policy: str) -> dict[str, Any]:
    kwargs = POLICIES[policy]
    server: Any
    if door == "app":
        app = web.Application()
        sf.add_static(app.router, "/static", public, **kwargs)
        server = TestServer(app)
    else:
        server = RawTestServer(sf.StaticResource("", public, **kwargs).handle)
    await server.start_server()
    try:
        return {
            name: normalise(await raw_async(server.host, server.port, raw, None))
            for name, raw in requests(policy, DOORS[door])
        }
    finally:
        await server.close()


@pytest.mark.parametrize("door", sorted(DOORS))
async def test_static_answers_match_the_recorded_table(tmp_path: Path, door: str) -> None:
    public = build_tree(tmp_path)
    _fileresponse.hot_files.clear()
    got = {policy: await _answers(public, door, policy) for policy in POLICIES}
    _fileresponse.hot_files.clear()
    if os.environ.get("AIOSENDFILE_GOLDEN_WRITE"):
        table = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        table[door] = got
        GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    expected = json.loads(GOLDEN.read_text())[door]
    for policy, answers in expected.items():
        for name, answer in answers.items():
            assert got[policy][name] == answer, (door, policy, name)
    assert {p: sorted(a) for p, a in got.items()} == {p: sorted(a) for p, a in expected.items()}
