"""uvicorn's own test suite run against ``aiosendfile.uvicorn``'s protocols.

``python -m tests.host_suites.uvicorn_suite`` (what ``nox -s uvicorn`` runs) takes the tests of
the installed uvicorn from its source distribution (:mod:`._sdist`) and runs them (all but
``tests/benchmarks``) with pytest, uvicorn's own settings, and the plugin
``aiosendfile_uvicorn_swap``, which puts our ``HttpToolsProtocol`` and ``H11Protocol`` where
uvicorn's tests and uvicorn itself obtain theirs, and checks that it did. When a test fails, the
suite runs again stock: the run is red when a test that passes stock fails with ours, or runs
stock but not with ours. There is no skip list.
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


def _counts(results: dict[str, str]) -> str:
    kinds = list(results.values())
    return f"{kinds.count('passed')} passed, {kinds.count('failed')} failed, {kinds.count('skipped')} skipped"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (a file, -k ...)")
    parser.add_argument("--verbose", action="store_true", help="print the runs' whole output")
    args = parser.parse_args(argv)

    import uvicorn

    from ._sdist import sdist_folder

    version = uvicorn.__version__
    root = sdist_folder("uvicorn", version, "tests").parent
    code, ours, output = _run("ours", root, args.pytest_args)
    if args.verbose:
        print(output)
    failed = sorted(name for name, kind in ours.items() if kind == "failed")
    print(f"uvicorn {version}'s tests with aiosendfile.uvicorn's protocols: {_counts(ours)}")
    if "swap checked" not in output or "SWAP NOT TAKEN" in output:
        print(output)
        print("The swap was not checked: the run proves nothing.")
        return 1
    print("uvicorn's test modules held aiosendfile.uvicorn's HttpToolsProtocol and H11Protocol.")
    if not ours:
        print(output)
        print("No test results were read from the run.")
        return 1
    if not failed and code == 0:
        return 0
    _, stock, _ = _run("stock", root, args.pytest_args)
    print(f"stock uvicorn {version}: {_counts(stock)}")
    worse = [name for name in failed if stock.get(name) == "passed"]
    missing = sorted(name for name, kind in stock.items() if kind == "passed" and name not in ours)
    for name in worse:
        print(f"FAILS WITH aiosendfile.uvicorn, PASSES STOCK: {name}")
    for name in missing:
        print(f"PASSES STOCK, NOT RUN WITH aiosendfile.uvicorn: {name}")
    if worse or missing:
        print(output)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
