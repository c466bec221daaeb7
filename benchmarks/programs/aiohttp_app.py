"""A static directory in an aiohttp ``web.Application`` on uvloop, one process: the aiohttp contenders.

``python -m benchmarks.programs.aiohttp_app KIND DIR HOST PORT [--cert CERT --key KEY]``

KIND is what the application mounts at ``/``:

* ``static``: aiohttp's own ``app.router.add_static("/", DIR)``.
* ``plugin``: ``aiosendfile.aiohttp.add_static(app.router, "/", DIR)``, the plugin as a user mounts it.
* ``memory``: a reference, not a file server: the bytes of every file at DIR's top level, read at
  start and answered with ``web.Response`` (no stat, no open, no validators): the ceiling for any
  handler inside aiohttp, what aiohttp's own machinery costs per request.

``--cert`` and ``--key`` serve HTTPS (``tls_static``). ``web.run_app`` runs it with no access log,
no start-up banner, a 1 s shutdown timeout and a uvloop loop; SIGTERM or SIGINT stop it cleanly.
``aiosendfile`` is imported only for ``plugin``.
"""

from __future__ import annotations

import argparse
import os
import ssl

import uvloop
from aiohttp import web

__all__ = ["KINDS", "main", "make_app"]

KINDS = ("static", "plugin", "memory")


def _memory_routes(app: web.Application, directory: str) -> None:
    bodies: dict[str, bytes] = {}
    for entry in os.scandir(directory):
        if entry.is_file():
            with open(entry.path, "rb") as f:
                bodies[entry.name] = f.read()

    async def handle(request: web.Request) -> web.Response:
        body = bodies.get(request.match_info["name"])
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, content_type="application/octet-stream")

    app.router.add_get("/{name}", handle)


def make_app(kind: str, directory: str) -> web.Application:
    """The application of ``kind`` (one of :data:`KINDS`) serving ``directory`` at ``/``."""
    app = web.Application()
    if kind == "static":
        app.router.add_static("/", directory)
    elif kind == "plugin":
        from aiosendfile.aiohttp import add_static

        add_static(app.router, "/", directory)
    elif kind == "memory":
        _memory_routes(app, directory)
    else:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.programs.aiohttp_app", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("kind", choices=KINDS)
    p.add_argument("directory")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--cert", help="server certificate chain (PEM): serve HTTPS")
    p.add_argument("--key", help="the certificate's private key (PEM)")
    args = p.parse_args(argv)
    if (args.cert is None) != (args.key is None):
        p.error("--cert and --key go together")
    ssl_context = None
    if args.cert is not None:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(args.cert, args.key)
    web.run_app(
        make_app(args.kind, args.directory),
        host=args.host,
        port=args.port,
        ssl_context=ssl_context,
        access_log=None,
        print=None,
        shutdown_timeout=1.0,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
