"""Sessions: ``nox`` runs tests (every installed Python >= 3.10), lint, typing, docs and build."""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile

import nox

nox.options.sessions = ["ci"]  # every session below but coverage, stress and bench, in lanes (ci)
nox.options.error_on_missing_interpreters = False  # test on whichever Pythons this machine has
nox.options.reuse_existing_virtualenvs = True
# uv makes a session's virtualenv and installs into it in seconds (pip: 15-40 s a session, and the
# default run has eight); where uv is not installed, nox falls back to virtualenv and pip.
nox.options.default_venv_backend = "uv|virtualenv"
# uv may only use the interpreters on this machine: never download one.
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
# The sessions start hundreds of Python processes (servers, clients, pytest's workers), each
# importing the package, its hosts and pytest: with bytecode writing off (PYTHONDONTWRITEBYTECODE,
# set in some CI images), each compiled every module again from source, uv installing none, and
# pytest rewrote every test module's asserts in every worker. The .pyc files go in __pycache__
# folders (ignored by git) and in .nox.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

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


# What differs between Python versions is asyncio itself (sslproto, streams, cancellation) and what
# the doors lean on (the ssl module, anyio's task groups): these files exercise it. The newest
# Python runs the whole suite and the oldest runs these; the Pythons between run the library's own
# calls on asyncio (ASYNCIO_CORE), where 3.11's new sslproto and 3.12's task changes show. Both on
# stock asyncio only (OLDER_PYTHONS_SELECT): uvloop is one Cython build of the same source for every
# Python, its transports are its own, and the newest Python runs every test on it. So CI stays short
# on two cores.
VERSION_SENSITIVE = [
    "tests/core/test_sendfile.py",
    "tests/core/test_first_await.py",
    "tests/core/test_misuse.py",
    "tests/core/test_peer_failures.py",
    "tests/core/test_file_failures.py",
    "tests/core/test_cancellation.py",
    "tests/core/test_odd_environments.py",
    "tests/core/test_never_stall.py",
    "tests/core/test_recvfile.py",
    "tests/core/test_sock_sendfile.py",
    "tests/core/test_patch.py",
    "tests/core/test_units.py",
    "tests/core/test_compat.py",
    "tests/core/test_tls_peer_loss.py",
    "tests/serve/test_serve_protocol.py",  # serve's engine on raw sockets: TCP, Unix, TLS
    "tests/serve/test_serve_heads_memo.py",
    "tests/serve/test_serve_iteration_budget.py",
    "tests/serve/test_serve_shutdown.py",
    "tests/serve/test_serve_hot_memo.py",
    "tests/serve/test_serve_accepting.py",
    "tests/serve/test_serve_tls.py",  # serve's own TLS transport: the ssl module's SSLSocket, non-blocking
    "tests/serve/test_serve_clients.py",  # clients in other processes (curl, http.client, aiohttp), TLS too
    "tests/serve/test_serve_auth.py",  # over TLS too; scrypt from hashlib (OpenSSL's)
    "tests/serve/test_serve_upload.py",  # PUT bodies over TLS too; O_TMPFILE and linkat through os
    "tests/serve/test_serve_form.py",  # form bodies over TLS too (python-multipart in the pool)
    "tests/asgi/test_uvicorn_protocol.py",  # aiosendfile.sendfile on uvicorn's transports (TCP, Unix, TLS)
    "tests/asgi/test_uvicorn_protocol_features.py",
    "tests/asgi/test_asgi_static.py",  # anyio task groups: ExceptionGroup is a backport on 3.10
    "tests/asgi/test_asgi_static_apps.py",
]
# (aiosendfile.django meets the oldest Python in the django sessions: Django's own ASGI tests.)

#: What the Pythons between run: the calls on asyncio's own transports and streams (TCP, Unix,
#: sslproto's TLS), their cancellation, and the table of asyncio's internals ``_compat`` relies on.
ASYNCIO_CORE = [
    "tests/core/test_sendfile.py",
    "tests/core/test_first_await.py",
    "tests/core/test_recvfile.py",
    "tests/core/test_cancellation.py",
    "tests/core/test_tls_peer_loss.py",
    "tests/core/test_compat.py",
]


