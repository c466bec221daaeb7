"""``aiosendfile serve``: the command (:func:`serve_command`), and ``hash-password``.

Checks the options, the directory and the TLS files, binds the address (errors show before
anything starts), prints the banner and runs the engine in this process
(:mod:`._serve_run`) or in ``--workers N`` forked processes that share the port with
``SO_REUSEPORT``, supervised by this one (:mod:`._supervisor`). The options are
:mod:`._serve_options`'; how stop signals are handled before the loop runs is in
:mod:`aiosendfile._cli._main`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from typing import Any
from urllib.parse import quote

from .. import __version__
from .._serve._listener import listening_socket
from ._common import announce, fail, in_words, loop_factory
from ._serve_run import PROG, drain_log, run_server, tls_context, tls_refusal
from ._supervisor import Supervisor

__all__ = ("MAX_WORKERS", "hash_password_command", "serve_command")

MAX_WORKERS = 1024


def hash_password_command(args: argparse.Namespace) -> int:
    from .._serve._auth import AuthError, hash_password, parse_entry

    prog = "aiosendfile hash-password"
    if ":" in args.user:
        return fail(prog, f"cannot use user {args.user!r}: a user name holds no ':'", 2)
    try:
        parse_entry(f"{args.user}:x")
    except AuthError as exc:
        return fail(prog, f"cannot use user {args.user!r}: {exc}", 2)
    except UnicodeError:  # (bytes that are no UTF-8 in the argument: surrogates)
        return fail(prog, "cannot use the user: it is not UTF-8 text", 2)
    if sys.stdin is not None and sys.stdin.isatty():
        import getpass

        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            return fail(prog, "the passwords differ", 2)
    else:
        line = sys.stdin.readline() if sys.stdin is not None else ""
        password = line[:-1] if line.endswith("\n") else line
    if not password:
        return fail(prog, "the password is empty", 2)
    try:
        line = f"{args.user}:{hash_password(password)}"
    except UnicodeError:  # (bytes that are no UTF-8 on stdin: surrogates)
        return fail(prog, "the password is not UTF-8 text", 2)
    if sys.stdout is None:
        return fail(prog, "cannot write the line: stdout is closed", 1)
    failed = announce(line)
    if failed is not None:  # (a full or broken stdout: `> /dev/full`, `| true`)
        return fail(prog, f"cannot write the line to stdout: {in_words(failed)}", 1)
    return 0


def _users(args: argparse.Namespace) -> tuple[tuple[bytes, Any], ...]:
    """The users of ``--auth`` and ``--auth-file`` (AuthError saying which cannot be used, and why)."""
    from .._serve._auth import AuthError, parse_entry, read_auth_file

    users = {}
    if args.auth_file:
        try:
            users.update(read_auth_file(args.auth_file))
        except (AuthError, OSError, UnicodeDecodeError) as exc:
            words = in_words(exc) if isinstance(exc, OSError) else str(exc)
            raise AuthError(f"--auth-file {args.auth_file}: {words}") from None
        if not users:  # (what a failed `hash-password alice > users` leaves: the server was open)
            raise AuthError(f"--auth-file {args.auth_file}: it holds no USER:HASH line")
    for entry in args.auth:
        try:
            user, secret = parse_entry(entry)
        except AuthError as exc:  # (the password is not repeated)
            raise AuthError(f"--auth {entry.partition(':')[0]}:...: {exc}") from None
        users[user] = secret
    return tuple(users.items())


#: What "no hard limit" is taken as: Linux's own ceiling (``fs.nr_open``'s default).
NO_HARD_LIMIT = 1 << 20


def raise_open_file_limit() -> None:
    """The soft ``RLIMIT_NOFILE`` raised to the hard one (workers inherit it).

    A server's connections, the files it sends and an archive's batch of files each take a
    descriptor, and the soft limit most systems give, 1,024, is a few hundred clients; the hard
    one is the administrator's. Go's runtime raises it so for every program; nginx has
    ``worker_rlimit_nofile``. Where the system refuses (macOS caps it below an unlimited hard
    limit), it stays as it was."""
    try:
        import resource
    except ImportError:  # (not on this system)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = NO_HARD_LIMIT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def serve_command(args: argparse.Namespace) -> int:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return fail(PROG, "needs httptools (pip install 'aiosendfile[serve]')", 2)
    directory = args.directory  # absolute, and checked readable by _directory
    _, loop_name = loop_factory(args.loop)
    if args.tls_key and not args.tls_cert:
        return fail(PROG, "--tls-key needs --tls-cert", 2)
    try:
        args.users = _users(args)
    except ValueError as exc:  # (an AuthError, or an OSError's words: what, and where)
        return fail(PROG, f"cannot use {exc}", 2)
    if args.public_read and not args.users:
        return fail(PROG, "--public-read needs --auth or --auth-file (who may upload)", 2)
    if args.trusted_proxy and not (args.users or args.access_log or args.upload):
        return fail(
            PROG,
            "--trusted-proxy goes with --auth or --auth-file (whose lockout it keys), --access-log"
            " or --upload (whose shares it keys)",
            2,
        )
    try:
        from .._serve._auth import TrustedProxies

        TrustedProxies(tuple(args.trusted_proxy))
    except ValueError as exc:
        return fail(PROG, f"cannot use --trusted-proxy: {exc}", 2)
    if args.access_log_format != "combined" and not args.access_log:
        return fail(PROG, "--access-log-format goes with --access-log", 2)
    resumable_options = (
        not args.resumable
        or args.upload_expiry is not None
        or args.max_partial_uploads is not None
        or args.max_partial_size is not None
    )
    if (args.overwrite or args.max_upload_size is not None or resumable_options) and not args.upload:
        return fail(
            PROG,
            "--overwrite, --max-upload-size, --no-resumable, --upload-expiry, --max-partial-uploads and "
            "--max-partial-size go with --upload",
            2,
        )
    if args.upload and importlib.util.find_spec("python_multipart") is None:
        return fail(PROG, "--upload needs python-multipart (pip install 'aiosendfile[serve]')", 2)
    if args.tls_cert:
        try:
            tls_context(args)  # checked here, so that a bad file shows before anything starts
        except OSError as exc:  # (ssl.SSLError is one)
            return fail(PROG, tls_refusal(exc, args.tls_cert, args.tls_key), 2)

    raise_open_file_limit()
    multi = args.workers > 1
    # Bind here first: errors (port in use) show before any worker starts, and with
    # port 0 this picks the port every worker then shares. With workers, this socket
    # only holds the port: it never listens, so the kernel gives it no connections.
    try:
        if multi:  # (bound alone first: another server's SO_REUSEPORT socket would share the port)
            with listening_socket(args.host, args.port, listen=False) as alone:
                args.port = alone.getsockname()[1]
        sock = listening_socket(args.host, args.port, reuse_port=multi, listen=not multi)
    except (OSError, UnicodeError) as exc:  # (UnicodeError: a host name IDNA cannot encode)
        return fail(PROG, f"cannot listen on {args.host}:{args.port}: {in_words(exc)}")
    host, port = sock.getsockname()[:2]
    if args.upload and not args.users and not _is_loopback(host):
        sock.close()
        return fail(PROG, f"--upload on {host} lets anyone write files: add --auth USER:PASSWORD", 2)
    scheme = "https" if args.tls_cert else "http"
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{quote(args.path_prefix)}/"
    banner = (
        f"aiosendfile {__version__} serving {directory} at {url} "
        f"({loop_name}, {args.workers} worker{'s' if multi else ''}; Ctrl-C to stop)"
    )
    if args.tls_cert:
        from .._serve._tls_rules import tls_path

        banner += f"\n{tls_path()}"
    if args.upload:
        limit = "" if args.max_upload_size is None else f", up to {args.max_upload_size} bytes"
        verb = "write and replace" if args.overwrite else "write"
        banner += f"\nuploads: PUT and the listing's form (POST) {verb} files{limit}"
        if args.resumable:
            banner += "; resumable (IETF draft, tus 1.0)"
    if args.users:
        n = len(args.users)
        who = f"{n} user{'s' if n > 1 else ''}"
        reads = "GET and HEAD are open (--public-read)" if args.public_read else "every request needs one"
        banner += f"\npasswords (HTTP Basic): {who}; {reads}"
        if not args.tls_cert and not _is_loopback(host):
            banner += (
                "\nwarning: over plain HTTP on a non-loopback address, passwords cross the network in"
                " clear text: add --tls-cert FILE"
            )
    if not multi:

        def ready(error: str) -> None:
            if error:
                fail(PROG, f"cannot start: {error}")
            else:
                announce(banner)

        return run_server(args, directory, sock, worker=False, ready=ready)
    with sock:
        status = Supervisor(args, directory, host, port, sock).run(banner)
    drain_log()
    return status
