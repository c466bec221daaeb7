"""Django's own tests of its ASGI handler, run against ``aiosendfile.django``.

``python -m tests.host_suites.django_suite`` (what ``nox -s django`` runs) takes the tests of the
installed Django from its source distribution (:mod:`._sdist`), and runs ``LABELS`` with Django's
``runtests.py`` in a child process where the names the tests import are ours:
``get_asgi_application`` and ``ASGIHandler`` of ``django.core.asgi`` and ``django.core.handlers.asgi`` are
``aiosendfile.django``'s, as in a project's ``asgi.py`` (Django's own modules keep theirs:
``ASGIStaticFilesHandler`` wraps our handler, as in a project). The child checks that the test
modules got our names. A test that fails with ours is run again with stock Django: the run is red
when a test that passes stock fails with ours, or when ours leaves more ``ResourceWarning``\\s
(an unclosed file or socket) than stock. There is no skip list.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
from pathlib import Path

__all__ = ("LABELS", "main")

#: Django's tests of its handlers and responses, and of the static files app our door sits beside.
LABELS = ("asgi", "handlers", "responses", "staticfiles_tests")

#: A verbose unittest line: ``test_x (asgi.tests.ASGITest.test_x) ... ok`` (3.11+; 3.10 names the
#: class alone, the method first). A test with a docstring has its outcome on the next line, after
#: the docstring's first line.
_TEST = re.compile(r"^(\w+) \(([\w.]+)\)(?: \[.*?\])?(?: \.\.\. (.*))?$")
_OUTCOME = re.compile(r" \.\.\. (ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)$")
_KINDS = {"ok": "passed", "FAIL": "failed", "ERROR": "failed", "unexpected success": "failed"}


def _results(output: str) -> dict[str, str]:
    """Each test's outcome in a verbose run's output: passed, failed or skipped."""
    results: dict[str, str] = {}
    pending = None
    for line in output.splitlines():
        match = _TEST.match(line)
        if match:
            method, where, outcome = match.groups()
            pending = where if where.endswith(f".{method}") else f"{where}.{method}"
            if outcome is None:
                continue
            line = f" ... {outcome}"
        found = _OUTCOME.search(line)
        if found and pending is not None:
            results[pending] = _KINDS.get(found.group(1), "skipped")
            pending = None
    return results


def _unclosed(output: str) -> int:
    """The ``ResourceWarning``\\s (a file or socket left unclosed) a run printed: runtests.py makes
    them errors, which Python prints (an error in ``__del__`` cannot be raised)."""
    return output.count("ResourceWarning: unclosed")


def _child(which: str, tests: Path, loop: str, args: list[str]) -> int:
    """In the child: the loop, the swap (for ``ours``), Django's ``runtests.py``, then the swap
    checked."""
    sys.path.insert(0, str(tests))
    os.chdir(tests)
    if loop == "uvloop":  # (asgiref's async_to_sync makes the tests' loops through the policy)
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if which == "ours":
        import django.contrib.staticfiles.handlers  # (imported first: Django's own keeps its base)
        import django.core.asgi
        import django.core.handlers.asgi

        import aiosendfile.django

        django.core.asgi.get_asgi_application = aiosendfile.django.get_asgi_application
        django.core.asgi.ASGIHandler = aiosendfile.django.ASGIHandler  # (4.2's tests import it there)
        django.core.handlers.asgi.ASGIHandler = aiosendfile.django.ASGIHandler
    import runpy

    sys.argv = [str(tests / "runtests.py"), *args]
    try:
        runpy.run_path(str(tests / "runtests.py"), run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    if which == "ours":
        import aiosendfile.django

        module = sys.modules.get("asgi.tests")
        if module is None or (
            module.get_asgi_application is not aiosendfile.django.get_asgi_application
            or module.ASGIHandler is not aiosendfile.django.ASGIHandler
        ):
            print("SWAP NOT TAKEN: asgi.tests does not use aiosendfile.django's handler", file=sys.stderr)
            return 3
        print("swap checked: asgi.tests imported aiosendfile.django's ASGIHandler and get_asgi_application")
    return code


def _run(which: str, tests: Path, loop: str, labels: list[str]) -> tuple[int, dict[str, str], int, str]:
    import multiprocessing

    # The swap is made in the parent process: workers that are forked keep it, others would not.
    parallel = "2" if multiprocessing.get_start_method() == "fork" else "1"
    env = dict(os.environ, PYTHONWARNINGS="always::ResourceWarning")
    command = [sys.executable, "-m", "tests.host_suites.django_suite", "--child", which]
    command += ["--tests", str(tests), "--loop", loop]
    command += ["--", "-v", "2", "--parallel", parallel, *labels]
    here = Path(__file__).resolve().parents[2]
    done = subprocess.run(command, cwd=here, env=env, capture_output=True, text=True, timeout=1800)
    output = done.stdout + done.stderr
    warnings = _unclosed(output)
    return done.returncode, _results(output), warnings, output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labels", nargs="*", default=list(LABELS))
    parser.add_argument("--child", choices=("ours", "stock"), help=argparse.SUPPRESS)
    parser.add_argument("--tests", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        action="append",
        help="the tests' loop (default asyncio); given twice, both runs at once, each judged",
    )
    parser.add_argument("--verbose", action="store_true", help="print the runs' whole output")
    args, rest = parser.parse_known_args(argv)
    loops = list(dict.fromkeys(args.loop or ["asyncio"]))
    if args.child:
        return _child(args.child, args.tests, loops[0], [a for a in rest if a != "--"] or args.labels)

    import django

    from ._sdist import sdist_folder

    tests = sdist_folder("Django", django.get_version(), "tests")
    # Each run is a child process that waits on its own (Django's runner starts two workers):
    # the loops' runs go at once, then each is judged in turn.
    with concurrent.futures.ThreadPoolExecutor(len(loops)) as pool:
        runs = list(pool.map(lambda loop: _run("ours", tests, loop, args.labels), loops))
    return max(_judge(run, tests, loop, args) for run, loop in zip(runs, loops, strict=True))


def _judge(
    run: tuple[int, dict[str, str], int, str], tests: Path, loop: str, args: argparse.Namespace
) -> int:
    """The verdict on our run of the labels on *loop* (stock run only if ours failed)."""
    import django

    from ._verdict import Run, judge

    code, results, warnings, output = run
    if args.verbose or code not in (0, 1):
        print(output)
    ours = Run(code, results, output, warnings)
    swapped = (
        "The test modules imported aiosendfile.django's ASGIHandler and get_asgi_application."
        if "swap checked" in output
        else None
    )

    def stock_run() -> Run:
        code, results, warnings, output = _run("stock", tests, loop, args.labels)
        return Run(code, results, output, warnings)

    host = f"Django {django.get_version()} ({loop}, {' '.join(args.labels)})"
    return judge(ours, swapped, stock_run, "aiosendfile.django", host)


if __name__ == "__main__":
    sys.exit(main())
