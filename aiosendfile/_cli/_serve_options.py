"""``aiosendfile serve`` and ``aiosendfile hash-password``: their options (what each means, its
type and its check), for the ``aiosendfile`` parser. The commands are :mod:`._serve`'s."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import stat
from typing import Any

from .._serve._accesslog import FORMATS
from .._static._archive import DEFAULT_MAX_ENTRIES
from ._common import add_loop_option, in_words, is_number, port
from ._serve import MAX_WORKERS, hash_password_command, serve_command

__all__ = ("add_serve_command",)

_SERVE_DESCRIPTION = """\
Serve the files in DIRECTORY over HTTP (GET and HEAD), zero-copy with
sendfile(2). Ranges, conditional requests (ETag, Last-Modified) and
pre-compressed siblings (a.js.br, a.js.gz, chosen by Accept-Encoding) are
supported. A directory answers with its index.html, else with a listing
(sortable by name, date or size; as JSON with ?json or Accept:
application/json), or 403 under --no-listing.

Hidden by default: any path with a component starting with "." (/.env,
/.git/config) gets 404 and is not listed; only /.well-known/ is served.
Symlinks that lead outside DIRECTORY get 404 unless --follow-symlinks.

--tls-cert FILE (and --tls-key FILE, unless the key is in FILE) serves HTTPS
instead. OpenSSL encrypts on the connection's socket itself, as nginx does
without kernel TLS (a file is read once into memory, encrypted and written);
the banner says so, and whether this machine offers kernel TLS (not used
yet).

--access-log writes a line per response to stderr (Combined Log Format;
--access-log-format common or json for the others).
It never holds serving up: when stderr is not read, up to 1 MiB of lines
waits, later ones are dropped, then a line says how many.

Ctrl-C, SIGTERM or SIGHUP stops the server (exit status 0; SIGHUP says so
on stderr, and stays ignored if it was when serve started, as under nohup):
open connections get half a second to finish. SIGUSR1 and SIGUSR2 are
ignored, with a line on stderr: there is no log file to reopen (the log is
stderr) and nothing to reload. With --workers N, signals are for the first
process; a worker that dies is restarted, with a line on stderr, 0.1 s
later, then twice as late each time a new one dies within 30 s (up to 10 s)."""

_SERVE_EPILOG = """\
examples:
  aiosendfile serve                          the current directory on 127.0.0.1:8000
  aiosendfile serve ./public --no-listing    403 for folders that have no index.html
  aiosendfile serve site --host 0.0.0.0 --port 8080 --workers 4
                                             every interface, 4 processes

exit status: 0 when stopped by Ctrl-C/SIGTERM/SIGHUP; 2 for a bad argument (a
port outside 0-65535, --workers outside 1-1024, a DIRECTORY that is missing or
unreadable); 1 when the address cannot be listened on (in use, not this
machine's, or a port below 1024 without privileges), or a worker cannot start."""


def _workers(text: str) -> int:
    """``--workers``: a number of processes, 1 to :data:`MAX_WORKERS`."""
    value = text.strip()
    if not is_number(value) or not 1 <= int(value) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"a number of processes from 1 to {MAX_WORKERS}, not {text!r}")
    return int(value)


def _size(text: str) -> int:
    """``--max-upload-size``: bytes, or a number with K, M or G (powers of 1024)."""
    value = text.strip().upper().removesuffix("B")
    scale = 1
    if value[-1:] in ("K", "M", "G", "T"):
        scale = 1024 ** ("KMGT".index(value[-1]) + 1)
        value = value[:-1]
    if not is_number(value):
        raise argparse.ArgumentTypeError(f"a size in bytes (or with K, M, G), not {text!r}")
    return int(value) * scale


