"""Fetch a file from ``examples/file_server.py`` and check its length.

python examples/file_client.py OUT [--port 8765]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time


async def fetch(out: str, host: str, port: int) -> int:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        reason = "nothing is listening there" if isinstance(exc, ConnectionRefusedError) else exc.strerror
        print(
            f"file_client: cannot connect to {host}:{port}: {reason or exc}"
            " (is examples/file_server.py running on that port?)",
            file=sys.stderr,
        )
        return 1
    header = await reader.readline()
    if not header.strip().isdigit():
        writer.close()
        what = f"{host}:{port} is not examples/file_server.py (it sent {header[:40]!r})"
        print(f"file_client: {what}", file=sys.stderr)
        return 1
    expected = int(header)
    received = 0
    start = time.perf_counter()
    with open(out, "wb") as f:
        while chunk := await reader.read(1 << 20):
            f.write(chunk)
            received += len(chunk)
    writer.close()
    elapsed = time.perf_counter() - start
    rate = received / elapsed / 1e6 if elapsed else 0.0
    status = "ok" if received == expected else f"SHORT (expected {expected})"
    print(f"received {received} bytes in {elapsed:.3f}s ({rate:.0f} MB/s): {status}")
    return 0 if received == expected else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    try:
        sys.exit(asyncio.run(fetch(args.out, args.host, args.port)))
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:  # the output file, or the connection mid-transfer
        print(f"file_client: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
