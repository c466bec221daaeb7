"""``StaticFiles`` and ``FileResponse``: plain ASGI apps answering from the static-file core.

``StaticFiles`` serves a directory (mount it anywhere: Starlette's ``Mount``, FastAPI's
``app.mount``, or as the whole app). The request path below the mount is the raw path
(``scope["raw_path"]``, percent-encoded as sent) minus ``scope["root_path"]``, which ``Mount`` sets
to the mount's path; decoding happens once, in the core (``_static._paths``).

Per request, cheapest first:

* A plain ``GET``/``HEAD`` (no ``Range``, ``If-*`` or ``Accept-Encoding``) of a file answered
  before: one lookup by raw path in the app's answer cache (``_static._answers``: the core's
  ``Decided``, with this door's header pairs in its slot). A hot file: one ``os.stat`` to check the
  path still names that file, its bytes (kept with the answer and charged with it), a start message
  with the header pairs (a copy: middlewares edit them in place) and one body message. Any other
  file (or a small one kept without its bytes, which the hot-file cache does not hold): opened
  again, checked by ``fstat``, and sent as the core's answer would be (``_render.send_answer``),
  with no decision made. With ``Accept-Encoding`` alone (every browser sends it) and no sibling it
  admits, the same by (raw path, its value), plus a ``stat`` of the file's directory: adding,
  removing or renaming a sibling changes it (nothing is kept while a sibling's name exists in any
  form, such as a dangling symlink, which could come to life without its directory changing). An
  ``Accept-Encoding`` value longer than :data:`MEMO_MAX_ACCEPT_ENCODING` is never part of a key.
  The cache is bounded by entries and by the bytes each entry keeps alive, its key (both parts come
  from the peer) included. An answer is kept only where the mount's prefix the core read is
  ``root_path`` itself (Starlette's ``Mount``, a server's ``--root-path``), and checked against it
  on a hit.
* Any other: the first sight every door shares (``_static._inline.first_look``): decided on the
  loop where the lookup waits for no disk (the file opened at once) or the path was decided in the
  last seconds (:class:`~aiosendfile._static._recent.RecentPaths`); else looked up in the cold-read
  pool first, then decided on the loop. Only a directory listing is built in the pool. A body whose
  pages are not cached is read off the loop (or sent by the server from the file).

The answer is rendered by :mod:`._render`; its descriptor, if any, is closed when ``send`` returns
or raises, and on cancellation (a decision cancelled in the pool is closed when it comes back). A
``send`` that finds the connection's transport already closed ends the answer quietly (the client
is gone; :func:`._render.transport_gone`); any other error from ``send`` is raised.
"""

from __future__ import annotations

import mimetypes
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from .._options import DEFAULT_FALLBACK_CHUNK
from .._static._answer import Answer, FileRange, Multipart
from .._static._answers import AnswerKey, Answers, Decided
from .._static._core import Located, answer, respond
from .._static._fs import POOL_FS, REAL_FS, DecideInPool, directory_policy, folder_identity
from .._static._inline import (
    browser_folder,
    decide_looked,
    first_look,
    for_browsers,
    from_memory,
    look_again,
    look_up,
    reopen_kept,
)
from .._static._policy import DEFAULT_INLINE_LIMIT, file_policy
from .._static._recent import RecentPaths
from .._static._request import EMPTY, MEMO_MAX_ACCEPT_ENCODING, BytesHeaders, Request
from ._render import BODY_TYPE, START, file_mode, header_pairs, off_loop, send_answer, transport_gone

__all__ = ("FileResponse", "StaticFiles")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
PathLike = str | os.PathLike[str]
_R = TypeVar("_R")

_WANTED = BytesHeaders.WANTED
#: What ``quote`` keeps as it is when the raw path is rebuilt from ``path`` (a server without raw_path).
_SAFE = "/:@!$&'()*+,;=~"


#: The fields a ``FileResponse``'s caller may set in place of the core's (Starlette's own defaults).
_CALLERS = frozenset((b"content-type", b"etag", b"last-modified", b"content-disposition", b"cache-control"))
_VALIDATORS = (b"etag", b"last-modified")
_PRECONDITIONS = frozenset((b"if-match", b"if-none-match", b"if-modified-since", b"if-unmodified-since"))


