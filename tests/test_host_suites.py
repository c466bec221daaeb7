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
