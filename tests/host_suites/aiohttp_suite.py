"""aiohttp's own static-file and ``FileResponse`` tests run against ``aiosendfile.aiohttp``.

``python -m tests.host_suites.aiohttp_suite`` (what ``nox -s aiohttp`` runs) takes the tests of
the installed aiohttp from its source distribution (:mod:`._sdist`) and runs, on both of
aiohttp's loops (``pyloop``, ``uvloop``), all of ``test_web_sendfile_functional.py`` and
``test_web_sendfile.py``, all of ``test_web_urldispatcher.py``, and the static, file, index and
symlink tests of ``test_urldispatch.py``, ``test_route_def.py`` and ``test_web_functional.py``,
under aiohttp's own settings (``pytest.ini``: warnings as errors, ``blockbuster``, timeouts) but
coverage. The plugin ``aiosendfile_aiohttp_swap`` puts our ``FileResponse``, ``StaticResource``,
``static`` and ``add_static`` where the tests obtain aiohttp's, and checks that it did.

When a test fails, it runs once more with ours; if it fails again, the tests run stock, and
:func:`._verdict.judge` decides: no test that passes stock may fail with ours, but those named
below, which are left out of our run:

* :data:`INTERNALS`: tests of aiohttp's internals (a mocked ``Path``, ``_sendfile_fallback``,
  ``_send_headers_immediately``), each with the project's test of the same behaviour through
  the public API;
* :data:`DIFFERENCES`: tests of a behaviour the project keeps on purpose, each listed in
  ``docs/aiohttp.md`` ("Differences from aiohttp") with its reason, and the project's test of it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

from ._pytest_host import main_for, run_pytest

__all__ = ("DIFFERENCES", "INTERNALS", "SELECTED", "Excused", "excused", "main")

#: The test files, and the tests of the last three that concern static files.
FILES = (
    "tests/test_web_sendfile_functional.py",
    "tests/test_web_sendfile.py",
    "tests/test_web_urldispatcher.py",
    "tests/test_urldispatch.py",
    "tests/test_route_def.py",
    "tests/test_web_functional.py",
)
SELECTED = "static or file or index or symlink or urldispatcher"
LOOPS = ("pyloop", "uvloop")

PLUGIN_TESTS = "tests/aiohttp/test_aiohttp_plugin.py::TestStaticCases"
DROPIN_TESTS = "tests/aiohttp/test_aiohttp_dropin.py"


class Excused(NamedTuple):
    """Why an aiohttp test is left out of our run, and the project's test that stands for it."""

    reason: str
    ours: str


_GZ = Excused(
    "mocks pathlib.Path (with_suffix, lstat, open) and FileResponse._sendfile, aiohttp's own file access",
    f"{DROPIN_TESTS}::test_a_handlers_file_response_picks_the_gz_sibling_by_accept_encoding",
)
_PERMISSION = Excused(
    "mocks pathlib.Path (open, iterdir, is_dir), which aiohttp's handler uses and ours does not",
    f"{DROPIN_TESTS}::test_what_the_server_may_not_read_is_forbidden",
)
_LISTING = Excused(
    "compares the listing with aiohttp's page byte for byte; ours is the project's page "
    "(docs/aiohttp.md, Differences from aiohttp)",
    f"{PLUGIN_TESTS}::test_directories",
)

#: aiohttp's tests of its internals (node ids; ``{loop}`` stands for each loop).
INTERNALS: dict[str, Excused] = {
    "tests/test_web_sendfile.py::test_using_gzip_if_header_present_and_file_available": _GZ,
    "tests/test_web_sendfile.py::test_gzip_if_header_not_present_and_file_available": _GZ,
    "tests/test_web_sendfile.py::test_gzip_if_header_not_present_and_file_not_available": _GZ,
    "tests/test_web_sendfile.py::test_gzip_if_header_present_and_file_not_available": _GZ,
    "tests/test_web_sendfile.py::test_status_controlled_by_user": Excused(
        "mocks pathlib.Path and FileResponse._sendfile, and reads FileResponse._status",
        f"{DROPIN_TESTS}::test_the_callers_status_answers_a_whole_file",
    ),
    "tests/test_web_sendfile.py::test_file_response_sends_headers_immediately": Excused(
        "reads FileResponse._send_headers_immediately and mocks _sendfile_fallback and NOSENDFILE",
        f"{DROPIN_TESTS}::test_the_headers_are_out_when_prepare_returns",
    ),
    "tests/test_web_sendfile.py::test_sendfile_fallback_respects_count_boundary": Excused(
        "calls FileResponse._sendfile_fallback with a mocked writer",
        f"{DROPIN_TESTS}::test_a_range_shorter_than_a_chunk_sends_exactly_its_bytes",
    ),
    "tests/test_web_urldispatcher.py::test_static_directory_with_mock_permission_error": _PERMISSION,
    "tests/test_web_urldispatcher.py::test_static_file_with_mock_permission_error": _PERMISSION,
    "tests/test_web_urldispatcher.py::test_access_mock_special_resource": Excused(
        "mocks os.stat and Path.stat to call a file a FIFO; ours judges the opened descriptor's fstat",
        f"{DROPIN_TESTS}::test_socket_file_is_forbidden",
    ),
}

