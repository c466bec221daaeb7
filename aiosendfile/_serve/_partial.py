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
from typing import Any, NamedTuple

try:
    import fcntl
except ImportError:  # (Windows: no flock, no resumable uploads)
    fcntl = None  # type: ignore[assignment]

from .._static._answer import Answer
from .._static._policy import DirectoryPolicy
from ._resumable import CREATE, TUS_EXTENSIONS, Ask, expires_field, id_of, interim, limit_field
from ._upload import Target, Upload, UploadRefused, open_directory, status_of

__all__ = (
    "AVAILABLE",
    "BUSY_TRIES",
    "BUSY_WAIT",
    "MAX_RECORDS",
    "REGISTRY",
    "Busy",
    "Landing",
    "Limits",
    "ResumableUpload",
    "Store",
    "options_answer",
    "stop_holder",
    "status_answer",
)

#: The folder (at the root) holding the records.
REGISTRY = ".upload-state"
#: Records (uploads in progress and completed ones remembered) a server keeps.
MAX_RECORDS = 1024
#: Seconds a completed upload is remembered (at most its expiry).
KEEP_DONE = 600.0
#: Seconds an upload nothing was sent to is kept (at most its expiry): a made-up upload costs a
#: record for ten minutes, not a day.
KEEP_EMPTY = 600.0

_TUS = ("Tus-Resumable", "1.0.0")
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
                record = json.loads(f.read(64 * 1024))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("v") == 1 else None

    @staticmethod
    def save(reg: int, upload_id: str, record: dict[str, Any]) -> None:
        """Write *record* whole (a new file renamed over the old one)."""
        data = json.dumps(record).encode()
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

    def _parent(self, record: dict[str, Any]) -> str:
        parent = os.path.dirname(record["path"])
        return os.path.join(self.root, parent) if parent else self.root

    def expired(self, record: dict[str, Any], now: float, upload_id: str | None = None) -> bool:
        """Whether *record*'s upload has had no progress for its time: its expiry (ten minutes
        for one that was never sent to, or is complete). With *upload_id*, its partial file's
        last write counts as progress (a request cut before it noted any)."""
        expiry = self.limits.expiry
        if record.get("done") is not None:
            keep = min(KEEP_DONE, expiry)
        elif not record.get("size"):  # (nothing sent yet, whatever length it announced)
            keep = min(KEEP_EMPTY, expiry)
        else:
            keep = expiry
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
        mine = [r for _, r in records if r.get("owner") == owner and r.get("done") is None]
        if len(mine) >= self.limits.per_owner:
            raise UploadRefused(507, "too many uploads in progress for this client")
        held = sum(int(r["length"]) if r.get("length") is not None else _holds(r) for r in mine)
        if held + (length or 0) > self.limits.owner_bytes:
            raise UploadRefused(507, "too many bytes in uploads in progress for this client")

    def room(self, reg: int, owner: str, upload_id: str) -> int:
        """The bytes *owner*'s upload *upload_id* may hold: ``owner_bytes`` less what the owner's
        other uploads in progress hold (their lengths, else their sizes)."""
        held = 0
        for other, record in self._records(reg):
            if other != upload_id and record.get("owner") == owner and record.get("done") is None:
                length = record.get("length")
                held += int(length) if length is not None else _holds(record)
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
            _lock(fd)
            os.fdatasync(fd)  # (the offset told is never one a crash takes back)
            return record, os.fstat(fd).st_size
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


def _holds(record: dict[str, Any]) -> int:
    """The bytes an upload of no known length counts for: what it holds, or what a request under
    way may bring it to."""
    return max(int(record.get("size", 0)), int(record.get("reserved", 0)))


def stop_holder(engine: Any, upload_id: str, conn: Any) -> None:
    """Stop the request of another connection of this worker that is writing *upload_id* (the
    client has given up on it, and resumes): its connection is dropped, what it wrote stays."""
    holder = engine.appending.pop(upload_id, None)
    if holder is not None and holder is not conn and holder.transport is not None:
        holder.transport.abort()


def _lock(fd: int) -> None:
    """Take the partial file's lock, or Busy."""
    if fcntl is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise Busy() from None
        raise