#: What the older Pythons leave out of their files: the uvloop cases (ids with "uvloop" in them).
OLDER_PYTHONS_SELECT = ["-k", "not uvloop"]


# pytest-xdist: two workers per core, because most tests spend their time waiting (a server process
# starting, a timeout running out, a socket filling): on 2 cores the whole suite took 229 s with 2
# workers, 179 s with 3 and 167 s with 4, at the same CPU time. worksteal: a worker that runs out
# takes queued tests from another.
PARALLEL = ["-n", str(2 * (os.cpu_count() or 1)), "--dist", "worksteal"]


@nox.session(python=INSTALLED)
def tests(session: nox.Session) -> None:
    """The test suite, on stock asyncio and uvloop, over TCP, Unix and TLS (see VERSION_SENSITIVE)."""
    session.install("-e", ".[test]")
    if session.python == INSTALLED[-1]:
        chosen: list[str] = []
    elif session.python == INSTALLED[0]:
        chosen = [*OLDER_PYTHONS_SELECT, *VERSION_SENSITIVE]
    else:
        chosen = [*OLDER_PYTHONS_SELECT, *ASYNCIO_CORE]
    # Anything after `--` comes after PARALLEL: `nox -s tests-3.13 -- -n 0 tests/serve/test_serve_cli.py`
    # is serial.
    session.run("pytest", *PARALLEL, *(session.posargs or chosen))


def _lanes() -> list[list[str]]:
    """What ``ci`` runs at once, each lane one session after another: the newest Python's whole
    suite; the older Pythons' files and Django's tests; the other hosts' tests and the checks."""
    return [
        [f"tests-{INSTALLED[-1]}"],
        [*(f"tests-{python}" for python in INSTALLED[:-1]), "django"],
        ["uvicorn", "aiohttp", "lint", "typing", "docs", "build"],
    ]


