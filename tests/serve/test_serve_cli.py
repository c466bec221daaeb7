"""``python -m aiosendfile serve`` as a user runs it: a subprocess, on both loops.

These are synchronous tests (the server is another process); the event loop
under test is chosen with ``--loop``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from aiosendfile import _platform

from ..support.connections import trusting
from ..support.files import pattern
from ..support.processes import BANNER, Server, alive, cli_process, signal_while_starting

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def served_dir(tmp_path: Path) -> Path:
    (tmp_path / "file.bin").write_bytes(pattern(300_000))
    (tmp_path / "hello.txt").write_text("hello")
    return tmp_path


@pytest.fixture
def server_factory() -> Iterator[type[Server]]:
    started: list[Server] = []

    class Tracked(Server):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield Tracked
    for s in started:
        s.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_serve_starts_serves_ranges_and_stops_on_sigint(
    served_dir: Path, server_factory: type[Server], loop: str
) -> None:
    server = server_factory(str(served_dir), "--port", "0", "--loop", loop)
    assert server.banner["loop"] == loop
    assert Path(server.banner["dir"]) == served_dir
    status, _, body = server.get("/file.bin")
    assert (status, body) == (200, pattern(300_000))
    status, headers, body = server.get("/file.bin", Range="bytes=1000-1999")
    assert (status, body) == (206, pattern(300_000)[1000:2000])
    assert headers["Content-Range"] == "bytes 1000-1999/300000"
    assert server.get("/missing")[0] == 404
    assert server.interrupt() == 0
    assert server.proc.stderr is not None
    assert "Traceback" not in server.proc.stderr.read()


def test_serve_defaults_to_the_current_directory(
    served_dir: Path, server_factory: type[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(served_dir)
    server = server_factory("--port", "0")
    assert Path(server.banner["dir"]) == served_dir
    assert server.get("/hello.txt")[2] == b"hello"
    assert server.interrupt() == 0


def test_serve_workers_share_the_port(served_dir: Path, server_factory: type[Server]) -> None:
    server = server_factory(str(served_dir), "--port", "0", "--workers", "2")
    assert server.banner["workers"] == "2"
    for _ in range(20):  # new connection each time: the kernel spreads them over the workers
        assert server.get("/hello.txt")[2] == b"hello"
    assert server.interrupt() == 0


def test_serve_access_log_is_opt_in(served_dir: Path, server_factory: type[Server]) -> None:
    quiet = server_factory(str(served_dir), "--port", "0")
    quiet.get("/hello.txt")
    assert quiet.interrupt() == 0
    assert quiet.proc.stderr is not None
    assert "GET /hello.txt" not in quiet.proc.stderr.read()
    loud = server_factory(str(served_dir), "--port", "0", "--access-log")
    loud.get("/hello.txt")
    assert loud.interrupt() == 0
    assert loud.proc.stderr is not None
    assert "GET /hello.txt" in loud.proc.stderr.read()


def test_serve_access_log_in_json_behind_a_trusted_proxy(
    served_dir: Path, server_factory: type[Server]
) -> None:
    server = server_factory(
        str(served_dir),
        "--port",
        "0",
        "--access-log",
        "--access-log-format",
        "json",
        "--trusted-proxy",
        "127.0.0.1",
    )
    server.get("/hello.txt", **{"X-Forwarded-For": "203.0.113.5"})
    assert server.interrupt() == 0
    assert server.proc.stderr is not None
    lines = [line for line in server.proc.stderr.read().splitlines() if line.startswith("{")]
    (line,) = lines
    fields = json.loads(line)
    assert (fields["remote_addr"], fields["request"], fields["status"]) == (
        "203.0.113.5",
        "GET /hello.txt HTTP/1.1",
        200,
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--access-log-format", "json"], ("--access-log-format", "--access-log")),
        (["--access-log-format", "xml"], ()),
        (["--trusted-proxy", "10.0.0.1"], ("--trusted-proxy", "--access-log")),
    ],
)
def test_log_options_without_their_log_are_refused(
    tmp_path: Path, argv: list[str], words: tuple[str, ...]
) -> None:
    done = _run("serve", str(tmp_path), "--port", "0", *argv)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("key_apart", [True, False], ids=["key-file", "key-in-cert"])
def test_serve_https_with_tls_cert_and_key(
    served_dir: Path, server_factory: type[Server], tmp_path: Path, loop: str, key_apart: bool
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key = tmp_path / "chain.pem", tmp_path / "key.pem"
    if key_apart:
        cert.cert_chain_pems[0].write_to_path(str(chain))
        cert.private_key_pem.write_to_path(str(key))
        tls = ["--tls-cert", str(chain), "--tls-key", str(key)]
    else:
        cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
        tls = ["--tls-cert", str(chain)]
    server = server_factory(str(served_dir), "--port", "0", "--loop", loop, *tls)
    assert server.url.startswith("https://127.0.0.1:")
    client = trusting(ca)
    assert server.get("/file.bin", context=client)[::2] == (200, pattern(300_000))
    status, _, body = server.get("/file.bin", context=client, Range="bytes=5-9")
    assert (status, body) == (206, pattern(300_000)[5:10])
    assert server.interrupt() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-key", "k.pem"], "--tls-key needs --tls-cert"),
        (["--tls-cert", "missing.pem"], "cannot use --tls-cert/--tls-key"),
        (["--tls-cert", "hello.txt"], "cannot use --tls-cert/--tls-key"),
    ],
)
def test_serve_refuses_unusable_tls_files(served_dir: Path, args: list[str], message: str) -> None:
    """A bad certificate is a usage error at start (exit 2, one line), not failed handshakes later."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "serve", str(served_dir), "--port", "0", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=served_dir,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _serve_with(
    prelude: str,
    served_dir: Path,
    *args: str,
    exercise: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run serve in a ``python -c`` whose *prelude* runs first, GET hello.txt (and *exercise* it
    with its base URL), stop it with SIGINT (exit status 0); its stderr."""
    code = f"{prelude}; from aiosendfile._cli._main import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", str(served_dir), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        match = BANNER.search(proc.stdout.readline())
        assert match, proc.stderr.read() if proc.stderr else ""
        with urllib.request.urlopen(match["url"] + "hello.txt", timeout=10) as resp:
            assert resp.read() == b"hello"
        if exercise is not None:
            exercise(match["url"])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    return err


def test_serve_needs_no_web_framework(served_dir: Path) -> None:
    """The serve extra is uvloop + httptools: serve runs, and answers, with aiohttp unimportable."""
    _serve_with("import sys; sys.modules['aiohttp'] = None", served_dir)


#: A prelude that reports ``ctypes`` being imported (with where from) and, at exit, whether the
#: compiled system calls were in use.
_WATCH_CTYPES = (
    "import atexit, sys, traceback; "
    "sys.addaudithook(lambda event, args: event == 'import' and args[0] in ('ctypes', '_ctypes') "
    "and print('ctypes imported', *traceback.format_stack(), file=sys.stderr)); "
    "atexit.register(lambda: print('syscalls', sys.modules['aiosendfile._platform'].HAS_SYSCALLS_MODULE, "
    "sys.modules['aiosendfile._platform'].range_cached_available(), file=sys.stderr))"
)


def _every_kind_of_request(base: str) -> None:
    """A first sight, its repeat, a large file in chunks (the page-cache probe), a range, a
    listing, a miss, an upload and its read-back: each path a request can take."""

    def fetch(path: str, **kwargs: Any) -> tuple[int, bytes]:
        request = urllib.request.Request(base + path, **kwargs)
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    assert fetch("file.bin") == (200, pattern(300_000))
    assert fetch("file.bin") == (200, pattern(300_000))
    assert fetch("large.bin") == (200, pattern(5 * 2**20))
    assert fetch("large.bin", headers={"Range": "bytes=3000000-3000009"}) == (
        206,
        pattern(5 * 2**20)[3000000:3000010],
    )
    assert fetch("")[0] == 200
    assert fetch("nothing-here")[0] == 404
    assert fetch("put.bin", data=b"x" * 70_000, method="PUT")[0] == 201
    assert fetch("put.bin") == (200, b"x" * 70_000)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure"])
def test_serving_imports_no_ctypes(served_dir: Path, loop: str, compiled: bool) -> None:
    """No request path reaches ``ctypes`` (a call through it costs 2-3 times a C call): cachestat
    and openat2 come from the compiled ``_syscalls`` where it was built, and without it (or with
    ``AIOSENDFILE_NO_EXTENSIONS``) serve does without them, as on a kernel that lacks them."""
    if compiled and not _platform.HAS_SYSCALLS_MODULE:
        pytest.skip("aiosendfile._syscalls was not built here (no compiler at install)")
    (served_dir / "large.bin").write_bytes(pattern(5 * 2**20))
    err = _serve_with(
        _WATCH_CTYPES,
        served_dir,
        "--loop",
        loop,
        "--upload",
        exercise=_every_kind_of_request,
        env={} if compiled else {"AIOSENDFILE_NO_EXTENSIONS": "1"},
    )
    assert "ctypes imported" not in err, err
    expected = f"syscalls {compiled} {compiled and _platform.range_cached_available()}"
    assert expected in err.splitlines(), err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_serve_keeps_the_collector_off_what_it_started_with(served_dir: Path, loop: str) -> None:
    """Once serving, what starting built is frozen (``gc.freeze``): a full collection of it held
    the loop 4-9 ms (``benchmarks.mixed_stall``)."""
    err = _serve_with(
        "import atexit, gc, sys; "
        "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))",
        served_dir,
        "--loop",
        loop,
    )
    frozen = [int(line.split()[1]) for line in err.splitlines() if line.startswith("frozen ")]
    assert frozen, err
    assert frozen[0] > 5000, err


def test_serve_errors(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    missing = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "serve", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert missing.returncode == 2
    assert "no such file or directory" in missing.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = subprocess.run(
            [sys.executable, "-m", "aiosendfile", "serve", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    assert taken.returncode == 1
    assert "cannot listen" in taken.stderr
    assert "already in use" in taken.stderr
    version = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert version.returncode == 0
    assert version.stdout.startswith("aiosendfile ")


def test_workers_exit_when_the_parent_is_killed(served_dir: Path, server_factory: type[Server]) -> None:
    """A SIGKILLed parent leaves no orphaned workers behind."""
    server = server_factory(str(served_dir), "--port", "0", "--workers", "2")
    children = [
        int(pid)
        for pid in Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    ]
    assert len(children) == 2
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in children)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", ".", "--port", "99999"],
        ["serve", ".", "--port", "65536"],
        ["serve", ".", "--port", "-1"],
        ["serve", ".", "--port", "http"],
        ["send", "README.md", "127.0.0.1:99999"],
        ["send", "README.md", "127.0.0.1:0"],
        ["send", "README.md", "127.0.0.1"],
        ["recv", "out.bin", "--listen", "127.0.0.1:99999"],
        ["recv", "out.bin", "--listen", "127.0.0.1:-1"],
    ],
)
def test_bad_ports_are_refused_in_one_line_at_once(tmp_path: Path, argv: list[str]) -> None:
    """Every command checks ports the same way: no wrap-around (99999 → 34463), no cryptic resolver text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aiosendfile", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"aiosendfile {argv[0]}: ")
    assert "port" in lines[0].lower()
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out.bin").exists()


