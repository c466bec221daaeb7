"""The static-file decisions: ``route`` → ``resolve`` → ``respond``, or all three as ``answer``.

* ``route`` (pure): GET/HEAD only (else 405 with ``Allow``); the path below the mount decoded once
  and checked by the rules of ``_paths`` (else 404).
* ``resolve`` (one ``stat``): missing → 404, unreadable → 403. A directory must lie inside the
  root (unless symlinks are followed); without a trailing slash → 301 adding it (query kept, as
  nginx does); else its index, a listing if allowed, or 403. A plain GET/HEAD (no ranges or
  conditions, no pre-compressed sibling the client takes) of a hot small file is answered from
  the cache here. Anything else is ``Located`` for ``respond``.
* ``respond``: the representation (a ``.br``/``.gz`` sibling ``Accept-Encoding`` admits, else the
  file; a sibling that cannot be opened, escapes or is not a regular file counts as absent, as
  nginx's ``gzip_static``), opened and checked on its descriptor, then validators (from that
  descriptor), preconditions (412/304), ``If-Range`` and ``Range`` (206, multipart, 416). Bodies
  up to ``inline_limit`` whose pages are cached come back as bytes and fill the hot cache.

A plain ``200`` of a whole file (no encoding), of any size, carries its ``Decided``
(``Answer.decided``): what a door may keep in its answer cache (``_answers``) and answer the same
request from again without the core, once it has checked that the path still names that file.

Errors from ``route``/``resolve`` carry aiohttp's text body (``404: Not Found``); errors found
only on opening (``respond``) are empty (``Content-Length: 0``), as the plugin gives them.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import uuid
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

from . import _hot, _http, _listing
from ._answer import Answer, Archive, FileRange, Multipart, error
from ._answers import Decided
from ._archive import Layout, TooLarge, content_disposition
from ._fs import REAL_FS, ArchivesBusy, FileSystem, NotRegular, OutsideRoot
from ._hot import Rendering
from ._listing import listing_html, listing_json, view_of
from ._mime import content_type_for
from ._paths import checked, decode, inside
from ._policy import ENCODINGS, DirectoryPolicy
from ._request import Request
from ._zip import ZipLayout

__all__ = (
    "Located",
    "answer",
    "decide",
    "file_content_type",
    "present_siblings",
    "resolve",
    "respond",
    "route",
)

#: Request fields that need ``respond``'s full handling (ranges, preconditions).
_NOT_PLAIN = ("Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since")
_CONDITIONAL = ("If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since")
_ALLOW = ("Allow", "GET,HEAD")
_ALLOW_UPLOADS = ("Allow", "GET,HEAD,POST,PUT")  # (serve --upload: its form posts, PUT)


class Located(NamedTuple):
    """A file to answer: its path, its ``stat`` if taken, the pre-compressed siblings if looked up,
    whether the hot-file cache was looked in for it (and had nothing) with that ``stat``, and its
    descriptor if the door opened it already (``respond`` owns it: used or closed)."""

    path: str
    st: os.stat_result | None = None
    siblings: list[tuple[str, str]] | None = None
    hot_missed: bool = False
    fd: int | None = None


def route(req: Request, policy: DirectoryPolicy) -> str | Answer:
    """The path *req* names under ``policy.root``, or the error answer (405, 404)."""
    if req.method != "GET" and req.method != "HEAD":
        return error(405, req.method, _ALLOW_UPLOADS if policy.upload_form else _ALLOW)
    filename = req.rel
    if filename is None or "%" in filename:
        # Decoded from the raw bytes, as the file system names files: yarl leaves percent-escapes
        # that are not UTF-8 encoded (``/%FF``), so such a name could not be reached from ``rel``.
        full = decode(req.raw_path)
        head = req.prefix + "/"
        if full.startswith(head):
            filename = full[len(head) :]
        elif full == req.prefix and req.prefix:  # the mount itself, without its slash: to it
            return error(301, req.method, ("Location", _with_slash(req, policy)))
        elif filename is None:
            return error(404, req.method)
    root = policy.root
    if root is None or not checked(filename, policy.dotfiles):
        return error(404, req.method)
    return root.rstrip(os.sep) + os.sep + filename if filename else root  # (no leading "/": checked)


#: Why a look at a name says it holds no file this server serves (404); any other failure but a
#: refusal (403) is the server's own trouble (500: out of descriptors, a disk error), not an
#: answer a cache in front may keep about the name (nginx answers alike).
_NOT_THERE = frozenset((errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EXDEV))


def _failure_status(exc: Exception) -> int:
    """The status for a look at a name, or an open of it, that failed with *exc*: 403 (not ours
    to read: a refusal, a FIFO or socket), 404 (``_NOT_THERE``, outside the root), else 500."""
    code = getattr(exc, "errno", None)
    if isinstance(exc, NotRegular | PermissionError) or code == errno.ENXIO:  # (ENXIO: a socket)
        return 403
    if isinstance(exc, OutsideRoot) or code in _NOT_THERE:
        return 404
    return 500


def _failed(req: Request, exc: Exception) -> Answer:
    """The error answer for a look at a name that failed with *exc* (``_failure_status``)."""
    return error(_failure_status(exc), req.method)


def resolve(
    req: Request,
    path: str,
    policy: DirectoryPolicy,
    fs: FileSystem = REAL_FS,
    opened: tuple[int, os.stat_result] | None = None,
) -> Answer | Located:
    """What *path* is (see the module docstring): an answer already, or a file for :func:`respond`.

    *opened*: the door opened *path* already, a regular file it knows lies inside the root (its
    descriptor and ``fstat``); it is handed on in the ``Located``, or closed."""
    if opened is not None:
        fd, st = opened
        try:
            found = _resolve_file(req, path, policy, fs, st, fd)
        except BaseException:
            fs.close(fd)
            raise
        if not isinstance(found, Located):
            fs.close(fd)
        return found
    try:
        st = fs.stat(path)
    except OSError as exc:  # missing, ENOTDIR (``a.txt/``), ELOOP, ENAMETOOLONG; EACCES; EIO...
        return _failed(req, exc)
    if stat.S_ISDIR(st.st_mode):
        root = policy.root
        if root is not None and not policy.follow_symlinks:
            try:
                real = fs.realpath(path)
            except OSError as exc:  # (a link swapped under realpath's feet: ENOENT, EINVAL)
                return error(404, req.method) if exc.errno == errno.EINVAL else _failed(req, exc)
            if not inside(real, root):
                return error(404, req.method)
        return _directory(req, path, st, policy, fs)
    return _resolve_file(req, path, policy, fs, st, None)


def _resolve_file(
    req: Request, path: str, policy: DirectoryPolicy, fs: FileSystem, st: os.stat_result, fd: int | None
) -> Answer | Located:
    """``resolve`` of what is not a directory (*fd*: opened by the door, handed on if located)."""
    if not policy.hot_cache or st.st_size > policy.inline_limit:
        return Located(path, st, fd=fd)
    # A plain GET/HEAD of a hot small file is answered from the cache.
    headers = req.headers
    if headers:  # (most requests have none of the fields the core reads)
        for name in _NOT_PLAIN:
            if name in headers:
                return Located(path, st, fd=fd)
    entry = _hot.hot_files.entry(path, policy.cache_root, st)
    if entry is None:
        return Located(path, st, None, True, fd)
    if policy.precompressed and (accept := headers.get("Accept-Encoding")):
        siblings = present_siblings(path, accept, fs)
        if siblings:
            return Located(path, st, siblings, fd=fd)  # (respond need not look them up again)
    rendering = entry.rendering(policy.precompressed)
    fields = rendering.fields
    if fields is None:
        fields = _plain_fields(rendering, path, st, policy)
    ans = Answer(200, fields, st.st_size, req.method == "HEAD", entry.body, None, entry, path)
    if rendering.fields is not None:  # (memoised: its date is the file's own, so a door may keep it)
        ans.decided = Decided(entry.identity, path, st.st_size, True, req.prefix)
    return ans


def _with_slash(req: Request, policy: DirectoryPolicy) -> str:
    """A folder's address with its slash, for its 301 (the query kept, as nginx): the path as
    asked, or with ``relative_locations`` its last step (``./sub/`` for ``/a/sub``: "./" so that
    a step with a colon is no scheme), which a client resolves under whatever prefix it asked."""
    query = f"?{req.raw_query.decode('latin-1')}" if req.raw_query else ""
    path = req.raw_path.decode("latin-1")
    if policy.relative_locations:
        path = "./" + path.rsplit("/", 1)[-1]
    return path + "/" + query


def _directory(
    req: Request, path: str, st: os.stat_result, policy: DirectoryPolicy, fs: FileSystem
) -> Answer | Located:
    raw = req.raw_path
    if not (raw.endswith(b"/") or raw[-3:].lower() == b"%2f"):
        return error(301, req.method, ("Location", _with_slash(req, policy)))
    if policy.archives and policy.listings and req.raw_query in _ARCHIVE_KINDS:
        return _archive(req, path, policy, fs, _ARCHIVE_KINDS[req.raw_query])
    if policy.index:
        index = os.path.join(path, policy.index)
        if fs.is_file(index):
            return Located(index)
    if policy.listings:
        root = None if policy.follow_symlinks else policy.root
        shown = unquote_to_bytes(raw)
        view = view_of(req.raw_query, req.headers.get("Accept"))
        key = (
            st.st_dev,
            st.st_ino,
            shown,
            root,
            policy.root,
            policy.dotfiles,
            policy.upload_form,
            policy.resumable_uploads,
            policy.archives,
            view,
            req.prefix,
        )
        page = _listing.listings.get(key, st)
        if page is None:
            try:  # (the loop's file system raises DecideInPool: the door asks again in its pool)
                entries, real = fs.scan(path, root)
            except (OSError, OutsideRoot) as exc:  # removed meanwhile; swapped for a symlink out
                return _failed(req, exc)
            if view.json:
                page = listing_json(shown, entries, policy.dotfiles, view)
            else:
                page = listing_html(
                    shown,
                    real == policy.root,
                    entries,
                    policy.dotfiles,
                    view,
                    policy.upload_form,
                    policy.archives,
                    policy.resumable_uploads,
                    req.prefix,
                )
            _listing.listings.put(key, st, page, len(shown) + len(path))
        kind = "application/json" if view.json else "text/html; charset=utf-8"
        fields = [("Content-Type", kind), ("Vary", "Accept")]
        if not view.json:
            fields.append(("Content-Security-Policy", _listing.LISTING_POLICY[policy.upload_form]))
        return Answer(200, fields, len(page), head_only=req.method == "HEAD", body=page, path=path)
    return error(403, req.method)


def _archive(req: Request, path: str, policy: DirectoryPolicy, fs: FileSystem, kind: type[Layout]) -> Answer:
    """``GET /folder/?tar`` (``?zip``): the folder as a tar (a stored zip) archive (``_archive``,
    ``_zip``), with its validators and ranges as a file's (one range; several are answered
    whole), or 413/503/403/404."""
    # One folder, however it was spelled (``/a/./``, ``/./a//``; ``..`` never comes this far): one
    # name, one layout shared while it is sent (``_fs._shared`` keys them by path), one ETag.
    path = os.path.normpath(path)
    top = os.path.basename(path) or "archive"
    try:  # (the loop's file system raises DecideInPool: the door asks again in its pool)
        layout = fs.archive(path, top, policy, kind)
    except TooLarge:
        return error(413, req.method)
    except ArchivesBusy:
        return error(503, req.method, ("Retry-After", "1"))
    except OSError as exc:  # removed meanwhile
        return _failed(req, exc)
    size = layout.length
    etag = layout.etag
    last_modified = max(m.mtime_ns for m in layout.members) // 1_000_000_000
    shown = _http.last_modified(last_modified, time.time())  # (not after the answer's Date)
    headers = req.headers
    extra = [("Content-Disposition", content_disposition(f"{top}.{layout.KIND}"))]
    if headers and any(field in headers for field in _CONDITIONAL):
        status = _http.evaluate_preconditions(req.method, headers, etag, last_modified)
        if status is not None:
            fields = _http.file_headers(etag, shown)
            return Answer(status, fields, None if status == 304 else 0, head_only=True, path=path)
    start, stop = 0, size
    content_range = None
    # An If-Range date is not believed: a chmod, or a member dated in the future, changes the
    # archive and not its date; only the ETag (the snapshot) says a range goes with the bytes before.
    if_range = headers.get("If-Range") if headers else None
    ranges_ok = req.ranges_ok and (if_range is None or if_range.strip() == etag)
    try:
        ranges = _ranges_asked(req, etag, last_modified, size, policy, ranges_ok)
    except _http.RangeNotSatisfiable:
        fields = _http.file_headers(etag, shown, content_range=f"bytes */{size}")
        return Answer(416, fields, 0, head_only=True, path=path)
    if ranges is not None and len(ranges) == 1:
        start, stop = ranges[0].start, ranges[0].stop
        content_range = ranges[0].content_range(size)
    fields = _http.file_headers(etag, shown, content_type=layout.CONTENT_TYPE, content_range=content_range)
    fields += extra
    if layout.skipped:
        fields.append(("X-Skipped-Entries", str(layout.skipped)))  # unreadable, special, links out
    status = 200 if content_range is None else 206
    if req.method == "HEAD":
        return Answer(status, fields, stop - start, head_only=True, path=path)
    return Answer(status, fields, stop - start, body=Archive(path, layout, start, stop), path=path)


#: The query that asks for a folder's archive, and its format.
_ARCHIVE_KINDS: dict[bytes, type[Layout]] = {b"tar": Layout, b"zip": ZipLayout}


def _plain_fields(
    rendering: Rendering, path: str, st: os.stat_result, policy: DirectoryPolicy
) -> list[tuple[str, str]]:
    """The fields of a plain 200 of a hot file, memoised in its entry's *rendering* (valid while
    the entry is; not for a file dated later than now, whose ``Last-Modified`` is the answer's)."""
    now = time.time()
    fields = _http.file_headers(
        _http.make_etag(st.st_mtime_ns, st.st_size),
        _http.last_modified(st.st_mtime, now),
        vary=policy.precompressed,
        content_type=_content_type(os.path.basename(path)),
    )
    if _http.settled(st.st_mtime, now):
        rendering.fields = fields
    return fields


