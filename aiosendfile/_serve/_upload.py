"""``serve --upload``: a ``PUT`` body into a file that appears whole or not at all.

Where it goes (:func:`upload_target`, pure): the request path decoded once and held to the read
rules (no ``..``, no dotfile unless they are served, no NUL or backslash) and to the write ones:
no control or invisible formatting character (:func:`bad_name`), no empty or dot component, a
name at the end (a path ending in ``/`` is a directory: 405). The parent must be a directory
inside the served root (a symlink out of it counts as outside unless symlinks are followed): it is
opened once (:func:`open_directory`) and checked by the descriptor, and every step after works
relative to that descriptor, so a directory swapped for a symlink meanwhile changes nothing.

What it may not take: a directory's name, an existing file's without ``overwrite`` (409), and,
where the core serves pre-compressed siblings, the ``.gz``/``.br`` sibling of an existing file or
(without ``overwrite``) a name whose sibling exists: either would make a request for one name
answer with bytes that are not that file's. With ``overwrite``, replacing a file removes its
siblings.

How it lands (:class:`Upload`, in the cold pool: every call may wait for the disk): the body is
written to a nameless temporary file in the target directory (Linux's ``O_TMPFILE``: nothing a
listing or a crash could leave behind), or where the file system has none, to a hidden
``.upload-*`` file there, removed on any failure. Only once the body is complete and its length
is the one announced is the file flushed to disk (``fsync``) and given its name: linked, which
fails if the name exists (409) unless ``overwrite``, then renamed over it, atomically (the rules
above judged again then, under the directory's ``flock``); the directory is then flushed too.
Two uploads to one name never mix bytes: each has its own temporary file, and the last to finish
wins.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import unicodedata
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

try:
    import fcntl
except ImportError:  # (Windows: no flock; the link's EEXIST still keeps a name from two uploads)
    fcntl = None  # type: ignore[assignment]

from .._static._answer import Answer, error
from .._static._fs import opened_inside
from .._static._paths import checked, decode
from .._static._policy import DirectoryPolicy

__all__ = (
    "BUFFER",
    "DISCARD_MAX",
    "SIBLINGS",
    "SPLICE_AT",
    "Receiving",
    "Target",
    "Upload",
    "UploadRefused",
    "bad_name",
    "fields_of",
    "open_directory",
    "sibling_of",
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

    def __init__(self, status: int, why: str = "", *extra: tuple[str, str]) -> None:
        super().__init__(status, why)
        self.status = status
        self.extra = extra  # fields its answer carries


def upload_target(raw_path: bytes, policy: DirectoryPolicy, prefix: str = "") -> Target:
    """The directory and name a ``PUT`` of *raw_path* (under the mount *prefix*) writes
    (UploadRefused if none may be)."""
    root = policy.root
    full = _below(decode(raw_path), prefix)
    if root is None or not full.startswith("/"):
        raise UploadRefused(404)
    filename = full[1:]
    if not filename or filename.endswith("/"):
        raise UploadRefused(405, "a directory")
    parts = _parts(filename, policy)
    return Target(os.path.join(root, *parts[:-1]), parts[-1])


def upload_directory(raw_path: bytes, policy: DirectoryPolicy, prefix: str = "") -> str:
    """The directory a form ``POST`` to *raw_path* (under the mount *prefix*) writes into
    (UploadRefused if none may be)."""
    root = policy.root
    full = _below(decode(raw_path), prefix)
    if root is None or not full.startswith("/"):
        raise UploadRefused(404)
    directory = full[1:].rstrip("/")
    return os.path.join(root, *_parts(directory, policy)) if directory else root


def _below(full: str, prefix: str) -> str:
    """*full* (a decoded request path) below the mount *prefix*, or "" if it is not under it."""
    if not prefix:
        return full
    return full[len(prefix) :] if full.startswith(prefix + "/") else ""


def _parts(relative: str, policy: DirectoryPolicy) -> list[str]:
    """The components of *relative* (decoded, under the root), each a name a file may have."""
    if not checked(relative, policy.dotfiles):
        raise UploadRefused(404)
    parts = relative.split("/")
    if any(bad_name(part) for part in parts):
        raise UploadRefused(403, "not a name a file may have")
    return parts


#: Unicode categories no uploaded name may hold: controls (C0, C1), formatting characters (the
#: bidirectional overrides and isolates, zero-width ones), surrogates, private use, unassigned,
#: line and paragraph separators. They make a listing or a terminal show another name than the
#: file's (``evil\u202egnp.exe`` shows as ``evilexe.png``).
_SPOOFING = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
#: Letters that show as nothing (Hangul fillers, the blank Braille pattern) and slashes that are not
#: one (a name that reads as a path).
_LOOK_ALIKES = frozenset("\u115f\u1160\u3164\uffa0\u2800\u2044\u2215\u29f8\uff0f")


def bad_name(name: str) -> bool:
    """Whether *name* may not name a file: empty, ``.``, ``..``, a ``/``, a control character or
    another that shows as something else (``_SPOOFING``)."""
    if name in ("", ".", "..") or "/" in name:
        return True
    if name.isascii():
        return any(ord(c) < 32 or ord(c) == 127 for c in name)
    return any(unicodedata.category(c) in _SPOOFING or c in _LOOK_ALIKES for c in name)


#: The pre-compressed siblings the core serves in a file's place (``DirectoryPolicy.precompressed``).
SIBLINGS = (".gz", ".br")


def sibling_of(name: str) -> str | None:
    """The file *name* stands in for if it is a pre-compressed sibling (``a.css.gz`` → ``a.css``)."""
    folded = name.lower()
    for suffix in SIBLINGS:
        if folded.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def open_directory(path: str, policy: DirectoryPolicy) -> int:
    """A descriptor of the directory *path*, which must be one inside the root (UploadRefused:
    409 if it is not a directory, 404 if it lies outside). Checked by what was opened, not by
    its name again: whatever is swapped in at *path* later, the upload lands in this directory."""
    root = policy.root
    assert root is not None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise UploadRefused(409, "no such directory") from None
    try:
        if not policy.follow_symlinks and not opened_inside(fd, path, root):
            raise UploadRefused(404)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fields_of(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The fields the answer to an upload that failed with *exc* carries (a refusal's own)."""
    return exc.extra if isinstance(exc, UploadRefused) else ()


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
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENAMETOOLONG):
        return 409  # (a name longer than the file system takes: 409, as nginx's WebDAV)
    return 500


