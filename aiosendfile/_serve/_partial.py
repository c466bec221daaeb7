"""Resumable uploads, the store: partial files that become files whole or not at all.

An upload in progress is two things on disk:

* its **partial file**, ``.upload-<id>.partial`` in the directory it will land in (so that it is
  given its name there by a ``link``, atomically, as a ``PUT`` body is); bodies are written (or
  spliced) into it at its end, and its size is the upload's offset: what a client has been told
  it need not send again;
* its **record**, ``<root>/.upload-state/<id>.json``: where it goes, its length once known, who
  made it, when it was last added to, and once it is complete, its final status (kept a while:
  a client that lost the final answer asks again and is told it is complete).

``<id>`` is a hash of the token (``_resumable.id_of``): the token names an upload and is known to
its client only. Names starting ``.upload-`` are never served, listed, archived or uploaded to
(``_static._paths``), whatever ``--show-dotfiles`` says.

Every step runs in the cold pool, holds the partial file's ``flock`` while it writes (an append
from another worker, or a stale connection of this one, finds it held: :class:`Busy`), and
judges the directory by the descriptor it opens (``open_directory``): a directory swapped meanwhile
gets nothing. An upload with no progress for ``expiry`` seconds is removed (:meth:`Store.sweep`).
One request's part of an upload (creation, append) is ``_partial_upload.ResumableUpload``.

Bounds: at most ``per_owner`` uploads in progress per user (with passwords) or address, holding
at most ``owner_bytes`` (their announced lengths, else what they hold); ``MAX_RECORDS`` records
for the whole server (completed ones are dropped first); one upload at most ``max_size``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

try:
    import fcntl
except ImportError:  # (Windows: no flock, no resumable uploads)
    fcntl = None  # type: ignore[assignment]

from .._static._policy import DirectoryPolicy
from ._upload import UploadRefused, open_directory, status_of

__all__ = (
    "AVAILABLE",
    "BUSY_TRIES",
    "BUSY_WAIT",
    "CREATED_MAX",
    "MAX_RECORDS",
    "RECORD_MAX",
    "REGISTRY",
    "Busy",
    "Landing",
    "Limits",
    "RecordTooLarge",
    "Store",
    "lock",
    "busy_status",
    "lifetime",
    "partial_name",
    "still_named",
    "wait_for_holder",
)

#: The folder (at the root) holding the records.
REGISTRY = ".upload-state"
#: A record is read back up to this many bytes (``Store.load``): one longer is no record, which no
#: bound counts and no expiry removes, so none is written (``Store.save``). A creation's is kept to
#: half of it, the room what later requests note in it (its length, its file's identity, where it
#: landed) may take: a tus ``Upload-Metadata`` (any bytes in its keys, several fields one list,
#: each byte up to six in JSON) is the one part of a record a client sizes.
RECORD_MAX = 64 * 1024
CREATED_MAX = RECORD_MAX // 2
#: Records (uploads in progress and completed ones remembered) a server keeps.
MAX_RECORDS = 1024
#: Seconds a completed upload is remembered (at most its expiry).
KEEP_DONE = 600.0
#: Seconds an upload nothing was sent to is kept (at most its expiry): a made-up upload costs a
#: record for ten minutes, not a day.
KEEP_EMPTY = 600.0


def lifetime(record: dict[str, Any], expiry: float) -> float:
    """The seconds *record*'s upload is kept after its last progress: *expiry*, but ten minutes
    (at most) for one that was never sent to, or is complete. What its answers say it has left
    (``Upload-Limit: max-age``, ``Upload-Expires``) is this, so that a client is told the truth."""
    if record.get("done") is not None:
        return min(KEEP_DONE, expiry)
    if not record.get("size"):  # (nothing sent yet, whatever length it announced)
        return min(KEEP_EMPTY, expiry)
    return expiry


#: A request finding the partial file written by another is tried again, this often, this far
#: apart (about 2 s: the other request, stopped, lets go meanwhile), then answered 423.
BUSY_TRIES = 40
BUSY_WAIT = 0.05


class Busy(Exception):
    """The partial file is being written by another request (its lock is held): try again soon
    (the record was found, and is the asker's: the request writing it may be stopped)."""


class Landing(Busy):
    """The partial file is gone but its record does not say the upload is complete yet: it is being
    given its name. Asked again, it is complete, or (still so) gone: 404."""


class RecordTooLarge(ValueError):
    """A record larger than ``Store.load`` reads back: not written."""


class Limits(NamedTuple):
    expiry: float  # seconds without progress before an upload in progress is removed
    per_owner: int  # uploads in progress one user (or address) may have
    owner_bytes: int  # and their bytes, all together
    max_size: int | None  # one upload's (--max-upload-size)


#: Whether resumable uploads work here (they need ``flock``).
AVAILABLE = fcntl is not None


def partial_name(upload_id: str) -> str:
    return f".upload-{upload_id}.partial"


class Store:
    """The records and partial files of one served root (see the module). Pool-thread methods."""

    def __init__(self, policy: DirectoryPolicy, overwrite: bool, limits: Limits) -> None:
        assert policy.root is not None
        self.policy = policy
        self.root = policy.root
        self.overwrite = overwrite
        self.limits = limits
        #: the records read, by file name: ((inode, mtime, size), record)
        self._read: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    # -- records --------------------------------------------------------------------------------

    def _registry(self, make: bool) -> int:
        """A descriptor of the records' folder (never a symlink; made if missing and *make*)."""
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                return os.open(
                    REGISTRY, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd
                )
            except FileNotFoundError:
                if not make:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(REGISTRY, 0o700, dir_fd=root_fd)
                return os.open(
                    REGISTRY, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd
                )
        finally:
            os.close(root_fd)

    @contextlib.contextmanager
    def registry(self, exclusive: bool = False, make: bool = False) -> Any:
        """The records' folder, open (and ``flock``'ed, *exclusive*: counting and making records is
        one step across the workers); made if missing and *make*, else UploadRefused 404."""
        try:
            fd = self._registry(make)
        except FileNotFoundError:
            raise UploadRefused(404) from None
        except OSError as exc:
            raise UploadRefused(status_of(exc), "no place for upload records") from None
        try:
            if exclusive and fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # (and its flock with it)

    @staticmethod
    def load(reg: int, upload_id: str) -> dict[str, Any] | None:
        try:
            fd = os.open(upload_id + ".json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=reg)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                record = json.loads(f.read(RECORD_MAX))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("v") == 1 else None

    @staticmethod
    def save(reg: int, upload_id: str, record: dict[str, Any], most: int = RECORD_MAX) -> None:
        """Write *record* whole (a new file renamed over the old one); ``RecordTooLarge`` if it
        would take more than *most* bytes (nothing written): :meth:`load` could not read it back."""
        data = json.dumps(record).encode()
        if len(data) > most:
            raise RecordTooLarge(f"an upload record of {len(data)} bytes")
        temp = f"{upload_id}.{secrets.token_hex(4)}.tmp"
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=reg
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temp, upload_id + ".json", src_dir_fd=reg, dst_dir_fd=reg)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=reg)
            raise

    def forget(self, reg: int, upload_id: str, record: dict[str, Any]) -> None:
        """Remove an upload: its partial file (if it is still the one recorded) and its record."""
        if record.get("done") is None:
            with contextlib.suppress(UploadRefused, OSError):
                dir_fd = open_directory(self._parent(record), self.policy)
                try:
                    name = partial_name(upload_id)
                    st = os.lstat(name, dir_fd=dir_fd)
                    recorded = (record.get("dev"), record.get("ino"))
                    if recorded == (None, None) or (st.st_dev, st.st_ino) == recorded:
                        os.unlink(name, dir_fd=dir_fd)  # (None: made under its name, not yet noted)
                finally:
                    os.close(dir_fd)
        with contextlib.suppress(OSError):
            os.unlink(upload_id + ".json", dir_fd=reg)

    def relative(self, path: str) -> str:
        """*path* (under the root) as a record names it."""
        return os.path.relpath(path, self.root)

    def _parent(self, record: dict[str, Any]) -> str:
        parent = os.path.dirname(record["path"])
        return os.path.join(self.root, parent) if parent else self.root

    def expired(self, record: dict[str, Any], now: float, upload_id: str | None = None) -> bool:
        """Whether *record*'s upload has had no progress for its time (:func:`lifetime`). With
        *upload_id*, its partial file's last write counts as progress (a request cut before it
        noted any)."""
        expiry = self.limits.expiry
        keep = lifetime(record, expiry)
        if now - float(record.get("touched", 0)) <= keep:
            return False
        if upload_id is None or record.get("done") is not None:
            return True
        with contextlib.suppress(UploadRefused, OSError):
            dir_fd = open_directory(self._parent(record), self.policy)
            try:
                written = os.lstat(partial_name(upload_id), dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
            if written.st_size:  # (bytes came: the whole expiry from the last of them)
                keep = expiry
            return now - max(written.st_mtime, float(record.get("touched", 0))) > keep
        return True

    def _records(self, reg: int) -> list[tuple[str, dict[str, Any]]]:
        """Every record, each read again only when its file changed (a record is replaced by a
        rename: a new inode): counting a full registry's costs a ``stat`` a record, not a read."""
        found = []
        seen = {}
        with os.scandir(reg) as entries:
            for entry in entries:
                name = entry.name
                if not (name.endswith(".json") and len(name) == 37):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
                with self._lock:
                    kept = self._read.get(name)
                record = kept[1] if kept is not None and kept[0] == stamp else self.load(reg, name[:-5])
                if record is not None:
                    seen[name] = (stamp, record)
                    found.append((name[:-5], record))
        with self._lock:
            self._read = seen  # (what is no longer there is forgotten: bounded by the registry)
        return found

    def sweep(self, now: float | None = None) -> int:
        """Remove what has expired (an upload being written is left for next time); the count."""
        now = time.time() if now is None else now
        removed = 0
        if not os.path.isdir(os.path.join(self.root, REGISTRY)):
            return 0  # (no upload was ever made here)
        with self.registry(exclusive=True) as reg:
            for upload_id, record in self._records(reg):
                if self.expired(record, now, upload_id) and not self._held(record, upload_id):
                    self.forget(reg, upload_id, record)
                    removed += 1
            for name in os.listdir(reg):  # (a record half-written by a worker that died)
                if name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        if now - os.lstat(name, dir_fd=reg).st_mtime > 60:
                            os.unlink(name, dir_fd=reg)
        return removed

    def _held(self, record: dict[str, Any], upload_id: str) -> bool:
        """Whether the upload's partial file is locked by a request writing it."""
        if record.get("done") is not None or fcntl is None:
            return False
        try:
            dir_fd = open_directory(self._parent(record), self.policy)
        except UploadRefused:
            return False
        try:
            fd = os.open(partial_name(upload_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return False
        finally:
            os.close(dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def _holds(self, record: dict[str, Any], upload_id: str) -> int:
        """The bytes an upload of no known length counts for: what it holds, or what a request
        writing it now may bring it to. A share noted by a request that is gone without taking it
        back (its server killed) counts for nothing: nothing holds the partial file's lock."""
        size = int(record.get("size", 0))
        reserved = int(record.get("reserved", 0))
        if reserved > size and self._held(record, upload_id):
            return reserved
        return size

    def make_room(self, reg: int, owner: str, length: int | None, now: float) -> None:
        """Judge a new upload of *owner*'s (announcing *length*) against the bounds, removing what
        has expired first (UploadRefused 507 if it has no room)."""
        records = []
        for upload_id, record in self._records(reg):
            if self.expired(record, now, upload_id) and not self._held(record, upload_id):
                self.forget(reg, upload_id, record)
            else:
                records.append((upload_id, record))
        if len(records) >= MAX_RECORDS:  # completed ones go first, oldest first
            done = sorted((r["touched"], i, r) for i, r in records if r.get("done") is not None)
            for _, upload_id, record in done[: len(records) - MAX_RECORDS + 1]:
                self.forget(reg, upload_id, record)
                records.remove((upload_id, record))
            if len(records) >= MAX_RECORDS:
                raise UploadRefused(507, "too many uploads in progress")
        mine = [(i, r) for i, r in records if r.get("owner") == owner and r.get("done") is None]
        if len(mine) >= self.limits.per_owner:
            raise UploadRefused(507, "too many uploads in progress for this client")
        held = sum(int(r["length"]) if r.get("length") is not None else self._holds(r, i) for i, r in mine)
        if held + (length or 0) > self.limits.owner_bytes:
            raise UploadRefused(507, "too many bytes in uploads in progress for this client")

    def room(self, reg: int, owner: str, upload_id: str) -> int:
        """The bytes *owner*'s upload *upload_id* may hold: ``owner_bytes`` less what the owner's
        other uploads in progress hold (their lengths, else their sizes)."""
        held = 0
        for other, record in self._records(reg):
            if other != upload_id and record.get("owner") == owner and record.get("done") is None:
                length = record.get("length")
                held += int(length) if length is not None else self._holds(record, other)
        return self.limits.owner_bytes - held

    def note(self, upload_id: str, record: dict[str, Any]) -> None:
        """Save *record* if it is still there (an upload cancelled meanwhile, by another worker,
        stays cancelled)."""
        with contextlib.suppress(UploadRefused, OSError), self.registry() as reg:
            if self.load(reg, upload_id) is not None:
                self.save(reg, upload_id, record)

    # -- bodiless steps ---------------------------------------------------------------------------

    def look(self, upload_id: str, path: str, user: str | None) -> tuple[dict[str, Any], int]:
        """The record of an upload and its offset (HEAD): UploadRefused 404 if there is none (or it
        is another path's or another user's); Busy while a request writes it."""
        with self.registry() as reg:
            record = self._mine(reg, upload_id, path, user)
        if record.get("done") is not None:
            return record, int(record["length"])
        try:
            dir_fd, fd = self._open_partial(upload_id, record)
        except UploadRefused:
            raise Landing() from None  # (or gone: asked again, 404)
        try:
            lock(fd)
            # Read again under the lock (another worker may have removed or completed the upload
            # since, the lock free); it removes one under its registry's lock, the file first.
            with self.registry(exclusive=True) as reg:
                now = self.load(reg, upload_id)
            if now is None or os.fstat(fd).st_nlink == 0:
                raise UploadRefused(404)
            if now.get("done") is not None:
                return now, int(now["length"])
            if not still_named(dir_fd, partial_name(upload_id), fd):
                raise Landing()  # (being given its name, its record not yet saying so: asked again)
            os.fdatasync(fd)  # (the offset told is never one a crash takes back)
            return now, os.fstat(fd).st_size
        finally:
            os.close(fd)
            os.close(dir_fd)

    def cancel(self, upload_id: str, path: str, user: str | None) -> dict[str, Any]:
        """Remove an upload (DELETE): UploadRefused 404 as :meth:`look`; Busy while written."""
        with self.registry(exclusive=True) as reg:
            record = self._mine(reg, upload_id, path, user)
            if self._held(record, upload_id):
                raise Busy()
            self.forget(reg, upload_id, record)
        return record

    def _mine(self, reg: int, upload_id: str, path: str, user: str | None) -> dict[str, Any]:
        record = self.load(reg, upload_id)
        if record is None or record.get("path") != path or record.get("user") != user:
            raise UploadRefused(404)
        if self.expired(record, time.time(), upload_id) and not self._held(record, upload_id):
            self.forget(reg, upload_id, record)
            raise UploadRefused(404)
        return record

    def _open_partial(self, upload_id: str, record: dict[str, Any]) -> tuple[int, int]:
        """The upload's directory and partial file, open (UploadRefused 404 if it is gone, or is
        no longer the file recorded: a swapped directory, a replaced file)."""
        dir_fd = open_directory(self._parent(record), self.policy)
        try:
            fd = os.open(partial_name(upload_id), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            os.close(dir_fd)
            raise UploadRefused(404) from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (record["dev"], record["ino"]) or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            os.close(dir_fd)
            raise UploadRefused(404)
        return dir_fd, fd


def wait_for_holder(engine: Any, upload_id: str, conn: Any, tries: int, again: Callable[[], None]) -> bool:
    """A request of *conn* found *upload_id* :class:`Busy`: call *again* soon and say True, or
    say False once it has waited its ``BUSY_TRIES``. At the first try, the request of another
    connection of this worker still writing the upload is stopped (the client has given up on
    it, and resumes): its connection is dropped, what it wrote stays."""
    if tries >= BUSY_TRIES:
        return False
    if tries == 0:
        holder = engine.appending.pop(upload_id, None)
        if holder is not None and holder is not conn and holder.transport is not None:
            holder.transport.abort()
    engine.loop.call_later(BUSY_WAIT, again)
    return True


def busy_status(exc: Busy) -> int:
    """The answer once a request has waited for a :class:`Busy` upload in vain: 423 while another
    request writes it; 404 if its partial file stayed gone (:class:`Landing`)."""
    return 404 if isinstance(exc, Landing) else 423


def still_named(dir_fd: int, name: str, fd: int) -> bool:
    """Whether *name* in *dir_fd* still names the file open as *fd* (a partial file given its
    final name by a link and an unlink is no longer under it)."""
    try:
        named = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return False
    st = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino)


def lock(fd: int) -> None:
    """Take the partial file's lock, or Busy."""
    if fcntl is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise Busy() from None
        raise
