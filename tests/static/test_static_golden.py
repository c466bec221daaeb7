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
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import RawTestServer, TestServer

import aiosendfile.aiohttp as sf
from aiosendfile._static import _hot

from ..support.raw_http import raw_async
from ..support.static_requests import GOLDEN_PATH as GOLDEN
from ..support.static_requests import POLICIES, build_tree, normalise, requests

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


def _phrase_free(answer: dict[str, Any]) -> dict[str, Any]:
    """*answer* with its status line's reason checked against this Python's and then dropped.

    Both doors say ``http.HTTPStatus``'s phrase, which Python 3.13 renamed for some statuses
    (416 "Requested Range Not Satisfiable" became "Range Not Satisfiable"): the table was recorded
    on an older Python, so the code is compared, and the phrase must be the running Python's.
    """
    version, code, phrase = answer["status"].split(" ", 2)
    assert phrase in (HTTPStatus(int(code)).phrase, _RECORDED_PHRASES.get(int(code))), answer["status"]
    return {**answer, "status": f"{version} {code}"}


#: Phrases the table holds where Python 3.13 changed them.
_RECORDED_PHRASES = {
    416: "Requested Range Not Satisfiable",
    414: "Request-URI Too Long",
    413: "Request Entity Too Large",
}


@pytest.mark.parametrize("door", sorted(DOORS))
async def test_static_answers_match_the_recorded_table(tmp_path: Path, door: str) -> None:
    public = build_tree(tmp_path)
    _hot.hot_files.clear()
    got = {policy: await _answers(public, door, policy) for policy in POLICIES}
    _hot.hot_files.clear()
    if os.environ.get("AIOSENDFILE_GOLDEN_WRITE"):
        table = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        table[door] = got
        GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    expected = json.loads(GOLDEN.read_text())[door]
    for policy, answers in expected.items():
        for name, answer in answers.items():
            assert _phrase_free(got[policy][name]) == _phrase_free(answer), (door, policy, name)
    assert {p: sorted(a) for p, a in got.items()} == {p: sorted(a) for p, a in expected.items()}