#: The lines of a lane's output that say what went wrong: pytest's failed tests (``-ra``) and
#: assertion lines, nox's red sessions, a host suite's verdict, mypy's and ruff's findings, a Sphinx
#: warning made an error. ``ci`` prints them again at the end (a CI page may keep only the end of a
#: long log). Not a captured log record (``ERROR    name:file.py:...``) nor a verdict's note of a
#: test that passed when run again.
WHAT_FAILED = re.compile(
    r"^(FAILED (?!ONCE)|ERROR (?! )|=+ .*\b(failed|errors?)\b|nox > Session .* (failed|aborted)"
    r"|FAILS WITH |RAN STOCK, NOT WITH |MORE ResourceWarnings |The swap was not checked|No test results"
    r"|\S+:\d+: error: |\S+:\d+:\d+: [A-Z]+\d+ |[A-Z]+\d+ \S|\s*--> \S+:\d+:\d+|Would reformat"
    r"|Warning, treated as error)"
)
#: pytest's assertion lines (``E   ...``), the first of these many per lane: the other lines are
#: all kept (up to :data:`WHAT_FAILED_LINES`), so the names of what failed are never crowded out.
ASSERTION = re.compile(r"^E   ")
ASSERTION_LINES = 20
WHAT_FAILED_LINES = 200


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """The default run: the sessions of :func:`_lanes`, one nox process per lane, all at once, each
    line of their output under its lane's number; red if any lane is.

    nox runs one session at a time, and only the newest Python's whole suite keeps both cores busy
    (the others wait on one core, on a server or on a timeout): side by side, the lanes use the
    time those leave.
    """
    lanes = _lanes()
    printing = threading.Lock()
    processes = []
    # pytest cuts its summary lines to the terminal's width, 80 columns in a pipe.
    wide = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "200")}
    for number, sessions in enumerate(lanes, 1):
        command = [sys.executable, "-m", "nox", "--sessions", *sessions]
        session.log(f"lane {number}: {shlex.join(command)}")
        processes.append(
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env=wide,
            )
        )
    reported: list[list[str]] = [[] for _ in lanes]
    assertions = [0 for _ in lanes]

    def echo(number: int, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with printing:
                sys.stdout.write(f"[{number}] {line}")
                sys.stdout.flush()
            said, assertion = reported[number - 1], ASSERTION.match(line) is not None
            if len(said) < WHAT_FAILED_LINES and (
                WHAT_FAILED.match(line) or (assertion and assertions[number - 1] < ASSERTION_LINES)
            ):
                said.append(line)
                assertions[number - 1] += assertion

    readers = [
        threading.Thread(target=echo, args=(number, process), daemon=True)
        for number, process in enumerate(processes, 1)
    ]
    for reader in readers:
        reader.start()
    try:
        codes = [process.wait() for process in processes]
    finally:
        for process in processes:  # (an interrupted run: the lanes go too)
            if process.poll() is None:
                process.terminate()
                process.wait()
        for reader in readers:
            reader.join()
    failed = [" ".join(sessions) for sessions, code in zip(lanes, codes, strict=True) if code != 0]
    for number, code in enumerate(codes, 1):
        if code != 0:
            print(f"[{number}] lane {number} failed; what it reported:")
            print("".join(f"[{number}] {line}" for line in reported[number - 1]), end="", flush=True)
    if failed:
        session.error(f"failed: {'; '.join(failed)}")


#: The Djangos whose own tests ``django`` runs: each LTS the ``django`` extra allows, and the newest
#: release the session's Python can install. LTS series are left out where Django does not support
#: the Python; "newest" is left out where it is one of the LTS series.
DJANGOS = {"4.2": "django~=4.2.0", "5.2": "django~=5.2.0", "newest": "django"}
DJANGO_PYTHONS = {"4.2": ("3.10", "3.11", "3.12"), "5.2": ("3.10", "3.11", "3.12", "3.13")}


def _django_runs_on(django: str) -> list[str]:
    """The Python here whose ``django`` session runs *django*: the oldest Django on the oldest
    Python, every other on the newest Python here that it supports (the Pythons between meet
    asyncio's differences in the tests sessions, and the loops' in the newest Python's)."""
    if django not in DJANGO_PYTHONS:
        return INSTALLED[-1:]
    supported = [python for python in DJANGO_PYTHONS[django] if python in INSTALLED]
    return supported[:1] if django == next(iter(DJANGO_PYTHONS)) else supported[-1:]


@nox.session(python=INSTALLED)
@nox.parametrize("django", list(DJANGOS))
def django(session: nox.Session, django: str) -> None:
    """Django's own tests of its ASGI handler (``asgi``, ``handlers``, ``responses``,
    ``staticfiles_tests``, from the installed Django's sdist) against ``aiosendfile.django``: no
    test that passes with stock Django may fail (``tests/host_suites/django_suite.py``). On
    stock asyncio, and the newest Django on uvloop too."""
    if django in DJANGO_PYTHONS and session.python not in DJANGO_PYTHONS[django]:
        session.skip(f"Django {django} does not support Python {session.python}")
    runs_on = _django_runs_on(django)
    if session.python not in runs_on and not session.posargs:
        session.skip(f"Django {django} runs on Python {' '.join(runs_on) or '(none)'} here")
    session.install("-e", ".[django]", "uvloop", "tblib", DJANGOS[django])  # tblib: Django's parallel runner
    version = session.run("python", "-c", "import django; print(django.get_version())", silent=True)
    series = ".".join(str(version).strip().split(".")[:2])
    if django == "newest" and series in DJANGO_PYTHONS:
        session.skip(f"the newest Django for Python {session.python} is {series}, run as such")
    # (uvloop: once, the newest Django, which runs on the newest Python; tests/django runs our door on it)
    loops = ["--loop", "asyncio", "--loop", "uvloop"] if django == "newest" else []
    session.run("python", "-m", "tests.host_suites.django_suite", *(session.posargs or loops))


#: What uvicorn's own tests import (its dev dependency group, less the tools that are not tests).
UVICORN_TEST_DEPS = [
    "pytest",
    "pytest-mock",
    "pytest-xdist",
    "trustme",
    "cryptography",
    "httpx2",
    "a2wsgi",
    "wsproto",
]


@nox.session(python=INSTALLED[-1])
def uvicorn(session: nox.Session) -> None:
    """uvicorn's own test suite (from the installed uvicorn's sdist) with ``aiosendfile.uvicorn``'s
    ``HttpToolsProtocol`` and ``H11Protocol`` in place of uvicorn's: no test that passes stock may
    fail (``tests/host_suites/uvicorn_suite.py``)."""
    session.install("-e", ".[asgi]", "uvicorn[standard]", *UVICORN_TEST_DEPS)
    session.run("python", "-m", "tests.host_suites.uvicorn_suite", *session.posargs)


#: What aiohttp's static and FileResponse tests import (from its test requirements): the
#: compressors make its compression cases run rather than skip; coverage is there for the
#: warning filter its pytest.ini names.
AIOHTTP_TEST_DEPS = [
    "pytest",
    "pytest-xdist",
    "pytest-mock",
    "pytest-timeout",
    "trustme",
    "blockbuster",
    "coverage",
    "freezegun",
    "isal",
    "zlib_ng",
    "brotli",
    "uvloop",
]


@nox.session(python=INSTALLED[-1])
def aiohttp(session: nox.Session) -> None:
    """aiohttp's own static-file and ``FileResponse`` tests (from the installed aiohttp's sdist),
    on both of its loops, with ``aiosendfile.aiohttp``'s classes in place of aiohttp's: no test
    that passes stock may fail but those the runner names, each with its reason
    (``tests/host_suites/aiohttp_suite.py``)."""
    session.install("-e", ".[aiohttp]", *AIOHTTP_TEST_DEPS)
    session.run("python", "-m", "tests.host_suites.aiohttp_suite", *session.posargs)


@nox.session
def coverage(session: nox.Session) -> None:
    """Branch coverage of the whole suite, subprocesses included (not in the default run).

    Under coverage a few tests that signal a CLI while it starts may time out (coverage's own start
    widens the window before our handler, and its exit hooks write to stderr): this session reports
    the coverage, the test sessions judge the tests.
    """
    session.install("-e", ".[test]", "coverage>=7.10")
    session.run("coverage", "erase")
    session.run("coverage", "run", "-m", "pytest", "-q", *PARALLEL, *session.posargs, success_codes=[0, 1])
    session.run("coverage", "combine", "-q")
    session.run("coverage", "report")


@nox.session
def stress(session: nox.Session) -> None:
    """Load, slowloris and long fault runs (not in the default sessions): ``pytest -m stress``."""
    session.install("-e", ".[test]")
    session.run("pytest", "-m", "stress", "-s", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    paths = ["aiosendfile", "tests", "examples", "benchmarks", "noxfile.py", "hatch_build.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


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


# Run by `build` in the wheel's own virtualenv: each module named imports from that venv, and so does
# every public name it lists. "--bare" first checks that no optional dependency is installed.
_IMPORT_CHECK = """
import importlib, importlib.util, os, sys
names = sys.argv[1:]
if names[0] == "--bare":
    names = names[1:]
    extras = [m for m in ("aiohttp", "uvloop", "httptools", "uvicorn", "starlette", "anyio", "tqdm")
              if importlib.util.find_spec(m)]
    assert not extras, f"not a bare install: {extras}"
venv = os.path.realpath(sys.prefix) + os.sep
for name in names:
    module = importlib.import_module(name)
    where = os.path.realpath(module.__file__)
    assert where.startswith(venv), f"{name} was imported from {where}, not from the wheel's venv {venv}"
    for public in getattr(module, "__all__", ()):
        getattr(module, public)
    print("imported", name, "from", where)
"""


def _check_archives(session: nox.Session, sdist: str, wheel: str, *, compiled: bool) -> None:
    """The wheel holds the whole package, py.typed and the licence, nothing else (and, *compiled*,
    the C module hatch_build.py builds, not a build left in the checkout); the sdist has LICENSE."""
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    package = {
        path.replace(os.sep, "/")
        for path in glob.glob("aiosendfile/**/*", recursive=True)
        if os.path.isfile(path) and "__pycache__" not in path and not path.endswith((".pyc", ".so"))
    }
    built = sorted(n for n in in_wheel if n.endswith(".so"))
    if len(built) != compiled or not all(n.startswith("aiosendfile/_syscalls.") for n in built):
        session.error(f"wheel {wheel}: compiled modules {built}, expected {'one' if compiled else 'none'}")
    missing = sorted(package - in_wheel)
    foreign = sorted(n for n in in_wheel if n.split("/")[0] != "aiosendfile" and ".dist-info/" not in n)
    if missing or foreign or "aiosendfile/py.typed" not in in_wheel:
        session.error(f"wheel {wheel}: missing {missing}, not the package's {foreign}")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel):
        session.error(f"wheel {wheel}: no LICENSE in its .dist-info/licenses")
    with tarfile.open(sdist) as archive:
        in_sdist = {n.split("/", 1)[-1] for n in archive.getnames()}
    wanted = {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "aiosendfile/py.typed"}
    absent = sorted(wanted - in_sdist)
    if absent:
        session.error(f"sdist {sdist}: lacks {absent}")
    session.log(f"{wheel}: {len(package)} package files, py.typed, LICENSE; no tests/ or benchmarks/")


@nox.session
def build(session: nox.Session) -> None:
    """sdist and wheel into dist/, twine check, then the wheel in a fresh venv outside the checkout."""
    session.install("build[uv]", "twine")  # uv: build's isolated environments in seconds, not ~20 s
    for old in glob.glob("dist/aiosendfile-*"):
        os.remove(old)
    session.run("python", "-m", "build", "--installer", "uv", "--outdir", "dist")  # the wheel from the sdist
    (sdist,) = glob.glob("dist/aiosendfile-*.tar.gz")
    (wheel,) = glob.glob("dist/aiosendfile-*.whl")
    session.run("twine", "check", "--strict", sdist, wheel)
    # hatch_build.py compiles aiosendfile/_syscalls.c on Linux where a compiler is (this machine's)
    compiled = sys.platform.startswith("linux")
    _check_archives(session, sdist, wheel, compiled=compiled)
    wheel = os.path.abspath(wheel)
    with tempfile.TemporaryDirectory(prefix="aiosendfile-pure-") as tmp:  # a machine without a compiler
        session.run(
            "python", "-m", "build", "--installer", "uv", "--wheel", "--outdir", tmp, env={"CC": "false"}
        )
        (pure,) = glob.glob(os.path.join(tmp, "aiosendfile-*-py3-none-any.whl"))
        _check_archives(session, sdist, pure, compiled=False)
        _check_wheel(session, os.path.abspath(pure), compiled=False)
    _check_wheel(session, wheel, compiled=compiled)


def _check_wheel(session: nox.Session, wheel: str, *, compiled: bool) -> None:
    """*wheel* installed in a fresh venv outside the checkout: bare, it imports and serve starts
    (with the compiled system calls or without, as *compiled* says); with the extras, every door."""
    with tempfile.TemporaryDirectory(prefix="aiosendfile-wheel-") as tmp:
        python = os.path.join(tmp, "venv", "bin", "python")
        pip = ["uv", "pip", "install", "-q", "--python", python]
        session.run(
            "uv", "venv", "-q", "--python", os.path.join(session.bin, "python"), os.path.join(tmp, "venv")
        )
        check = os.path.join(tmp, "check_imports.py")
        with open(check, "w") as f:
            f.write(_IMPORT_CHECK)
        with session.chdir(tmp):  # not the checkout, whose aiosendfile/ must not be what gets imported
            session.run(*pip, wheel, external=True)  # no extras: the core needs nothing else
            session.run(python, "-I", check, "--bare", "aiosendfile", external=True)
            session.run(python, "-I", "-m", "aiosendfile", "serve", "--help", external=True, silent=True)
            has = (
                "import sys, aiosendfile; sys.exit(aiosendfile.capabilities()['compiled_syscalls'] is not {})"
            )
            session.run(python, "-I", "-c", has.format(compiled), external=True)
            session.run(*pip, f"{wheel}[aiohttp,asgi,django]", external=True)  # what the door modules import
            modules = [
                "aiosendfile",
                "aiosendfile.aiohttp",
                "aiosendfile.asgi",
                "aiosendfile.uvicorn",
                "aiosendfile.django",
            ]
            session.run(python, "-I", check, *modules, external=True)