def _duration(text: str) -> float:
    """``--upload-expiry``: seconds, or a number with s, m, h or d."""
    value = text.strip().lower()
    scale = 1
    if value[-1:] in ("s", "m", "h", "d"):
        scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}[value[-1]]
        value = value[:-1]
    if not is_number(value) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"a time such as 3600, 30m, 12h or 1d, not {text!r}")
    return float(int(value) * scale)


def _path_prefix(text: str) -> str:
    """``--path-prefix``: a path as a proxy forwards it (``/files``), its last ``/`` dropped."""
    value = text.strip().rstrip("/")
    parts = value.split("/")[1:]
    if value and (
        not value.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or any(c in value for c in "%?#\\")
        or not value.isprintable()
    ):
        raise argparse.ArgumentTypeError(f"a path such as /files (no %, ?, # or . parts), not {text!r}")
    return value


def _count(text: str) -> int:
    """``--max-archive-entries``: a positive number."""
    value = text.strip()
    if not is_number(value) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"a positive number, not {text!r}")
    return int(value)


_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?")


def _host_name(text: str) -> str:
    """``--allow-host``: ``*``, a host name or address, or a domain with its subdomains
    (``.example.org``, ``*.example.org``). Anything else (a URL, an empty value, ``*.`` alone: an
    unset variable in ``*.$DOMAIN``) is refused, not read as some other rule."""
    value = text.strip().lower()
    if value == "*":
        return value
    name = value[2:] if value.startswith("*.") else value[1:] if value.startswith(".") else value
    name = name[:-1] if name.endswith(".") else name
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        ipaddress.ip_address(name)
        ok = name == value or f"[{name}]" == value
    except ValueError:
        ok = bool(name) and len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))
    if not ok:
        raise argparse.ArgumentTypeError(
            f"a host name, an address, .DOMAIN or *.DOMAIN for a domain, or '*', not {text!r}"
        )
    return value


def _directory(text: str) -> str:
    """DIRECTORY: an existing directory this process can list and open files in; its absolute path.

    Checked at start, not per request: a folder the server cannot read would
    otherwise start fine and answer 403 to everything.
    """
    path = os.path.abspath(text)
    try:
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
        os.stat(os.path.join(path, "."))  # x: files in it can be opened
        with os.scandir(path):  # r: it can be listed (index.html lookups, --show-index)
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot serve {text!r}: {in_words(exc)}") from None
    return path


