"""``serve --upload``: a ``PUT`` body into a file that appears whole or not at all.

Where it goes (:func:`upload_target`, pure): the request path decoded once and held to the read
rules (no ``..``, no dotfile unless they are served, no NUL or backslash) and to the write ones:
no control character, no empty or dot component, a name at the end (a path ending in ``/`` is
a directory: 405). The parent must be a directory inside the served root (a symlink out of it
counts as outside unless symlinks are followed).

How it lands (:class:`Upload`, in the cold pool: every call may wait for the disk): the body is
written to a nameless temporary file in the target directory (Linux's ``O_TMPFILE``: nothing a
listing or a crash could leave behind), or where the file system has none, to a hidden
``.upload-*`` file there, removed on any failure. Only once the body is complete and its length
is the one announced is the file flushed to disk (``fsync``) and given its name: linked, which
fails if the name exists (409) unless ``overwrite``, then renamed over it, atomically; the
directory is then flushed too. Two uploads to one name never mix bytes: each has its own
temporary file, and the last to finish wins.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from typing import TYPE_CHECKING, NamedTuple

from .._static._paths import checked, decode, inside
from .._static._policy import DirectoryPolicy

__all__ = (
    "BUFFER",
    "DISCARD_MAX",
    "SPLICE_AT",
    "Receiving",
    "Target",
    "Upload",
    "UploadRefused",
    "bad_name",
    "checked_directory",
    "status_of",
    "upload_directory",
    "upload_target",
)

if TYPE_CHECKING:
    from ._form import FormUpload

_O_TMPFILE = getattr(os, "O_TMPFILE", 0)


class Target(NamedTuple):
    """Where an upload goes: its directory and its name there (both under the root)."""

    parent: str
    name: str

    @property
    def path(self) -> str:
        return os.path.join(self.parent, self.name)


class UploadRefused(Exception):
    """An upload that cannot go where it asks: *status* is the answer (403, 404, 409, 405, 507)."""

    def __init__(self, status: int, why: str = "") -> None:
        super().__init__(status, why)
        self.status = status


def upload_target(raw_path: bytes, policy: DirectoryPolicy) -> Target:
    """The directory and name a ``PUT`` of *raw_path* writes (UploadRefused if none may be)."""
    root = policy.root
    full = decode(raw_path)
    if root is None or not full.startswith("/"):
        raise UploadRefused(404)
    filename = full[1:]
    if not filename or filename.endswith("/"):
        raise UploadRefused(405, "a directory")
    parts = _parts(filename, policy)
    return Target(os.path.join(root, *parts[:-1]), parts[-1])


def upload_directory(raw_path: bytes, policy: DirectoryPolicy) -> str:
    """The directory a form ``POST`` to *raw_path* writes into (UploadRefused if none may be)."""
    root = policy.root
    full = decode(raw_path)
    if root is None or not full.startswith("/"):
        raise UploadRefused(404)
    directory = full[1:].rstrip("/")
    return os.path.join(root, *_parts(directory, policy)) if directory else root


def _parts(relative: str, policy: DirectoryPolicy) -> list[str]:
    """The components of *relative* (decoded, under the root), each a name a file may have."""
    if not checked(relative, policy.dotfiles):
        raise UploadRefused(404)
    parts = relative.split("/")
    if any(bad_name(part) for part in parts):
        raise UploadRefused(403, "not a name a file may have")
    return parts


def bad_name(name: str) -> bool:
    """Whether *name* may not name a file (empty, ``.``, ``..``, a ``/``, a control character)."""
    return name in ("", ".", "..") or "/" in name or any(ord(c) < 32 or ord(c) == 127 for c in name)


def checked_directory(path: str, policy: DirectoryPolicy) -> str:
    """The real path of the directory *path*, which must be one inside the root (UploadRefused:
    409 if it is not a directory, 404 if it lies outside)."""
    root = policy.root
    assert root is not None
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        raise UploadRefused(409, "no such directory") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UploadRefused(409, "not a directory")
    if not policy.follow_symlinks and not inside(real, root):
        raise UploadRefused(404)
    return real


def status_of(exc: BaseException) -> int:
    """The answer for an upload that failed with *exc*: a refusal's own status, a failed file
    operation's (a full disk: 507, ...), else 500."""
    if isinstance(exc, UploadRefused):
        return exc.status
    if not isinstance(exc, OSError):
        return 500
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return 507
    if exc.errno == errno.EFBIG:
        return 413
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return 403
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return 409
    return 500


