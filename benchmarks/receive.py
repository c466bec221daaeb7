"""Receive benchmark: one large upload into a file, ``recvfile`` vs ``StreamReader.read`` + ``write``.

The receiver is a fresh ``spawn``ed server process per trial (one event loop,
one connection). The sender is this process: blocking ``os.sendfile`` of a
page-cached file over loopback TCP, then it waits for the receiver's one-byte
acknowledgement, sent once every byte is in the destination file (written to
the page cache, not fsynced). Contenders, interleaved over ``--rounds`` rounds:

* ``recvfile-uvloop`` / ``recvfile-asyncio``: ``aiosendfile.recvfile(reader, f, size)``
  (splice socket -> pipe -> file where the kernel allows).
* ``read+write-uvloop`` / ``read+write-asyncio``: ``await reader.read(256 KiB)`` then
  ``f.write(chunk)`` until done, what an aiohttp upload handler does.

MB/s is the sender's: first byte handed to the kernel -> acknowledgement received.
CPU s/GB is the receiver process (all threads), connection accepted -> ack sent.
The destination file is checked (size, first and last MiB) after every trial.

Run from the repository root::

    python -m benchmarks.receive --quick
    python -m benchmarks.receive --size 512 --rounds 5 --json /tmp/out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from benchmarks.harness import GB, MB, MiB, TrialError
from benchmarks.harness.children import (
    client_then_result,
    recv_result,
    serve_on_contender_loop,
    serving_locally,
    spawned,
)
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.files import make_file, warm
from benchmarks.harness.measure import ClientWindow, LoopTicker, loop_name, measured, usage
from benchmarks.harness.report import finish_section, loop_trial_line, median_range, summary_row, table

CONTENDERS = ("recvfile-uvloop", "read+write-uvloop", "recvfile-asyncio", "read+write-asyncio")
READ_CHUNK = 256 * 1024
SUMMARIZED = ("mb_per_s", "cpu_s_per_gb", "loop_delay_p99_ms", "loop_delay_worst_ms", "other_load_cpus")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "receive.json"


async def _receive(conn: Connection, contender: str, dest: str, size: int, timeout: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ticker = LoopTicker()
    done: asyncio.Future[dict[str, Any]] = loop.create_future()
    zero_copy = contender.startswith("recvfile")
    if zero_copy:
        import aiosendfile

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            start = usage()
            with open(dest, "wb") as f:
                if zero_copy:
                    got = await aiosendfile.recvfile(reader, f, size)
                else:
                    got = 0
                    while got < size:
                        chunk = await reader.read(min(READ_CHUNK, size - got))
                        if not chunk:
                            break
                        f.write(chunk)
                        got += len(chunk)
            writer.write(b"K")
            await writer.drain()
            result = measured(start, usage(), got)
            writer.close()
            await writer.wait_closed()
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
        else:
            done.set_result(result)

    async with serving_locally(conn, handle, ticker):
        result = await asyncio.wait_for(done, timeout)
    result["loop_busy"] = ticker.busy(result["t_start"], result["t_end"])
    result["loop"] = loop_name(loop)
    return result


def _send_all(port: int, path: str, size: int, timeout: float) -> ClientWindow:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock, open(path, "rb") as f:
        sock.settimeout(None)
        window = ClientWindow()
        sent = 0
        while sent < size:
            n = os.sendfile(sock.fileno(), f.fileno(), sent, size - sent)
            if n == 0:
                raise TrialError(f"source file ended after {sent} bytes")
            sent += n
        sock.settimeout(timeout)
        ack = sock.recv(1)
        window.stop()
    if ack != b"K":
        raise TrialError(f"no acknowledgement from the receiver (got {ack!r})")
    return window


def _edges(path: str, size: int) -> tuple[bytes, bytes]:
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(MiB)).digest()
        f.seek(max(0, size - MiB))
        return head, hashlib.sha256(f.read(MiB)).digest()


@dataclass
class Sample:
    contender: str
    round: int
    ok: bool = False
    error: str | None = None
    bytes: int = 0
    mb_per_s: float | None = None
    sender_seconds: float | None = None
    receiver_seconds: float | None = None
    cpu_user_s: float | None = None
    cpu_sys_s: float | None = None
    cpu_s_per_gb: float | None = None  # receiver process user+sys per 10^9 bytes
    vol_ctx_switches: int | None = None
    loop_delay_worst_ms: float | None = None
    loop_delay_p99_ms: float | None = None
    sender_cpu_s: float | None = None
    other_cpu_s: float | None = None
    other_load_cpus: float | None = None
    loop: str | None = None


def run_trial(
    ctx: multiprocessing.context.SpawnContext,
    contender: str,
    rnd: int,
    src: str,
    dest: str,
    size: int,
    timeout: float,
    expected: tuple[bytes, bytes],
) -> Sample:
    sample = Sample(contender=contender, round=rnd, bytes=size)
    try:
        with spawned(ctx, serve_on_contender_loop, contender, _receive, dest, size, timeout) as (
            parent,
            proc,
        ):
            port = recv_result(parent, timeout, proc)
            sd, srv = client_then_result(
                parent, proc, timeout, lambda: _send_all(port, src, size, timeout), who="sender"
            )
            if srv["sent"] != size or os.path.getsize(dest) != size:
                raise TrialError(
                    f"receiver got {srv['sent']} bytes, file has {os.path.getsize(dest)}; want {size}"
                )
            if _edges(dest, size) != expected:
                raise TrialError("received file differs from the source (first or last MiB)")
    except TrialError as exc:
        sample.error = str(exc)
        return sample
    finally:
        with contextlib.suppress(OSError):
            os.unlink(dest)
    sample.ok = True
    sample.sender_seconds = sd.seconds
    sample.mb_per_s = size / sample.sender_seconds / MB
    sample.receiver_seconds = srv["t_end"] - srv["t_start"]
    sample.cpu_user_s, sample.cpu_sys_s = srv["cpu_user_s"], srv["cpu_sys_s"]
    sample.cpu_s_per_gb = (srv["cpu_user_s"] + srv["cpu_sys_s"]) * GB / size
    sample.vol_ctx_switches = srv["vol_ctx_switches"]
    sample.loop_delay_worst_ms = srv["loop_busy"]["worst_ms"]
    sample.loop_delay_p99_ms = srv["loop_busy"]["p99_ms"]
    sample.sender_cpu_s = sd.cpu_s
    sample.loop = srv["loop"]
    sample.other_cpu_s, sample.other_load_cpus = sd.others(srv["cpu_process_time_s"])
    return sample


def summarize(samples: list[Sample], contenders: list[str]) -> dict[str, dict[str, Any]]:
    return {name: summary_row([s for s in samples if s.contender == name], SUMMARIZED) for name in contenders}


def report(summary: dict[str, dict[str, Any]], size: int, rounds: int) -> str:
    rows = []
    base = summary.get(CONTENDERS[1], {}).get("mb_per_s_median")
    for name, r in summary.items():
        if not r["ok"]:
            rows.append([name, f"ERROR ({len(r['errors'])}/{r['runs']})", "", "", "", ""])
            continue
        rows.append(
            [
                name,
                median_range(r, "mb_per_s", ".0f"),
                median_range(r, "cpu_s_per_gb", ".3f"),
                f"{r['loop_delay_p99_ms_median']:.2f}",
                f"{r.get('other_load_cpus_median', math.nan):.2f}",
                f"{r['mb_per_s_median'] / base:.2f}x" if base else "n/a",
            ]
        )
    return "\n".join(
        [
            f"receive: one {size // MiB} MiB upload over loopback TCP into a file, {rounds} interleaved "
            "rounds (medians [min-max])",
            "",
            table(
                [
                    "receiver",
                    "MB/s",
                    "receiver CPU s/GB",
                    "loop p99 ms",
                    "other load CPUs",
                    f"vs {CONTENDERS[1]}",
                ],
                rows,
            ),
            "",
            "MB/s: sender, first byte -> receiver's ack (all bytes written to the file, not fsynced).",
            "CPU: receiver process user+sys per 10^9 bytes, accept -> ack sent.",
        ]
    )


def run(
    size_mib: int,
    rounds: int,
    contenders: list[str],
    *,
    directory: str | None = None,
    timeout: float = 300.0,
    log: IO[str] = sys.stderr,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the section; return its JSON document (also used by ``benchmarks.suite``)."""
    size = size_mib * MiB
    ctx = multiprocessing.get_context("spawn")
    started = datetime.now(timezone.utc)
    samples: list[Sample] = []
    say = progress or (lambda line: print(line, file=log, flush=True))
    with tempfile.TemporaryDirectory(prefix="aiosendfile-recv-", dir=directory) as tmp:
        src = make_file(tmp, size)
        warm(src)
        expected = _edges(src, size)
        dest = os.path.join(tmp, "received.bin")
        t_bench = time.perf_counter()
        for rnd in range(1, rounds + 1):
            for contender in rotated(contenders, rnd):
                s = run_trial(ctx, contender, rnd, src, dest, size, timeout, expected)
                samples.append(s)
                say(f"round {rnd}/{rounds}  {contender:<20} {loop_trial_line(s)}")
        elapsed = time.perf_counter() - t_bench
    summary = summarize(samples, contenders)
    return {
        "benchmark": "receive",
        "date": started.isoformat(timespec="seconds"),
        "params": {
            "size_bytes": size,
            "rounds": rounds,
            "contenders": contenders,
            "read_chunk": READ_CHUNK,
            "elapsed_s": elapsed,
        },
        "summary": summary,
        "report": report(summary, size, rounds),
        "samples": [asdict(s) for s in samples],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.receive", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="128 MiB, 1 round")
    p.add_argument(
        "--size", type=int, default=None, help="upload size in MiB (default 512; 128 with --quick)"
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; 1 with --quick)")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--dir", default=None, help="where the source and destination files go (default: temp)")
    args = p.parse_args(argv)
    args.size = args.size or (128 if args.quick else 512)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.contenders = comma_list(p, args.contenders, CONTENDERS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = run(args.size, args.rounds, args.contenders, directory=args.dir)
    return finish_section(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
