"""``python -m aiosendfile send`` / ``recv``: a zero-copy file transfer pair with end-to-end checks.

The protocol is line-delimited JSON around one raw body:

1. sender → ``{"name", "size", "sha256"}``
2. receiver → ``{"offset", "prefix_sha256"}``. ``offset`` is what the receiver
   already has (``--resume``), else 0.
3. sender → ``{"start"}``: ``offset`` if the sender's first ``offset`` bytes hash
   the same, else 0 (the partial file is not ours: start over).
4. sender → ``size - start`` raw bytes (``sendfile``); the receiver writes them
   at ``start`` (``recvfile``).
5. receiver → ``{"ok", "sha256"}`` after hashing the whole file.

A mismatch, an early close or a full disk leaves the partial file in place and
says so. Nothing is silently corrupt.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from ._api import sendfile
from ._cli_common import address, destination
from ._recv import recvfile

__all__ = ("add_commands", "recv_main", "send_main")

LINE_LIMIT = 64 * 1024


class TransferFailed(Exception):
    """A transfer that did not complete; the message says why and what is left behind."""


def _hash_file(path: str, length: int | None = None) -> str:
    digest = hashlib.sha256()
    remaining = length
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            block = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest.hexdigest()


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def _read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    line = await reader.readline()
    if not line.endswith(b"\n"):
        raise TransferFailed("the peer closed the connection during the handshake")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise TransferFailed("malformed handshake message")
    return message


def _send_message(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")


class Progress:
    """A tqdm bar on a terminal, nothing otherwise; a one-line summary either way."""

    def __init__(self, total: int, initial: int, label: str) -> None:
        self.start = time.monotonic()
        self.initial = initial
        self.bar: Any = None
        if sys.stdout.isatty():
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=label)
        self.done = initial

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done

    def close(self) -> float:
        if self.bar is not None:
            self.bar.close()
        return time.monotonic() - self.start


def _summary(verb: str, moved: int, elapsed: float, extra: str) -> str:
    rate = moved / elapsed / 1e6 if elapsed > 0 else 0.0
    return f"{verb} {moved} bytes in {elapsed:.2f}s ({rate:.0f} MB/s){extra}"


def add_commands(commands: Any) -> None:
    """Add ``send`` and ``recv`` to the ``aiosendfile`` command line (*commands*: its subparsers)."""
    send = commands.add_parser("send", help="send a file to 'aiosendfile recv' (zero-copy, checksummed)")
    send.add_argument("file")
    send.add_argument("address", metavar="HOST:PORT", type=destination)
    send.set_defaults(run=send_main)
    recv = commands.add_parser("recv", help="receive one file from 'aiosendfile send' (zero-copy)")
    recv.add_argument("out", help="where to write the file")
    recv.add_argument(
        "--listen",
        default=("127.0.0.1", 9000),
        type=address,
        metavar="HOST:PORT",
        help="(default: 127.0.0.1:9000)",
    )
    recv.add_argument("--resume", action="store_true", help="keep a verified partial OUT and fetch the rest")
    recv.set_defaults(run=recv_main)


# -- send ------------------------------------------------------------------------------------


async def send_file(path: str, host: str, port: int) -> str:
    size = os.path.getsize(path)
    digest = await _in_thread(_hash_file, path)
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=LINE_LIMIT)
    except OSError as exc:
        raise TransferFailed(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
    try:
        _send_message(writer, {"name": os.path.basename(path), "size": size, "sha256": digest})
        offer = await _read_message(reader)
        offset = int(offer.get("offset", 0))
        start = 0
        if 0 < offset <= size and await _in_thread(_hash_file, path, offset) == offer.get("prefix_sha256"):
            start = offset
        _send_message(writer, {"start": start})
        progress = Progress(size, start, "send")
        with open(path, "rb") as f:
            await sendfile(writer, f, start, on_progress=lambda sent, _t: progress.update(start + sent))
        elapsed = progress.close()
        verdict = await _read_message(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    resumed = f", resumed at {start}" if start else ""
    if not verdict.get("ok"):
        raise TransferFailed(f"the receiver's checksum does not match (sha256 {verdict.get('sha256')})")
    return _summary("sent", size - start, elapsed, f"{resumed}; checksum verified by the receiver")


def send_main(args: Any) -> int:
    host, port = args.address
    try:
        print(asyncio.run(send_file(args.file, host, port)), flush=True)
    except TransferFailed as exc:
        print(f"aiosendfile send: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"aiosendfile send: {exc}", file=sys.stderr)
        return 1
    return 0


# -- recv ------------------------------------------------------------------------------------


async def receive_one(out: str, host: str, port: int, resume: bool, ready: Callable[[int], None]) -> str:
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            result = await _receive(reader, writer, out, resume)
        except BaseException as exc:
            if not done.done():
                done.set_exception(exc)
        else:
            if not done.done():
                done.set_result(result)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=LINE_LIMIT)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        return await done


async def _receive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, out: str, resume: bool) -> str:
    offer = await _read_message(reader)
    size, expected = int(offer["size"]), str(offer["sha256"])
    have = os.path.getsize(out) if resume and os.path.exists(out) else 0
    have = min(have, size)
    prefix = await _in_thread(_hash_file, out, have) if have else ""
    _send_message(writer, {"offset": have, "prefix_sha256": prefix})
    start = int((await _read_message(reader))["start"])
    progress = Progress(size, start, "recv")
    mode = "r+b" if start and os.path.exists(out) else "wb"
    f: IO[bytes]
    with open(out, mode) as f:
        f.truncate(start)
        try:
            await recvfile(
                reader,
                f,
                size - start,
                offset=start,
                on_progress=lambda got, _t: progress.update(start + got),
            )
            f.flush()
            os.fsync(f.fileno())
        except OSError as exc:
            kept = f.tell()
            progress.close()
            raise TransferFailed(f"{exc}; kept the first {kept} bytes in {out}") from exc
        except EOFError as exc:
            kept = f.tell()
            progress.close()
            raise TransferFailed(
                f"the sender disconnected; kept the first {kept} of {size} bytes in {out}"
            ) from exc
    elapsed = progress.close()
    actual = await _in_thread(_hash_file, out)
    ok = actual == expected
    _send_message(writer, {"ok": ok, "sha256": actual})
    await writer.drain()
    if not ok:
        raise TransferFailed(f"checksum mismatch: got {actual}, the sender has {expected}; kept {out}")
    resumed = f", resumed at {start}" if start else ""
    return _summary("received", size - start, elapsed, f"{resumed} into {out}; sha256 verified")


def recv_main(args: Any) -> int:
    host, port = args.listen

    def ready(bound: int) -> None:
        print(f"aiosendfile recv listening on {host}:{bound}, writing {args.out}", flush=True)

    try:
        print(asyncio.run(receive_one(args.out, host, port, args.resume, ready)), flush=True)
    except TransferFailed as exc:
        print(f"aiosendfile recv: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"aiosendfile recv: {exc}", file=sys.stderr)
        return 1
    return 0
