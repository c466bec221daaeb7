"""``python -m aiosendfile send`` / ``recv``: a zero-copy file transfer pair with end-to-end checks.

The protocol is line-delimited JSON (each line at most 64 KiB) around one raw body:

1. sender → ``{"name", "size", "sha256"}``. ``name`` is informational (the
   receiver writes to its OUT, never to ``name``); ``size`` an int 0..2**63-1;
   ``sha256`` 64 hex digits.
2. receiver → ``{"offset", "prefix_sha256"}``. ``offset`` is the size of OUT
   with ``--resume`` when that is no more than ``size``, else 0; ``prefix_sha256``
   hashes all of OUT (it is ``""`` when ``offset`` is 0). An optional
   ``"notice"`` says why the receiver starts over (the sender prints it).
3. sender → ``{"start"}``: ``offset`` if the sender's first ``offset`` bytes hash
   the same, else 0 (the partial file is not ours: start over). Any other
   value is refused.
4. sender → ``size - start`` raw bytes (``sendfile``); the receiver writes them
   at ``start`` (``recvfile``).
5. receiver → ``{"ok", "sha256"}`` after hashing the whole file.

Errors: in place of any of its lines, the receiver may send ``{"error": "..."}``
(busy with another transfer, a start it did not offer, a malformed message, a
write that failed, ...) and close; the sender prints the text. A sender that
predates this line sees a closed connection instead, as before.

Trust: the receiver takes one file from the first peer that completes a valid
handshake. Anything else that connects (a port scanner, an HTTP client, a
garbage or silent peer) is logged in one line and dropped, and the receiver
keeps waiting; a handshake must complete within ``--handshake-timeout``. While a
transfer runs, other connections are refused. OUT is opened only once a sender
has announced a valid file and chosen an offered start; with ``--resume`` the
only hash a peer can obtain is that of the whole of OUT. There is no
authentication: anyone who can connect can send the file, so listen on
127.0.0.1 (the default) or a network you trust.

A mismatch, an early close, a failed write or a signal (Ctrl-C, SIGTERM: exit
130/143) leaves OUT holding exactly the bytes received, flushed, and says so;
``recv --resume`` continues it. Nothing is silently corrupt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import IO, Any, TypeGuard, TypeVar

from ._api import sendfile
from ._cli import _loop_factory
from ._cli_common import address, destination, fail, in_words
from ._errors import FileTruncatedError
from ._recv import recvfile

__all__ = ("add_commands", "recv_main", "send_main")

LINE_LIMIT = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0  # seconds a peer has for each handshake line
IDLE_TIMEOUT = 60.0  # seconds a body may stop coming before the transfer ends (nginx: client_body_timeout)
HASH_RATE = 50e6  # bytes/s: the sender gets extra time to hash the prefix it was offered
MAX_SIZE = 2**63 - 1
MAX_PENDING = 64  # connections in their handshake at once; more are dropped
FAREWELL_TIMEOUT = 1.0  # seconds a refused peer gets to read our error before we close
DRAIN_TIMEOUT = 5.0  # seconds we keep reading a body we cannot write, so the sender hears why
BUSY = "busy: another transfer is in progress; try again when it is done"
_SHA256 = re.compile(r"[0-9a-fA-F]{64}\Z")
_STOP = threading.Event()  # set on SIGINT/SIGTERM: hashing threads give up


T = TypeVar("T")


class TransferFailed(Exception):
    """A transfer that did not complete; the message says why and what is left behind."""


class BadPeer(Exception):
    """A peer that does not speak the protocol (or breaks it): logged in one line and dropped."""


class _Idle(Exception):
    """The body stopped coming for the idle timeout."""


async def _until_idle(aw: Awaitable[T], idle: float, last_activity: Callable[[], float]) -> T:
    """Await *aw*; if *last_activity()* (a loop time) falls *idle* seconds behind, cancel it and
    raise :class:`_Idle`. *aw* has always settled when this returns or raises (a cancelled
    ``recvfile`` leaves OUT consistent only once it has)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    try:
        while True:
            left = last_activity() + idle - loop.time()
            if left <= 0:
                raise _Idle()
            await asyncio.wait({task}, timeout=left)
            if task.done():
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: an error raced with the verdict is not logged as lost


