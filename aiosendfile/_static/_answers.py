"""The answer cache: "this request was decided recently; it is a plain 200 of this file".

The static core makes a :class:`Decided` for every plain ``200`` of a whole file it gives, of any
size (``Answer.decided``): the file's identity (from the ``stat`` the core took anyway), its path,
its size, whether its bytes may be in the hot-file cache, the request's ``prefix``, and its
:class:`~._hot.Rendering` (the core's fields, and a typed slot for each door's own rendering: a hot
file's is its cache entry's, shared by every spelling of its path). A door that can answer the same
request again without the core (the native engine, the ASGI apps) keeps it in its :class:`Answers`
under the request's key, once it has filled its slot. On a hit the door checks that the path still
names that file before using anything: one ``stat`` for a hot file, the ``fstat`` of the file opened
again for any other. The cache holds no body: a small file's bytes are the hot-file cache's (bounded
on its own), looked up by path and identity.

Bounded by entries and by the bytes each entry keeps alive, its key included (both come from the
peer: a client spelling one file ten thousand ways, ``/./a``, ``//a``, ... must not grow it); a
key longer than :data:`~._memo.MEMO_MAX_KEY` is never kept. Loop-thread only.
"""

from __future__ import annotations

from ._hot import Rendering
from ._memo import MEMO_MAX_BYTES, MEMO_MAX_ENTRIES, MEMO_MAX_KEY, Memo

__all__ = ("AnswerKey", "Answers", "Decided", "rendering_bytes")

#: A request's key: its raw path, or its raw path and what else its answer depends on (the ASGI
#: apps: the ``Accept-Encoding`` value).
AnswerKey = bytes | tuple[bytes, bytes]

#: What one header pair or field costs beyond its bytes: its tuple and the objects' headers.
PAIR_OVERHEAD = 100


class Decided:
    """A plain 200 of a whole file, as the core decided it (see the module docstring).

    ``folder``: for a door that keys an answer by ``Accept-Encoding`` too, the file's directory and
    what changes when a name is added to it (a pre-compressed sibling appearing), else None.
    """

    __slots__ = ("folder", "identity", "path", "prefix", "rendering", "size", "small")

    def __init__(
        self,
        identity: tuple[int, ...],
        path: str,
        size: int,
        small: bool,
        rendering: Rendering,
        prefix: str = "",
    ) -> None:
        self.identity, self.path, self.size, self.small = identity, path, size, small
        self.rendering, self.prefix = rendering, prefix
        self.folder: tuple[str, tuple[int, ...]] | None = None

    def cost(self) -> int:
        """The bytes this answer keeps alive: its path, prefix, folder and renderings."""
        folder = self.folder
        return (
            len(self.path)
            + len(self.prefix)
            + (len(folder[0]) if folder is not None else 0)
            + rendering_bytes(self.rendering)
        )

    def __repr__(self) -> str:
        return f"Decided({self.path!r}, size={self.size}, small={self.small})"


def rendering_bytes(rendering: Rendering) -> int:
    """The bytes a rendering's filled slots hold (the aiohttp door's ``headers`` counted as fields)."""
    n = len(rendering.head) if rendering.head is not None else 0
    for pairs in (rendering.fields, rendering.pairs):
        if pairs is not None:
            n += sum(len(name) + len(value) + PAIR_OVERHEAD for name, value in pairs)
    if rendering.headers is not None:
        n += sum(len(name) + len(value) + PAIR_OVERHEAD for name, value in rendering.headers.items())
    return n


class Answers:
    """:data:`AnswerKey` → :class:`Decided`, bounded (see the module docstring)."""

    __slots__ = ("_memo", "get")

    def __init__(self, max_entries: int = MEMO_MAX_ENTRIES, max_bytes: int = MEMO_MAX_BYTES) -> None:
        self._memo: Memo[AnswerKey, Decided] = Memo(max_entries, max_bytes)
        self.get = self._memo.get  # (the doors' hot path: one call, no wrapper)

    def keep(self, key: AnswerKey, decided: Decided) -> bool:
        """Hold *decided* under *key*, charged the key and :meth:`Decided.cost` (its door's slot is
        filled by now); False if the key is too long or the entry could never fit."""
        if isinstance(key, bytes):
            if len(key) > MEMO_MAX_KEY:
                return False
            nbytes = len(key)
        else:
            if len(key[0]) > MEMO_MAX_KEY:
                return False
            nbytes = len(key[0]) + len(key[1])
        return self._memo.put(key, decided, nbytes + decided.cost())

    def forget(self, key: AnswerKey) -> None:
        self._memo.pop(key)

    def clear(self) -> None:
        self._memo.clear()

    @property
    def size(self) -> int:
        """The bytes charged for what is held now (:data:`~._memo.ENTRY_OVERHEAD` each included)."""
        return self._memo.size

    @property
    def max_entries(self) -> int:
        return self._memo.max_entries

    @property
    def max_bytes(self) -> int:
        return self._memo.max_bytes

    def __len__(self) -> int:
        return len(self._memo)

    def __contains__(self, key: object) -> bool:
        return key in self._memo
