"""Sessions: ``nox`` runs tests (every installed Python >= 3.10), lint and typing."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typing"]
nox.options.error_on_missing_interpreters = False  # test on whichever Pythons this machine has
nox.options.reuse_existing_virtualenvs = True

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole test suite, on stock asyncio and uvloop, over TCP, Unix and TLS."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "aiosendfile", "tests", "examples", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "aiosendfile", "tests", "examples", "benchmarks", "noxfile.py")


@nox.session
def typing(session: nox.Session) -> None:
    session.install("mypy", "-e", ".[all]")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Throughput benchmark (not a test): aiosendfile vs loop.sendfile vs userspace copy."""
    session.install("-e", ".[all]")
    session.run("python", "benchmarks/raw_transfer.py", *session.posargs)