# -- stopping at any moment ------------------------------------------------------------------


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_at_any_moment_exits_0_without_traceback(
    served_dir: Path, signum: int, loop: str, workers: str
) -> None:
    """Ctrl-C or SIGTERM while serve starts (importing aiohttp, binding, forking workers, just
    after the banner, while it stops): status 0, nothing on stderr.

    Only a signal that lands before serve's own code runs (the interpreter starting,
    ``import aiosendfile``: no SIGTERM handler in /proc yet) has Python's default
    effect; such runs are told apart by looking before sending, not by timing.
    """
    args = (str(served_dir), "--port", "0", "--loop", loop, "--workers", workers)
    for delay in (0.0, 0.02, 0.1, 0.3):  # from Popen
        ours, status, err = signal_while_starting(["serve", *args], signum, delay)
        if ours:
            assert (status, err) == (0, ""), (delay, err)
        # else: Python's own (killed by the signal, or KeyboardInterrupt in runpy):
        # all that is asked of it is to end, which it did.
    for delay in (0.0, 0.005, 0.05):  # from the banner (the server is still getting ready), twice
        with cli_process("serve", *args) as proc:
            assert proc.stdout is not None
            assert BANNER.search(proc.stdout.readline())
            time.sleep(delay)
            proc.send_signal(signum)
            time.sleep(delay)
            proc.send_signal(signum)  # a second one, while it stops
            _, err = proc.communicate(timeout=30)
        assert (proc.returncode, err) == (0, ""), (delay, err)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_while_workers_start(served_dir: Path, signum: int) -> None:
    """Sent as soon as the first worker is forked: the parent used to wait 60 s for it to say ready."""
    for _ in range(3):
        with cli_process("serve", str(served_dir), "--port", "0", "--workers", "2") as proc:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            while proc.poll() is None and not children.read_text().split():
                time.sleep(0.0005)
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=30)
        assert (proc.returncode, err) == (0, "")
        assert out == "" or BANNER.search(out)  # the banner only if every worker was ready


