"""The host-suite runner's own reading of a run (``tests/host_suites``): each test's outcome in
unittest's verbose output, whatever the Python's format, and the verdict against stock."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.host_suites import django_suite

pytest.importorskip("django")

VERBOSE_311 = """\
test_get_asgi_application (asgi.tests.ASGITest.test_get_asgi_application)
get_asgi_application() returns a functioning ASGI callable. ... ok
test_disconnect_with_body (asgi.tests.ASGITest.test_disconnect_with_body) ... FAIL
test_wrong_connection_type (asgi.tests.ASGITest.test_wrong_connection_type) ... ERROR
test_selenium (staticfiles_tests.test_liveserver.StaticLiveServerView.test_selenium) ... skipped 'No browsers'
test_file_response (responses.test_fileresponse.FileResponseTests.test_file_response) ... ok
Exception ignored in: <_io.FileIO name='/tmp/x' mode='rb' closefd=True>
ResourceWarning: unclosed file <_io.BufferedReader name='/tmp/x'>
"""

VERBOSE_310 = """\
test_get_asgi_application (asgi.tests.ASGITest) ... ok
test_disconnect_with_body (asgi.tests.ASGITest)
A client that leaves. ... FAIL
"""


def test_unclosed_files_are_counted() -> None:
    assert django_suite._unclosed(VERBOSE_311) == 1
    assert django_suite._unclosed(VERBOSE_310) == 0


def test_outcomes_are_read_in_both_formats() -> None:
    assert django_suite._results(VERBOSE_311) == {
        "asgi.tests.ASGITest.test_get_asgi_application": "passed",
        "asgi.tests.ASGITest.test_disconnect_with_body": "failed",
        "asgi.tests.ASGITest.test_wrong_connection_type": "failed",
        "staticfiles_tests.test_liveserver.StaticLiveServerView.test_selenium": "skipped",
        "responses.test_fileresponse.FileResponseTests.test_file_response": "passed",
    }
    assert django_suite._results(VERBOSE_310) == {
        "asgi.tests.ASGITest.test_get_asgi_application": "passed",
        "asgi.tests.ASGITest.test_disconnect_with_body": "failed",
    }


@pytest.mark.parametrize(
    ("ours", "stock", "warnings", "red"),
    [
        ({"a": "passed", "b": "failed"}, {"a": "passed", "b": "failed"}, (0, 0), False),  # fails stock too
        ({"a": "passed", "b": "failed"}, {"a": "passed", "b": "passed"}, (0, 0), True),  # ours only
        ({"a": "passed"}, {"a": "passed", "b": "passed"}, (0, 0), True),  # not run with ours
        ({"a": "passed"}, {"a": "passed"}, (1, 0), True),  # an unclosed file more than stock
        ({"a": "passed"}, {"a": "passed"}, (1, 1), False),
    ],
)
def test_the_verdict_against_stock(
    monkeypatch: pytest.MonkeyPatch, ours: dict, stock: dict, warnings: tuple[int, int], red: bool
) -> None:
    runs = {"ours": (1, ours, warnings[0], "swap checked"), "stock": (1, stock, warnings[1], "")}
    monkeypatch.setattr(django_suite, "_run", lambda which, *args: runs[which])
    monkeypatch.setattr("tests.host_suites._sdist.sdist_folder", lambda *args: "unused")
    assert django_suite.main([]) == (1 if red else 0)


def test_a_run_whose_swap_was_not_checked_is_red(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(django_suite, "_run", lambda which, *args: (0, {"a": "passed"}, 0, "no check"))
    monkeypatch.setattr("tests.host_suites._sdist.sdist_folder", lambda *args: "unused")
    assert django_suite.main([]) == 1


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.protocols.test_http" name="test_get_request[httptools]" time="0.1"/>
<testcase classname="tests.protocols.test_http" name="test_keepalive[h11]" time="0.1">
  <failure message="assert 1 == 2">...</failure></testcase>
<testcase classname="tests.test_server" name="test_boom" time="0.1">
  <error message="fixture">...</error></testcase>
<testcase classname="tests.protocols.test_http" name="test_zttp[zttp]" time="0">
  <skipped message="zttp"/></testcase>
</testsuite></testsuites>"""


@pytest.mark.parametrize(
    ("second", "stock", "red"),
    [("passed", None, False), ("failed", "passed", True), ("failed", "failed", False)],
)
def test_a_test_that_fails_once_with_ours_runs_again_with_ours(
    monkeypatch: pytest.MonkeyPatch, second: str, stock: str | None, red: bool
) -> None:
    """A failure with ours is run once more with ours, by node id: passing then, it is named and
    the verdict is green without a stock run; failing again, stock decides."""
    from tests.host_suites import uvicorn_suite

    flaky = "tests.test_main.TestRun::test_b"
    first = {"tests.protocols.test_http::test_a[h11]": "passed", flaky: "failed"}
    calls: list[tuple[str, list[str] | None]] = []

    def run(which: str, root: Path, args: list[str], only: list[str] | None = None) -> tuple:
        calls.append((which, only))
        if which == "stock":
            return (1, {**first, flaky: stock}, "")
        if only is not None:
            return (1 if second == "failed" else 0, {flaky: second}, "")
        return (1, first, "swap checked")

    monkeypatch.setattr(uvicorn_suite, "_run", run)
    monkeypatch.setattr("tests.host_suites._sdist.sdist_folder", lambda *args: Path("/uvicorn/tests"))
    monkeypatch.setattr(Path, "is_file", lambda path: path == Path("/uvicorn/tests/test_main.py"))
    assert uvicorn_suite.main([]) == (1 if red else 0)
    assert calls[:2] == [("ours", None), ("ours", ["/uvicorn/tests/test_main.py::TestRun::test_b"])]
    assert [which for which, _ in calls[2:]] == ([] if second == "passed" else ["stock"])


