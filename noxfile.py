"""Sessions: ``nox`` runs tests (every installed Python >= 3.10), lint and typing."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.sessions = ["tests", "lint", "typing"]
nox.options.error_on_missing_interpreters = False  # test on whichever Pythons this machine has
nox.options.reuse_existing_virtualenvs = True

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


def _works(exe: str) -> bool:
    try:
        return subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _interpreter(version: str) -> str | None:
    """``pythonX.Y`` from PATH, else from a pyenv install (whose shims only run the global one)."""
    exe = shutil.which(f"python{version}")
    if exe and _works(exe):
        return version
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for candidate in sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True):
        if _works(candidate):
            return candidate
    return None


INSTALLED = [exe for v in PYTHONS if (exe := _interpreter(v))] or PYTHONS


@nox.session(python=INSTALLED)
def tests(session: nox.Session) -> None:
    """The whole test suite, on stock asyncio and uvloop, over TCP, Unix and TLS."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def stress(session: nox.Session) -> None:
    """Load, slowloris and long fault runs (not in the default sessions): ``pytest -m stress``."""
    session.install("-e", ".[test]")
    session.run("pytest", "-m", "stress", "-s", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "aiosendfile", "tests", "examples", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "aiosendfile", "tests", "examples", "benchmarks", "noxfile.py")


@nox.session
def typing(session: nox.Session) -> None:
    session.install("mypy", "types-tqdm", "-e", ".[all]")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite (not a test): raw transfer, concurrency, HTTP, TLS, receive; table, JSON, plots."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)