def _without_preconditions(
    headers: Iterable[tuple[bytes, bytes]], validators: dict[bytes, bytes]
) -> list[tuple[bytes, bytes]]:
    """*headers* without the preconditions, for an answer sent with the caller's own *validators*
    (lowercase name → value): an ``If-Range`` is judged against them (RFC 9110 13.1.5: a strong
    tag that matches, or the exact ``Last-Modified``) and keeps its ``Range`` if it holds, else
    the whole file goes, as for a mismatched one (a resumed download of such a file got the whole
    file every time)."""
    pairs = [(n, v) for n, v in headers if n.lower() not in _PRECONDITIONS]
    if_range = next((v for n, v in pairs if n.lower() == b"if-range"), None)
    if if_range is not None:
        pairs = [(n, v) for n, v in pairs if n.lower() != b"if-range"]
        if not _if_range_holds(if_range.strip(), validators):
            pairs = [(n, v) for n, v in pairs if n.lower() != b"range"]
    return pairs


def _if_range_holds(asked: bytes, validators: dict[bytes, bytes]) -> bool:
    if asked[:1] == b'"' or asked[:2] == b"W/":  # an entity tag: strong, and the same
        tag = validators.get(b"etag", b"").strip()
        return asked[:1] == b'"' and tag[:1] == b'"' and asked == tag
    modified = validators.get(b"last-modified")
    return modified is not None and asked == modified.strip()


def _scan(headers: Iterable[tuple[bytes, bytes]]) -> bool | bytes:
    """True if no request field the core reads is present; the ``Accept-Encoding`` value if it is
    the only one (once); else False. (ASGI names are lowercase; checked anyway. A loop: a third of
    any()'s cost on the hot path.)"""
    found: bool | bytes = True
    for name, value in headers:
        if name in _WANTED or name.lower() in _WANTED:
            if found is not True or name.lower() != b"accept-encoding":
                return False
            found = value
    return found


async def _off_loop(fn: Callable[..., _R], *args: Any) -> _R:
    """``fn(*args)`` (a lookup, a core decision) off the loop (``_render.off_loop``); if we are
    cancelled meanwhile, an answer that still comes back is closed (its descriptor would leak)."""
    return await off_loop(fn, *args, if_cancelled=_close_late)


def _close_late(late: object) -> None:
    if isinstance(late, Answer):
        late.close()


def _quiet_on_disconnect(scope: Scope, receive: Receive) -> Receive | None:
    """*receive* if the server is older than ASGI 2.4, whose ``send`` returns quietly once the
    client is gone (a long body must then listen for ``http.disconnect``), else None."""
    version = scope.get("asgi", {}).get("spec_version", "2.0")
    try:
        newer = tuple(int(part) for part in version.split(".")[:2]) >= (2, 4)
    except ValueError:
        newer = False
    return None if newer else receive


