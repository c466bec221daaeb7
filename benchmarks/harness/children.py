"""The server side of a trial in its own ``spawn``ed process, and its result back to this one.

A trial starts a fresh child (``spawned``) that serves on a loop of the contender's kind
(``run_on_contender_loop``), says ``("ready", port)`` once its listener is up and its ticker
has an idle baseline (``serving``; ``serving_locally`` starts a 127.0.0.1 stream server first),
and ends with ``report_to_parent``: ``("result", dict)`` or ``("error", traceback)``
(``serve_on_contender_loop`` is the whole child for a benchmark's own coroutine). The parent
reads each message with ``recv_result``, and runs its own side of the trial between the two
with ``client_then_result``.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from benchmarks.harness import TrialError
from benchmarks.harness.measure import IDLE_S, TICK_S, LoopTicker

_T = TypeVar("_T")

Process = multiprocessing.process.BaseProcess


# ---------------------------------------------------------------------------
# In the child
# ---------------------------------------------------------------------------


def run_on_contender_loop(contender: str, main: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run *main()* on a fresh loop of the contender's kind (uvloop for ``*-uvloop``), then close it.

    For ``aiofastnet-*`` the loop is patched with ``aiofastnet.patch_loop`` (as
    ``aiofastnet.loop_factory`` does), so its servers make aiofastnet transports.
    """
    loop: asyncio.AbstractEventLoop
    if contender.endswith("-uvloop"):
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    if contender.startswith("aiofastnet"):
        import aiofastnet

        aiofastnet.patch_loop(loop)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def report_to_parent(conn: Connection, produce: Callable[[], dict[str, Any]]) -> None:
    """Child-process epilogue: send ``("result", produce())`` or ``("error", traceback)``, then close."""
    try:
        conn.send(("result", produce()))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def serving(
    conn: Connection, server: asyncio.AbstractServer, port: int, ticker: LoopTicker
) -> AsyncIterator[None]:
    """Let *ticker* run ``IDLE_S`` on the idle loop, then send ``("ready", port)`` and run the block.

    After the block, let the tick in flight at the end land; on the way out (errors too) stop
    the ticker and close *server*.
    """
    try:
        await asyncio.sleep(IDLE_S)
        conn.send(("ready", port))
        yield
        await asyncio.sleep(3 * TICK_S)  # let the tick in flight at the end land
    finally:
        await ticker.stop()
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def serving_locally(
    conn: Connection,
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]],
    ticker: LoopTicker,
    backlog: int = 100,
) -> AsyncIterator[None]:
    """Start a stream server for *handle* on a free 127.0.0.1 port, and run the block ``serving`` it."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=backlog)
    async with serving(conn, server, server.sockets[0].getsockname()[1], ticker):
        yield


def serve_on_contender_loop(
    conn: Connection, contender: str, main: Callable[..., Coroutine[Any, Any, dict[str, Any]]], *args: Any
) -> None:
    """A ``spawned`` target: run ``main(conn, contender, *args)`` on the contender's loop, report it."""
    report_to_parent(conn, lambda: run_on_contender_loop(contender, lambda: main(conn, contender, *args)))


# ---------------------------------------------------------------------------
# In the parent
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def spawned(
    ctx: multiprocessing.context.SpawnContext, target: Callable[..., None], *args: Any
) -> Iterator[tuple[Connection, Process]]:
    """Start ``target(child_conn, *args)`` in a daemon child; yield (our end of the pipe, the process).

    On the way out close our end, give the child 10 s to exit, then kill it.
    """
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    child.close()
    try:
        yield parent, proc
    finally:
        parent.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def recv_result(conn: Connection, timeout: float, proc: Process) -> Any:
    """The child's next message's payload; TrialError if it sent nothing in *timeout* s or failed."""
    if not conn.poll(timeout):
        raise TrialError(f"server sent nothing in {timeout} s (alive: {proc.is_alive()})")
    kind, payload = conn.recv()
    if kind == "error":
        raise TrialError("server failed:\n" + payload)
    return payload


def client_then_result(
    conn: Connection, proc: Process, timeout: float, client: Callable[[], _T], who: str = "reader"
) -> tuple[_T, Any]:
    """Run this process's side of the trial, ``client()``, then receive the child's result.

    A failure of ``client()`` (OSError or TrialError) becomes ``TrialError("WHO: ...")``, unless
    the child sends its own error within 5 s: a server failure shows up on this side as a short
    read, and the server's traceback says more.
    """
    try:
        mine = client()
    except (OSError, TrialError) as exc:
        if conn.poll(5):
            recv_result(conn, 0, proc)
        raise TrialError(f"{who}: {exc!r}") from exc
    return mine, recv_result(conn, timeout, proc)
