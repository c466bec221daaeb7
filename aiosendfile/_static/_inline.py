"""What a door answers on the loop without the core's full path: a kept answer replayed, and a
first sight looked up where no disk is read. The rules every door shares.

**Replay.** A door keeps the plain 200 of a whole file it decided (the file's identity, its path,
whether it is small, its head) and answers the same path from that later. The rule, for every
door: *a changed file is never answered from the memo.* A body from memory (or a ``HEAD``'s
head) goes only once a ``stat`` shows the path still names a file of the same identity
(``_hot.identity``: device, inode, size, mtime, ctime; :func:`from_memory`); a body from the file
only once the path is opened again and its ``fstat`` has that identity (:func:`reopen_kept`).
Anything else is decided again, and the door forgets what it kept.

**A browser's request** (``Accept-Encoding`` its only field the core reads): its answer is a plain
one's unless a pre-compressed sibling is there to choose. A door looks at the folder the file lies
in before the core looks for siblings (:func:`browser_folder`; the root itself for the root's
index), and keeps the answer for browsers only if the file lies in that folder and no name a
sibling could have is beside it (:func:`for_browsers`); it replays it for a browser only while
that folder is unchanged (``_fs.same_file`` of it): a sibling added, removed or renamed in
changes it. An answer kept for a plain request says nothing of siblings and is not a browser's.

**First sight.** A path not kept is routed, then looked up and opened at once where that waits
for no disk and crosses no symlink (:func:`first_look`); a lookup that would read the disk goes to
the pool (:func:`look_up` there: a ``stat`` brings the metadata into the kernel's caches) unless
the door decided the path a moment ago (its ``RecentPaths``), and is then looked at again on the
loop (:func:`look_again`). Either way the loop decides (:func:`decide_looked`), so no decision's
Python runs in a thread, contending for the GIL with the loop; only a directory listing to build
is decided in the pool. A small body whose pages are not cached is sent from the file, by a sender
that reads cold pages off the loop.
"""

from __future__ import annotations

import os
from typing import Literal

from . import _hot
from ._answer import Answer
from ._core import decide, route
from ._fs import (
    folder_identity,
    look_up_path,
    lookup_cached,
    no_sibling_names,
    open_cached,
    read_back,
    reopen,
    same_file,
)
from ._policy import DirectoryPolicy
from ._recent import RecentPaths
from ._request import Request

__all__ = (
    "Looked",
    "browser_folder",
    "decide_looked",
    "first_look",
    "for_browsers",
    "from_memory",
    "look_again",
    "look_up",
    "reopen_kept",
)

# (Every system call here is _fs's: the rest of _static stays pure.)


def from_memory(
    path: str,
    ident: tuple[int, ...],
    small: bool,
    cache_root: str | None,
    get: bool,
    kept: bytes | None = None,
) -> bytes | Literal[False] | None:
    """The body of a kept answer from memory, once a ``stat`` shows *path* still names the file
    *ident* describes: ``b""`` for a ``HEAD`` (not *get*), a *small* file's bytes (*kept* with the
    answer, else the hot-file cache's). None: not in memory (a ``GET`` then goes to
    :func:`reopen_kept`); False: the file changed (decide again, forget the kept answer)."""
    if get:
        if not small:
            return None
        body = kept if kept is not None else _hot.hot_files.body(path, cache_root, ident)
        if body is None:
            return None
    else:
        body = b""
    return body if same_file(path, ident) else False


def reopen_kept(
    path: str, ident: tuple[int, ...], small: bool, cache_root: str | None, read_max: int = 0
) -> tuple[int, int, bytes | bytearray | Literal[False] | None] | None:
    """A kept answer's file opened again, if ``fstat`` shows it is the file *ident* describes:
    its descriptor, its size, and for a *small* one its bytes read back with one ``RWF_NOWAIT``
    read (``_fs.read_back``: into the hot-file cache if it admits them, or up to *read_max*; then
    the descriptor is closed), False if its pages are not all cached, None if not read. None: it is
    not that file (replaced, renamed over, grown, truncated, chmod'ed, gone): nothing is open."""
    opened = reopen(path, ident)
    if opened is None:
        return None
    fd, st = opened
    body = read_back(fd, st, path, cache_root, read_max) if small else None
    return fd, st.st_size, body


#: A first sight's route, and for a file its descriptor and ``fstat`` where it was opened already.
Looked = tuple[str | Answer, tuple[int, os.stat_result] | None]


def first_look(
    request: Request, policy: DirectoryPolicy, recent: RecentPaths, key: bytes, now: float
) -> Looked | None:
    """A request's route, and for a file its descriptor and ``fstat`` where its lookup waited for
    no disk (``decide(..., opened=)`` skips its own open then), to :func:`decide_looked` on the
    loop. None: the lookup would read the disk and *key* was not decided within *recent*'s
    seconds of *now*: :func:`look_up` it in the pool, note it in *recent*, then :func:`look_again`."""
    path = route(request, policy)
    if isinstance(path, Answer):
        return path, None
    found = open_cached(path)
    if type(found) is tuple:
        return path, found
    if (found is False or (found is None and lookup_cached(path) is not True)) and not recent.seen(key, now):
        return None
    return path, None


def look_up(request: Request, policy: DirectoryPolicy) -> None:
    """(In a pool thread.) Look up the file *request* names, so that deciding it on the loop next
    waits for no disk: its ``stat`` brings the directory entries and inode into the kernel's
    caches. Whatever it finds (or fails to find) is decided again on the loop."""
    path = route(request, policy)
    if isinstance(path, str):
        look_up_path(path)


def look_again(request: Request, policy: DirectoryPolicy) -> Looked:
    """A first sight's route on the loop once the pool has looked it up (its lookup cached now):
    the file opened by ``open_cached`` where no symlink lies on the way, as :func:`first_look`."""
    path = route(request, policy)
    if isinstance(path, Answer):
        return path, None
    found = open_cached(path)
    return path, found if type(found) is tuple else None


def decide_looked(request: Request, looked: Looked, policy: DirectoryPolicy) -> Answer:
    """The core's answer on the loop for what :func:`first_look` or :func:`look_again` found (a
    descriptor in *looked* is the answer's now: used or closed). Raises ``DecideInPool`` for a
    directory listing to build: the door decides that in its pool (``answer(..., POOL_FS)``)."""
    path, opened = looked
    return path if isinstance(path, Answer) else decide(request, path, policy, opened=opened)


def browser_folder(path: str, policy: DirectoryPolicy) -> tuple[str, tuple[int, ...]] | None:
    """For a browser's request of what ``route`` gave as *path*: the folder its file lies in, and
    that folder's identity now (``_fs.folder_identity``), taken before the core looks for
    siblings. The root's own path (``/``, a mount's bare prefix) names its index: the root."""
    return folder_identity(os.path.join(path, "") if path == policy.root else path)


def for_browsers(folder: tuple[str, tuple[int, ...]] | None, path: str) -> bool:
    """Whether an answer about the file *path*, decided after *folder* was looked at
    (:func:`browser_folder`), may be kept for browsers' requests: the file lies in that folder and
    no name a pre-compressed sibling of it could have is there, in any form."""
    return folder is not None and folder[0] == os.path.dirname(path) and no_sibling_names(path)
