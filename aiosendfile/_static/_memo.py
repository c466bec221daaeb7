"""A bounded memo: a door's "this request was answered recently; here is how", bounded twice.

A door memoises the rendered plain ``200`` of a hot file under the request's key (the raw target,
maybe with its ``Accept-Encoding`` value). The key comes from the peer: without a bound on the
keys' bytes, a client that spells one file ten thousand ways (``/./a``, ``//a``, ...) or sends a new
megabyte-long header each time would grow the memo without end. So every entry is charged what it
keeps alive (its key, its rendered head, the body it holds on to, and a fixed overhead for the
objects around them), and the memo holds at most ``max_entries`` entries and ``max_bytes`` of such
charges; the least recently used go first. Loop-thread only (no lock).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ("ENTRY_OVERHEAD", "MEMO_MAX_BYTES", "MEMO_MAX_ENTRIES", "MEMO_MAX_KEY", "Memo")

K = TypeVar("K")
V = TypeVar("V")

#: Entries one door's memo holds at most.
MEMO_MAX_ENTRIES = 4096
#: Bytes one door's memo may charge at most: keys, heads, paths and the bodies it keeps alive.
MEMO_MAX_BYTES = 16 * 1024 * 1024
#: A request target longer than this is not memoised (its answer is decided each time): real
#: paths are far shorter, and ten thousand spellings of one file, each near the 8 KiB limit of a
#: request target, would otherwise each take a slot.
MEMO_MAX_KEY = 1024
#: What an entry costs beyond the bytes it is charged: the dict slot, the tuple, the bytes objects'
#: headers (measured: about 350 bytes for a native entry; rounded up).
ENTRY_OVERHEAD = 512


class Memo(Generic[K, V]):
    """Key → value, bounded by entries and by the bytes charged for them (see the module docstring)."""

    __slots__ = ("_costs", "_entries", "max_bytes", "max_entries", "size")

    def __init__(self, max_entries: int = MEMO_MAX_ENTRIES, max_bytes: int = MEMO_MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._costs: dict[K, int] = {}
        self.size = 0  # bytes charged for what is held now

    def get(self, key: K) -> V | None:
        """The value of *key*, or None; a hit becomes the most recently used."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V, nbytes: int) -> bool:
        """Hold *value* under *key*, charged *nbytes* (plus :data:`ENTRY_OVERHEAD`), evicting the least
        recently used as needed. An entry that could never fit is not held (returns False)."""
        cost = nbytes + ENTRY_OVERHEAD
        self.pop(key)
        if cost > self.max_bytes // 16:  # one entry may take a sixteenth of the memo
            return False
        self._entries[key] = value
        self._costs[key] = cost
        self.size += cost
        while len(self._entries) > self.max_entries or self.size > self.max_bytes:
            old, _ = self._entries.popitem(last=False)
            self.size -= self._costs.pop(old)
        return True

    def pop(self, key: K) -> None:
        """Forget *key* (nothing if absent)."""
        if self._entries.pop(key, None) is not None:
            self.size -= self._costs.pop(key)

    def clear(self) -> None:
        self._entries.clear()
        self._costs.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