class Upload:
    """One ``PUT``'s temporary file (see the module). Pool-thread calls, in order: :meth:`open`,
    :meth:`write` any number of times, then :meth:`commit` or :meth:`abort` (always one of
    them; :meth:`abort` also after a failed :meth:`commit`).

    Everything happens in the directory opened once (``open_directory``; a form's parts share
    their form's), by name relative to its descriptor: what was checked is where it lands."""

    def __init__(self, target: Target, policy: DirectoryPolicy, overwrite: bool, dir_fd: int = -1) -> None:
        self.target = target
        self.policy = policy
        self.overwrite = overwrite
        self.fd = -1
        self.dir_fd = dir_fd
        self.owns_dir = dir_fd < 0  # (opened by open: closed with the file)
        self.temp: str | None = None  # the hidden temporary file's name there (no O_TMPFILE)
        self.written = 0

    zero_copy = True  # (its body may go from the socket to the file with splice)

    def open(self) -> None:
        """Check where it goes and make the temporary file (UploadRefused if it may not; then
        nothing of it stays open)."""
        if self.dir_fd < 0:
            self.dir_fd = open_directory(self.target.parent, self.policy)
        try:
            self._open()
        except BaseException:
            self.abort()
            raise

    def _open(self) -> None:
        self._may_take_name()
        try:
            if _O_TMPFILE:
                try:
                    self.fd = os.open(".", _O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=self.dir_fd)
                    return
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                        raise
            temp = _hidden_name()
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            self.fd = os.open(temp, flags, 0o644, dir_fd=self.dir_fd)
            self.temp = temp
        except OSError as exc:
            raise UploadRefused(status_of(exc)) from None

    def _lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.lstat(name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UploadRefused(status_of(exc)) from None

    def _may_take_name(self) -> bool:
        """Whether the name holds a file now (UploadRefused if the upload may not take it: a
        directory's; a file's without ``overwrite``; a pre-compressed sibling of a file, which
        would be served in that file's place; a file's whose siblings exist, without
        ``overwrite``, which would be served in its place; without ``overwrite``, a folder's index
        page, which would be served in place of the folder's listing)."""
        name = self.target.name
        there = self._lstat(name)
        if there is not None:
            if stat.S_ISDIR(there.st_mode):
                raise UploadRefused(409, "a directory has that name")
            if not self.overwrite:
                raise UploadRefused(409, "a file has that name")
        elif not self.overwrite and name == self.policy.index:
            raise UploadRefused(409, "an index page would be served in place of the folder")
        if self.policy.precompressed:
            base = sibling_of(name)
            if base is not None and self._lstat(base) is not None:
                raise UploadRefused(409, "a compressed copy of another file is not uploaded")
            if not self.overwrite and any(self._lstat(name + suffix) is not None for suffix in SIBLINGS):
                raise UploadRefused(409, "a compressed copy of a file has that name")
        return there is not None

    def write(self, data: bytes | memoryview) -> None:
        """Append *data* (OSError as the disk says: ENOSPC...)."""
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, self.written)
            self.written += n
            view = view[n:]

    def commit(self, size: int) -> bool:
        """The body is complete: *size* bytes, as the file holds (else UploadRefused(400)). Flush it
        and give it its name (the rules of ``_may_take_name`` judged again, under an exclusive
        ``flock`` of the directory: uploads into one directory name their files one at a time);
        True if the name is new (201), False if a file was replaced (204, its stale siblings
        removed)."""
        if os.fstat(self.fd).st_size != size or self.written != size:
            raise UploadRefused(400, "the body is not the length announced")
        name, dfd = self.target.name, self.dir_fd
        try:
            os.fsync(self.fd)
            with _locked(dfd):
                existed = self._may_take_name()
                if self.overwrite:  # renamed over the old file (a nameless one gets a hidden name first)
                    if self.temp is None:
                        self.temp = _hidden_name()
                        _link_nameless(self.fd, self.temp, dfd)
                    os.replace(self.temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                    self.temp = None
                    if self.policy.precompressed:
                        for suffix in SIBLINGS:  # (what stood in for the file replaced)
                            with contextlib.suppress(OSError):  # (none; a directory: never served)
                                os.unlink(name + suffix, dir_fd=dfd)
                else:  # linked: EEXIST if another upload took the name meanwhile (409)
                    existed = False
                    if self.temp is None:
                        _link_nameless(self.fd, name, dfd)
                    else:
                        os.link(self.temp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                        os.unlink(self.temp, dir_fd=dfd)
                        self.temp = None
            with contextlib.suppress(OSError):
                os.fsync(dfd)
        except OSError as exc:
            raise UploadRefused(status_of(exc)) from None
        finally:
            self._close()
        return not existed

    @staticmethod
    def answer(new: bool) -> Answer:
        """The answer once :meth:`commit` returned *new*: 201 Created, or 204 for a file replaced."""
        return error(201, "PUT") if new else Answer(204, [], None)

    def abort(self) -> None:
        """Drop it: nothing stays (a hidden temporary file is removed)."""
        if self.temp is not None and self.dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.temp, dir_fd=self.dir_fd)
        self.temp = None
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        if self.owns_dir and self.dir_fd >= 0 and self.temp is None:
            with contextlib.suppress(OSError):
                os.close(self.dir_fd)
            self.dir_fd = -1


@contextlib.contextmanager
def _locked(dir_fd: int) -> Iterator[None]:
    """An exclusive ``flock`` of a directory (across the workers too), where the platform has one."""
    try:
        if fcntl is None:
            raise OSError(errno.ENOSYS, "no flock")
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)