_ROOT_OF_STATIC = "tests/test_web_urldispatcher.py::test_access_root_of_static_handler"

#: aiohttp's tests of a behaviour the project keeps (docs/aiohttp.md, Differences from aiohttp).
DIFFERENCES: dict[str, Excused] = {
    "tests/test_web_sendfile_functional.py::test_static_file_invalid_range": Excused(
        "its first request, Range: blocks=0-10, gets the whole file (RFC 9110 §14.2: a server MUST "
        "ignore a range unit it does not understand; nginx does); its invalid bytes ranges get 416",
        f"{PLUGIN_TESTS}::test_ignored_ranges, {PLUGIN_TESTS}::test_rejected_ranges",
    ),
    "tests/test_web_sendfile_functional.py::test_static_file_if_range_future_with_range": Excused(
        "an If-Range date other than Last-Modified gets the whole file (RFC 9110 §13.1.5: an exact "
        "match; nginx does): a file restored with an older date must not be resumed",
        f"{PLUGIN_TESTS}::test_if_range",
    ),
    f"{_ROOT_OF_STATIC}[{{loop}}-True-200-/-/-data1]": _LISTING,
    f"{_ROOT_OF_STATIC}[{{loop}}-index_static]": _LISTING,
    f"{_ROOT_OF_STATIC}[{{loop}}-index_static_trailing_slash]": _LISTING,
    f"{_ROOT_OF_STATIC}[{{loop}}-index_subdir]": Excused(
        "a directory without its slash is redirected to it (301, as nginx), then listed with the "
        "project's page",
        f"{PLUGIN_TESTS}::test_directories",
    ),
    f"{_ROOT_OF_STATIC}[{{loop}}-index_subdir_trailing_slash]": _LISTING,
}


def _node_ids() -> dict[str, Excused]:
    """Every excused test's node id (a prefix: a test's parameters follow it), loops spelled out."""
    ids: dict[str, Excused] = {}
    for pattern, why in {**INTERNALS, **DIFFERENCES}.items():
        for loop in LOOPS if "{loop}" in pattern else ("",):
            ids[pattern.format(loop=loop)] = why
    return ids


def excused(name: str) -> str | None:
    """Why the test *name* (as :func:`._pytest_host.outcomes` names it) is left out, or None."""
    for node_id, why in _node_ids().items():
        path, _, test = node_id.partition("::")
        junit = f"{path.removesuffix('.py').replace('/', '.')}::{test}"
        if name == junit or (name.startswith(junit) and "[" not in test and name[len(junit)] == "["):
            return f"{why.reason} (ours: {why.ours})"
    return None


#: Tests that take a file's or a folder's read permission away and expect a refusal: root reads
#: it all the same, so they fail stock too. Left out of both runs when run as root (CI's containers).
NOT_AS_ROOT = (
    "tests/test_web_urldispatcher.py::test_static_directory_without_read_permission",
    "tests/test_web_urldispatcher.py::test_static_file_without_read_permission",
)


def _run(
    which: str, root: Path, args: list[str], only: list[str] | None = None
) -> tuple[int, dict[str, str], str]:
    """pytest on aiohttp's tests (or the node ids *only*), with the swap and without the excused
    tests for ``ours`` (nor, as root, :data:`NOT_AS_ROOT`). Run from an empty directory: the
    sdist's own ``aiohttp/`` (uncompiled) must not shadow the installed one."""
    arguments = [*([str(root / f) for f in FILES] if only is None else only), "-k", SELECTED]
    arguments += [f"--rootdir={root}", "-c", str(root / "pytest.ini"), "-o", "addopts="]
    arguments += ["-m", "not dev_mode and not autobahn and not internal", "--strict-markers"]
    arguments += ["-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:asyncio"]
    arguments += [f"--aiohttp-loop={','.join(LOOPS)}", "-n", "2" if only is None else "0", "-q", *args]
    if which == "ours":
        arguments += [f"--deselect={node_id}" for node_id in _node_ids()]
    if os.geteuid() == 0:
        arguments += [f"--deselect={node_id}" for node_id in NOT_AS_ROOT]
    return run_pytest(arguments, None, "aiosendfile_aiohttp_swap" if which == "ours" else None)


def main(argv: list[str] | None = None) -> int:
    import aiohttp

    return main_for(
        argv,
        __doc__.split("\n\n")[0],
        "aiohttp",
        aiohttp.__version__,
        _run,
        "aiohttp's tests held aiosendfile.aiohttp's FileResponse, StaticResource, static and add_static.",
        "aiosendfile.aiohttp",
        excused,
    )


if __name__ == "__main__":
    sys.exit(main())