class Refused(BadPeer):
    """A well-formed request we cannot take (no room for the file): said, logged, dropped."""


def _hash_file(path: str, length: int | None = None) -> str:
    digest = hashlib.sha256()
    remaining = length
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            if _STOP.is_set():
                raise OSError("interrupted")
            block = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest.hexdigest()


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _send_message(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _peer(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        host = f"[{name[0]}]" if ":" in str(name[0]) else name[0]
        return f"{host}:{name[1]}"
    return str(name or "a peer")


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
            self.bar = None
        return time.monotonic() - self.start


def _summary(verb: str, moved: int, elapsed: float, extra: str) -> str:
    rate = moved / elapsed / 1e6 if elapsed > 0 else 0.0
    return f"{verb} {moved} bytes in {elapsed:.2f}s ({rate:.0f} MB/s){extra}"


# -- the command line -------------------------------------------------------------------------

_SEND_HELP = """\
Send FILE to a waiting 'aiosendfile recv' at HOST:PORT, zero-copy (sendfile).

The receiver checks the SHA-256 of what it wrote and reports back; send exits
0 only when it matches. If the receiver already holds the start of FILE (it
runs with --resume after an interrupted transfer), only the rest is sent.
"""
_SEND_EPILOG = """\
examples:
  aiosendfile send big.iso 192.0.2.7:9000     to 'aiosendfile recv big.iso --listen 0.0.0.0:9000'
  aiosendfile send big.iso :9000              to a receiver on this machine (127.0.0.1)

exit status: 0 sent and verified; 1 failed (the message says why); 2 bad
arguments; 130/143 interrupted by Ctrl-C/SIGTERM (the receiver keeps what
arrived: run 'recv --resume' and send again to finish).
"""
_RECV_HELP = """\
Wait for one file from 'aiosendfile send', write it to OUT zero-copy (splice),
check its SHA-256, then exit.

Only a sender that completes the handshake is served. Anything else that
connects (a port scanner, an HTTP request, a peer that says nothing) is logged
in one line and dropped, and recv keeps waiting. While a transfer runs, other
connections are refused. There is no authentication: anyone who can connect
can send the file, so listen on 127.0.0.1 (the default) or a trusted network.
"""
_RECV_EPILOG = """\
examples:
  aiosendfile recv big.iso --listen 0.0.0.0:9000      accept from other machines
  aiosendfile recv big.iso --resume                   continue an interrupted transfer
  aiosendfile recv big.iso --force                    overwrite an existing big.iso

exit status: 0 received and verified; 1 failed (OUT keeps the bytes received,
and the message says how many); 2 bad arguments or unusable OUT; 130/143
interrupted by Ctrl-C/SIGTERM (OUT keeps the bytes received: --resume continues).
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"a number of seconds greater than 0, not {text!r}")
    return value


def _add_loop(parser: Any) -> None:
    parser.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="event loop (default: auto, which is uvloop when it is installed)",
    )


def add_commands(commands: Any) -> None:
    """Add ``send`` and ``recv`` to the ``aiosendfile`` command line (*commands*: its subparsers)."""
    raw = argparse.RawDescriptionHelpFormatter
    send = commands.add_parser(
        "send",
        help="send a file to 'aiosendfile recv' (zero-copy, checksummed)",
        description=_SEND_HELP,
        epilog=_SEND_EPILOG,
        formatter_class=raw,
    )
    send.add_argument("file", metavar="FILE", help="the file to send (a regular file)")
    send.add_argument(
        "address",
        metavar="HOST:PORT",
        type=destination,
        help="where 'aiosendfile recv' listens, e.g. 192.0.2.7:9000 (no host: 127.0.0.1)",
    )
    _add_loop(send)
    send.set_defaults(run=send_main)

    recv = commands.add_parser(
        "recv",
        help="receive one file from 'aiosendfile send' (zero-copy)",
        description=_RECV_HELP,
        epilog=_RECV_EPILOG,
        formatter_class=raw,
    )
    recv.add_argument(
        "out",
        metavar="OUT",
        help="the file to write; its directory must exist. An existing OUT is refused "
        "unless --force or --resume is given",
    )
    recv.add_argument(
        "--listen",
        default=("127.0.0.1", 9000),
        type=address,
        metavar="HOST:PORT",
        help="where to listen (default: 127.0.0.1:9000, this machine only; 0.0.0.0:9000 "
        "accepts from any machine; port 0 picks a free one)",
    )
    existing = recv.add_mutually_exclusive_group()
    existing.add_argument(
        "--resume",
        action="store_true",
        help="keep an existing OUT and fetch only the rest, if it is the start of the file being "
        "sent (else start over, and say so)",
    )
    existing.add_argument("--force", action="store_true", help="overwrite an existing OUT")
    recv.add_argument(
        "--handshake-timeout",
        type=_seconds,
        default=HANDSHAKE_TIMEOUT,
        metavar="SECONDS",
        help=f"drop a peer that takes longer than this to send a handshake line "
        f"(default: {HANDSHAKE_TIMEOUT:g})",
    )
    recv.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=IDLE_TIMEOUT,
        metavar="SECONDS",
        help="end a transfer whose data stops coming for this long; OUT keeps what arrived "
        f"(default: {IDLE_TIMEOUT:g})",
    )
    _add_loop(recv)
    recv.set_defaults(run=recv_main)


def _run(prog: str, loop: str, main: Coroutine[Any, Any, str], interrupted: Callable[[], str]) -> int:
    """Run *main* on the chosen loop. SIGINT/SIGTERM cancel every task; once they have settled
    (a receiver has flushed OUT), *interrupted()* is printed in one line and the exit status is
    130/143."""
    factory, _ = _loop_factory(loop)
    event_loop = factory()
    signalled: list[int] = []

    def on_signal(signum: int) -> None:
        if signalled:
            return  # already stopping
        signalled.append(signum)
        _STOP.set()
        for task in asyncio.all_tasks(event_loop):
            task.cancel()

    outcome: str | BaseException
    try:
        task = event_loop.create_task(main)
        for signum in (signal.SIGINT, signal.SIGTERM):
            event_loop.add_signal_handler(signum, on_signal, signum)
        try:
            outcome = event_loop.run_until_complete(task)
        except (asyncio.CancelledError, TransferFailed) as exc:
            if not signalled and not isinstance(exc, TransferFailed):
                raise
            outcome = exc
        except Exception as exc:  # one we did not foresee: still one line, never a traceback
            outcome = TransferFailed(f"unexpected error: {in_words(exc)} ({type(exc).__name__})")
        finally:
            _finish(event_loop)
            for signum in (signal.SIGINT, signal.SIGTERM):
                event_loop.remove_signal_handler(signum)
    except KeyboardInterrupt:  # before our handler was installed
        signalled[:] = [signal.SIGINT]
        outcome = asyncio.CancelledError()
    finally:
        event_loop.close()
    if isinstance(outcome, str):
        print(outcome, flush=True)
        return 0
    if signalled:
        return fail(prog, interrupted(), 128 + signalled[0])
    return fail(prog, str(outcome))


def _finish(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does on the way out: cancel what is left, wait for it and the threads."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())


# -- send ------------------------------------------------------------------------------------


class _Sending:
    """What the sender has done so far, for the line it prints when interrupted."""

    def __init__(self) -> None:
        self.size: int | None = None
        self.start = 0
        self.sent: int | None = None  # body bytes sent, once the body started


def _open_source(path: str) -> IO[bytes]:
    try:
        f = open(path, "rb")  # noqa: SIM115 - the caller closes it
    except IsADirectoryError:
        raise TransferFailed(f"{path} is a directory; send one file") from None
    except OSError as exc:
        raise TransferFailed(f"cannot read {path}: {in_words(exc)}") from exc
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        kind = "a directory; send one file" if os.path.isdir(path) else "not a regular file"
        raise TransferFailed(f"{path} is {kind}")
    return f


async def _reply(reader: asyncio.StreamReader, host: str, port: int, refused: str) -> dict[str, Any]:
    """The receiver's next line; its ``error`` (or a broken reply) as a TransferFailed."""
    try:
        line = await reader.readline()
    except ValueError as exc:  # over the line limit
        raise TransferFailed(f"{host}:{port} sent a reply too long to be from 'aiosendfile recv'") from exc
    except OSError as exc:
        raise TransferFailed(f"the receiver dropped the connection: {in_words(exc)}") from exc
    if not line.endswith(b"\n"):
        raise TransferFailed(
            "the receiver closed the connection without a word (busy, or not 'aiosendfile recv'?)"
        )
    message = _json_object(line)
    if message is None:
        raise TransferFailed(
            f"{host}:{port} does not speak the protocol: is 'aiosendfile recv' listening there?"
        )
    if "error" in message:
        raise TransferFailed(f"{refused}: {_printable(message['error'])}")
    return message


def _json_object(line: bytes) -> dict[str, Any] | None:
    """A protocol line as a JSON object; None for anything else. (``json`` raises
    RecursionError, not ValueError, on deep nesting such as 5000 "[" in one line.)"""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _printable(text: Any, limit: int = 300) -> str:
    """What the receiver said, safe for a terminal: control characters (escape sequences that
    could rewrite the screen) shown escaped, and no longer than *limit*."""
    return _clip("".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text)), limit)