def test_the_first_runs_report_of_a_test_that_passed_again_is_its_section() -> None:
    from tests.host_suites._verdict import failure_report

    output = """..F.
=================================== FAILURES ===================================
____________________ test_log_config_yaml[log_config.yaml] _____________________
[gw1] linux -- Python 3.13.0 /x/bin/python

    def test_log_config_yaml(...):
>       assert 1 == 2
E       assert 1 == 2
__________________________________ test_other __________________________________
E       assert 3 == 4
=========================== short test summary info ============================
FAILED tests/test_config.py::test_log_config_yaml[log_config.yaml] - assert 1 == 2
"""
    report = failure_report(output, "tests.test_config::test_log_config_yaml[log_config.yaml]")
    assert report[0].strip("_ ") == "test_log_config_yaml[log_config.yaml]"
    assert "E       assert 1 == 2" in report
    assert "E       assert 3 == 4" not in report
    assert failure_report("FAILED tests/t.py::test_x - boom\n", "tests.t::test_x") == [
        "FAILED tests/t.py::test_x - boom"
    ]


def test_pytest_outcomes_are_read_from_junit(tmp_path: Path) -> None:
    from tests.host_suites import uvicorn_suite

    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    assert uvicorn_suite.outcomes(report) == {
        "tests.protocols.test_http::test_get_request[httptools]": "passed",
        "tests.protocols.test_http::test_keepalive[h11]": "failed",
        "tests.test_server::test_boom": "failed",
        "tests.protocols.test_http::test_zttp[zttp]": "skipped",
    }


# -- aiohttp's suite: the tests left out of our run -------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("tests.test_web_sendfile::test_status_controlled_by_user[pyloop]", "FileResponse._status"),
        ("tests.test_web_sendfile::test_status_controlled_by_user[uvloop]", "FileResponse._status"),
        ("tests.test_web_sendfile::test_sendfile_fallback_respects_count_boundary", "_sendfile_fallback"),
        ("tests.test_web_sendfile::test_status_controlled_by_user_too[pyloop]", None),  # another test
        ("tests.test_web_urldispatcher::test_access_root_of_static_handler[uvloop-index_static]", "listing"),
        ("tests.test_web_urldispatcher::test_access_root_of_static_handler[uvloop-index_forbidden]", None),
        ("tests.test_web_urldispatcher::test_access_root_of_static_handler[uvloop-index_subdir]", "301"),
        ("tests.test_web_sendfile_functional::test_static_file_ok[sendfile-pyloop]", None),
    ],
)
def test_aiohttp_tests_are_excused_by_name(name: str, why: str | None) -> None:
    from tests.host_suites import aiohttp_suite

    reason = aiohttp_suite.excused(name)
    assert (reason is None) == (why is None), reason
    assert why is None or why in reason


def test_each_excused_aiohttp_test_names_a_project_test_that_exists() -> None:
    """The test that stands for each excused one is a real test of this project."""
    import importlib

    from tests.host_suites import aiohttp_suite

    for why in {**aiohttp_suite.INTERNALS, **aiohttp_suite.DIFFERENCES}.values():
        assert why.reason
        for node_id in why.ours.split(", "):
            path, *names = node_id.split("::")
            found: object = importlib.import_module(path.removesuffix(".py").replace("/", "."))
            for name in names:
                found = getattr(found, name)
            assert callable(found), node_id
            assert names[-1].startswith("test_"), node_id


def test_the_verdict_excuses_only_what_the_runner_excuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.host_suites import aiohttp_suite

    excused = "tests.test_web_sendfile::test_sendfile_fallback_respects_count_boundary"
    stock = {excused: "passed", "tests.test_a::test_b": "passed", "tests.test_a::test_root": "failed"}
    cases = [
        ({"tests.test_a::test_b": "passed", "tests.test_a::test_root": "failed"}, False),  # left out
        ({excused: "failed", "tests.test_a::test_b": "passed", "tests.test_a::test_root": "failed"}, False),
        ({excused: "failed", "tests.test_a::test_b": "failed", "tests.test_a::test_root": "failed"}, True),
        ({excused: "passed", "tests.test_a::test_root": "failed"}, True),  # one not run
    ]
    monkeypatch.setattr("tests.host_suites._sdist.sdist_folder", lambda *args: Path("unused/tests"))
    for ours, red in cases:
        runs = {"ours": (1, ours, "swap checked"), "stock": (1, stock, "")}
        monkeypatch.setattr(aiohttp_suite, "_run", lambda which, *args, runs=runs, **only: runs[which])
        assert aiohttp_suite.main([]) == (1 if red else 0), ours