def add_serve_command(commands: Any) -> None:
    """The ``serve`` subcommand of the ``aiosendfile`` parser."""
    serve = commands.add_parser(
        "serve",
        help="serve a directory over HTTP",
        description=_SERVE_DESCRIPTION,
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "directory",
        nargs="?",
        default=".",
        type=_directory,
        metavar="DIRECTORY",
        help="the directory to serve (default: the current one)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; 0.0.0.0 or :: for all)",
    )
    serve.add_argument(
        "--port", type=port, default=8000, help="port to listen on (default: %(default)s; 0 picks a free one)"
    )
    add_loop_option(serve)
    serve.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N",
        help="processes sharing the port with SO_REUSEPORT, restarted if one dies (default: %(default)s)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log every request to stderr; never blocks serving (default: off)",
    )
    serve.add_argument(
        "--access-log-format",
        choices=FORMATS,
        default=FORMATS[0],
        help="with --access-log: combined (Apache/nginx, the default), common (without Referer and "
        "User-Agent) or json (a JSON object a line, nginx's field names)",
    )
    serve.add_argument(
        "--no-listing",
        dest="listing",
        action="store_false",
        help="answer 403 for a directory that has no index.html (default: a listing)",
    )
    serve.add_argument(
        "--path-prefix",
        type=_path_prefix,
        default="",
        metavar="PATH",
        help="serve under PATH, as a reverse proxy forwards it (/files: /files/a.txt is DIRECTORY/a.txt, "
        "/files redirects to /files/, anything else is 404; default: /)",
    )
    serve.add_argument(
        "--no-archives",
        dest="archives",
        action="store_false",
        help="no folder archives (default: a listed folder's URL with ?tar or ?zip downloads it as a tar "
        "or stored zip archive, linked from its listing; off with --no-listing)",
    )
    serve.add_argument(
        "--max-archive-entries",
        type=_count,
        default=DEFAULT_MAX_ENTRIES,
        metavar="N",
        help="refuse (413) the archive of a folder holding more files and folders (default: %(default)s)",
    )
    serve.add_argument(
        "--max-archive-size",
        type=_size,
        metavar="SIZE",
        help="refuse (413) the archive of a folder holding more bytes (with K, M, G, T; default: no limit)",
    )
    # (Listings are on by default; a script's --show-index is still taken, and changes nothing.)
    serve.add_argument("--show-index", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument(
        "--show-dotfiles",
        action="store_true",
        help="serve and list names starting with '.' (default: 404, except /.well-known/)",
    )
    serve.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="serve symlinks that point outside DIRECTORY (default: 404)",
    )
    serve.add_argument(
        "--upload",
        action="store_true",
        help="let PUT and form posts (the listing's upload form, curl -F) write files (each appears whole, "
        "or not at all; needs --auth off loopback)",
    )
    serve.add_argument(
        "--overwrite", action="store_true", help="with --upload: an upload may replace a file (default: 409)"
    )
    serve.add_argument(
        "--max-upload-size",
        type=_size,
        metavar="SIZE",
        help="with --upload: refuse larger bodies with 413 (bytes, or with K, M, G; default: no limit)",
    )
    serve.add_argument(
        "--no-resumable",
        dest="resumable",
        action="store_false",
        help="with --upload: no resumable uploads (the IETF draft's and tus 1.0's; default: on, and the "
        "listing's uploads resume after a dropped connection)",
    )
    serve.add_argument(
        "--upload-expiry",
        type=_duration,
        metavar="TIME",
        help="with --upload: an unfinished resumable upload with no progress for this long is removed "
        "(seconds, or with m, h, d; default: 1d)",
    )
    serve.add_argument(
        "--max-partial-uploads",
        type=_count,
        metavar="N",
        help="with --upload: unfinished resumable uploads one user (or address) may have (default: 16)",
    )
    serve.add_argument(
        "--max-partial-size",
        type=_size,
        metavar="SIZE",
        help="with --upload: and their bytes, all together (default: 64G)",
    )
    serve.add_argument(
        "--auth",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="ask for this user and password (HTTP Basic); repeatable; the password may be a hash "
        "from 'aiosendfile hash-password USER'",
    )
    serve.add_argument(
        "--auth-file",
        metavar="FILE",
        help="users from FILE, one USER:HASH a line (from 'aiosendfile hash-password USER')",
    )
    serve.add_argument(
        "--public-read",
        action="store_true",
        help="with --auth/--auth-file: GET and HEAD need no password (only uploads will)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        type=_host_name,
        default=[],
        metavar="NAME",
        help="also answer requests for this host name (repeatable; .example.org: it and its subdomains; "
        "'*': any); by default only IP addresses, localhost, this machine's name and --host are "
        "answered, others get 421 (DNS rebinding)",
    )
    serve.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDR",
        help="a reverse proxy (an address or a network, repeatable) whose X-Forwarded-For names the "
        "client: the one --auth counts failed passwords against, the one --access-log writes, and "
        "the one --upload's shares of uploads in progress are counted for",
    )
    serve.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    serve.add_argument(
        "--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM; default: in FILE)"
    )
    serve.set_defaults(run=serve_command)
    hasher = commands.add_parser(
        "hash-password",
        help="print a USER:HASH line for serve --auth-file",
        description="Read a password (asked twice on a terminal, else one line from stdin) and "
        "print USER:HASH, a salted scrypt hash, for serve --auth-file or --auth.",
    )
    hasher.add_argument("user", metavar="USER", help="the user name (no ':')")
    hasher.set_defaults(run=hash_password_command)
