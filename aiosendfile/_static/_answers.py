"""The answer cache: "this request was decided recently; it is a plain 200 of this file".

The static core makes a :class:`Decided` for every plain ``200`` of a whole file it gives, of any
size (``Answer.decided``): the file's identity (from the ``stat`` the core took anyway), its path,
its size, whether its bytes may be in the hot-file cache, and the request's ``prefix``. A door that
can answer the same request again without the core (the native engine, the ASGI apps) fills its own
typed slot (the engine's ``head``, the ASGI apps' header ``pairs``) and keeps it in its
:class:`Answers` under the request's key (the engine keeps a tuple of what it needs instead, which
the garbage collector does not track: ``_serve._server.Known``). On a hit the door checks that the
path still names that file before using anything: one ``stat`` for a hot file, the ``fstat`` of the
file opened again for any other. The engine's cache holds no body: a small file's bytes are the
hot-file cache's (bounded on its own), looked up by path and identity; the ASGI apps keep a hot
file's bytes with its answer (``body``, charged with it). One object an entry: a request answered
from it touches the entry, its identity, path and rendering, and nothing else (a second object per
entry, 10,000 entries looked up at random, cost the engine 5% more CPU a request: cache misses).

Bounded by entries and by the bytes each entry keeps alive, its key included (both come from the
peer: a client spelling one file ten thousand ways, ``/./a``, ``//a``, ... must not grow it); a
key longer than :data:`~._memo.MEMO_MAX_KEY` is never kept. Loop-thread only.
"""

from __future__ import annotations

from ._memo import MEMO_MAX_KEY, Memo

__all__ = ("AnswerKey", "Answers", "Decided")

#: A request's key: its raw path, or its raw path and what else its answer depends on (the ASGI
#: apps: the ``Accept-Encoding`` value).
AnswerKey = bytes | tuple[bytes, bytes]

#: What one header pair costs beyond its bytes: its tuple and the objects' headers.
PAIR_OVERHEAD = 100


class Decided:
    """A plain 200 of a whole file, as the core decided it, and a slot for each door that keeps it
    (see the module docstring).

    ``folder``: for a door that keys an answer by ``Accept-Encoding`` too, the file's directory and
    what changes when a name is added to it (a pre-compressed sibling appearing), else None.
    """

    __slots__ = ("body", "folder", "head", "identity", "pairs", "path", "prefix", "size", "small")

    def __init__(
        self, identity: tuple[int, ...], path: str, size: int, small: bool, prefix: str = ""
    ) -> None:
        self.identity, self.path, self.size, self.small, self.prefix = identity, path, size, small, prefix
        self.folder: tuple[str, tuple[int, ...]] | None = None
        self.head: bytes | None = None  # serve's engine: the head, without its per-second tail
        self.pairs: list[tuple[bytes, bytes]] | None = None  # the ASGI apps' header pairs
        #: A hot file's bytes, if the door keeps them with the answer (the ASGI apps: one lookup
        #: less a request); charged with it. The engine looks them up in the hot-file cache.
        self.body: bytes | None = None

    def cost(self) -> int:
        """The bytes this answer keeps alive: its path, prefix, folder, renderings and body."""
        folder, head, pairs, body = self.folder, self.head, self.pairs, self.body
        n = len(self.path) + len(self.prefix)
        if body is not None:
            n += len(body)
        if folder is not None:
            n += len(folder[0])
        if head is not None:
            n += len(head)
        if pairs is not None:
            n += sum(len(name) + len(value) + PAIR_OVERHEAD for name, value in pairs)
        return n

    def __repr__(self) -> str:
        return f"Decided({self.path!r}, size={self.size}, small={self.small})"


class Answers(Memo[AnswerKey, Decided]):
    """:data:`AnswerKey` → :class:`Decided`, bounded (see the module docstring): a
    :class:`~._memo.Memo` whose entries are charged by :meth:`keep`."""

    __slots__ = ()

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
        return self.put(key, decided, nbytes + decided.cost())
