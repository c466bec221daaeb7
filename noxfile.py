"""Sessions: ``nox`` runs tests (every installed Python >= 3.10), lint, typing and docs."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.sessions = ["tests", "lint", "typing", "docs"]
nox.options.error_on_missing_interpreters = False  # test on whichever Pythons this machine has
nox.options.reuse_existing_virtualenvs = True

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


def _works(exe: str) -> bool:
    try:
        return subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _installed_versions() -> list[str]:
    """The versions of PYTHONS this machine can run, each findable by nox as ``pythonX.Y``.

    pyenv's shims run only the global Python: a ``pythonX.Y`` on PATH that does not run is
    shadowed by pyenv's real interpreter of that version, when one is installed, so sessions
    keep version names (``tests-3.12``) whatever PATH holds.
    """
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found, extra = [], []
    for version in PYTHONS:
        exe = shutil.which(f"python{version}")
        if exe and _works(exe):
            found.append(version)
            continue
        for candidate in sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True):
            if _works(candidate):
                found.append(version)
                extra.append(os.path.dirname(candidate))
                break
    if extra:
        os.environ["PATH"] = os.pathsep.join([*extra, os.environ.get("PATH", "")])
    return found


INSTALLED = _installed_versions() or PYTHONS


# What differs between Python versions is asyncio itself (sslproto, streams, cancellation): these
# files exercise it. The newest Python runs the whole suite; the others run this core, which keeps
# CI under ten minutes on two cores.
VERSION_SENSITIVE = [
    "tests/test_sendfile.py",
    "tests/test_first_await.py",
    "tests/test_misuse.py",
    "tests/test_peer_failures.py",
    "tests/test_file_failures.py",
    "tests/test_cancellation.py",
    "tests/test_odd_environments.py",
    "tests/test_never_stall.py",
    "tests/test_recvfile.py",
    "tests/test_sock_sendfile.py",
    "tests/test_patch.py",
    "tests/test_units.py",
    "tests/test_compat.py",
    "tests/test_tls_peer_loss.py",
    "tests/test_serve_engine.py",
    "tests/test_uvicorn_protocol.py",  # aiosendfile.sendfile on uvicorn's transports (TCP, Unix, TLS)
    "tests/test_asgi_static.py",  # anyio task groups: ExceptionGroup is a backport on 3.10
]


@nox.session(python=INSTALLED)
def tests(session: nox.Session) -> None:
    """The test suite, on stock asyncio and uvloop, over TCP, Unix and TLS (see VERSION_SENSITIVE)."""
    session.install("-e", ".[test]")
    newest = session.python == INSTALLED[-1]
    session.run("pytest", *(session.posargs or ([] if newest else VERSION_SENSITIVE)))


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
    session.install("mypy", "types-tqdm", "fastapi", "-e", ".[all]")  # fastapi: the benchmark's ASGI apps
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite (not a test): raw transfer, concurrency, HTTP, TLS, receive; table, JSON, plots."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, docs/_build/html: Sphinx, warnings as errors, nothing fetched at build time."""
    session.install("-e", ".[docs]")
    # -E -a: a fresh environment each time, so a warning in a page that did not change still fails the build.
    out = session.posargs or ["docs/_build/html"]
    session.run("sphinx-build", "-W", "--keep-going", "-E", "-a", "-q", "docs", *out)
