"""Client side of the stress tests, run as a separate process so the server's memory is measured alone.

``python stress_clients.py download CONFIG.json``: concurrent downloads, each
checked against its SHA-256; prints one JSON line with the results.

``python stress_clients.py slow CONFIG.json``: opens connections that send a
request (or only part of its headers) and then never read; prints ``ready``,
adds one header byte per dribbler each second, and when stdin closes prints a
JSON line saying how many connections the server had closed meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import ssl
import sys
import time
from typing import Any


def _ctx(config: dict[str, Any]) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=config["ca"]) if config.get("ca") else None


async def download(config: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    ctx = _ctx(config)
    base = config["base"]
    in_flight = peak = 0
    go = asyncio.Event()

    async def one(session: aiohttp.ClientSession, path: str, size: int, digest: str) -> None:
        nonlocal in_flight, peak
        await go.wait()
        async with session.get(base + path) as resp:
            if resp.status != 200 or int(resp.headers["Content-Length"]) != size:
                raise AssertionError(f"{path}: {resp.status} {resp.headers.get('Content-Length')}")
            in_flight += 1
            peak = max(peak, in_flight)
            h = hashlib.sha256()
            got = 0
            async for chunk in resp.content.iter_chunked(2**16):
                h.update(chunk)
                got += len(chunk)
            in_flight -= 1
        if got != size or h.hexdigest() != digest:
            raise AssertionError(f"{path}: {got} bytes, digest mismatch={h.hexdigest() != digest}")

    connector = aiohttp.TCPConnector(limit=0, ssl=ctx if ctx else False)
    start = time.monotonic()
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=400), auto_decompress=False
    ) as session:
        tasks = [asyncio.create_task(one(session, *job)) for job in config["jobs"]]
        await asyncio.sleep(0)
        go.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    return {
        "ok": len(results) - len(errors),
        "errors": errors[:10],
        "error_count": len(errors),
        "peak_in_flight": peak,
        "seconds": time.monotonic() - start,
    }


async def slow(config: dict[str, Any]) -> dict[str, Any]:
    ctx = _ctx(config)
    host, port = config["host"], config["port"]
    full, partial = config["request"].encode(), config["partial"].encode()
    writers: list[asyncio.StreamWriter] = []
    dribblers: list[asyncio.StreamWriter] = []
    sem = asyncio.Semaphore(100)

    async def open_one(i: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        async with sem:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            _, writer = await asyncio.open_connection(
                sock=sock, ssl=ctx, server_hostname="localhost" if ctx else None, limit=4096
            )
        dribbling = i < config["dribblers"]
        writer.write(partial if dribbling else full)
        writer.transport.pause_reading()  # never read
        writers.append(writer)
        if dribbling:
            dribblers.append(writer)

    await asyncio.gather(*(open_one(i) for i in range(config["clients"])))
    print("ready", flush=True)
    stdin_closed = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    while not stdin_closed.done():
        for w in dribblers:
            if not w.transport.is_closing():
                w.write(b"X")
        await asyncio.wait([stdin_closed], timeout=1)
    closed = sum(1 for w in writers if w.transport.is_closing())
    for w in writers:
        w.transport.abort()
    await asyncio.sleep(0.1)
    return {"clients": len(writers), "closed_by_server": closed}


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        config = json.load(f)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    result = runner(download(config) if mode == "download" else slow(config))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