def test_stop_signal_while_serving_and_again_while_stopping(
    served_dir: Path, server_factory: type[Server]
) -> None:
    """A second Ctrl-C during the graceful stop (and after the loop closed) is quiet too."""
    for pause in (0.0, 0.001, 0.01, 0.1, 0.3, 0.6):
        server = server_factory(str(served_dir), "--port", "0", "--loop", "asyncio")
        assert server.get("/hello.txt")[2] == b"hello"
        server.proc.send_signal(signal.SIGINT)
        time.sleep(pause)
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=30) == 0
        assert server.proc.stderr is not None
        assert server.proc.stderr.read() == "", pause


# -- bad arguments ---------------------------------------------------------------------------


def _run(*argv: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "aiosendfile", *argv],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=30,
        **kwargs,
    )


def _refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("aiosendfile serve: ")
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("value", ["0", "-1", "-5", "two", "1.5", "", "99999"])
def test_bad_worker_counts_are_refused_in_one_line(tmp_path: Path, value: str) -> None:
    _refused(_run("serve", str(tmp_path), "--port", "0", "--workers", value), "--workers", "1 to")


def test_a_directory_that_is_missing_or_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    _refused(_run("serve", str(tmp_path / "missing"), "--port", "0"), "no such file or directory")
    _refused(_run("serve", str(tmp_path / "file"), "--port", "0"), "not a directory")
    _refused(_run("serve", str(tmp_path / "file" / "below"), "--port", "0"), "not a directory")


