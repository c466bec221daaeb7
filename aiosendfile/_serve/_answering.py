"""A connection's answers: a parsed request to the bytes (or the file body) that answer it.

A request is judged by the gate first, when it has credentials (:func:`respond`). A plain ``GET``
or ``HEAD`` of a path answered recently is replayed from the engine's answer cache
(:func:`replay`: ``_server.Known``, the head rendered then; ``_static._inline``'s rules, so a
changed file is never answered from it), with no core request or answer object. Any other
request becomes a core ``Request``, decided inline at a first sight whose lookup waits for no
disk, else after one hop to the cold pool (:func:`decide`). The answer is rendered (:func:`render`)
into the connection's ``out``; a file body goes to a body sender (``_sending``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from .._lookup import identity_of
from .._outlet import PROBED_COLD, READ_MAX, probe_max
from .._platform import peer_ended
from .._static import _hot
from .._static._answer import Answer, FileRange, Multipart, error
from .._static._core import answer as core_answer
from .._static._fs import POOL_FS, DecideInPool, read_back, read_first, reopen_answer, same_file
from .._static._http import settled
from .._static._inline import (
    Looked,
    browser_folder,
    decide_looked,
    first_look,
    for_browsers,
    from_memory,
    look_again,
    look_up,
)
from .._static._policy import DirectoryPolicy
from .._static._request import EMPTY, BytesHeaders, Request, accept_encoding_alone
from ._auth import ALLOWED
from ._bounds import FLUSH_AT
from ._exchange import Exchange
from ._reader import GET_HEAD
from ._refusal import refusal, verdict_of
from ._render import error_response, file_head, head_of
from ._resumable import MARK
from ._sending import send_body, send_whole
from ._target import split_target

if TYPE_CHECKING:
    from ._protocol import HttpProtocol

__all__ = ("decide", "render", "replay", "respond")

_GET, _HEAD = b"GET", b"HEAD"


#: Requests that may be a resumable upload's without a body (``_resumable_door``; a HEAD only with
#: an upload token in its query).
RESUMABLE_BODILESS = (b"HEAD", b"DELETE", b"OPTIONS")


def respond(conn: HttpProtocol, exchange: Exchange, replayed: bool = False) -> None:
    """Answer *exchange*: judged by the gate if it must be, replayed if it can be, else decided.
    *replayed*: the caller found it not kept a moment ago, as it stands (not asked again)."""
    method = exchange.method
    if (
        method is not _GET
        and method in RESUMABLE_BODILESS
        and (method != _HEAD or MARK in exchange.url)  # (a plain HEAD goes straight on)
        and conn.engine.resumable is not None
    ):
        from ._resumable_door import answer_resumable  # (it answers through this module)

        if answer_resumable(conn, exchange):
            return
    if exchange.auth is not None and not authorize(conn, exchange):
        return
    fields = exchange.fields
    browser = False
    if fields is not None and accept_encoding_alone(fields):
        if conn.engine.policy.precompressed:
            browser = True
        else:  # (the core reads no Accept-Encoding without pre-compressed siblings: a plain request)
            exchange.fields = fields = None
    if (
        (fields is None or browser)
        and method in GET_HEAD
        and not replayed
        and replay(conn, exchange, exchange.url, exchange.mode, method == _GET, browser)
    ):
        return
    decide(conn, exchange)


def authorize(
    conn: HttpProtocol,
    exchange: Exchange,
    as_method: bytes | None = None,
    then: Callable[[HttpProtocol, Exchange], None] | None = None,
) -> bool:
    """Whether *exchange*'s credentials let it be answered now, judged as it is answered (after the
    answers before it, their failures counted), as a request of *as_method* (its own by default).
    False: it is refused (401, 429, 503), or its password is checked in the gate's thread
    (reading paused meanwhile, what follows waits) and it goes on from there: *then* (by
    default, :func:`respond`)."""
    gate = conn.engine.gate
    assert gate is not None
    assert exchange.auth is not None
    value, client = exchange.auth
    verdict = gate.judge(as_method or exchange.method, value, conn._key_of(client))
    if not isinstance(verdict, float):  # (its password is checked in the gate's thread)
        conn.busy = True
        conn._update_reading()
        later = functools.partial(_authorized, conn, exchange, then or respond)
        verdict.add_done_callback(functools.partial(conn._on_loop, later))
        return False
    if verdict != ALLOWED:
        refuse(conn, exchange, verdict)
        return False
    exchange.auth = None
    return True


def _authorized(
    conn: HttpProtocol,
    exchange: Exchange,
    then: Callable[[HttpProtocol, Exchange], None],
    job: concurrent.futures.Future[float],
) -> None:
    conn._free()
    if conn.transport is None:
        return
    verdict = verdict_of(job)
    if verdict == ALLOWED:
        exchange.auth = None
        then(conn, exchange)
    else:
        refuse(conn, exchange, verdict)
    conn._resume()


def refuse(conn: HttpProtocol, exchange: Exchange, verdict: float) -> None:
    """Answer *exchange* as the gate's *verdict* says (``_refusal.refusal``; kept alive: a browser
    asks again on the same connection)."""
    status, extra = refusal(verdict)
    render(conn, exchange, error(status, exchange.method.decode("latin-1"), *extra))


def replay(
    conn: HttpProtocol, exchange: Exchange | None, url: bytes, mode: int, get: bool, browser: bool = False
) -> bool:
    """Answer a plain GET (*get*) or HEAD of *url* if its path is in the answer cache: a hot
    file's bytes (or its head alone) from memory, else (GET) sent from its file opened again
    (``_static._inline``'s rules). *exchange* is the request if one was made (its log fields);
    None for a head read from the heads memo. A *browser*'s request (``Accept-Encoding`` alone)
    only from an answer kept for one, whose file's directory has not changed since (no name
    came, went or was renamed there: no sibling appeared). False: not kept, or the path no longer
    names the kept file (it is forgotten); the request is to be decided."""
    engine = conn.engine
    q = url.find(b"?")
    if q < 0:
        key = url
    else:
        key = url[:q]
        if key[-1:] == b"/" or key[-3:].lower() == b"%2f":
            return False  # (a folder's query may ask for its archive, not its index page: decided)
    known = engine.answers.get(key)
    if known is None:
        return False
    ident, path, head, small, folder, folder_ident = known
    if browser and (folder is None or folder_ident is None or not same_file(folder, folder_ident)):
        return False  # (what it keeps is a plain request's, or a sibling may be there: decided)
    head += engine.clock.tails[mode]
    body = from_memory(path, ident, small, engine.cache_root, get) if small or not get else None
    if body is None:  # (a GET) sent from the file, or read back (into the hot-file cache)
        # (probed as it is opened if it is sent from its descriptor: see _bodies.send_first)
        probe = probe_max(ident) if ident[2] > READ_MAX or not small else 0
        again = reopen_answer(path, ident, small, engine.cache_root, head, READ_MAX, probe)
        if again is None:
            engine.forget(key)  # replaced, renamed over, grown, truncated, chmod'ed: decided again
            return False
        if type(again) is bytes:  # the head and the bytes of a small file, read whole
            conn._put(again)
            if exchange is not None and exchange.log is not None:
                conn._log(exchange, ident[2])
        else:  # (a working set larger than the cache is sent from its files)
            fd, size, warm_to = again
            send_whole(conn, exchange, url, mode, fd, size, head, warm_to, (ident[0], ident[1]))
        return True
    if body is False:
        engine.forget(key)
        return False
    data = head + body
    conn.out.append(data)  # (_put, inline: the hot path)
    conn.out_size += len(data)
    if conn.out_size >= FLUSH_AT:
        conn._flush()
    if exchange is not None and exchange.log is not None:
        conn._log(exchange, len(body))
    return True


def decide(conn: HttpProtocol, exchange: Exchange) -> None:
    """Any request but a kept hot one: through the core, inline or in the cold pool."""
    method = exchange.method
    target = split_target(exchange.url)
    if target is not None:
        raw, query = target
    elif method in GET_HEAD:  # "*", authority-form: nothing a file could be
        error_now(conn, exchange, 400)
        return
    else:  # OPTIONS *, CONNECT host:port: the core refuses the method (405) before the path
        raw, query = b"/", b""
    fields = exchange.fields
    request = exchange.request = Request(
        method.decode("latin-1"), raw, query, BytesHeaders(fields) if fields else EMPTY, conn.engine.prefix
    )
    exchange.raw = raw
    engine = conn.engine
    policy = engine.policy
    looked = first_look(request, policy, engine.recent, raw, engine.now)
    if looked is None:  # its lookup would read the disk: in the pool first
        _to_pool(conn, exchange, first=True)
        return
    answer_looked(conn, exchange, looked, first=True)


def answer_looked(conn: HttpProtocol, exchange: Exchange, looked: Looked, *, first: bool) -> bool:
    """Decide and answer on the loop what ``first_look`` (a *first* look) or ``look_again`` found:
    a plain ``GET`` of a file it opened by :func:`first_plain`, anything else by the core. False: a
    directory listing to build went to the pool."""
    path, opened = looked
    policy = conn.engine.policy
    plain = exchange.fields is None
    if not plain:
        try:
            _look_at_folder(exchange, looked, policy)
            # A browser's request of a file with no name a sibling could have beside it is a plain
            # one (its folder looked at first: what is kept for it says when that may change).
            if opened is not None and isinstance(path, str):
                plain = for_browsers(exchange.folder, path)
        except Exception as exc:
            if opened is not None:
                os.close(opened[0])
            crashed(conn, exchange, exc)
            return True
    try:
        if (
            plain
            and opened is not None
            and exchange.method == _GET
            and opened[1].st_size
            and policy.hot_cache
        ):
            first_plain(conn, exchange, path, *opened)  # type: ignore[arg-type]  # (a path: opened)
            return True
        ans = decide_looked(exchange.request, looked, policy)
    except DecideInPool:  # a directory listing to build: in the pool
        _to_pool(conn, exchange, first=first)
        return False
    except Exception as exc:
        crashed(conn, exchange, exc)
        return True
    render(conn, exchange, ans)
    return True


def first_plain(conn: HttpProtocol, exchange: Exchange, path: str, fd: int, st: os.stat_result) -> None:
    """The first sight of a plain ``GET`` (no field the core reads, or a browser's with no sibling
    to choose: kept with its ``folder``) of a regular file of a byte or more that ``first_look``
    opened (*fd*, now ours) below the root: what ``decide_looked`` then :func:`render` give it,
    made without the core's request, answer and decision objects (their Python was most of a
    first sight's cost): a hot small file's bytes, or one read whole (``_fs.read_back``: into the
    hot-file cache if it admits it, else up to ``READ_MAX``), else the file sent from *fd*; the
    answer kept. (The core reads a file it admits with ``read_cached``, whose error is the
    request's: here, as a kept file's read, an error leaves the file to the sender, which meets
    it again.)"""
    engine = conn.engine
    policy = engine.policy
    size = st.st_size
    small = size <= policy.inline_limit
    try:
        ident = identity_of(st)
        now = time.time()
        head = file_head(path, st, policy.precompressed, engine.sandbox, now)
        entry = _hot.hot_files.entry(path, engine.cache_root, st) if small else None
    except BaseException:  # (a date the head cannot show, say: answered 500, and no fd left open)
        os.close(fd)
        raise
    body: bytes | bytearray | Literal[False] | None = None
    if entry is not None:
        os.close(fd)
        body = entry.body
    elif small:  # one RWF_NOWAIT read, also its probe; fd closed once the bytes are in (False: cold)
        body = read_back(fd, st, path, engine.cache_root, READ_MAX)
    if settled(st.st_mtime, now):  # (else its date is this answer's: not kept)
        engine.keep(exchange.raw, ident, path, head, small, exchange.folder)
    head += engine.clock.tails[exchange.mode]
    if type(body) is bytes or type(body) is bytearray:
        _written(conn, exchange, head + body, size)
    else:  # as a kept one is sent: straight where the socket takes it, or to wait for cold pages
        warm_to = PROBED_COLD if body is False else 0
        send_whole(
            conn, exchange, exchange.url, exchange.mode, fd, size, head, warm_to, (st.st_dev, st.st_ino)
        )


def _read_or_send(
    conn: HttpProtocol, exchange: Exchange, fd: int, size: int, device: int, head: bytes
) -> None:
    """A first sight's file, from *fd* (ours), after *head* (its tail included), as a kept one is
    sent: one of up to ``READ_MAX`` bytes read whole with one ``RWF_NOWAIT`` read (its probe) and
    written with its head; else the head and the file straight where the socket takes them, or by
    a body sender, which waits for the pages at once if the read found them cold. A read that
    fails leaves the file to the send, which meets the error again."""
    warm_to = 0
    if size <= READ_MAX:
        read = read_first(fd, size, device)
        if type(read) is bytearray and len(read) == size:
            os.close(fd)
            _written(conn, exchange, head + read, size)
            return
        if read is False:
            warm_to = PROBED_COLD
    send_whole(conn, exchange, exchange.url, exchange.mode, fd, size, head, warm_to)


def _written(conn: HttpProtocol, exchange: Exchange, data: bytes, size: int) -> None:
    conn._put(data)
    if exchange.log is not None:
        conn._log(exchange, size)


def _look_at_folder(exchange: Exchange, looked: Looked, policy: DirectoryPolicy) -> None:
    """A browser's request (``Accept-Encoding`` alone) of a path: the folder of its file looked at
    before the core looks for siblings (``_inline.browser_folder``), so that an answer kept for it
    is one no sibling could have changed (:func:`render`)."""
    fields = exchange.fields
    path = looked[0]
    if fields is not None and type(path) is str and accept_encoding_alone(fields):
        exchange.folder = browser_folder(path, policy)


def _to_pool(conn: HttpProtocol, exchange: Exchange, *, first: bool, waited: int = 0) -> None:
    """One hop to the cold pool and back. At a *first* sight the thread only looks the path up
    (``_inline.look_up``) and the loop then decides inline; otherwise (a listing to build) the
    thread decides with ``POOL_FS``. *waited*: the times an archive found every walk taken."""
    conn.busy = True
    conn._update_reading()
    engine = conn.engine
    # No task: the pool thread's done callback schedules _cold_done on the loop (one hop back).
    job: concurrent.futures.Future[Answer | None]
    request = exchange.request
    if first:
        job = engine.executor.submit(look_up, request, engine.policy)
    else:
        job = engine.executor.submit(core_answer, request, engine.policy, POOL_FS)
    job.add_done_callback(functools.partial(_cold_arrived, conn, exchange, waited))


def _cold_arrived(
    conn: HttpProtocol, exchange: Exchange, waited: int, job: concurrent.futures.Future[Answer | None]
) -> None:
    """(In the pool thread.) Hand the cold decision to the loop, or close it if the loop is gone."""
    try:
        conn.engine.loop.call_soon_threadsafe(_cold_done, conn, exchange, job, waited)
    except RuntimeError:  # the loop is closed: nobody will send the answer
        if not job.cancelled() and job.exception() is None:
            ans = job.result()
            if ans is not None:
                ans.close()


#: An archive that finds every walk taken (``_fs.MAX_WALKS``: 503) asks again after these many
#: seconds, on the loop (no pool thread held while it waits), before it is answered 503: about
#: 10 s in all. A browser does not retry a download on ``Retry-After``.
WALK_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def _cold_done(
    conn: HttpProtocol, exchange: Exchange, job: concurrent.futures.Future[Answer | None], waited: int = 0
) -> None:
    """A cold decision is back on the loop: render it (or close it if the connection is gone)."""
    exc = job.exception() if not job.cancelled() else RuntimeError("the cold pool cancelled a decision")
    ans = job.result() if exc is None else None
    if ans is not None and ans.status == 503 and waited < len(WALK_WAITS) and conn.transport is not None:
        # (the core's one 503: every archive walk taken) asked again later; the connection stays
        # busy meanwhile
        ans.close()
        conn.engine.loop.call_later(WALK_WAITS[waited], _walk_again, conn, exchange, waited + 1)
        return
    conn._free()
    if exc is not None:
        if not isinstance(exc, Exception):
            raise exc
        crashed(conn, exchange, exc)
        conn._resume()
        return
    engine = conn.engine
    engine.saw(exchange.raw)
    if ans is None:  # looked up: decide now, inline
        if conn.transport is None:
            return
        try:
            looked = look_again(exchange.request, engine.policy)
        except Exception as error:
            crashed(conn, exchange, error)
            conn._resume()
            return
        if answer_looked(conn, exchange, looked, first=False):
            conn._resume()
        return
    if conn.transport is None:
        ans.close()
        return
    render(conn, exchange, ans)
    conn._resume()


def _walk_again(conn: HttpProtocol, exchange: Exchange, waited: int) -> None:
    transport = conn.transport
    if transport is None:  # the connection is gone: nothing to answer
        return
    sock = transport.get_extra_info("socket")
    if sock is not None and peer_ended(sock.fileno()):
        # Its client left while it waited (reading is paused: its end was not read): no walk
        # for nobody. (A client that half-closed after its request is taken as gone too.)
        transport.abort()
        return
    _to_pool(conn, exchange, first=False, waited=waited)


def render(conn: HttpProtocol, exchange: Exchange, ans: Answer) -> None:
    """Write *ans* (or start sending it); it is closed once sent."""
    engine = conn.engine
    body = ans.body
    exchange.status = ans.status
    decided = ans.decided
    # A plain 200 of a whole file: kept; for a browser's request (Accept-Encoding alone) only while
    # no name a sibling could have is there (its directory, looked at first, shows one coming).
    if decided is not None and (exchange.fields is None or for_browsers(exchange.folder, decided.path)):
        head = decided.head
        if head is None or engine.sandbox:  # (under --upload: rendered here, kept in the engine's memo)
            head = head_of(ans, engine.sandbox)
            if not engine.sandbox:
                decided.head = head
        engine.remember(exchange.raw, decided, head, exchange.folder)
        fd = ans.fd
        if fd is not None and exchange.method == _GET and isinstance(body, FileRange):
            # A first sight of a file sent from its descriptor: as a kept one is sent, the head
            # and the file straight where the socket takes them (a small one read and written
            # from memory, its read the probe), else by a body sender.
            ans.fd = None  # (ours now: the answer closes nothing)
            head += engine.clock.tails[exchange.mode]
            _read_or_send(conn, exchange, fd, decided.size, decided.identity[0], head)
            return
    else:
        head = head_of(ans, engine.sandbox)
    head += engine.clock.tails[exchange.mode]
    if ans.head_only or body is None:
        ans.close()
        conn._put(head)
        sent = 0
    elif isinstance(body, bytes):
        ans.close()
        conn._put(head + body)
        sent = len(body)
    elif isinstance(body, Multipart) and isinstance(body.source, bytes):
        ans.close()
        source = body.source
        chunks = [head]
        for part_head, r in body.parts:
            chunks += (part_head, source[r.start : r.stop])
        chunks.append(body.closing)
        conn._put(b"".join(chunks))
        sent = sum(r.length for _, r in body.parts)
    else:
        send_body(conn, exchange, ans, body, head)
        return
    if exchange.log is not None:
        conn._log(exchange, sent)


def error_now(conn: HttpProtocol, exchange: Exchange, status: int) -> None:
    """An error answer for a parsed request; the connection closes after it."""
    conn.dead = True
    exchange.status = status
    conn._put(error_response(status, conn.engine.clock, body=exchange.method != _HEAD))
    if exchange.log is not None:
        conn._log(exchange, 0)


def crashed(conn: HttpProtocol, exchange: Exchange, exc: Exception) -> None:
    """The core raised: answer 500, close, and report it to the loop like any callback error."""
    error_now(conn, exchange, 500)
    conn._report(exc, "the static core failed")
