"""Reading a range of a regular file without waiting for the disk on the event-loop thread.

One rule, shared by the userspace fallback (``ChunkReader``) and the aiohttp
``FileResponse``: a range whose pages are all in the page cache is read on
the loop (one ``RWF_NOWAIT`` read, ``_platform.pread_cached``, which reads
the bytes when they are there); any other range is read in the cold-read
pool (``_options.default_cold_executor`` unless the caller has its own), never
in the loop's default executor, so a slow disk cannot starve
``run_in_executor`` users. Where the platform cannot tell (no ``RWF_NOWAIT``),
every read goes to the pool: the conservative choice.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor

from . import _platform
from ._options import default_cold_executor
from ._threads import in_pool

__all__ = ("read_range",)


async def read_range(
    fd: int, size: int, offset: int, executor: Executor | None = None, *, probe: bool = True
) -> bytes | bytearray:
    """Up to *size* bytes of *fd* at *offset* (fewer only at end of file), in a new buffer.

    On the loop if the pages are cached, else in *executor* (default: the cold-read
    pool). ``probe=False`` trusts the cache and always reads on the loop. A read already
    running in a thread when we are cancelled is waited for, so the caller may close
    *fd* as soon as this returns or raises.
    """
    if not probe:
        return os.pread(fd, size, offset)
    data = _platform.pread_cached(fd, size, offset)
    if data is not None:
        return data
    _platform.counters.cold += 1
    return await in_pool(executor or default_cold_executor(), os.pread, fd, size, offset)
