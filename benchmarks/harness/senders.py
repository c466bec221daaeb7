"""The server-side send strategies the sending benchmarks race, and the options a trial passes them.

Each strategy sends one open file down an ``asyncio.StreamWriter`` and returns the bytes sent.
``SENDERS`` names them by contender (``<strategy>-<loop>``: the loop is chosen by the
contender's suffix, see ``children.run_on_contender_loop``); ``THREADS`` are the two rows that
run no event loop at all (``transfer`` serves them from a plain thread). The aiofastnet rows need
that library installed (``unavailable`` says why a row cannot run here).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import IO, BinaryIO, cast

from benchmarks.harness import TrialError

THREAD = "thread-os.sendfile"
THREAD_COPY = "thread-copy"  # blocking read + sendall in a thread (only when named in --contenders)
THREADS = (THREAD, THREAD_COPY)
COPY_ROWS = ("copy-uvloop", "copy-asyncio", THREAD_COPY)  # the rows that use --copy-chunk


@dataclass(frozen=True)
class Options:
    """What a trial needs to know (pickled to the server process)."""

    size: int
    max_chunk: int
    copy_chunk: int
    timeout: float
    probe: bool = True  # aiosendfile's probe= (page-cache check, cold chunks to its pool)
    # Evict the file from the page cache right before the transfer (and check it is out);
    # otherwise check that it is in (see ``cache_state``).
    cold: bool = False
    host: str = "127.0.0.1"  # the server binds here and the reader connects here
    netns: str | None = None  # the server process enters this network namespace first (veth mode)
    unix_path: str | None = None  # a Unix stream socket instead of TCP (unix mode)
    client_netns: str | None = None  # the reader (this process's trial thread) enters this one (veth mode)
    # ``taskset -c`` lists: the server process (all its threads) and the reader's trial thread run
    # there (None: wherever the scheduler puts them)
    server_cpus: str | None = None
    client_cpus: str | None = None
    # TCP congestion control of the server's socket, set before the "go" (None: the machine's default)
    congestion: str | None = None


Sender = Callable[[asyncio.StreamWriter, IO[bytes], Options], Awaitable[int]]


async def send_aiosendfile(writer: asyncio.StreamWriter, f: IO[bytes], opts: Options) -> int:
    import aiosendfile

    return await aiosendfile.sendfile(writer, f, max_chunk=opts.max_chunk, probe=opts.probe)


async def send_loop_sendfile(writer: asyncio.StreamWriter, f: IO[bytes], opts: Options) -> int:
    loop = asyncio.get_running_loop()
    return await loop.sendfile(writer.transport, f)


async def send_copy(writer: asyncio.StreamWriter, f: IO[bytes], opts: Options) -> int:
    # aiohttp's FileResponse fallback, minus its run_in_executor hop: with the file
    # in the page cache f.read() here is a memcpy; with a cold file it waits for the disk.
    sent = 0
    while chunk := f.read(opts.copy_chunk):
        writer.write(chunk)
        await writer.drain()
        sent += len(chunk)
    return sent


async def send_aiofastnet(writer: asyncio.StreamWriter, f: IO[bytes], opts: Options) -> int:
    """aiofastnet's native sendfile, called as aiohttp's ``FileResponse`` calls it when it is installed.

    The loop is patched (``children.run_on_contender_loop``), so ``asyncio.start_server`` made an
    aiofastnet transport; on any other transport aiofastnet would quietly use the loop's own
    sendfile, so that is an error. ``aiofastnet.sendfile`` returns None, not a count: the reader
    checks the bytes that arrived.
    """
    import aiofastnet

    if not isinstance(writer.transport, aiofastnet.Transport):
        raise TrialError(f"not an aiofastnet transport: {type(writer.transport)}")
    await aiofastnet.sendfile(asyncio.get_running_loop(), writer.transport, cast(BinaryIO, f), 0, opts.size)
    return opts.size


SENDERS: dict[str, Sender] = {
    "aiosendfile-uvloop": send_aiosendfile,
    "aiosendfile-asyncio": send_aiosendfile,
    "loop.sendfile-asyncio": send_loop_sendfile,
    "copy-uvloop": send_copy,
    "copy-asyncio": send_copy,  # not run by default (loop_stall.py uses it)
    "aiofastnet-uvloop": send_aiofastnet,
    "aiofastnet-asyncio": send_aiofastnet,  # not run by default in raw_transfer (loop_stall.py uses it)
}


def unavailable(contender: str) -> str | None:
    """Why *contender* cannot run here (a one-line reason), or None if it can."""
    if contender.startswith("aiofastnet") and importlib.util.find_spec("aiofastnet") is None:
        return "aiofastnet is not installed (pip install aiofastnet)"
    return None