async def _last_word(reader: asyncio.StreamReader) -> str | None:
    """After a send failed: the ``error`` line the receiver left, if it did (it says why)."""
    with contextlib.suppress(Exception):
        line = await asyncio.wait_for(reader.readline(), FAREWELL_TIMEOUT)
        message = _json_object(line)
        if message is not None and "error" in message:
            return _printable(message["error"])
    return None


async def send_file(path: str, host: str, port: int, state: _Sending | None = None) -> str:
    state = state or _Sending()
    with _open_source(path) as f:
        size = os.fstat(f.fileno()).st_size
        digest = await _in_thread(_hash_file, path, size)
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=LINE_LIMIT)
        except OSError as exc:
            raise TransferFailed(f"cannot connect to {host}:{port}: {in_words(exc)}") from exc
        try:
            return await _send_over(f, path, size, digest, reader, writer, host, port, state)
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
) -> str:
    _send_message(writer, {"name": os.path.basename(path), "size": size, "sha256": digest})
    offer = await _reply(reader, host, port, "the receiver refused the transfer")
    if "notice" in offer:
        print(
            f"aiosendfile send: the receiver says: {_printable(offer['notice'])}", file=sys.stderr, flush=True
        )
    offset = offer.get("offset", 0)
    if not _is_int(offset) or offset < 0:
        raise TransferFailed(f"{host}:{port} offered a malformed resume offset {offset!r}")
    start = 0
    if 0 < offset <= size:
        if await _in_thread(_hash_file, path, offset) == offer.get("prefix_sha256"):
            start = offset
        else:
            print(
                f"aiosendfile send: the receiver's partial file ({offset} bytes) is not the start of "
                f"{path}: sending it all again",
                file=sys.stderr,
                flush=True,
            )
    _send_message(writer, {"start": start})
    state.size, state.start, state.sent = size, start, 0
    progress = Progress(size, start, "send")

    def sent_so_far(sent: int, _total: int | None) -> None:
        state.sent = sent
        progress.update(start + sent)

    try:
        await sendfile(writer, f, start, size - start, on_progress=sent_so_far)
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
    verdict = await _reply(reader, host, port, "the receiver stopped the transfer")
    resumed = f", resumed at {start}" if start else ""
    if verdict.get("ok") is not True:
        raise TransferFailed(f"the receiver's checksum does not match (sha256 {verdict.get('sha256')})")
    return _summary("sent", size - start, elapsed, f"{resumed}; checksum verified by the receiver")


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

    return _run("aiosendfile send", args.loop, send_file(args.file, host, port, state), interrupted)