async def _not_http(scope: Scope, receive: Receive, send: Send) -> None:
    """A websocket is refused (closed before accepting: the server answers 403); lifespan is
    acknowledged, so the app runs alone under a server too."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1000, "reason": ""})
    elif scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    else:
        raise RuntimeError(f"aiosendfile.asgi serves http scopes, not {scope['type']!r}")


class StaticFiles:
    """A directory as an ASGI app (see ``aiosendfile.asgi`` for the parameters)."""

    def __init__(
        self,
        *,
        directory: PathLike,
        html: bool = False,
        check_dir: bool = True,
        follow_symlink: bool = False,
        index: str | None = "index.html",
        listings: bool = False,
        dotfiles: bool = False,
        follow_symlinks: bool | None = None,
        precompressed: bool = True,
        hot_cache: bool = True,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        max_ranges: int = 16,
        chunk_size: int = DEFAULT_FALLBACK_CHUNK,
    ) -> None:
        self.directory = os.fspath(directory)
        if check_dir and not os.path.isdir(self.directory):
            raise RuntimeError(f"Directory '{self.directory}' does not exist")
        if follow_symlinks is None:
            follow_symlinks = follow_symlink
        self.html = html
        self.chunk_size = chunk_size
        self.policy = directory_policy(
            self.directory,
            index=index,
            listings=listings,
            dotfiles=dotfiles,
            follow_symlinks=follow_symlinks,
            precompressed=precompressed,
            hot_cache=hot_cache,
            inline_limit=inline_limit,
            max_ranges=max_ranges,
        )
        #: raw path, or (raw path, Accept-Encoding), → the core's ``Decided`` of a plain 200 of a
        #: file of any size, with this door's header pairs in its slot (and for the latter the
        #: file's directory and its identity).
        self._answers = Answers()
        self._answers_get = self._answers.get  # (one attribute lookup less on the hot path)
        self._recent = RecentPaths()

    def __repr__(self) -> str:
        return f"aiosendfile.asgi.StaticFiles(directory={self.directory!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await _not_http(scope, receive, send)
            return
        method: str = scope["method"]
        raw: bytes | None = scope.get("raw_path")
        if raw is None:
            raw = quote(scope["path"], safe=_SAFE, errors="surrogateescape").encode("ascii")
        root: str = scope.get("root_path", "")
        headers = scope["headers"]
        kind = _scan(headers)
        if kind is not True and kind is not False:
            if not self.policy.precompressed:
                kind = True  # (Accept-Encoding changes nothing without pre-compressed siblings)
            elif len(kind) > MEMO_MAX_ACCEPT_ENCODING:
                kind = False  # no memo key: the core reads it as any other field
        if kind is not False and (method == "GET" or method == "HEAD"):
            key: AnswerKey = raw if kind is True else (raw, kind)
            decided = self._answers_get(key)
            if decided is not None and decided.prefix == root and (pairs := decided.pairs) is not None:
                path = decided.path
                # (a HEAD's nothing, a hot file's bytes kept with the answer or in the hot-file
                # cache; None: not in memory; False: the file changed, decided again)
                get = method == "GET"
                cache_root = self.policy.cache_root
                body = from_memory(path, decided.identity, decided.small, cache_root, get, decided.body)
                if body is not False and (decided.folder is None or folder_identity(path) == decided.folder):
                    # (no sibling came or went)
                    if body is not None:
                        try:
                            await send({"type": START, "status": 200, "headers": pairs.copy()})
                            await send({"type": BODY_TYPE, "body": body})
                        except RuntimeError as exc:  # (free in 3.11+ unless raised)
                            if not transport_gone(exc):
                                raise
                        return
                    if get and await self._send_again(decided, pairs, scope, receive, send):
                        return
                self._answers.pop(key)
        await self._answer(scope, receive, send, method, raw, root, headers, kind)

    async def _send_again(
        self, decided: Decided, pairs: list[tuple[bytes, bytes]], scope: Scope, receive: Receive, send: Send
    ) -> bool:
        """GET of a kept answer whose bytes are not in memory (a larger file, or a small one the
        hot-file cache dropped): the file opened again, checked by ``fstat`` to be the one the
        answer describes, and sent as the core's answer would be (a small file whose pages are
        cached is read back into the hot-file cache if it admits it). False: it is not that file
        (nothing was sent)."""
        again = reopen_kept(decided.path, decided.identity, decided.small, self.policy.cache_root)
        if again is None:
            return False  # replaced, renamed over, grown, truncated, chmod'ed: decided again
        fd, size, body = again
        # A small file's bytes read back into the hot-file cache, as the core would (then *fd* is
        # closed); else the file itself.
        if isinstance(body, bytes):  # (else False, cold, or None: sent from the file)
            ans = Answer(200, [], size, body=body, path=decided.path)
        else:
            ans = Answer(200, [], size, body=FileRange(fd, 0, size), path=decided.path, fd=fd, close=os.close)
        with ans:
            await send_answer(
                ans,
                send,
                file_mode(scope),
                pairs.copy(),
                follow_symlinks=self.policy.follow_symlinks,
                chunk_size=self.chunk_size,
                receive=_quiet_on_disconnect(scope, receive),
            )
        return True

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        method: str,
        raw: bytes,
        root: str,
        headers: Iterable[tuple[bytes, bytes]],
        kind: bool | bytes,
    ) -> None:
        """Any request but a memoised hot one: through the core, inline or in the cold pool.

        *kind*: what :func:`_scan` found (True: a plain request; bytes: only Accept-Encoding)."""
        key = raw
        plain = kind is True
        if b"?" in raw or b"#" in raw:  # a server that left the query (or a fragment) in raw_path
            raw = raw.partition(b"#")[0].partition(b"?")[0]
        # The mount's prefix, where the path holds it (as Starlette's get_route_path reads it).
        prefix = root.rstrip("/") if root and scope.get("path", "").startswith(root) else ""
        req = Request(
            method,
            raw,
            scope.get("query_string", b""),
            EMPTY if plain else BytesHeaders(headers),
            prefix,
        )
        policy = self.policy
        folder = None
        try:
            looked = first_look(req, policy, self._recent, key, time.monotonic())
            if looked is None:  # its lookup would read the disk: in the pool first
                await _off_loop(look_up, req, policy)
                self._recent.saw(key, time.monotonic())
                looked = look_again(req, policy)
            if isinstance(kind, bytes) and isinstance(looked[0], str):
                # (only Accept-Encoding: looked at before the core looks for siblings)
                folder = browser_folder(looked[0], policy)
            ans = decide_looked(req, looked, policy)
        except DecideInPool:  # a directory listing to build: in the pool, never on the loop
            folder = None
            ans = await _off_loop(answer, req, policy, POOL_FS)
        with ans:
            status = None
            if ans.status == 404 and self.html:  # (also one found as the file is opened)
                ans, status = await self._not_found_page(ans, method)
            decided = ans.decided
            if (
                decided is not None
                and status is None  # (not the 404 page: its 200 is not the answer for this path)
                and decided.prefix == root  # (the path below the mount is read from root_path)
                and (plain or for_browsers(folder, decided.path))
            ):
                pairs = decided.pairs = header_pairs(ans.fields, ans.length)
                decided.folder = folder
                if ans.entry is not None:
                    decided.body = ans.entry.body  # (charged with the answer)
                self._answers.keep((key, kind) if isinstance(kind, bytes) else key, decided)
                pairs = pairs.copy()
            else:
                pairs = header_pairs(ans.fields, ans.length)
            try:
                await send_answer(
                    ans,
                    send,
                    file_mode(scope),
                    pairs,
                    status=status,
                    follow_symlinks=policy.follow_symlinks,
                    chunk_size=self.chunk_size,
                    receive=_quiet_on_disconnect(scope, receive),
                )
            finally:
                ans.close()

    async def _not_found_page(self, ans: Answer, method: str) -> tuple[Answer, int | None]:
        """``html=True``: the directory's ``404.html``, if it has one, with status 404 (as Starlette)."""
        root = self.policy.root
        assert root is not None
        page = os.path.join(root, "404.html")
        located = Located(page)
        found = await _off_loop(respond, Request(method, b""), located, self.policy, POOL_FS)
        if found.status != 200:
            found.close()
            return ans, None
        ans.close()
        return found, 404


