"""``aiosendfile send``: announce a file, resume where the receiver's partial copy allows, send the
rest zero-copy, and exit 0 only when the receiver's checksum matches (see :mod:`._protocol`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from typing import IO, Any

from .._api import sendfile
from .._cli._common import in_words
from .._errors import FileTruncatedError
from ._protocol import (
    FAREWELL_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    HASH_RATE,
    IDLE_TIMEOUT,
    LINE_LIMIT,
    TransferFailed,
    is_int,
    json_object,
    printable,
)
from ._session import Idle, Progress, hash_file, in_thread, run, send_message, summary, until_idle

__all__ = ("send_file", "send_main")


class _Sending:
    """What the sender has done so far, for the line it prints when interrupted."""

    def __init__(self) -> None:
        self.size: int | None = None
        self.start = 0
        self.sent: int | None = None  # body bytes sent, once the body started


def _open_source(path: str) -> IO[bytes]:
    """FILE opened for reading: a regular file only. O_NONBLOCK on the open: a FIFO's waited for a
    writer for ever, on the loop's thread, its signals unheard; it is refused as any non-file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TransferFailed(f"cannot read {path}: {in_words(exc)}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory; send one file" if stat.S_ISDIR(mode) else "not a regular file"
            raise TransferFailed(f"{path} is {kind}")
        os.set_blocking(fd, True)
        return open(fd, "rb", closefd=True)  # (the caller closes it)
    except BaseException:
        os.close(fd)
        raise


async def _reply(
    reader: asyncio.StreamReader, host: str, port: int, refused: str, within: float
) -> dict[str, Any]:
    """The receiver's next line, within *within* seconds; its ``error`` (or a broken reply, or
    none in time) as a TransferFailed."""
    try:
        line = await asyncio.wait_for(reader.readline(), within)
    except asyncio.TimeoutError:
        raise TransferFailed(
            f"{host}:{port} said nothing for {within:.3g}s (is 'aiosendfile recv' there?)"
        ) from None
    except ValueError as exc:  # over the line limit
        raise TransferFailed(f"{host}:{port} sent a reply too long to be from 'aiosendfile recv'") from exc
    except OSError as exc:
        raise TransferFailed(f"the receiver dropped the connection: {in_words(exc)}") from exc
    if not line.endswith(b"\n"):
        raise TransferFailed(
            "the receiver closed the connection without a word (busy, or not 'aiosendfile recv'?)"
        )
    message = json_object(line)
    if message is None:
        raise TransferFailed(
            f"{host}:{port} does not speak the protocol: is 'aiosendfile recv' listening there?"
        )
    if "error" in message:
        raise TransferFailed(f"{refused}: {printable(message['error'])}")
    return message


async def _last_word(reader: asyncio.StreamReader) -> str | None:
    """After a send failed: the ``error`` line the receiver left, if it did (it says why)."""
    with contextlib.suppress(Exception):
        line = await asyncio.wait_for(reader.readline(), FAREWELL_TIMEOUT)
        message = json_object(line)
        if message is not None and "error" in message:
            return printable(message["error"])
    return None


async def send_file(
    path: str,
    host: str,
    port: int,
    state: _Sending | None = None,
    handshake: float = HANDSHAKE_TIMEOUT,
    idle: float = IDLE_TIMEOUT,
) -> str:
    """Send *path*: the connection and each handshake reply within *handshake* seconds, the body
    never without progress for *idle* seconds (a silent or stalled receiver held it for ever)."""
    state = state or _Sending()
    with _open_source(path) as f:
        size = os.fstat(f.fileno()).st_size
        digest = await in_thread(hash_file, path, size)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=LINE_LIMIT), handshake
            )
        except asyncio.TimeoutError:
            raise TransferFailed(f"cannot connect to {host}:{port}: no answer in {handshake:g}s") from None
        except OSError as exc:
            raise TransferFailed(f"cannot connect to {host}:{port}: {in_words(exc)}") from exc
        try:
            return await _send_over(f, path, size, digest, reader, writer, host, port, state, handshake, idle)
        finally:
            writer.transport.abort()


async def _send_over(
    f: IO[bytes],
    path: str,
    size: int,
    digest: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    host: str,
    port: int,
    state: _Sending,
    handshake: float,
    idle: float,
) -> str:
    send_message(writer, {"name": os.path.basename(path), "size": size, "sha256": digest})
    # (with --resume, the receiver first hashes the partial OUT it offers, at most this file's size)
    offer = await _reply(
        reader, host, port, "the receiver refused the transfer", handshake + size / HASH_RATE
    )
    if "notice" in offer:
        print(
            f"aiosendfile send: the receiver says: {printable(offer['notice'])}", file=sys.stderr, flush=True
        )
    offset = offer.get("offset", 0)
    if not is_int(offset) or offset < 0:
        raise TransferFailed(f"{host}:{port} offered a malformed resume offset {offset!r}")
    start = 0
    if 0 < offset <= size:
        if await in_thread(hash_file, path, offset) == offer.get("prefix_sha256"):
            start = offset
        else:
            print(
                f"aiosendfile send: the receiver's partial file ({offset} bytes) is not the start of "
                f"{path}: sending it all again",
                file=sys.stderr,
                flush=True,
            )
    send_message(writer, {"start": start})
    state.size, state.start, state.sent = size, start, 0
    progress = Progress(size, start, "send")

    loop = asyncio.get_running_loop()
    last = loop.time()

    def sent_so_far(sent: int, _total: int | None) -> None:
        nonlocal last
        last = loop.time()
        state.sent = sent
        progress.update(start + sent)

    try:
        await until_idle(
            sendfile(writer, f, start, size - start, on_progress=sent_so_far), idle, lambda: last
        )
    except Idle:
        moved = start + (state.sent or 0)
        raise TransferFailed(
            f"{host}:{port} took nothing for {idle:g}s; stopped after {moved} of {size} bytes "
            "(the receiver keeps what arrived)"
        ) from None
    except FileTruncatedError as exc:
        raise TransferFailed(
            f"{path} got shorter while it was being sent, after {start + exc.sent} of its {size} bytes; "
            "the receiver keeps what arrived"
        ) from exc
    except OSError as exc:
        why = await _last_word(reader)
        if why is not None:
            raise TransferFailed(f"the receiver stopped the transfer: {why}") from exc
        moved = getattr(exc, "sent", state.sent) or 0
        raise TransferFailed(
            f"the transfer broke off after {start + moved} of {size} bytes: {in_words(exc)}"
        ) from exc
    finally:
        elapsed = progress.close()
    state.sent = size - start
    # (the receiver reads OUT back first: minutes for 20 GiB on a slow disk)
    within = idle + size / HASH_RATE
    verdict = await _reply(reader, host, port, "the receiver stopped the transfer", within)
    resumed = f", resumed at {start}" if start else ""
    if verdict.get("ok") is not True:
        raise TransferFailed(f"the receiver's checksum does not match (sha256 {verdict.get('sha256')})")
    return summary("sent", size - start, elapsed, f"{resumed}; checksum verified by the receiver")


def send_main(args: Any) -> int:
    host, port = args.address
    state = _Sending()

    def interrupted() -> str:
        if state.sent is None or state.size is None:
            return "interrupted before sending any of the file"
        return (
            f"interrupted after sending {state.start + state.sent} of {state.size} bytes; the receiver "
            "keeps what arrived: run 'recv --resume' and send again to finish"
        )

    sending = send_file(args.file, host, port, state, args.handshake_timeout, args.idle_timeout)
    return run("aiosendfile send", args.loop, sending, interrupted)
