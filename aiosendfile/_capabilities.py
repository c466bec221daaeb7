"""What this platform lets aiosendfile do, for users and bug reports."""

from __future__ import annotations

from typing import Any

from . import _platform
from ._options import COLD_POOL_THREADS, DEFAULT_FALLBACK_CHUNK
from ._state import DEFAULT_MAX_CHUNK

__all__ = ("capabilities",)


def capabilities() -> dict[str, Any]:
    """A dict describing the platform: zero-copy support and the default sizes."""
    return {
        "platform": _platform.PLATFORM,
        "zero_copy_sendfile": _platform.HAS_SENDFILE,
        # False: chunks cannot be probed for cold pages, so each goes to the pool.
        "page_cache_probe": _platform.HAS_RWF_NOWAIT,
        # True: the probe sees every page of a chunk (cachestat(2)), not its two ends.
        "whole_chunk_probe": _platform.range_cached_available(),
        # True: cachestat(2) and openat2(2) through the C module built at install (Linux, a compiler).
        "compiled_syscalls": _platform.HAS_SYSCALLS_MODULE,
        "cork": _platform.CORK_OPTION is not None,
        "cold_pool_threads": COLD_POOL_THREADS,
        "max_chunk": DEFAULT_MAX_CHUNK,
        "fallback_chunk": DEFAULT_FALLBACK_CHUNK,
    }
