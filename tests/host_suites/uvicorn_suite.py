"""uvicorn's own test suite run against ``aiosendfile.uvicorn``'s protocols.

``python -m tests.host_suites.uvicorn_suite`` (what ``nox -s uvicorn`` runs) takes the tests of
the installed uvicorn from its source distribution (:mod:`._sdist`) and runs them (all but
``tests/benchmarks``) with pytest, uvicorn's own settings, and the plugin
``aiosendfile_uvicorn_swap``, which puts our ``HttpToolsProtocol`` and ``H11Protocol`` where
uvicorn's tests and uvicorn itself obtain theirs, and checks that it did. When a test fails, it
runs once more with ours, then, if it fails again, the suite runs stock, and
:func:`._verdict.judge` decides. There is no skip list.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ._pytest_host import main_for, outcomes, run_pytest

__all__ = ("main", "outcomes")


def _run(
    which: str, root: Path, args: list[str], only: list[str] | None = None
) -> tuple[int, dict[str, str], str]:
    """pytest on uvicorn's tests (or the node ids *only*, a few tests run again: in one process),
    with the swap for ``ours``: two workers per core, as most of them wait (a server starting, a
    timeout running out)."""
    workers = str(2 * (os.cpu_count() or 1)) if only is None else "0"
    arguments = [
        *(["tests"] if only is None else only),
        "--ignore=tests/benchmarks",
        "-p",
        "no:cacheprovider",
        "-n",
        workers,
        "-q",
        *args,
    ]
    return run_pytest(arguments, root, "aiosendfile_uvicorn_swap" if which == "ours" else None)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    return main_for(
        argv,
        __doc__.split("\n\n")[0],
        "uvicorn",
        uvicorn.__version__,
        _run,
        "uvicorn's test modules held aiosendfile.uvicorn's HttpToolsProtocol and H11Protocol.",
        "aiosendfile.uvicorn's protocols",
    )


if __name__ == "__main__":
    sys.exit(main())