@pytest.fixture
def world_readable_tmp() -> Iterator[Path]:
    """A directory nobody may enter (pytest's tmp_path is 0700, owned by root)."""
    path = Path(tempfile.mkdtemp(prefix="aiosendfile-cli-"))
    path.chmod(0o755)
    yield path
    for sub in path.iterdir():
        sub.chmod(0o755)
    shutil.rmtree(path)


# Run as nobody (root reads everything). The interpreter lives under /root (0700), so
# the child imports what serve needs while still root (the checkout may be under a 0700
# directory too, as mkdtemp makes them), then drops its privileges.
AS_NOBODY = """
import os, sys
import aiosendfile._cli._main, aiosendfile._cli._serve, aiosendfile._cli._serve_options
import aiosendfile._serve._server
import aiosendfile._pair._cli
os.setgroups([]); os.setgid(65534); os.setuid(65534)
sys.exit(aiosendfile._cli._main.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("mode", "missing"), [(0o311, "r"), (0o644, "x"), (0o000, "rx")])
def test_a_directory_it_cannot_read_is_refused_at_start(
    world_readable_tmp: Path, mode: int, missing: str
) -> None:
    """Not answered with 403 to everything: serve says so and stops, at once."""
    folder = world_readable_tmp / "folder"
    folder.mkdir()
    (folder / "index.html").write_text("hi")
    folder.chmod(mode)
    command = (
        [sys.executable, "-c", AS_NOBODY] if os.geteuid() == 0 else [sys.executable, "-m", "aiosendfile"]
    )
    proc = subprocess.Popen(
        [*command, "serve", str(folder), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=world_readable_tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # (the old serve started and answered 403 to everything)
        proc.kill()
        out, err = proc.communicate()
    _refused(
        subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "cannot serve", "permission denied"
    )


# -- help ------------------------------------------------------------------------------------


def test_help_is_written_for_users() -> None:
    top = _run("--help")
    serve = _run("serve", "--help")
    for done in (top, serve):
        assert done.returncode == 0
        assert "examples:" in done.stdout
        assert "``" not in done.stdout  # no reST
        assert ":mod:" not in done.stdout
        assert "_cli" not in done.stdout  # no private module names
    assert "aiosendfile serve ./public" in top.stdout
    for option in ("--no-listing", "--show-dotfiles", "--follow-symlinks", "--workers", "--loop", "--port"):
        assert option in serve.stdout
    assert "default: 8000" in serve.stdout
    assert "default: 127.0.0.1" in serve.stdout
    assert ".well-known" in serve.stdout
    assert "exit status:" in serve.stdout


# -- dotfiles and listings, as serve runs them -------------------------------------------------


def test_serve_hides_dotfiles_unless_asked_and_lists_raw_names(
    served_dir: Path, server_factory: type[Server]
) -> None:
    (served_dir / ".env").write_text("TOKEN=secret")
    (served_dir / ".git").mkdir()
    (served_dir / ".git" / "config").write_text("secret")
    with open(os.fsencode(served_dir) + b"/raw-\xff.txt", "wb") as f:
        f.write(b"raw")
    server = server_factory(str(served_dir), "--port", "0")
    assert server.get("/.env")[0] == 404
    assert server.get("/.git/config")[0] == 404
    status, headers, body = server.get("/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert b".env" not in body
    assert b".git" not in body
    assert b'<a href="raw-%FF.txt">raw-\xef\xbf\xbd.txt</a>' in body
    assert server.get("/raw-%FF.txt")[::2] == (200, b"raw")
    assert server.interrupt() == 0
    shown = server_factory(str(served_dir), "--port", "0", "--show-dotfiles")
    assert shown.get("/.env")[::2] == (200, b"TOKEN=secret")
    assert shown.interrupt() == 0


def test_serve_lists_a_directory_by_default_and_not_under_no_listing(
    served_dir: Path, server_factory: type[Server]
) -> None:
    """A directory without index.html is listed, as http.server, miniserve and dufs do (also with
    the old ``--show-index``, which changes nothing now); ``--no-listing`` answers 403. A
    directory with an index.html answers it either way."""
    (served_dir / "docs").mkdir()
    (served_dir / "docs" / "index.html").write_text("<p>docs</p>")
    (served_dir / "a.txt").write_text("a")
    for options in ([], ["--show-index"]):
        server = server_factory(str(served_dir), "--port", "0", *options)
        status, headers, body = server.get("/")
        assert status == 200
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert b'<a href="a.txt">a.txt</a>' in body
        assert b'<a href="docs/">docs/</a>' in body
        assert server.get("/docs/")[::2] == (200, b"<p>docs</p>")
        assert server.interrupt() == 0
    closed = server_factory(str(served_dir), "--port", "0", "--no-listing")
    assert closed.get("/")[0] == 403
    assert closed.get("/docs/")[::2] == (200, b"<p>docs</p>")
    assert closed.interrupt() == 0


@pytest.mark.parametrize(
    "value", ["*.", "", "https://files.example.org", "a..b", "exa mple", "files.example.org/x"]
)
def test_a_host_name_allow_host_cannot_read_is_refused(tmp_path: Path, value: str) -> None:
    """Not read as some other rule: ``*.`` (``*.$DOMAIN`` with DOMAIN unset) turned the check
    off, a URL allowed the name ``https``."""
    done = _run("serve", str(tmp_path), "--port", "0", "--allow-host", value)
    assert done.returncode == 2, done
    assert "--allow-host" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_port_another_servers_workers_hold_is_refused(tmp_path: Path) -> None:
    """Two ``--workers`` servers on one port: the second is refused in words (with SO_REUSEPORT on
    both, it started and took half the connections)."""
    first = Server(str(tmp_path), "--port", "0", "--workers", "2")
    try:
        port = first.url.rsplit(":", 1)[1].strip("/")
        done = _run("serve", str(tmp_path), "--port", port, "--workers", "2")
        assert done.returncode == 1, done
        assert "already in use" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    finally:
        first.close()


def _certificate(where: Path) -> Path:
    """A new CA's certificate for ``localhost`` (no key with it), as ``where/cert.pem``."""
    cert = where / "cert.pem"
    trustme.CA().issue_cert("localhost").cert_chain_pems[0].write_to_path(str(cert))
    return cert


