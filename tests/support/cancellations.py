"""Transfers started and cancelled at random moments on one connection, each checked after.

The default run does a few dozen (``test_cancellation``), the stress run hundreds
(``test_stress``): after every cancellation, what the peer got is exactly
``file[offset:f.tell()]`` followed by what was written later, and no fd, task or poller
registration is left behind.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import aiosendfile
from aiosendfile._compat import defuse_py310_tls_resume

from .fds import open_fds
from .files import pattern


def _selector_fds() -> set[int] | None:
    """The fds registered in a stock asyncio loop's selector (None on uvloop)."""
    selector = getattr(asyncio.get_running_loop(), "_selector", None)
    if selector is None:
        return None
    return set(selector.get_map())


async def random_cancellations(
    conn: Any, path: Path, size: int, iterations: int, seed: int
) -> dict[str, int]:
    """Start and cancel transfers at random moments on one connection; check everything after each.

    Returns counts of how the iterations ended (for the caller to check the mix).
    """
    rng = random.Random(seed)
    transport = conn.transport
    protocol, limits = transport.get_protocol(), transport.get_write_buffer_limits()
    server_fd = transport.get_extra_info("socket").fileno()
    received: list[bytes] = []

    async def read_slowly() -> None:
        client = conn.client_reader
        assert client is not None
        # CPython 3.10's TLS StreamReader crashes resuming a torn-down TLS layer, and the bytes
        # of that read are lost inside asyncio. recvfile's workaround, applied at every resume,
        # keeps this client reading what arrived.
        resume = client._maybe_resume_transport  # type: ignore[attr-defined]

        def resume_safely() -> None:
            defuse_py310_tls_resume(client)
            resume()

        client._maybe_resume_transport = resume_safely  # type: ignore[attr-defined]
        while chunk := await client.read(65536):
            received.append(chunk)
            if rng.random() < 0.5:
                await asyncio.sleep(0.002)

    reader = asyncio.create_task(read_slowly())
    await asyncio.sleep(0.01)
    me = asyncio.current_task()
    expected: list[bytes] = []
    outcomes = {"cancelled": 0, "completed": 0, "cancelled-before-start": 0}
    data = pattern(size)
    untouched = size + 12345  # a position no transfer leaves behind: tells "never started"
    with open(path, "rb") as f:
        base_fds = open_fds()
        base_selector = _selector_fds()
        for i in range(iterations):
            if rng.random() < 0.25:  # something to flush first: cancel may land in the lease's flush
                prefix = b"P" * rng.randrange(1, 400_000)
                conn.writer.write(prefix)
                expected.append(prefix)
            offset = rng.randrange(0, size)
            count = None if rng.random() < 0.5 else rng.randrange(0, size - offset + 1)
            kwargs: dict[str, Any] = {}
            if rng.random() < 0.5:
                kwargs["max_chunk"] = rng.choice([4096, 65536, 300_001])
            f.seek(untouched)  # the call's offset must win over the file's position
            task = asyncio.create_task(aiosendfile.sendfile(conn.writer, f, offset, count, **kwargs))
            how = rng.random()
            if how < 0.15:
                pass  # cancelled before it ever ran
            elif how < 0.5:
                for _ in range(rng.randrange(1, 6)):
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(rng.uniform(0, 0.006))
            task.cancel()
            try:
                result: int | None = await task
            except asyncio.CancelledError:
                result = None
            position = f.tell()
            if position == untouched:
                assert result is None
                outcomes["cancelled-before-start"] += 1
                sent = 0
            else:
                sent = position - offset
                assert 0 <= sent <= (size - offset if count is None else count), (i, offset, count, position)
                if result is not None:
                    assert result == sent
                    outcomes["completed"] += 1
                else:
                    outcomes["cancelled"] += 1
            expected.append(data[offset : offset + sent])
            marker = b"<%d>" % i
            conn.writer.write(marker)
            expected.append(marker)
            # Nothing left behind: tasks, fds (the dup'd socket), poller registrations.
            await asyncio.sleep(0)
            assert asyncio.all_tasks() - {me, reader} == set(), i
            assert open_fds() == base_fds, (i, open_fds() ^ base_fds)
            if base_selector is not None:
                now = _selector_fds()
                assert now is not None
                assert now - base_selector == set(), (i, now - base_selector)
                assert server_fd in now  # reading resumed
            assert transport.get_protocol() is protocol
            assert transport.get_write_buffer_limits() == limits
            assert transport.is_reading()
            assert not transport.is_closing()
    conn.writer.close()
    await asyncio.wait_for(reader, 30)
    got, want = b"".join(received), b"".join(expected)
    if got != want:
        at = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        raise AssertionError(f"stream differs at byte {at} (got {len(got)}, expected {len(want)} bytes)")
    return outcomes
