"""uvicorn's own test suite run against ``aiosendfile.uvicorn``'s protocols.

``python -m tests.host_suites.uvicorn_suite`` (what ``nox -s uvicorn`` runs) takes the tests of
the installed uvicorn from its source distribution (:mod:`._sdist`) and runs them (all but
``tests/benchmarks``) with pytest, uvicorn's own settings, and the plugin
``aiosendfile_uvicorn_swap``, which puts our ``HttpToolsProtocol`` and ``H11Protocol`` where
uvicorn's tests and uvicorn itself obtain theirs, and checks that it did. When a test fails, the
suite runs again stock, and :func:`._verdict.judge` decides. There is no skip list.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

__all__ = ("main", "outcomes")

PLUGINS = Path(__file__).resolve().parent / "plugins"


def outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit XML report: passed, failed or skipped."""
    results: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            results[name] = "failed"
        elif case.find("skipped") is not None:
            results[name] = "skipped"
        else:
            results[name] = "passed"
    return results


def _run(which: str, root: Path, args: list[str]) -> tuple[int, dict[str, str], str]:
    """pytest on uvicorn's tests (with the swap for ``ours``): its exit code, each test's outcome,
    and its output, followed by what the swap plugin checked."""
    with tempfile.TemporaryDirectory(prefix="aiosendfile-uvicorn-suite-") as tmp:
        junit, report = Path(tmp, "junit.xml"), Path(tmp, "swap")
        command = [
            sys.executable,
            "-m",
            "pytest",
            "tests",
            "--ignore=tests/benchmarks",
            "-p",
            "no:cacheprovider",
        ]
        command += ["-n", "2", "-q", f"--junitxml={junit}", *args]
        env = dict(os.environ)
        if which == "ours":
            command += ["-p", "aiosendfile_uvicorn_swap"]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")]))
            env["AIOSENDFILE_SWAP_REPORT"] = str(report)
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
        results = outcomes(junit) if junit.exists() else {}
        checked = report.read_text() if report.exists() else ""
    return done.returncode, results, done.stdout + done.stderr + checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (a file, -k ...)")
    parser.add_argument("--verbose", action="store_true", help="print the runs' whole output")
    args = parser.parse_args(argv)

    import uvicorn

    from ._sdist import sdist_folder
    from ._verdict import Run, judge

    version = uvicorn.__version__
    root = sdist_folder("uvicorn", version, "tests").parent
    code, results, output = _run("ours", root, args.pytest_args)
    if args.verbose:
        print(output)
    swapped = (
        "uvicorn's test modules held aiosendfile.uvicorn's HttpToolsProtocol and H11Protocol."
        if "swap checked" in output and "SWAP NOT TAKEN" not in output
        else None
    )

    def stock_run() -> Run:
        return Run(*_run("stock", root, args.pytest_args))

    return judge(
        Run(code, results, output),
        swapped,
        stock_run,
        "aiosendfile.uvicorn's protocols",
        f"uvicorn {version}",
    )


if __name__ == "__main__":
    sys.exit(main())