def _content_type(name: str) -> str:
    """``content_type_for(name)``, memoised by the name's extensions (``mimetypes`` reads only them):
    ten thousand names of one type are one cache entry, not ten thousand."""
    dot = name.find(".")
    if dot > 0 and ":" not in name:  # (a ``data:`` name is guessed whole)
        return content_type_for("f" + name[dot:])
    return content_type_for(name)


def file_content_type(path: str) -> str:
    """The Content-Type of the file at *path* (its base name's), as its answers carry it."""
    return _content_type(os.path.basename(path))


def present_siblings(path: str, accept: str, fs: FileSystem = REAL_FS) -> list[tuple[str, str]]:
    """(encoding, sibling path) of the ``.br``/``.gz`` siblings *accept* admits and that exist."""
    return [
        (enc, path + ext)
        for enc, ext in ENCODINGS
        if _http.choose_encoding(accept, (enc,)) == enc and fs.is_file(path + ext)
    ]


def respond(req: Request, located: Located, policy: DirectoryPolicy, fs: FileSystem = REAL_FS) -> Answer:
    """The answer about the file *located* names (see the module docstring). A descriptor
    *located* holds is used for the file itself, or closed."""
    owned = located.fd
    try:
        candidates: list[tuple[str | None, str]] = []
        accept = req.headers.get("Accept-Encoding") if policy.precompressed else None
        if accept:
            present = located.siblings
            if present is None:
                present = present_siblings(located.path, accept, fs)
            if present:
                chosen = _http.choose_encoding(accept, [enc for enc, _ in present])
                candidates += [(enc, p) for enc, p in present if enc == chosen]
        candidates.append((None, located.path))
        cache_root = policy.cache_root
        root = None if policy.follow_symlinks else policy.root
        # With no root to check containment against, a symlinked sibling could name any file.
        nofollow = policy.root is None and not policy.follow_symlinks
        for encoding, path in candidates:
            if policy.hot_cache and not (encoding is None and located.hot_missed):
                try:
                    st = located.st if encoding is None and located.st is not None else fs.stat(path)
                except OSError:
                    st = None  # let the open below say what is wrong
                if st is not None and st.st_size <= policy.inline_limit and stat.S_ISREG(st.st_mode):
                    body = _hot.hot_files.get(path, cache_root, st)
                    if body is not None:
                        return _file_answer(req, located.path, policy, st, encoding, body, fs)
            if encoding is None and owned is not None and located.st is not None:
                fd, st, owned = owned, located.st, None  # opened by the door: ours now
            else:
                try:
                    fd, st = fs.open_regular(path, root, nofollow and encoding is not None)
                except (OSError, OutsideRoot, NotRegular) as exc:
                    if encoding is not None:
                        # A sibling that vanished, that we may not read (EACCES, ELOOP, ...), that
                        # escapes the root or is no regular file: serve the next candidate, as
                        # nginx's gzip_static declines.
                        continue
                    return _empty_error(_failure_status(exc))
            # A small file is read into the hot-file cache if the cache admits it: once the cache
            # is full, one in READMIT_EVERY (a set of files larger than the cache is sent from its
            # files, not copied in, written by copy and evicted again at each first sight).
            if policy.hot_cache and st.st_size <= policy.inline_limit and _hot.hot_files.admits(st.st_size):
                try:
                    read = fs.read_cached(fd, st.st_size)
                except BaseException:
                    fs.close(fd)
                    raise
                if read is not None and len(read) == st.st_size:
                    fs.close(fd)
                    # (shared while cached)
                    entry = _hot.hot_files.put(path, cache_root, _hot.identity(st), read)
                    ans = _file_answer(req, located.path, policy, st, encoding, read, fs)
                    if entry is not None and ans.body is read:  # the whole file: a door may memoise it
                        ans.entry = entry
                        if ans.status == 200 and encoding is None and _http.settled(st.st_mtime, time.time()):
                            ans.decided = Decided(entry.identity, path, st.st_size, True, req.prefix)
                    return ans
            try:
                return _file_answer(req, located.path, policy, st, encoding, fd, fs)
            except BaseException:
                fs.close(fd)
                raise
        return _empty_error(404)
    finally:
        if owned is not None:
            fs.close(owned)


