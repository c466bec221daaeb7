"""``http_static``'s contenders: their names, how each is started, and what the JSON records of them.

Each trial starts one contender afresh (:func:`start_server`) on a free port, serving the
trial's directory, pinned to the trial's server CPUs: ``serve`` (``python -m aiosendfile serve``),
nginx (a generated config, :data:`NGINX_CONF`), caddy (``file-server``), ``python -m
http.server``, the aiohttp contenders (``python -m benchmarks.programs.aiohttp_app KIND``:
aiohttp's static, the plugin in an application, in-memory bodies) and the ASGI rows, ``SERVER/APP``
(:data:`ASGI_COMMANDS` loading an app of ``benchmarks.asgi_apps``, the directory in
``AIOSENDFILE_BENCH_ROOT``). The names and their groups (defaults, the ``--workers N`` cases,
the references that hold files in memory) are here too; the grid and the run are
``http_static``'s, the ratios and tables ``http_report``'s. Over HTTPS (the ``*-tls`` sets) only
:data:`TLS_CONTENDERS` run: ``serve --tls-cert CERT --tls-key KEY`` and nginx with ``listen ... ssl``
(:data:`NGINX_TLS`), both with the same certificate and key. The ``py-floor`` rows, asked for by name,
are ``benchmarks.programs.floor_server`` (:data:`FLOORS`): the least a Python server on uvloop
spends per request, with and without ``serve``'s page-cache probe.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import sys
from pathlib import Path
from typing import Any

from benchmarks import asgi_apps
from benchmarks.asgi_apps import ROOT_ENV
from benchmarks.harness import TrialError, servers
from benchmarks.harness.http_trial import Context
from benchmarks.harness.report import REPO
from benchmarks.harness.servers import Server, free_port, repo_env

__all__ = [
    "AIOHTTP_APP",
    "AIOHTTP_APP_SOURCE",
    "AIOHTTP_KINDS",
    "ALIASES",
    "ASGI_APPS",
    "ASGI_APPS_SOURCE",
    "ASGI_COMMANDS",
    "ASGI_CONTENDERS",
    "ASGI_MEMORY",
    "ASGI_SERVERS",
    "BASE",
    "CONTENDERS",
    "DEFAULT_CONTENDERS",
    "FLOORS",
    "FLOOR_SERVER",
    "MULTI_WORKER",
    "NGINX_AIO",
    "NGINX_CONF",
    "NGINX_TLS",
    "SERVE",
    "SINGLE_FILE_ONLY",
    "TLS_CONTENDERS",
    "asgi_command",
    "asgi_versions",
    "is_asgi",
    "start_server",
]

SERVE = "serve"
#: ``serve`` from another checkout (``AIOSENDFILE_BEFORE=DIR``): a change against the tree before
#: it, interleaved in one run (asked for by name).
SERVE_BEFORE = "serve-before"
BEFORE_ENV = "AIOSENDFILE_BEFORE"
#: An ASGI row with this suffix runs the app from that checkout too (asked for by name).
BEFORE_SUFFIX = "@before"
BASE = "nginx"  # every ratio is to nginx
#: nginx with ``aio threads`` (asked for by name): its reads and ``sendfile`` in a thread pool, as
#: the nginx documentation advises where a slow disk would block the worker (its ``open`` and
#: ``fstat`` still run on the worker).
NGINX_AIO = "nginx-aio"
# The ASGI rows (issue #16), SERVER/APP: the server's command and the app in benchmarks.asgi_apps.
ASGI_SERVERS = ("uvicorn", "uvicorn+asf", "granian")
ASGI_APPS = {
    "starlette": "starlette_app",
    "fastapi": "fastapi_app",
    "asf.asgi": "aiosendfile_app",
    "memory": "memory_app",
}
ASGI_CONTENDERS = (
    "uvicorn/starlette",
    "uvicorn+asf/starlette",
    "uvicorn+asf/asf.asgi",
    "granian/starlette",
    "uvicorn/fastapi",
    "uvicorn+asf/fastapi",
    "uvicorn/asf.asgi",
    "granian/asf.asgi",
)
# References, asked for by name: a bare ASGI app answering from memory (no framework, no file).
ASGI_MEMORY = ("uvicorn/memory", "granian/memory")
ASGI_BEFORE = ("uvicorn+asf/asf.asgi" + BEFORE_SUFFIX,)
CONTENDERS = (
    SERVE,
    "nginx",
    "caddy",
    "http.server",
    "aiohttp-static",
    "aiosendfile-app",
    "aiohttp-memory",
    *ASGI_CONTENDERS,
    *ASGI_MEMORY,
    "py-floor",
    "py-floor+probe",
    NGINX_AIO,
    SERVE_BEFORE,
    *ASGI_BEFORE,
)
# aiohttp-memory is a reference, asked for by name; the ASGI rows run with --asgi or by name.
DEFAULT_CONTENDERS = CONTENDERS[:6]
ALIASES = {"aiosendfile-plugin": SERVE}  # the serve command's name before issue #15
MULTI_WORKER = (SERVE, SERVE_BEFORE, "nginx", NGINX_AIO)  # the contenders of the --workers N > 1 cases
# Hold the files in memory: not for the mixed (cold) set.
SINGLE_FILE_ONLY = ("aiohttp-memory", *ASGI_MEMORY)
# The contenders of the HTTPS cases (the *-tls sets), each given the same certificate and key: the
# uvicorn rows (issue #25) with uvicorn's --ssl-certfile/--ssl-keyfile, run when named or with --asgi.
TLS_CONTENDERS = (SERVE, SERVE_BEFORE, "nginx", "uvicorn+asf/asf.asgi", "uvicorn/starlette")

# The py-floor rows (references, asked for by name): python -m FLOOR_SERVER DIR HOST PORT [--probe].
FLOOR_SERVER = "benchmarks.programs.floor_server"
FLOORS = {"py-floor": [], "py-floor+probe": ["--probe"]}

# The aiohttp contenders' program: python -m AIOHTTP_APP KIND DIR HOST PORT (KIND per contender).
AIOHTTP_APP = "benchmarks.programs.aiohttp_app"
AIOHTTP_KINDS = {"aiohttp-static": "static", "aiosendfile-app": "plugin", "aiohttp-memory": "memory"}
# Its source, for the JSON (read, not imported: this process needs neither aiohttp nor uvloop).
AIOHTTP_APP_SOURCE = Path(__file__).resolve().parent.joinpath("programs", "aiohttp_app.py").read_text()
ASGI_APPS_SOURCE = Path(asgi_apps.__file__).read_text()

# The ASGI servers' command lines (after the interpreter; APP is benchmarks.asgi_apps:NAME).
# One process (granian: its main process and one worker), one thread serving, uvloop, no access log.
_UVICORN = ["-m", "uvicorn", "APP", "--loop", "uvloop", "--no-access-log", "--log-level", "warning"]
ASGI_COMMANDS = {
    "uvicorn": [*_UVICORN, "--http", "httptools"],  # what uvicorn's "auto" picks with httptools installed
    "uvicorn+asf": [*_UVICORN, "--http", "aiosendfile.uvicorn:HttpToolsProtocol"],
    "granian": [
        "-m",
        "granian",
        "APP",
        "--interface",
        "asgi",
        "--workers",
        "1",
        "--runtime-threads",
        "1",
        "--loop",
        "uvloop",
        "--no-ws",
        "--no-access-log",
        "--log-level",
        "warning",
    ],
}

NGINX_CONF = """\
{user}worker_processes {workers};
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;{aio}
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    # The default (1000 since nginx 1.19.10) would make wrk reconnect every
    # 1000 requests; aiohttp has no such limit.
    keepalive_requests 100000000;
    default_type application/octet-stream;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port}{ssl};
        root {root};{tls}
    }}
}}
"""
# The HTTPS cases: NGINX_CONF with ssl=" ssl" and tls=NGINX_TLS. TLS 1.3 allowed as serve's (Python's
# defaults) does: this nginx's default is TLS 1.2 at most, so both negotiate TLS 1.3 with
# TLS_AES_256_GCM_SHA384; nginx's default ciphers otherwise. No kTLS, so nginx does not use sendfile
# over TLS either.
NGINX_TLS = """
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_certificate {cert};
        ssl_certificate_key {key};"""


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------


def start_server(
    ctx: Context, tools: dict[str, str | None], name: str, *, tls: tuple[str, str] | None = None
) -> Server:
    """Start contender ``name`` (``ctx.workers`` workers) on a free port, serving ``ctx.root``.

    ``tls``: (certificate file, key file): serve HTTPS with them (:data:`TLS_CONTENDERS` only).
    """
    port = free_port()
    log = Path(ctx.tmp, f"server-{name.replace('/', '_')}.log")

    def launch(cmd: list[str], **how: Any) -> Server:
        """``servers.start_server`` of *cmd* with this trial's port, log, CPUs and command prefix."""
        return servers.start_server(name, cmd, port, log, cpus=ctx.server_cpus, wrap=ctx.wrap, **how)

    if tls is not None and name not in TLS_CONTENDERS:
        raise TrialError(f"{name} has no HTTPS mode here")
    if name in (SERVE, SERVE_BEFORE):
        env = repo_env()
        where: Path | str = _from_before(name, env) if name == SERVE_BEFORE else REPO
        cmd = [sys.executable, "-m", "aiosendfile", "serve", ctx.root, "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--workers", str(ctx.workers)]
        if tls is not None:
            cmd += ["--tls-cert", tls[0], "--tls-key", tls[1]]
        # With workers, the parent forks them: wait for the whole tree.
        procs = 1 + ctx.workers if ctx.workers > 1 else 1
        return launch(cmd, env=env, processes=procs, cwd=where)
    if ctx.workers != 1 and name not in MULTI_WORKER:
        raise TrialError(f"{name} has no --workers {ctx.workers} mode here")
    if is_asgi(name):
        server, app = name.removesuffix(BEFORE_SUFFIX).split("/")
        cmd = [sys.executable, *asgi_command(server, app)]
        cmd += ["--host", "127.0.0.1", "--port", str(port)]
        if tls is not None:
            cmd += ["--ssl-certfile", tls[0], "--ssl-keyfile", tls[1]]
        env = dict(repo_env(), **{ROOT_ENV: ctx.root})
        where = _from_before(name, env) if name.endswith(BEFORE_SUFFIX) else REPO
        # granian: a main process and its one worker (wait for both). uvicorn re-raises SIGTERM
        # after its graceful shutdown (its exit status is then -15).
        granian = server == "granian"
        return launch(
            cmd, env=env, processes=2 if granian else 1, reraises_stop_signal=not granian, cwd=where
        )
    if name in AIOHTTP_KINDS:
        cmd = [sys.executable, "-m", AIOHTTP_APP, AIOHTTP_KINDS[name], ctx.root, "127.0.0.1", str(port)]
        # The program is this repository's (and the plugin imports aiosendfile from it).
        return launch(cmd, env=repo_env())
    if name in FLOORS:
        cmd = [sys.executable, "-m", FLOOR_SERVER, ctx.root, "127.0.0.1", str(port), *FLOORS[name]]
        return launch(cmd, env=repo_env())
    if name == "http.server":
        cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", ctx.root]
        # Its clean stop is Ctrl-C (exit 0); SIGTERM has no handler there.
        return launch(cmd, stop_signal=signal.SIGINT)
    if name == "caddy":
        caddy = tools["caddy"]
        assert caddy is not None
        # file-server disables caddy's admin endpoint; stdout/stderr: its JSON log (info level).
        cmd = [caddy, "file-server", "--root", ctx.root, "--listen", f"127.0.0.1:{port}"]
        return launch(cmd, env=dict(os.environ, HOME=ctx.tmp))
    if name in ("nginx", NGINX_AIO):
        nginx = tools["nginx"]
        assert nginx is not None
        ngx = Path(ctx.tmp, "nginx")
        ngx.mkdir(exist_ok=True)
        # As root the worker would switch to "nobody", who cannot read the 0700 temp dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf = ngx / "nginx.conf"
        ssl, tls_conf = (" ssl", NGINX_TLS.format(cert=tls[0], key=tls[1])) if tls is not None else ("", "")
        conf.write_text(
            NGINX_CONF.format(
                user=user,
                workers=ctx.workers,
                tmp=ngx,
                port=port,
                root=ctx.root,
                ssl=ssl,
                tls=tls_conf,
                aio="\n    aio threads;" if name == NGINX_AIO else "",
            )
        )
        cmd = [nginx, "-p", str(ngx), "-c", str(conf), "-e", str(ngx / "error.log")]
        # The master accepts into its backlog before the workers exist: wait for all processes.
        # SIGQUIT is nginx's graceful stop.
        return launch(cmd, processes=1 + ctx.workers, stop_signal=signal.SIGQUIT, error_log=ngx / "error.log")
    raise ValueError(name)