class Upload:
    """One ``PUT``'s temporary file (see the module). Pool-thread calls, in order: :meth:`open`,
    :meth:`write` any number of times, then :meth:`commit` or :meth:`abort` (always one of
    them; :meth:`abort` also after a failed :meth:`commit`)."""

    def __init__(self, target: Target, policy: DirectoryPolicy, overwrite: bool) -> None:
        self.target = target
        self.policy = policy
        self.overwrite = overwrite
        self.fd = -1
        self.temp: str | None = None  # the hidden temporary file's path (no O_TMPFILE)
        self.written = 0

    zero_copy = True  # (its body may go from the socket to the file with splice)

    def open(self, checked: str | None = None) -> None:
        """Check where it goes and make the temporary file (UploadRefused if it may not);
        *checked*: the directory's real path, already checked (``checked_directory``)."""
        target = self.target
        real = checked or checked_directory(target.parent, self.policy)
        try:
            there = os.lstat(os.path.join(real, target.name))
        except FileNotFoundError:
            there = None
        except OSError as exc:
            raise UploadRefused(status_of(exc)) from None
        if there is not None:
            if stat.S_ISDIR(there.st_mode):
                raise UploadRefused(409, "a directory has that name")
            if not self.overwrite:
                raise UploadRefused(409, "a file has that name")
        try:
            if _O_TMPFILE:
                try:
                    self.fd = os.open(real, _O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
                    return
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                        raise
            temp = _hidden_name(real)
            self.fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            self.temp = temp
        except OSError as exc:
            raise UploadRefused(status_of(exc)) from None

    def write(self, data: bytes | memoryview) -> None:
        """Append *data* (OSError as the disk says: ENOSPC...)."""
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, self.written)
            self.written += n
            view = view[n:]

    def commit(self, size: int) -> bool:
        """The body is complete: *size* bytes, as the file holds (else UploadRefused(400)). Flush it
        and give it its name; True if the name is new (201), False if a file was replaced (204)."""
        if os.fstat(self.fd).st_size != size or self.written != size:
            raise UploadRefused(400, "the body is not the length announced")
        target = self.target
        final = os.path.join(os.path.realpath(target.parent), target.name)
        try:
            os.fsync(self.fd)
            if self.overwrite:  # renamed over the old file (a nameless one gets a hidden name first)
                existed = os.path.lexists(final)
                if self.temp is None:
                    self.temp = _hidden_name(os.path.dirname(final))
                    _link_nameless(self.fd, self.temp)
                os.replace(self.temp, final)
            else:  # linked: EEXIST if another upload took the name meanwhile (409)
                existed = False
                if self.temp is None:
                    _link_nameless(self.fd, final)
                else:
                    os.link(self.temp, final)
                    os.unlink(self.temp)
            self.temp = None
            _fsync_directory(os.path.dirname(final))
        except OSError as exc:
            raise UploadRefused(status_of(exc)) from None
        finally:
            self._close()
        return not existed

    @staticmethod
    def answer(new: bool) -> tuple[int, tuple[tuple[str, str], ...]]:
        """The answer once :meth:`commit` returned *new*: 201 Created, or 204 for a file replaced."""
        return (201 if new else 204), ()

    def abort(self) -> None:
        """Drop it: nothing stays (a hidden temporary file is removed)."""
        self._close()
        if self.temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.temp)
            self.temp = None

    def _close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def _hidden_name(directory: str) -> str:
    """A new hidden name in *directory* for a temporary file (a dotfile: not listed, not served)."""
    return os.path.join(directory, f".upload-{uuid.uuid4().hex}")


def _link_nameless(fd: int, path: str) -> None:
    """Give the ``O_TMPFILE`` file *fd* the name *path* (``linkat`` of ``/proc/self/fd/N`` with
    ``AT_SYMLINK_FOLLOW``, as open(2) describes; ``os.link`` only passes the flag with a
    directory descriptor)."""
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _fsync_directory(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: Body bytes a connection keeps in memory on their way to the file: reading pauses above it.
BUFFER = 256 * 1024
#: A body with at least this much still to come (and a Content-Length, on a plain TCP or Unix
#: socket) goes from the socket to the file with ``splice``: it never enters userspace.
SPLICE_AT = 64 * 1024
#: A refused upload's body is read and dropped up to this many bytes (so that the client, still
#: sending it, reads the answer instead of a reset); a longer one is answered and closed at once.
DISCARD_MAX = 16 * 1024 * 1024


class Receiving:
    """One PUT (or form POST) body on a connection: where it goes (*upload*; None when it is
    refused), the chunks waiting to be written (in order, one write at a time in the pool), and
    what is decided."""

    __slots__ = (
        "buffered",
        "chunks",
        "done",
        "got",
        "length",
        "log",
        "mode",
        "opened",
        "refused",
        "upload",
        "working",
        "zero_copy",
    )

    def __init__(
        self, upload: Upload | FormUpload | None, length: int | None, mode: int = 0, log: object = None
    ) -> None:
        self.upload = upload
        self.length = length  # announced (Content-Length); None: chunked
        self.mode = mode  # how the request's answer ends (keep-alive or close), and its log fields:
        self.log = log  # what the parser gives at the message's end, when the body is spliced
        self.chunks: list[bytes] = []
        self.buffered = 0  # bytes in chunks and in the write under way
        self.got = 0  # body bytes received
        self.opened = False
        self.working = False  # a job of the upload's (open, write, commit) is in the pool
        self.zero_copy = False  # the rest of the body (after what came with the head) is spliced
        self.refused: tuple[int, tuple[tuple[str, str], ...]] | None = None  # the answer, its fields
        self.done: object | None = None  # the request, once its body is all there

    def full(self) -> bool:
        return self.buffered >= BUFFER

    def refuse(self, status: int, *extra: tuple[str, str]) -> Upload | FormUpload | None:
        """Refused: the body is dropped from now on. The upload to abort now, or None: none, or a
        job of its is in the pool (its end aborts it: the protocol's ``_upload_*`` callbacks)."""
        self.refused = (status, extra)
        self.chunks.clear()
        self.buffered = 0
        if self.working:
            return None
        upload, self.upload = self.upload, None
        return upload

    def drop(self) -> None:
        """The connection is gone: nothing stays (the abort waits for a write under way)."""
        status, extra = self.refused or (0, ())
        upload = self.refuse(status, *extra)
        if upload is not None:
            upload.abort()