def _empty_error(status: int) -> Answer:
    return Answer(status, [], 0, head_only=True)


def _file_answer(
    req: Request,
    name: str,
    policy: DirectoryPolicy,
    st: os.stat_result,
    encoding: str | None,
    source: bytes | int,
    fs: FileSystem,
) -> Answer:
    """Preconditions, ranges and headers for the representation *source* (bytes, or an fd now owned)."""
    size = st.st_size
    etag = _http.make_etag(st.st_mtime_ns, size)
    last_modified = int(st.st_mtime)  # (the validators compare the file's own time)
    now = time.time()
    shown = _http.last_modified(st.st_mtime, now)  # (not after the answer's Date)
    headers = req.headers
    vary = policy.precompressed
    fd = source if isinstance(source, int) else None

    if headers and any(field in headers for field in _CONDITIONAL):
        status = _http.evaluate_preconditions(req.method, headers, etag, last_modified)
        if status is not None:  # (no Content-Encoding: no representation is sent)
            fields = _http.file_headers(etag, shown, vary=vary)
            return _headers_only(status, fields, None if status == 304 else 0, None, name, fd, fs)

    content_type = req.content_type or _content_type(os.path.basename(name))
    # Not a body a middleware compresses (a pre-compressed sibling is sent as it is: the door
    # turns compression off for it).
    try:
        ranges = _ranges_asked(req, etag, last_modified, size, policy, req.ranges_ok or encoding is not None)
    except _http.RangeNotSatisfiable:
        fields = _http.file_headers(
            etag, shown, vary=vary, encoding=encoding, content_range=f"bytes */{size}"
        )
        return _headers_only(416, fields, 0, encoding, name, fd, fs)

    close = fs.close if fd is not None else None
    if ranges is None:
        fields = _http.file_headers(etag, shown, vary=vary, encoding=encoding, content_type=content_type)
        if size == 0 or req.method == "HEAD":
            return _headers_only(200, fields, size, encoding, name, fd, fs)
        whole = FileRange(source, 0, size) if isinstance(source, int) else source
        ans = Answer(200, fields, size, body=whole, encoding=encoding, path=name, fd=fd, close=close)
        if fd is not None and encoding is None and _http.settled(st.st_mtime, now):
            # (a whole file of any size, dated before now: a door may memoise it)
            small = policy.hot_cache and size <= policy.inline_limit
            ans.decided = Decided(_hot.identity(st), name, size, small, req.prefix)
        return ans
    if len(ranges) == 1:
        r = ranges[0]
        fields = _http.file_headers(
            etag,
            shown,
            vary=vary,
            encoding=encoding,
            content_type=content_type,
            content_range=r.content_range(size),
        )
        body1 = FileRange(source, r.start, r.length) if isinstance(source, int) else source[r.start : r.stop]
        return Answer(206, fields, r.length, body=body1, encoding=encoding, path=name, fd=fd, close=close)
    boundary = uuid.uuid4().hex
    parts, closing, length = _http.multipart_byteranges(ranges, size, content_type, boundary)
    fields = _http.file_headers(
        etag,
        shown,
        vary=vary,
        encoding=encoding,
        content_type=f"multipart/byteranges; boundary={boundary}",
    )
    return Answer(
        206,
        fields,
        length,
        body=Multipart(source, parts, closing),
        encoding=encoding,
        path=name,
        fd=fd,
        close=close,
    )