def _from_before(name: str, env: dict[str, str]) -> str:
    """Put the checkout named by :data:`BEFORE_ENV` first on *env*'s ``PYTHONPATH``; returns it, the
    directory to run the server in (``python -m`` puts the working directory before
    ``PYTHONPATH``: run from this repository, the "before" server was this tree's own). The
    ASGI rows' apps (``benchmarks.asgi_apps``) come from that checkout too."""
    before = os.environ.get(BEFORE_ENV)
    if not before:
        raise TrialError(f"{name} needs {BEFORE_ENV}=DIR, a checkout of the tree before")
    before = str(Path(before).resolve())
    env["PYTHONPATH"] = os.pathsep.join([before, env["PYTHONPATH"]])
    return before


def is_asgi(name: str) -> bool:
    """Whether contender ``name`` is one of the ASGI rows (``SERVER/APP``, maybe ``@before``)."""
    return name in ASGI_CONTENDERS or name in ASGI_MEMORY or name in ASGI_BEFORE


def asgi_versions(names: list[str]) -> dict[str, str | None]:
    """The versions of the ASGI servers, frameworks and parsers the rows ``names`` run."""
    wanted = {"uvicorn", "starlette", "uvloop", "httptools", "anyio"}
    for name in names:
        server, app = name.removesuffix(BEFORE_SUFFIX).split("/")
        wanted.add("granian" if server == "granian" else "uvicorn")
        if app == "fastapi":
            wanted.add("fastapi")
    out: dict[str, str | None] = {}
    for dist in sorted(wanted):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def asgi_command(server: str, app: str) -> list[str]:
    """ASGI server ``server``'s command line after the interpreter, serving ``app`` (of ASGI_APPS)."""
    target = f"benchmarks.asgi_apps:{ASGI_APPS[app]}"
    return [target if a == "APP" else a for a in ASGI_COMMANDS[server]]
