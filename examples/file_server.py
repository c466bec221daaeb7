"""A minimal file server: every client that connects gets FILE, zero-copy, then EOF.

    python examples/file_server.py FILE [--port 8765] [--loop uvloop|asyncio]

Pair it with ``examples/file_client.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

import aiosendfile


async def serve(path: str, host: str, port: int) -> None:
    size = os.path.getsize(path)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"%d\n" % size)  # a length prefix, so the client can check it got everything
            with open(path, "rb") as f:
                sent = await aiosendfile.sendfile(writer, f)
            print(f"sent {sent} bytes to {writer.get_extra_info('peername')}", flush=True)
        except (aiosendfile.SendfileError, ConnectionError) as exc:
            print(f"transfer failed after {getattr(exc, 'sent', 0)} bytes: {exc!r}", file=sys.stderr)
        finally:
            writer.close()

    try:
        server = await asyncio.start_server(handle, host, port)
    except OSError as exc:
        raise SystemExit(f"file_server: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    print(f"serving {path} ({size} bytes) on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto")
    args = parser.parse_args()
    if not os.path.isfile(args.file):
        raise SystemExit(f"file_server: {args.file}: not a file")
    runner = asyncio.run
    if args.loop != "asyncio":
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            if args.loop == "uvloop":
                raise
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop as quietly as on Ctrl-C
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve(args.file, args.host, args.port))


if __name__ == "__main__":
    main()
