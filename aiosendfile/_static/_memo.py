"""A bounded memo: a door's "this request was answered recently; here is how", bounded twice.

A door memoises the rendered plain ``200`` of a hot file under the request's key (the raw target,
maybe with its ``Accept-Encoding`` value). The key comes from the peer: without a bound on the
keys' bytes, a client that spells one file ten thousand ways (``/./a``, ``//a``, ...) or sends a new
megabyte-long header each time would grow the memo without end. So every entry is charged what it
keeps alive (its key, its rendered head, the body it holds on to, and a fixed overhead for the
objects around them), and the memo holds at most ``max_entries`` entries and ``max_bytes`` of such
charges. Loop-thread only (no lock).

What goes first is the least recently used, nearly: the entries are kept in two generations, and a
hit in the younger one reorders nothing (an ``OrderedDict``'s ``move_to_end`` on every hit cost
about 2 µs a request in ``serve``'s answer path, two memos of thousands of entries each: a node
unlinked and linked again, its memory far from the last request's). Entries are put in the young
generation. When the memo is full and the old one empty, the young one becomes the old one; then
the old generation's entries go first, oldest first, and one hit there moves back into the young
generation (used since the generations turned: kept). So an entry used once per turn is never
evicted, and a sweep of new keys evicts those not used, in the order they came (as CLOCK does).
"""

from __future__ import annotations

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

    __slots__ = ("_costs", "_next", "_old", "_order", "_young", "max_bytes", "max_entries", "size")

    def __init__(self, max_entries: int = MEMO_MAX_ENTRIES, max_bytes: int = MEMO_MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._young: dict[K, V] = {}  # put, or used, since the generations last turned
        self._old: dict[K, V] = {}  # not used since: evicted first, oldest first
        # The old generation's keys in the order they came, and the next one to evict: a dict
        # emptied from its front is not a queue (each next(iter()) skips every slot freed before).
        self._order: list[K | None] = []
        self._next = 0
        self._costs: dict[K, int] = {}
        self.size = 0  # bytes charged for what is held now

    def get(self, key: K) -> V | None:
        """The value of *key*, or None; a hit in the old generation moves to the young one."""
        value = self._young.get(key)
        if value is None and self._old:
            value = self._old.pop(key, None)
            if value is not None:
                self._young[key] = value
        return value

    def put(self, key: K, value: V, nbytes: int) -> bool:
        """Hold *value* under *key*, charged *nbytes* (plus :data:`ENTRY_OVERHEAD`), evicting the
        entries not used longest as needed. An entry that could never fit is not held (returns
        False)."""
        cost = nbytes + ENTRY_OVERHEAD
        costs = self._costs
        if key in costs:  # (the charges name every key held: one lookup for a new key)
            self.pop(key)
        if cost > self.max_bytes // 16:  # one entry may take a sixteenth of the memo
            return False
        young = self._young
        young[key] = value
        costs[key] = cost
        size = self.size = self.size + cost
        if len(costs) > self.max_entries or size > self.max_bytes:
            self._evict()
        return True

    def _evict(self) -> None:
        """Evict the entries not used longest until the memo is within its bounds."""
        costs = self._costs
        while len(costs) > self.max_entries or self.size > self.max_bytes:
            old = self._old
            if not old:  # the generations turn: what was young is old now, the new key too
                old = self._old = self._young
                self._young = {}
                self._order = list(old)
                self._next = 0
            order = self._order
            position = self._next
            while True:  # (a key promoted or popped since the turn is passed over)
                oldest = order[position]
                order[position] = None  # (not kept alive once passed)
                position += 1
                if oldest in old:
                    break
            self._next = position
            assert oldest is not None
            del old[oldest]
            self.size -= costs.pop(oldest)

    def pop(self, key: K) -> None:
        """Forget *key* (nothing if absent)."""
        if self._young.pop(key, None) is not None or self._old.pop(key, None) is not None:
            self.size -= self._costs.pop(key)

    def clear(self) -> None:
        self._young.clear()
        self._old.clear()
        self._order = []
        self._next = 0
        self._costs.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def __contains__(self, key: object) -> bool:
        return key in self._young or key in self._old