# -- recv ------------------------------------------------------------------------------------


def check_out(out: str, *, resume: bool, force: bool) -> str | None:
    """Why OUT cannot be written (checked before listening), or None."""
    if os.path.isdir(out):
        return f"{out} is a directory; name the file to write, e.g. {os.path.join(out, 'NAME')}"
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        reason = "does not exist" if not os.path.lexists(parent) else "is not a directory"
        return f"cannot write {out}: the directory {parent} {reason}"
    if not os.access(parent, os.W_OK | os.X_OK) and not os.path.exists(out):
        return f"cannot write {out}: no permission to create files in {parent}"
    if os.path.lexists(out):
        if not (resume or force):
            return (
                f"{out} already exists; use --force to overwrite it, or --resume to continue "
                "a partial transfer"
            )
        if not os.access(out, os.W_OK):
            return f"cannot write {out}: permission denied"
    return None


def _check_announcement(message: Any) -> tuple[int, str]:
    """The announced (size, sha256), or BadPeer saying what is wrong."""
    if not isinstance(message, dict):
        raise BadPeer("its handshake is not a JSON object")
    size, digest, name = message.get("size"), message.get("sha256"), message.get("name", "")
    if not _is_int(size) or not 0 <= size <= MAX_SIZE:
        raise BadPeer(f"announced an invalid size {_short(size)}")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise BadPeer(f"announced an invalid sha256 {_short(digest)}")
    if not isinstance(name, str) or len(name) > 255 or any(c in name for c in "/\\\0") or name in (".", ".."):
        raise BadPeer(f"announced an invalid name {_short(name)}")
    return size, digest.lower()