def _hidden_name() -> str:
    """A new hidden name for a temporary file (a dotfile: not listed, not served)."""
    return f".upload-{uuid.uuid4().hex}"


def _link_nameless(fd: int, name: str, dir_fd: int) -> None:
    """Give the ``O_TMPFILE`` file *fd* the *name* in *dir_fd* (``linkat`` of ``/proc/self/fd/N``
    with ``AT_SYMLINK_FOLLOW``, as open(2) describes; ``os.link`` only passes the flag with a
    directory descriptor)."""
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), name, src_dir_fd=proc, dst_dir_fd=dir_fd, follow_symlinks=True)
    finally:
        os.close(proc)


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
        "interim",
        "length",
        "log",
        "method",
        "mode",
        "opened",
        "refused",
        "tries",
        "upload",
        "working",
        "zero_copy",
    )

    def __init__(
        self,
        upload: Upload | FormUpload | None,
        length: int | None,
        mode: int = 0,
        log: object = None,
        method: bytes = b"PUT",
    ) -> None:
        self.upload = upload
        self.method = method  # (the request's, for its log line when the body is spliced)
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
        self.tries = 0  # opens found the partial file busy (a resumable upload's)
        self.interim = False  # a resumable creation's 104 reaches its client (``_receiver``)

    def full(self) -> bool:
        return self.buffered >= BUFFER

    def refuse(self, status: int, *extra: tuple[str, str]) -> Upload | FormUpload | None:
        """Refused: the body is dropped from now on. The upload to abort now, or None: none, or a
        job of its is in the pool (its end aborts it: ``_receiver.UploadReceiver``'s steps)."""
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