def test_an_encrypted_key_is_refused_in_words_never_asked(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert = _certificate(tmp_path)
    key = tmp_path / "key.pem"
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    done = _run("serve", str(tmp_path), "--port", "0", "--tls-cert", str(cert), "--tls-key", str(key))
    assert done.returncode == 2, done
    assert "encrypted" in done.stderr
    assert "PEM pass phrase" not in done.stderr + done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("files", "words"),
    [
        (("cert", None), "holds no private key: give it with --tls-key"),
        (("junk", None), "holds no PEM certificate"),
        (("key", None), "holds no PEM certificate"),
        (("cert", "junk"), "holds no PEM private key"),
        (("cert", "cert"), "holds no PEM private key"),
        (("cert", "other"), "does not belong to the certificate"),
    ],
)
def test_a_certificate_and_key_that_do_not_make_a_pair_are_refused_in_words(
    tmp_path: Path, files: tuple[str, str | None], words: str
) -> None:
    """Each way a ``--tls-cert``/``--tls-key`` pair fails says which file lacks what, not
    OpenSSL's ``[SSL] PEM lib (_ssl.c:3926)``."""
    ca = trustme.CA()
    issued = ca.issue_cert("localhost")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "cert"))
    issued.private_key_pem.write_to_path(str(tmp_path / "key"))
    ca.issue_cert("other").private_key_pem.write_to_path(str(tmp_path / "other"))
    (tmp_path / "junk").write_text("not a PEM file\n")
    cert, key = files
    options = ["--tls-cert", str(tmp_path / cert)] + (
        [] if key is None else ["--tls-key", str(tmp_path / key)]
    )
    done = _run("serve", str(tmp_path), "--port", "0", *options)
    assert done.returncode == 2, done
    assert words in done.stderr, done.stderr
    assert "PEM lib" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_stdout_nobody_reads_is_no_reason_to_stop(tmp_path: Path, workers: str) -> None:
    """``serve > /dev/full``: the banner cannot be written; serving goes on, with no traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aiosendfile",
                "serve",
                str(tmp_path),
                "--port",
                "0",
                "--workers",
                workers,
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(2)  # (still serving)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err


def test_a_host_name_that_cannot_be_encoded_is_one_line(tmp_path: Path) -> None:
    done = _run("serve", str(tmp_path), "--port", "0", "--host", "a..b")
    assert done.returncode == 1, done
    assert "cannot listen on a..b" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("closed", ["1 2", "0 1 2", "0 2"])
def test_serve_started_with_its_standard_descriptors_closed_stops_cleanly(
    tmp_path: Path, loop: str, closed: str
) -> None:
    """``serve DIR >&- 2>&-`` (a daemon's way): the sockets and the loop's own descriptors took
    numbers 0-2, and libuv's close asserts a descriptor above 2: every stop on uvloop ended in
    SIGABRT (exit 134). They are /dev/null's now, as a daemon has them, and the stop is exit 0."""
    (tmp_path / "a.txt").write_text("a")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shut = " ".join(f"{fd}>&-" if fd != "0" else "<&-" for fd in closed.split())
    command = f"exec {sys.executable} -m aiosendfile serve {tmp_path} --port 0 --loop {loop} {shut}"
    proc = subprocess.Popen(["sh", "-c", command], env=env, stdin=subprocess.DEVNULL)
    try:
        time.sleep(1.5)  # (started and serving: there is no banner to wait for)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_tls_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    """OpenSSL's error for a file it cannot open names none: which of the two it is is said."""
    cert = _certificate(tmp_path)
    missing = tmp_path / "gone-key.pem"
    done = _run("serve", str(tmp_path), "--port", "0", "--tls-cert", str(cert), "--tls-key", str(missing))
    assert done.returncode == 2, done
    assert f"{missing}: no such file" in done.stderr, done.stderr
    done = _run("serve", str(tmp_path), "--port", "0", "--tls-cert", str(tmp_path))
    assert done.returncode == 2, done
    assert f"{tmp_path}: it is a directory" in done.stderr, done.stderr