class ResumableUpload(Upload):
    """One request's part of a resumable upload: a creation (with or without a body) or an
    append. It lands as a :class:`~._upload.Upload` does (``write``, or splice at ``written``), but
    into the partial file, and an :meth:`abort` keeps what was written: the client resumes there.
    Pool-thread calls, in order: :meth:`open`, :meth:`write`..., then :meth:`commit` or
    :meth:`abort`."""

    def __init__(
        self,
        store: Store,
        ask: Ask,
        target: Target,
        path: str,
        token: bytes,
        user: str | None,
        owner: str,
        location: str,
        body_length: int | None,
    ) -> None:
        super().__init__(target, store.policy, store.overwrite)
        self.store = store
        self.ask = ask
        self.path = path  # relative to the root: what the record says
        self.id = id_of(token)
        self.user = user
        self.owner = owner
        self.location = location
        self.body_length = body_length
        self.start = 0
        self.length: int | None = None  # the whole upload's, once known
        self.record: dict[str, Any] | None = None
        self.replay: Answer | None = None  # an append to a completed upload: its final answer again
        self.locked = False
        self.room = store.limits.owner_bytes  # the bytes it may hold: its owner's share, less the others'

    # -- the fields of its answers -----------------------------------------------------------------

    def _expires(self) -> float:
        return float((self.record or {}).get("touched", time.time())) + self.store.limits.expiry

    def _limit(self) -> tuple[str, str]:
        return limit_field(self.store.limits.max_size, self._expires() - time.time())

    def fields(self, offset: int | None, complete: bool | None) -> list[tuple[str, str]]:
        """The fields of an answer to this request (*offset*: the upload's, if it is to be told)."""
        fields: list[tuple[str, str]] = []
        if self.ask.tus:
            fields.append(_TUS)
            if offset is not None:
                fields.append(("Upload-Offset", str(offset)))
            if complete is False:
                fields.append(expires_field(self._expires()))
        else:
            if complete is not None:
                fields.append(("Upload-Complete", "?1" if complete else "?0"))
            if offset is not None:
                fields.append(("Upload-Offset", str(offset)))
            if complete is False:
                fields.append(self._limit())
        return fields

    def refused(
        self, status: int, why: str = "", offset: int | None = None, complete: bool | None = False
    ) -> UploadRefused:
        exc = UploadRefused(status, why)
        exc.extra = tuple(self.fields(offset, complete))
        return exc

    def interim(self) -> bytes | None:
        """The 104 a creation sends once its upload exists (IETF, a client of this interop
        version, HTTP/1.1: the caller checks that), else None."""
        if self.ask.step == CREATE and not self.ask.tus and self.ask.interop:
            return interim(self.location, self._limit())
        return None

    # -- the pool's steps ------------------------------------------------------------------------------

    def open(self) -> None:
        try:
            if self.ask.step == CREATE:
                self._create()
            else:
                self._resume()
        except UploadRefused as exc:
            self.abort()
            if not exc.extra and self.ask.tus:
                exc.extra = tuple(self.fields(None, None))  # (every tus answer says its version)
            raise
        except BaseException:
            self.abort()
            raise

    def _announced(self, offset: int) -> int | None:
        """The whole upload's length as this request tells it (UploadRefused 400 where its fields
        disagree with each other or with the record)."""
        ask = self.ask
        lengths = set()
        if ask.length is not None:
            lengths.add(ask.length)
        if ask.complete and self.body_length is not None:
            lengths.add(offset + self.body_length)
        known = None if self.record is None else self.record.get("length")
        if known is not None:
            lengths.add(int(known))
        if len(lengths) > 1:
            raise self.refused(400, "inconsistent upload length", offset)
        length = lengths.pop() if lengths else None
        reach = offset + (self.body_length or 0)
        if length is not None and length < reach:
            raise self.refused(400, "inconsistent upload length", offset)
        largest = self.store.limits.max_size
        if largest is not None and (reach if length is None else length) > largest:
            raise self.refused(413, "larger than the server takes", offset)
        # The owner's share: judged for a length told now, or for the bytes a request of no known
        # length adds; a length the record holds was judged when it was told.
        needed = reach if length is None else None if known is not None else length
        if needed is not None and needed > offset and needed > self.room:
            raise self.refused(507, "too many bytes in uploads in progress for this client", offset)
        return length

    def _create(self) -> None:
        self.dir_fd = open_directory(self.target.parent, self.policy)
        self._may_take_name()
        self.length = self._announced(0)
        now = time.time()
        with self.store.registry(exclusive=True, make=True) as reg:
            self.store.make_room(reg, self.owner, self.length, now)
            self.room = self.store.room(reg, self.owner, self.id)
            record = {
                "v": 1,
                "path": self.path,
                "length": self.length,
                "user": self.user,
                "owner": self.owner,
                "tus": self.ask.tus,
                "metadata": (self.ask.metadata or b"").decode("latin-1"),
                "dev": None,  # (until its partial file is made: a crash between leaves no orphan)
                "ino": None,
                "size": 0,
                "created": now,
                "touched": now,
                "done": None,
            }
            name = partial_name(self.id)
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                self.store.save(reg, self.id, record)
                self.fd = os.open(name, flags, 0o644, dir_fd=self.dir_fd)
                self.temp = name
                _lock(self.fd)
                self.locked = True
                st = os.fstat(self.fd)
                record.update(dev=st.st_dev, ino=st.st_ino)
                self.store.save(reg, self.id, record)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(self.id + ".json", dir_fd=reg)
                raise self.refused(status_of(exc)) from None
            self.record = record

    def _resume(self) -> None:
        store = self.store
        with store.registry() as reg:
            self.record = record = store._mine(reg, self.id, self.path, self.user)
        if record.get("done") is not None:
            self._completed(record)
            return
        try:
            self.dir_fd, self.fd = store._open_partial(self.id, record)
        except UploadRefused:
            raise Landing() from None  # (being given its name: asked again, complete; or gone: 404)
        self.temp = partial_name(self.id)  # (named so: given its name by a link when complete)
        _lock(self.fd)
        self.locked = True
        offset = os.fstat(self.fd).st_size
        try:
            if self.ask.offset != offset:
                raise self.refused(409, "mismatching upload offset", offset)
            # Judged and noted as one step across the workers: two requests telling lengths, or
            # a creation, cannot both take the same room.
            with store.registry(exclusive=True) as reg:
                self.room = store.room(reg, str(record.get("owner")), self.id)
                self.length = self._announced(offset)
                if self.length is not None and record.get("length") is None:  # told now: kept, even if cut
                    record["length"] = self.length
                    store.save(reg, self.id, record)
                elif self.length is None:  # what it may take, counted against its owner meanwhile
                    reach = offset + self.body_length if self.body_length is not None else self.room
                    record["reserved"] = max(offset, reach)
                    store.save(reg, self.id, record)
        except UploadRefused:
            os.fdatasync(self.fd)  # (the offset it tells is never one a crash takes back)
            raise
        self.start = self.written = offset

    def _completed(self, record: dict[str, Any]) -> None:
        """An append to an upload already complete: its final answer again if the request is the
        one that completed it (its answer was lost), else 409 (nothing is changed)."""
        length = int(record["length"])
        if self.ask.offset == length and not self.body_length:
            self.length = length
            self.start = self.written = length
            self.replay = self.final(bool(record["done"] == 201))
            return
        raise self.refused(409, "the upload is complete", length, complete=True)

    def write(self, data: bytes | memoryview) -> None:
        end = self.written + len(data)
        if self.replay is not None or (self.length is not None and end > self.length):
            raise self.refused(400, "inconsistent upload length", self.written)
        if self.store.limits.max_size is not None and end > self.store.limits.max_size:
            raise self.refused(413, "larger than the server takes", self.written)
        if self.length is None and end > self.room:
            raise self.refused(507, "too many bytes in uploads in progress for this client", self.written)
        super().write(data)

    def commit(self, size: int) -> Answer:  # type: ignore[override]
        """This request's body is all there (*size* bytes): the upload is complete (flushed, given
        its name) if the request says so (IETF ``Upload-Complete: ?1``; tus: its length reached),
        else its record is brought up to date. The answer."""
        if self.replay is not None:
            return self.replay
        offset = self.written
        if os.fstat(self.fd).st_size != offset or offset != self.start + size:
            raise self.refused(400, "the body is not the length announced", os.fstat(self.fd).st_size)
        length = self.length
        if self.ask.tus:
            if length is None and self.ask.length is not None:
                length = self.length = self.ask.length  # (a deferred length, told now)
            complete = length is not None and offset == length
        else:
            complete = bool(self.ask.complete)
            if complete and length is not None and offset != length:
                raise self.refused(400, "inconsistent upload length", offset)
        record = self.record
        assert record is not None
        if not complete:
            os.fdatasync(self.fd)  # (the offset told is never one a crash takes back)
            record.pop("reserved", None)
            record.update(length=length, size=offset, touched=time.time())
            self.store.note(self.id, record)
            self._release()
            if self.ask.step == CREATE:
                return Answer(201, [("Location", self.location), *self.fields(offset, False)], 0, body=b"")
            return Answer(204, self.fields(offset, False), None)
        try:
            new = self._land(offset)
        except UploadRefused as exc:  # (the name is taken now...): the upload is over
            with self.store.registry() as reg:
                self.store.forget(reg, self.id, record)
            self.abort()
            raise self.refused(exc.status, "", None, complete=True) from None
        finally:
            self._release()
        record.pop("reserved", None)
        record.update(length=offset, size=offset, touched=time.time(), done=201 if new else 204)
        self.store.note(self.id, record)
        return self.final(new)

    def _land(self, size: int) -> bool:
        """Flush the partial file and give it its name (``Upload.commit``'s rules)."""
        return Upload.commit(self, size)

    def final(self, new: bool) -> Answer:
        """The answer of the request that completes the upload: IETF, the one a ``PUT`` gets (201
        for a new file, 204 for one replaced); tus, 201 to a creation, 204 to an append."""
        if self.ask.tus:
            fields = self.fields(self.length, None)
            if self.ask.step == CREATE:
                return Answer(201, [("Location", self.location), *fields], 0, body=b"")
            return Answer(204, fields, None)
        fields = self.fields(None, True)
        return Answer(201, fields, 0, body=b"") if new else Answer(204, fields, None)

    def abort(self) -> None:
        """This request is over without completing the upload: what was written stays (the client
        resumes at its end), unless the upload was being created and has no record."""
        record = self.record
        if record is None and self.temp is not None and self.dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.temp, dir_fd=self.dir_fd)
        elif record is not None and self.fd >= 0 and record.get("done") is None:
            moved = self.written > self.start
            if moved or "reserved" in record:
                record.pop("reserved", None)
                if moved:
                    record.update(size=self.written, touched=time.time())  # (progress, even cut short)
                self.store.note(self.id, record)
        self._release()

    def _release(self) -> None:
        self.temp = None
        self.locked = False
        self._close()  # (the lock goes with the descriptor)

    def answer(self, result: Answer) -> Answer:  # type: ignore[override]
        return result


