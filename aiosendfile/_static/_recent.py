"""Which request paths were decided recently: a door decides those inline, any other in its cold pool.

A path decided in the last ``seconds`` has its metadata (dentries, inode) in the kernel's caches,
so deciding it again on the event loop costs microseconds; a first sight may wait for the disk, so
a door sends it to a thread. Both doors (the native engine, the ASGI apps) keep one
:class:`RecentPaths` per served directory. Pure bookkeeping: the caller passes the clock.

Bounded by count and by the bytes of the paths kept (least recently decided forgotten first). An
LRU over uniformly random paths hits about ``max_entries / paths``: it must cover a site's working
set, or most requests hop to the pool.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ("RECENT_MAX", "RECENT_MAX_BYTES", "RECENT_MAX_PATH", "RECENT_SECONDS", "RecentPaths")

#: A path decided within this many seconds is decided again inline.
RECENT_SECONDS = 10.0
#: At most this many paths, and this many bytes of paths (~8 MiB + ~100 bytes of bookkeeping each).
RECENT_MAX = 65536
RECENT_MAX_BYTES = 8 * 1024 * 1024
#: A longer path is not noted (always decided in the pool): real paths are far shorter, and a
#: client spelling one file ten thousand ways near the 8 KiB request-target limit would otherwise
#: push every real path out.
RECENT_MAX_PATH = 1024


class RecentPaths:
    """Paths (bytes) decided recently, with when (see the module docstring)."""

    __slots__ = ("_bytes", "_when", "max_bytes", "max_entries", "seconds")

    def __init__(
        self,
        seconds: float = RECENT_SECONDS,
        max_entries: int = RECENT_MAX,
        max_bytes: int = RECENT_MAX_BYTES,
    ) -> None:
        self.seconds, self.max_entries, self.max_bytes = seconds, max_entries, max_bytes
        self._when: OrderedDict[bytes, float] = OrderedDict()
        self._bytes = 0

    def seen(self, path: bytes, now: float) -> bool:
        """Whether *path* was decided within ``seconds`` of *now* (then it is noted again, at *now*)."""
        when = self._when.get(path)
        if when is None or now - when > self.seconds:
            return False
        self._when[path] = now
        self._when.move_to_end(path)
        return True

    def saw(self, path: bytes, now: float) -> None:
        """Note that *path* was decided at *now* (unless it is longer than RECENT_MAX_PATH)."""
        if len(path) > RECENT_MAX_PATH:
            return
        when = self._when
        if path in when:
            when.move_to_end(path)
        else:
            self._bytes += len(path)
        when[path] = now
        while len(when) > self.max_entries or self._bytes > self.max_bytes:
            self._bytes -= len(when.popitem(last=False)[0])

    def __len__(self) -> int:
        return len(self._when)