def _short(value: Any, limit: int = 60) -> str:
    return _clip(repr(value), limit)


class _Receiver:
    """One ``recv``: at most one transfer, from the first peer with a valid handshake."""

    def __init__(
        self, out: str, resume: bool, handshake_timeout: float, idle_timeout: float = IDLE_TIMEOUT
    ) -> None:
        self.out, self.resume, self.timeout, self.idle = out, resume, handshake_timeout, idle_timeout
        self.busy = False
        self.pending = 0
        self.connections: set[asyncio.StreamWriter] = set()
        self.prefix: tuple[int, str] | None = None  # (length, sha256) of OUT, hashed once
        self.size: int | None = None
        self.kept: int | None = None  # bytes OUT holds once a transfer touched it
        self.done: asyncio.Future[str] | None = None

    @staticmethod
    def log(message: str) -> None:
        print(f"aiosendfile recv: {message}", file=sys.stderr, flush=True)

    async def run(self, host: str, port: int, ready: Callable[[int], None]) -> str:
        self.done = asyncio.get_running_loop().create_future()
        try:
            server = await asyncio.start_server(self.handle, host, port, limit=LINE_LIMIT)
        except OSError as exc:
            raise TransferFailed(f"cannot listen on {host}:{port}: {in_words(exc)}") from exc
        try:
            ready(server.sockets[0].getsockname()[1])
            return await self.done
        finally:
            server.close()
            for writer in list(self.connections):
                writer.transport.abort()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.done is not None
        peer = _peer(writer)
        if self.done.done() or self.pending >= MAX_PENDING:
            if not self.done.done():
                self.log(f"dropped {peer}: {MAX_PENDING} other connections are in their handshake")
            writer.transport.abort()
            return
        self.pending += 1
        self.connections.add(writer)
        try:
            if self.busy:
                self.log(f"refused {peer}: a transfer is in progress")
                await self.refuse(reader, writer, BUSY)
                return
            try:
                await self.serve(reader, writer, peer)
            except BadPeer as exc:
                if self.done.done():
                    return  # we are closing it ourselves: the transfer is over
                if isinstance(exc, Refused):
                    self.log(f"refused {peer}: {exc}")
                    await self.refuse(reader, writer, str(exc))
                else:
                    self.log(f"ignored {peer}: {exc}")
                    await self.refuse(reader, writer, f"not accepted: {exc}")
            except TransferFailed as exc:
                if not self.done.done():
                    self.done.set_exception(exc)
            except asyncio.CancelledError:
                # Stopping (a signal, or the transfer is over). Not re-raised: on 3.10/3.11 the
                # stream server's done-callback reports a cancelled handler task as an error.
                self.done.cancel()
            except Exception as exc:  # an error we did not foresee: say it, never a traceback
                if not self.done.done():
                    self.done.set_exception(TransferFailed(f"unexpected error: {in_words(exc)}"))
        finally:
            self.pending -= 1
            self.connections.discard(writer)
            writer.transport.abort()

    async def line(self, reader: asyncio.StreamReader, timeout: float, what: str) -> dict[str, Any]:
        """One handshake line as a JSON object; BadPeer for silence, garbage or a close."""
        try:
            raw = await asyncio.wait_for(reader.readline(), timeout)
        except asyncio.TimeoutError:
            raise BadPeer(f"sent no complete {what} within {timeout:g}s") from None
        except ValueError:
            raise BadPeer(f"sent a {what} line longer than {LINE_LIMIT} bytes") from None
        except OSError as exc:
            raise BadPeer(f"dropped the connection during the handshake ({in_words(exc)})") from None
        if not raw:
            raise BadPeer("closed the connection without a handshake")
        if not raw.endswith(b"\n"):
            raise BadPeer(f"closed the connection in the middle of its {what}")
        message = _json_object(raw)
        if message is None:
            raise BadPeer(f"not an aiosendfile sender (it sent {_short(raw.rstrip()[:60])})")
        return message

    async def refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, why: str) -> None:
        """Tell the peer why, and let it read that before we close (no reset under its feet)."""
        with contextlib.suppress(Exception):
            _send_message(writer, {"error": why})
            if writer.can_write_eof():
                writer.write_eof()

            async def until_eof() -> None:
                while await reader.read(LINE_LIMIT):
                    pass

            await asyncio.wait_for(until_eof(), min(FAREWELL_TIMEOUT, self.timeout))

    def check_room(self, size: int) -> None:
        """Refuse a file the disk has no room for, before anything is written."""
        try:
            st = os.stat(self.out)
        except OSError:
            have = 0  # not there yet: a new regular file
        else:
            if not stat.S_ISREG(st.st_mode):
                return  # a device or a pipe (/dev/null, /dev/stdout): not the directory's disk
            have = st.st_size
        try:
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(self.out))).free
        except OSError:
            return  # cannot tell: the writes will say
        if size - have > free:
            raise Refused(f"not enough disk space: the file is {size} bytes, {free} are free")

    async def offer(self, size: int) -> tuple[int, str, str | None]:
        """(offset, prefix hash, notice): only the whole of OUT, only to a file at least as long."""
        if not self.resume or not os.path.exists(self.out):
            return 0, "", None
        have = os.path.getsize(self.out)
        if have == 0:
            return 0, "", None
        if have > size:
            self.log(f"{self.out} holds {have} bytes, more than the {size} being sent: starting over")
            return 0, "", f"its partial file is longer than the {size} bytes being sent: starting over"
        if self.prefix is None or self.prefix[0] != have:
            try:
                self.prefix = (have, await _in_thread(_hash_file, self.out, have))
            except OSError as exc:
                raise TransferFailed(f"cannot read {self.out} to resume it: {in_words(exc)}") from exc
        return have, self.prefix[1], None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        assert self.done is not None
        size, expected = _check_announcement(await self.line(reader, self.timeout, "handshake"))
        if self.busy:  # another peer took the slot while this one was announcing
            self.log(f"refused {peer}: a transfer is in progress")
            await self.refuse(reader, writer, BUSY)
            return
        self.busy = True
        try:
            self.check_room(size)
            have, prefix, notice = await self.offer(size)
            message: dict[str, Any] = {"offset": have, "prefix_sha256": prefix}
            if notice:
                message["notice"] = notice
            _send_message(writer, message)
            reply = await self.line(reader, self.timeout + have / HASH_RATE, "start line")
            start = reply.get("start")
            if not _is_int(start) or start not in (0, have):
                offered = f"0 or {have}" if have else "0"
                raise BadPeer(f"asked to start at {_short(start)}, but only {offered} was offered")
        except BaseException:
            self.busy = False
            raise
        if have and start == 0:
            self.log(f"the sender's file does not start with the {have} bytes in {self.out}: starting over")
        self.done.set_result(await self.receive(reader, writer, peer, size, expected, start))

    async def receive(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        size: int,
        expected: str,
        start: int,
    ) -> str:
        out = self.out
        self.size = size
        try:
            f = open(out, "r+b" if start else "wb")  # noqa: SIM115 - closed below
        except OSError as exc:
            _send_message(writer, {"error": f"the receiver cannot write its file: {in_words(exc)}"})
            await self.drain_body(reader, size - start)
            raise TransferFailed(f"cannot write {out}: {in_words(exc)}") from exc
        progress = Progress(size, start, "recv")
        with f:
            self.kept = start
            try:
                if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    f.truncate(start)
                loop = asyncio.get_running_loop()
                last = loop.time()

                def landed(got: int, _total: int | None) -> None:
                    nonlocal last
                    last = loop.time()
                    progress.update(start + got)

                await _until_idle(
                    recvfile(reader, f, size - start, offset=start, on_progress=landed),
                    self.idle,
                    lambda: last,
                )
            except BaseException as exc:
                self.kept = _settle(f, start)
                progress.close()
                kept = f"kept the first {self.kept} of {size} bytes in {out}"
                if isinstance(exc, _Idle):
                    with contextlib.suppress(Exception):  # it may be gone for good
                        _send_message(writer, {"error": f"sent nothing for {self.idle:g}s; giving up"})
                    raise TransferFailed(
                        f"{peer} sent nothing for {self.idle:g}s mid-transfer; {kept} (--resume continues it)"
                    ) from None
                if isinstance(exc, (EOFError, ConnectionError)):
                    how = "disconnected" if isinstance(exc, EOFError) else f"was lost ({in_words(exc)})"
                    raise TransferFailed(
                        f"the connection from {peer} {how} mid-transfer; {kept} (--resume continues it)"
                    ) from exc
                if isinstance(exc, OSError):
                    reason = f"cannot write {out}: {in_words(exc)}"
                    _send_message(
                        writer, {"error": f"{reason}; it kept the first {self.kept} of {size} bytes"}
                    )
                    await self.drain_body(reader, size - self.kept)
                    raise TransferFailed(f"{reason}; {kept}") from exc
                raise
            self.kept = _settle(f, start)
        elapsed = progress.close()
        try:
            actual = await _in_thread(_hash_file, out)
        except OSError as exc:
            raise TransferFailed(f"cannot read {out} back to check it: {in_words(exc)}") from exc
        ok = actual == expected
        with contextlib.suppress(OSError):
            _send_message(writer, {"ok": ok, "sha256": actual})
            await writer.drain()
        if not ok:
            raise TransferFailed(f"checksum mismatch: got {actual}, the sender has {expected}; kept {out}")
        resumed = f", resumed at {start}" if start else ""
        return _summary("received", size - start, elapsed, f"{resumed} into {out}; sha256 verified")

    async def drain_body(self, reader: asyncio.StreamReader, remaining: int) -> None:
        """Read (and drop) the rest of a body we cannot write, for a while, so the sender finishes
        sending and then reads our error instead of a reset connection."""

        async def discard() -> None:
            left = remaining
            while left > 0:
                data = await reader.read(min(left, 1 << 20))
                if not data:
                    return
                left -= len(data)

        with contextlib.suppress(Exception):
            await asyncio.wait_for(discard(), DRAIN_TIMEOUT)


def _settle(f: IO[bytes], start: int) -> int:
    """Flush what OUT holds to disk; return its length (recvfile leaves the position there)."""
    try:
        kept = f.tell()
    except (OSError, ValueError):
        kept = start
    with contextlib.suppress(OSError, ValueError):
        f.flush()
        os.fsync(f.fileno())
    return kept


def recv_main(args: Any) -> int:
    prog = "aiosendfile recv"
    problem = check_out(args.out, resume=args.resume, force=args.force)
    if problem:
        return fail(prog, problem, 2)
    host, port = args.listen
    receiver = _Receiver(args.out, args.resume, args.handshake_timeout, args.idle_timeout)

    def ready(bound: int) -> None:
        print(
            f"aiosendfile recv listening on {host}:{bound}, writing {args.out} (Ctrl-C to stop)", flush=True
        )

    def interrupted() -> str:
        if receiver.kept is None:
            return f"interrupted before any transfer; {args.out} untouched"
        return (
            f"interrupted; kept the first {receiver.kept} of {receiver.size} bytes in {args.out} "
            "(recv --resume continues it)"
        )

    return _run(prog, args.loop, receiver.run(host, port, ready), interrupted)
