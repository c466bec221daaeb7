"""``aiosendfile._django._threads.RequestThreads``: a request's thread-sensitive calls on one
thread of its own, that thread lent again to a later request (not started and joined per
request, as asgiref's ``ThreadSensitiveContext()`` does), never while it still runs something,
and a bounded number kept idle. On stock asyncio and uvloop."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

pytest.importorskip("asgiref")
from asgiref.sync import sync_to_async

from aiosendfile._django import _threads

pytestmark = pytest.mark.skipif(not _threads._LENDS, reason="asgiref < 3.13 lends no executor")


@sync_to_async
def ident() -> int:  # (thread-sensitive, as Django's calls)
    return threading.get_ident()


async def test_a_requests_calls_share_a_thread_kept_for_the_next_request() -> None:
    threads = _threads.RequestThreads()

    seen = []
    for _ in range(3):
        async with threads.context():
            seen.append([await ident(), await ident()])
    assert len({i for request in seen for i in request}) == 1, seen
    assert seen[0][0] != threading.get_ident()
    threads.close()


async def test_concurrent_requests_have_threads_of_their_own() -> None:
    threads = _threads.RequestThreads()

    async def one(gate: asyncio.Event) -> set[int]:
        async with threads.context():
            first = await ident()
            await gate.wait()
            return {first, await ident()}

    gate = asyncio.Event()
    tasks = [asyncio.create_task(one(gate)) for _ in range(8)]
    await asyncio.sleep(0.2)
    gate.set()
    seen = await asyncio.gather(*tasks)
    assert all(len(s) == 1 for s in seen), seen
    assert len(set().union(*seen)) == 8
    threads.close()


async def test_a_thread_still_busy_when_its_request_ends_is_not_lent_again() -> None:
    """A sync call left running (its caller cancelled, as when a client leaves) keeps its thread:
    the next request gets another thread and does not wait behind it."""
    threads = _threads.RequestThreads()
    release = threading.Event()

    @sync_to_async
    def stuck() -> int:
        release.wait(10)
        return threading.get_ident()

    async with threads.context():
        busy_thread = await ident()
        task = asyncio.create_task(stuck())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    started = asyncio.get_running_loop().time()
    async with threads.context():
        next_thread = await ident()
    waited = asyncio.get_running_loop().time() - started
    release.set()
    assert next_thread != busy_thread
    assert waited < 5
    threads.close()


async def test_idle_threads_are_bounded() -> None:
    threads = _threads.RequestThreads(idle=4)

    async def one(gate: asyncio.Event) -> None:
        async with threads.context():
            await ident()
            await gate.wait()

    before = threading.active_count()
    gate = asyncio.Event()
    tasks = [asyncio.create_task(one(gate)) for _ in range(20)]
    await asyncio.sleep(0.2)
    gate.set()
    await asyncio.gather(*tasks)
    assert len(threads._idle) == 4
    for _ in range(100):  # (the threads of the executors shut down end soon after)
        if threading.active_count() <= before + 4:
            break
        await asyncio.sleep(0.05)
    assert threading.active_count() <= before + 4
    threads.close()


def test_a_close_that_fails_after_the_response_went_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """``run_logged``: a close on the request's thread after the thread wrote the response
    (nothing is left to report it to) is logged, not raised."""

    def fails() -> None:
        raise RuntimeError("a close that fails (the test expects it)")

    with caplog.at_level(logging.ERROR, logger="aiosendfile.django"):
        _threads.run_logged(fails)
    assert [r.getMessage() for r in caplog.records] == ["Closing a Django response failed"]
    assert "a close that fails" in caplog.text