if TYPE_CHECKING:
    _ResponseBase = object
else:
    try:  # FastAPI sends a handler's return value as is only if it is a Starlette Response
        from starlette.responses import Response as _ResponseBase
    except ImportError:  # (a plain ASGI app needs no Starlette)
        _ResponseBase = object

#: Files a FileResponse answered recently (decided inline next time), by path.
_RECENT_FILES = RecentPaths()


class FileResponse(_ResponseBase):
    """One file as an ASGI app (a response a handler returns; see ``aiosendfile.asgi``).

    With Starlette installed it is a ``starlette.responses.Response`` (FastAPI sends such a return
    value as it is); ``raw_headers`` (and Starlette's ``headers``, ``set_cookie``) are the caller's
    fields, read when the response is sent.
    """

    body = b""

    def __init__(
        self,
        path: PathLike,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        background: Callable[[], Awaitable[Any]] | None = None,
        filename: str | None = None,
        stat_result: os.stat_result | None = None,
        content_disposition_type: str = "attachment",
        *,
        precompressed: bool = True,
        hot_cache: bool = True,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        chunk_size: int = DEFAULT_FALLBACK_CHUNK,
        root: PathLike | None = None,
        follow_symlinks: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.status_code = status_code
        self.background = background
        self.stat_result = stat_result
        self.chunk_size = chunk_size
        extra = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in (headers or {}).items()
        ]
        if media_type is None:
            for name, value in extra:
                if name == b"content-type":
                    media_type = value.decode("latin-1")
        if media_type is None and filename is not None:  # (as Starlette: by the name it is sent as)
            media_type = mimetypes.guess_type(filename)[0]
        self.media_type = media_type
        if filename is not None and not any(name == b"content-disposition" for name, _ in extra):
            quoted = quote(filename)
            if quoted != filename:
                disposition = f"{content_disposition_type}; filename*=utf-8''{quoted}"
            else:
                disposition = f'{content_disposition_type}; filename="{filename}"'
            extra.append((b"content-disposition", disposition.encode("latin-1")))
        self.raw_headers = extra
        real_root = None if root is None else os.path.realpath(root)
        self.policy = file_policy(real_root, follow_symlinks, precompressed, hot_cache, inline_limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await _not_http(scope, receive, send)
            return
        headers = scope["headers"]
        method = scope["method"]
        if self.status_code != 200 or method not in ("GET", "HEAD"):
            # As Starlette: a file sent as another status has no ranges; and the answer to another
            # method (a PUT that returns what it wrote) is past its preconditions: they were the
            # handler's to judge, before it acted. (A HEAD stays one: no body.)
            headers = [(n, v) for n, v in headers if n.lower() == b"accept-encoding"]
            if method != "HEAD":
                method = "GET"
        elif any(name in _VALIDATORS for name, _ in self.raw_headers):
            # The caller's own ETag or Last-Modified is sent (as Starlette): the core judges no
            # precondition by its own, nor a range against a validator it does not send.
            mine = {name: value for name, value in self.raw_headers if name in _VALIDATORS}
            headers = _without_preconditions(headers, mine)
        req = Request(
            method,
            b"",
            headers=EMPTY if _scan(headers) is True else BytesHeaders(headers),
            content_type=self.media_type,
        )
        located = Located(self.path, self.stat_result)
        key = os.fsencode(self.path)
        if _RECENT_FILES.seen(key, time.monotonic()):
            ans = respond(req, located, self.policy, REAL_FS)
        else:
            ans = await _off_loop(respond, req, located, self.policy, POOL_FS)
            _RECENT_FILES.saw(key, time.monotonic())
        with ans:
            status = self.status_code if ans.status == 200 else None
            try:
                await send_answer(
                    ans,
                    send,
                    file_mode(scope),
                    self._fields_for(ans),
                    status=status,
                    follow_symlinks=self.policy.follow_symlinks,
                    chunk_size=self.chunk_size,
                    receive=_quiet_on_disconnect(scope, receive),
                )
            finally:
                ans.close()
        if self.background is not None:
            await self.background()

    def _fields_for(self, ans: Answer) -> list[tuple[bytes, bytes]]:
        """The caller's fields, then the core's that the caller did not set; the core's framing
        (``Content-Length``, ``Content-Range``, ``Content-Encoding``...) replaces the caller's, and
        ``vary`` joins. What Starlette's ``FileResponse`` lets a caller set (its type, validators,
        disposition, caching) stays the caller's, set at construction or after."""
        core = header_pairs(ans.fields, ans.length)
        if not ans.fields and ans.status != 200:  # an error found on opening: as the core says it
            return core
        mine = self.raw_headers
        kept = {name for name, _ in mine if name in _CALLERS}
        if isinstance(ans.body, Multipart):  # (its type names the parts' boundary: the core's)
            kept.discard(b"content-type")
        names = {name for name, _ in core if name != b"vary" and name not in kept}
        names.add(b"content-length")
        return [pair for pair in mine if pair[0] not in names] + [
            pair for pair in core if pair[0] not in kept
        ]
