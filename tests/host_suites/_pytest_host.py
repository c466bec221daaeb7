"""A host library's pytest suite run for :mod:`._verdict`: once with one of our drop-ins swapped in
by a pytest plugin of ``plugins/`` (which reports the swap it checked to ``$AIOSENDFILE_SWAP_REPORT``),
once stock if needed, and the tests that failed with ours once more with ours; each test's outcome
read from a JUnit report. The uvicorn and aiohttp runners are this with their own arguments."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

__all__ = ("PLUGINS", "main_for", "node_id", "outcomes", "run_pytest")

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


def node_id(root: Path, name: str) -> str | None:
    """The pytest node id, under *root*, of a test named as :func:`outcomes` names it (the JUnit
    ``classname``, a module's dotted path and maybe a class, then ``::`` and the test's name);
    None if no module under *root* matches."""
    classname, _, test = name.partition("::")
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = root.joinpath(*parts[:cut]).with_suffix(".py")
        if module.is_file():
            return "::".join([str(module), *parts[cut:], test])
    return None


def run_pytest(
    arguments: list[str], cwd: Path | None, swap_plugin: str | None
) -> tuple[int, dict[str, str], str]:
    """``python -m pytest`` with *arguments* in *cwd* (None: an empty directory), with the plugin
    *swap_plugin* if given: the exit code, each test's outcome, and the output followed by what
    the plugin checked."""
    with tempfile.TemporaryDirectory(prefix="aiosendfile-host-suite-") as tmp:
        junit, report = Path(tmp, "junit.xml"), Path(tmp, "swap")
        command = [sys.executable, "-m", "pytest", *arguments, f"--junitxml={junit}"]
        env = dict(os.environ)
        if swap_plugin is not None:
            command += ["-p", swap_plugin]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")]))
            env["AIOSENDFILE_SWAP_REPORT"] = str(report)
        done = subprocess.run(command, cwd=cwd or tmp, env=env, capture_output=True, text=True, timeout=3600)
        results = outcomes(junit) if junit.exists() else {}
        checked = report.read_text() if report.exists() else ""
    return done.returncode, results, done.stdout + done.stderr + checked


def main_for(
    argv: list[str] | None,
    description: str,
    project: str,
    version: str,
    run: Callable[..., tuple[int, dict[str, str], str]],
    held: str,
    drop_in: str,
    excused: Callable[[str], str | None] = lambda name: None,
) -> int:
    """The command line of a host's runner: *run* ("ours" or "stock", the sdist's root, more
    pytest arguments, and ``only=`` node ids to run instead of the whole suite) once with ours,
    judged (the failures once more with ours, stock run if needed); *held*: what a checked swap
    proves, in words."""
    from ._sdist import sdist_folder
    from ._verdict import Run, judge

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (-k ...)")
    parser.add_argument("--verbose", action="store_true", help="print the runs' whole output")
    args = parser.parse_args(argv)
    root = sdist_folder(project, version, "tests").parent
    code, results, output = run("ours", root, args.pytest_args)
    if args.verbose:
        print(output)
    swapped = held if "swap checked" in output and "SWAP NOT TAKEN" not in output else None

    def stock_run() -> Run:
        return Run(*run("stock", root, args.pytest_args))

    def rerun(names: list[str]) -> Run:
        ids = [found for name in names if (found := node_id(root, name)) is not None]
        return Run(*run("ours", root, args.pytest_args, only=ids)) if ids else Run(0, {}, "")

    host = f"{project} {version}"
    return judge(Run(code, results, output), swapped, stock_run, drop_in, host, excused, rerun)