def _ranges_asked(
    req: Request, etag: str, last_modified: int, size: int, policy: DirectoryPolicy, ranges_ok: bool
) -> list[_http.ByteRange] | None:
    """The ranges a request asks of a representation of *size* bytes, if it may have them: a GET
    (RFC 9110 §14.2) whose ``If-Range``, if any, still holds; raises ``RangeNotSatisfiable``."""
    headers = req.headers
    if req.method != "GET" or not ranges_ok or not headers or "Range" not in headers:
        return None
    if not _http.if_range_allows(headers.get("If-Range"), etag, last_modified):
        return None
    return _http.parse_ranges(headers.get("Range"), size, max_ranges=policy.max_ranges)


def _headers_only(
    status: int,
    fields: list[tuple[str, str]],
    length: int | None,
    encoding: str | None,
    name: str,
    fd: int | None,
    fs: FileSystem,
) -> Answer:
    """An answer without a body (a HEAD, a 304, 412 or 416, an empty file): *fd* is closed."""
    if fd is not None:
        fs.close(fd)
    return Answer(status, fields, length, head_only=True, encoding=encoding, path=name)


def answer(req: Request, policy: DirectoryPolicy, fs: FileSystem = REAL_FS) -> Answer:
    """``route`` ∘ ``resolve`` ∘ ``respond``: the whole decision, for doors without routing of their own."""
    path = route(req, policy)
    if isinstance(path, Answer):
        return path
    return decide(req, path, policy, fs)


def decide(
    req: Request,
    path: str,
    policy: DirectoryPolicy,
    fs: FileSystem = REAL_FS,
    opened: tuple[int, os.stat_result] | None = None,
) -> Answer:
    """``resolve`` ∘ ``respond``: the decision about the *path* ``route`` gave (a door that routed
    the request already). *opened*: *path* opened already by the door (a regular file it knows
    lies inside the root, with its ``fstat``); the decision owns the descriptor (used or closed)."""
    found = resolve(req, path, policy, fs, opened)
    if isinstance(found, Answer):
        return found
    return respond(req, found, policy, fs)