def status_answer(ask: Ask, record: dict[str, Any], offset: int, limits: Limits) -> Answer:
    """The answer to a ``HEAD`` of an upload resource: where it stands (never cached)."""
    done = record.get("done") is not None
    length = record.get("length")
    expires = float(record.get("touched", 0)) + limits.expiry
    fields: list[tuple[str, str]] = []
    if ask.tus:
        fields += [_TUS, ("Upload-Offset", str(offset))]
        fields.append(("Upload-Length", str(length)) if length is not None else ("Upload-Defer-Length", "1"))
        if record.get("metadata"):
            fields.append(("Upload-Metadata", record["metadata"]))
        if not done:
            fields.append(expires_field(expires))
        status = 200
    else:
        fields += [("Upload-Offset", str(offset)), ("Upload-Complete", "?1" if done else "?0")]
        if length is not None:
            fields.append(("Upload-Length", str(length)))
        fields.append(limit_field(limits.max_size, None if done else expires - time.time()))
        status = 204
    fields.append(("Cache-Control", "no-store"))
    return Answer(status, fields, None, head_only=True)


def options_answer(limits: Limits) -> Answer:
    """The answer to ``OPTIONS`` under ``--upload``: the methods, what tus and the IETF draft
    take here."""
    fields = [
        ("Allow", "GET, HEAD, OPTIONS, PUT, POST, PATCH, DELETE"),
        _TUS,
        ("Tus-Version", "1.0.0"),
        ("Tus-Extension", TUS_EXTENSIONS),
    ]
    if limits.max_size is not None:
        fields.append(("Tus-Max-Size", str(limits.max_size)))
    fields.append(limit_field(limits.max_size))
    return Answer(204, fields, None)
