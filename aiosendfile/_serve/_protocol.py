"""One HTTP/1.1 connection: httptools parses, the static core decides, answers go to the transport.

Each parsed request is an :class:`Exchange` (method, target, keep-alive mode, the core's header
pairs, the access log's fields; once decided its raw path, core ``Request`` and status), which
every step from the parser to the access log takes, and which waits in ``pending`` when it must.
A read that is exactly a plain request head parsed before (``Engine.heads``: a client asking again
sends the same bytes) is not parsed again: its method, target and keep-alive mode come from that
memo, and it goes on as a parsed one would. The hot path (a plain ``GET``/``HEAD``: no ``Range``,
``If-*``, ``Accept-Encoding`` or ``Expect``) of a file answered recently makes no core request or
answer object: the raw target path (query cut) finds what the core decided in the engine's answer
cache (``_server.Known``: the file's identity and path, the head the engine rendered, whether it is
small). A small file's bytes come from the hot-file cache, one ``os.stat`` checks the path still
names that file, and the prebuilt head, the second's tail and the bytes are appended to ``out``.
Any other file is opened again, checked by ``fstat``, and sent from the file on the connection's
outlet (``_outlet``); a first sight's plain 200 is sent the same way, from the core's descriptor.
Everything a ``data_received`` produced leaves in one ``transport.write`` (pipelined requests
share it). Any other request becomes a core ``Request``, decided inline
when its lookup waits for no disk (``_fs.open_cached``: one ``openat2`` that also opens a file
reached through no symlink, and the core's ``decide`` takes that descriptor) or its path was seen
in the last seconds, else after one hop to the cold pool, which looks the path up (a first sight
never stalls the loop on the disk's metadata).

Ordering: at most one response is in flight at a time (``busy``): a cold decision or a file body
(on the outlet; over TLS, or behind answers still in the transport's buffer, through
``aiosendfile.sendfile`` with the head as its ``headers=``). Meanwhile reading is paused and the
requests already parsed wait in ``pending``; they are answered in order when it ends. A body
that cannot be sent whole aborts the connection: a short body is never passed off as complete.

Limits (each answered, then the connection closes): request target over ``max_request_line`` →
414; header fields over ``max_header_bytes`` together, or one over ``max_request_line`` → 431;
anything llhttp refuses, or an HTTP/1.1 head without exactly one ``Host`` → 400; an ``Expect``
other than ``100-continue`` → 417. A request body (``Content-Length`` or chunked) is read by the
parser and dropped. The engine's timer applies the timeouts (:meth:`HttpProtocol.expire`): a head
not complete in ``header_timeout`` → 408; idle longer than ``keepalive_timeout`` → closed; a file
body with no progress for ``send_timeout`` → aborted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import io
import math
import os
from collections import deque
from typing import TYPE_CHECKING, Any

import httptools

from .. import _outlet, _platform
from .._api import sendfile
from .._errors import SendfileError
from .._options import DEFAULT_OPTIONS
from .._outlet import MAX_CHUNK, PROBED_COLD, READ_MAX, Outlet, Transfer
from .._sink import FileSink
from .._splice import splice_to_file
from .._static._answer import Answer, FileRange, Multipart, error
from .._static._core import answer, decide, route
from .._static._fs import POOL_FS, DecideInPool, open_cached, read_back, reopen
from .._static._hot import hot_files, identity
from .._static._policy import DirectoryPolicy
from .._static._request import EMPTY, BytesHeaders, Request, accept_matters
from ._auth import ALLOWED, BUSY, MISSING, REALM, address_key
from ._date import CLOSE, KEEP10, KEEP11
from ._render import error_response, head_of
from ._rules import same_origin
from ._tls import TLSTransport
from ._tls_body import TLSBody
from ._upload import (
    DISCARD_MAX,
    SPLICE_AT,
    Receiving,
    Upload,
    UploadRefused,
    status_of,
    upload_directory,
    upload_target,
)

if TYPE_CHECKING:
    from ._form import FormUpload
    from ._server import Engine, ServeConfig

__all__ = (
    "ACCEPT",
    "AGENT",
    "AUTH",
    "LENGTH",
    "CORE",
    "CTYPE",
    "EXPECT",
    "FETCH_SITE",
    "HOST",
    "ORIGIN",
    "REFERER",
    "TE",
    "XFF",
    "Head",
    "HttpProtocol",
    "header_kinds",
)

#: What a wanted request header is kept for (``Engine.wanted`` maps lowercase names to these).
HOST, CORE, EXPECT, REFERER, AGENT, TE, ACCEPT, AUTH, LENGTH, CTYPE = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
ORIGIN, FETCH_SITE, XFF = 10, 11, 12


def header_kinds(
    logging: bool, auth: bool = False, uploads: bool = False, proxied: bool = False
) -> dict[bytes, int]:
    """The request headers a connection keeps (lowercase name → what for): the core's (``Accept``
    only when it names JSON), ``Expect``, ``Host``, ``Transfer-Encoding``, and with an access log
    ``Referer`` and ``User-Agent``; with authentication ``Authorization`` (a request with it stays
    plain: the heads memo keys on the whole read, credentials included), and behind trusted
    proxies their ``X-Forwarded-For``; with uploads what a body needs and
    what tells a browser's cross-site write (``Origin``, ``Sec-Fetch-Site``)."""
    kinds = dict.fromkeys(BytesHeaders.WANTED, CORE)
    kinds[b"accept"] = ACCEPT
    kinds[b"expect"] = EXPECT
    kinds[b"host"] = HOST
    kinds[b"transfer-encoding"] = TE
    if auth:
        kinds[b"authorization"] = AUTH
        if proxied:
            kinds[b"x-forwarded-for"] = XFF
    if uploads:
        kinds[b"content-length"] = LENGTH
        kinds[b"content-type"] = CTYPE
        kinds[b"origin"] = ORIGIN
        kinds[b"sec-fetch-site"] = FETCH_SITE
    if logging:
        kinds[b"referer"] = REFERER
        kinds[b"user-agent"] = AGENT
    return kinds


#: Parsed requests waiting behind a response in flight before reading pauses.
MAX_PENDING = 16
#: Answers gathered in ``out`` are written once they reach this many bytes (else at the end of the
#: read that brought their requests): what a connection holds beyond the transport's buffer.
FLUSH_AT = 64 * 1024
#: Requests answered in one turn of the loop (one callback); the rest wait for the next turn, so a
#: client that pipelines thousands of requests delays the others by one turn's work at most.
TURN_BUDGET = 32
#: What the parser is fed at a time: between two slices parsing stops once MAX_PENDING requests
#: wait (the rest of the read is kept, reading paused), so a read of 256 KiB of tiny pipelined
#: requests is not parsed all at once.
PARSE_SLICE = 8 * 1024

#: What one read may bring beyond the head limits before an unfinished head counts as too large.
_READ_ALLOWANCE = 256 * 1024

_GET, _HEAD = b"GET", b"HEAD"
_GET_HEAD = (_GET, _HEAD)
_UPLOADS = (b"PUT", b"POST")  # (with uploads on: a file, a form of files)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CHALLENGE = ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')  # (a 401's)


def _refusal(verdict: float) -> tuple[int, tuple[tuple[str, str], ...]]:
    """The answer to a request the gate did not allow (``Gate.check``'s *verdict*: MISSING, BUSY
    or a lock's seconds): 401 with a Basic challenge, 503 or 429 with ``Retry-After``."""
    if verdict == MISSING:
        return 401, (_CHALLENGE,)
    if verdict == BUSY:
        return 503, (("Retry-After", "1"),)
    return 429, (("Retry-After", str(math.ceil(verdict))),)


def _verdict(job: concurrent.futures.Future[float]) -> float:
    """The gate's verdict in *job* (``Gate.verify_later``'s): MISSING if the check failed."""
    if job.cancelled() or job.exception() is not None:
        return MISSING
    return job.result()


def _failure(job: concurrent.futures.Future[Any]) -> BaseException | None:
    """What a pool job failed with (a cancelled one: CancelledError), or None."""
    return concurrent.futures.CancelledError() if job.cancelled() else job.exception()


def _split_target(url: bytes) -> tuple[bytes, bytes] | None:
    """The raw path and query of a request target: origin-form (a fragment, which clients should
    not send, is neither) or absolute-form (``http://host/path?query``); None for anything else
    (``*``, authority-form)."""
    if url[:1] == b"/":
        raw, _, query = (url.partition(b"#")[0] if b"#" in url else url).partition(b"?")
        return raw, query
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return None
    if not parsed.schema:
        return None
    return parsed.path or b"/", parsed.query or b""


def _back_to(raw_path: bytes) -> str:
    """The ``Location`` of a form POST's 303: the directory it was posted to, relative (right
    behind a proxy's prefix too): ``./`` for ``/a/b/``, ``b/`` for ``/a/b``."""
    if raw_path.endswith(b"/"):
        return "./"
    return raw_path.rsplit(b"/", 1)[-1].decode("latin-1") + "/"


#: What the access log needs besides method and target: (HTTP version, Referer, User-Agent).
LogFields = tuple[str, bytes | None, bytes | None]


class Exchange:
    """One request on its way to its answer (uvicorn's ``RequestResponseCycle`` shape).

    Made when the parser completes a request; what every step after it reads instead of the
    five to seven values it would pass on: the request's method, target, how its head ends
    (``mode``: the keep-alive tail), the core's header pairs (None: a plain request, the memo's
    case), the access log's fields, and, once decided, the raw path, the core's ``Request``
    and the answer's status.
    """

    __slots__ = ("auth", "fields", "guarded", "log", "method", "mode", "raw", "request", "status", "url")

    raw: bytes
    request: Request

    def __init__(
        self,
        method: bytes,
        url: bytes,
        mode: int,
        fields: list[tuple[bytes, bytes]] | None,
        log: LogFields | None,
    ) -> None:
        self.method = method
        self.url = url
        self.mode = mode
        self.fields = fields
        self.log = log
        self.status = 200  # the answer's (set when one is rendered or refused; a memoised one is a 200)
        # With a gate: the request's credentials (its Authorization value, and the client a trusted
        # proxy names) in guarded, and in auth until the gate allows them, when it is answered.
        self.auth: Guard | None = None
        self.guarded: Guard | None = None
        # Set by _decide, before anything reads them: raw (the target's path, raw) and request.


#: What the gate checks of a request: its ``Authorization`` value, and the client a trusted proxy
#: names (``TrustedProxies.client``; None: none, or no trusted proxy).
Guard = tuple["bytes | None", "str | None"]

#: A plain keep-alive request as its head parses (``Engine.heads``): method, target, mode, log
#: fields, and its credentials (checked again each time it is replayed).
Head = tuple[bytes, bytes, int, "LogFields | None", "Guard | None"]

#: What waits in ``pending``: a request, or prebuilt bytes (a 100 Continue, an error) to write.
Item = Exchange | bytes


def _looked_up(path: str | Answer) -> bool:
    """Whether the file *path* (``route``'s) can be looked up without the disk (its directories
    and inode are in the kernel's caches): then it is decided inline, with no hop to the pool."""
    return not isinstance(path, str) or _platform.lookup_cached(path) is True


def _decided_inline(request: Request, policy: DirectoryPolicy) -> Answer:
    """``answer()`` on the loop for a path the pool just looked up (its lookup cached now): the
    file opened by ``open_cached`` where no symlink lies on the way, as at a first sight."""
    path = route(request, policy)
    if isinstance(path, Answer):
        return path
    found = open_cached(path)
    return decide(request, path, policy, opened=found if type(found) is tuple else None)


def _look(request: Request, policy: DirectoryPolicy) -> None:
    """(In a pool thread.) Look up the file *request* names, so that deciding it on the loop
    next waits for no disk: its ``stat`` brings the directory entries and inode into the kernel's
    caches. Whatever it finds (or fails to find) is decided again on the loop."""
    path = route(request, policy)
    if isinstance(path, str):
        with contextlib.suppress(OSError, ValueError):
            os.stat(path)


class _Stop(Exception):
    """Raised in a parser callback to stop parsing: answer *status* (None: nothing more), with the
    *extra* fields, then close."""

    def __init__(self, status: int | None, *extra: tuple[str, str]) -> None:
        super().__init__(status)
        self.status = status
        self.extra = extra


class HttpProtocol(asyncio.Protocol):
    """An HTTP/1.1 server connection of one :class:`~._server.Engine`."""

    __slots__ = (
        "agent",
        "authorization",
        "backlog",
        "backlog_at",
        "budget",
        "busy",
        "client",
        "completed",
        "continue_owed",
        "ctype",
        "dead",
        "discard",
        "ended",
        "engine",
        "expect",
        "fetch_site",
        "fields",
        "head_size",
        "held",
        "host",
        "hosts",
        "in_head",
        "in_request",
        "key",
        "landing",
        "length",
        "max_head",
        "max_url",
        "origin",
        "out",
        "out_left",
        "out_since",
        "out_size",
        "outlet",
        "owned",
        "parsed",
        "parser",
        "partial",
        "peer",
        "pending",
        "plain",
        "proxied",
        "read_paused",
        "receiving",
        "referer",
        "scheduled",
        "sending",
        "since",
        "splicing",
        "starting",
        "task",
        "te",
        "transport",
        "url",
        "version",
        "wanted",
        "write_paused",
        "xff",
    )

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.wanted = engine.wanted
        self.max_url = engine.config.max_request_line
        self.max_head = engine.config.max_header_bytes
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] | None = None
        self.expect: bytes | None = None
        self.referer: bytes | None = None
        self.authorization: bytes | None = None  # the request's Authorization value (with a gate)
        self.length: bytes | None = None  # the request's Content-Length value (with uploads)
        self.ctype: bytes | None = None  # its Content-Type (with uploads: a form's boundary)
        self.continue_owed = False  # a PUT's Expect: 100-continue, answered once it may come
        self.receiving: Receiving | None = None  # a PUT body on its way to a file (with uploads)
        self.landing: Receiving | None = None  # a PUT body all there, being written and named
        self.splicing = False  # a PUT body goes from the socket to its file (reading paused)
        self.discard = 0  # bytes still to come of a body that failed half-way: dropped unparsed
        self.agent: bytes | None = None
        self.head_size = 0
        self.hosts = 0  # Host fields in this request's head
        self.host: bytes | None = None  # the first one's value
        self.origin: bytes | None = None  # (with uploads) Origin and Sec-Fetch-Site: who writes
        self.fetch_site: bytes | None = None
        self.xff: bytes | None = None  # (behind a trusted proxy) X-Forwarded-For
        self.client: str | None = None  # the client they name (TrustedProxies.client)
        self.key = "-"  # what the gate locks this connection's client out as (address_key)
        self.proxied = False  # the peer is a trusted proxy: its requests' clients are their own
        self.te: bytes | None = None  # Transfer-Encoding, its fields joined
        self.version = "1.1"  # the HTTP version of the request being read ("1.0", "1.1")
        self.partial = 0
        self.in_head = False
        self.in_request = False  # from a request's first byte to its body's last
        self.plain = True  # the request being read has no Expect and no Transfer-Encoding
        self.completed = 0  # requests the parser completed in the read being fed
        self.parsed: Exchange | None = None  # the last completed request, if the heads memo may hold it
        # A fresh connection gets header_timeout, not keepalive_timeout, to send its first request.
        self.since = engine.now - engine.config.keepalive_timeout + engine.config.header_timeout
        self.busy = False  # a cold decision or a file body is in flight
        self.sending = False  # a file body is in flight: since = its last progress
        self.dead = False  # no more requests will be read: close once everything is answered
        self.ended = False  # the client's end of stream came: answer what it sent, then close
        self.pending: deque[Item] = deque()
        self.backlog = b""  # a read not parsed yet past backlog_at (while MAX_PENDING requests wait)
        self.backlog_at = 0
        self.held: bytes | None = None  # a read waiting, as it came, for a turn (see _hold)
        self.budget = TURN_BUDGET  # requests this turn may still answer
        self.scheduled = False  # a next turn is scheduled (call_soon, or in the engine's waiting queue)
        self.out: list[bytes] = []
        self.out_size = 0  # bytes in out
        self.out_left = 0  # the transport's write buffer at the last tick, and since when
        self.out_since = 0.0
        self.task: asyncio.Task[None] | None = None
        self.outlet: Outlet | bool | None = None  # made at the first file body; False: none here
        self.owned: Transfer | TLSBody | None = None  # a file body in flight on the outlet (or over TLS)
        self.starting = False  # in _own's first try: a body that ends there goes on in the caller
        self.read_paused = False
        self.write_paused = False
        self.peer = "-"

    # -- transport callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.engine.connections.add(self)
        engine = self.engine
        if engine.log is not None or engine.gate is not None:  # (logged; locked out by address)
            peer = transport.get_extra_info("peername")
            if isinstance(peer, tuple) and peer:
                self.peer = str(peer[0])
            self.key = address_key(self.peer)
            self.proxied = engine.trusted is not None and engine.trusted.trusts(self.peer)
        if self.engine.stopping:  # set up after the server began to stop: nothing will be read
            self.dead = True
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        # Python 3.10's TLS transport counts as unclosed (a ResourceWarning) until close() is called.
        self.transport.close()
        self.transport = None
        self.pending.clear()
        self.backlog = b""
        self.held = None
        self.out.clear()
        self.out_size = 0
        if self.task is not None:
            self.task.cancel()
        if self.owned is not None:
            self.owned.stop()  # (closes the body's file once no pool thread sends from it)
            self.owned = None
        for r in (self.receiving, self.landing):
            if r is not None:
                r.drop()  # (nothing stays: its temporary file goes)
        self.receiving = self.landing = None
        if isinstance(self.outlet, Outlet):
            self.outlet.close()
        self.engine.lost(self)

    def eof_received(self) -> bool | None:
        """The client's end of stream (a half-close: ``nc``, health checks; over TLS its
        ``close_notify``). What it sent before and is still to be answered (a read held for a
        turn, a backlog, requests waiting, a body in flight) is answered first, then the
        connection closes, as nginx does; with nothing to answer it closes now."""
        if self.held is None and not self.backlog and not self.pending and not self.busy:
            return None
        self.ended = True
        return True

    def pause_writing(self) -> None:
        # The client reads slower than we answer: no more answers until it catches up (requests
        # parsed meanwhile wait in pending, and past MAX_PENDING reading pauses too).
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.since = self.engine.now  # progress
        self.budget = TURN_BUDGET
        self._resume()

    def data_received(self, data: bytes) -> None:
        if self.dead:
            return
        if self.discard:  # the rest of a body that failed half-way into its file: dropped
            n = min(self.discard, len(data))
            self.discard -= n
            if n == len(data):
                return
            data = data[n:]
        if self.engine.spent() and not self.busy and not self.write_paused:
            self._hold(data)
            return
        self._receive(data)

    def _hold(self, data: bytes) -> None:
        """The loop's time for answering in this iteration is spent: *data* waits for this
        connection's turn in a following one (``Engine.wait_turn``). A lone read of up to a slice
        is held as it came (its turn takes the common path, heads memo included); any other joins
        the backlog, which pauses reading. Reading goes on while a read is held (pausing and
        resuming would cost two ``epoll_ctl`` per request when the loop is saturated): an end of
        stream read meanwhile waits for the answer (``eof_received``)."""
        if not self.in_request:  # (a head's later bytes do not restart its header timeout)
            self.since = self.engine.now
        held = self.held
        if held is None and not self.backlog and not self.pending and len(data) <= PARSE_SLICE:
            self.held = data
        else:  # (the transport delivered once more after the pause, or a large read)
            self.held = None
            self._to_backlog(data if held is None else held + data)
            self._update_reading()
        if not self.scheduled:
            self.scheduled = True
            self.engine.wait_turn(self)

    def _to_backlog(self, data: bytes) -> None:
        """Append *data* to what is still unparsed of the backlog (reading was paused, but a
        transport may still deliver once more)."""
        if self.backlog_at < len(self.backlog):
            self.backlog = self.backlog[self.backlog_at :] + data
        else:
            self.backlog = data
        self.backlog_at = 0

    def _receive(self, data: bytes) -> None:
        self.budget = TURN_BUDGET
        if self.held is not None:  # (a read held for a turn comes first)
            data, self.held = self.held + data, None
        if self.backlog or len(data) > PARSE_SLICE or self.pending or self.busy or self.write_paused:
            self._to_backlog(data)
            self._resume()
            return
        # The common case, a read of one request or a few while nothing waits: parsed at once
        # (a slice's worth: at most a few hundred requests), answered within the turn's budget.
        # A read that is exactly a request head parsed before is not parsed again (``heads``).
        if self.in_request:
            self._feed(data)
        else:
            engine = self.engine
            head = engine.heads.get(data)
            if head is not None:
                self.since = engine.now
                self.budget -= 1
                # (a plain GET with no access log: answered with no request object if memoised)
                method, url, mode, log, guard = head
                if (
                    guard is not None
                    or method != _GET
                    or log is not None
                    or not self._known(None, url, mode, True)
                ):
                    exchange = Exchange(method, url, mode, None, log)
                    exchange.auth = exchange.guarded = guard
                    self._respond(exchange)
            else:
                self.completed = 0
                self._feed(data)
                parsed, self.parsed = self.parsed, None
                if (
                    self.completed == 1
                    and parsed is not None
                    and parsed.auth is None  # (allowed by now, if a gate had to)
                    and not self.in_request
                    and not self.dead
                ):
                    engine.learn(data, parsed)
        if self.out:
            self._flush()
        if self.pending or self.backlog:
            if not self.busy and not self.write_paused:
                self._next_turn()  # (the budget ran out)
        elif (self.dead or self.ended) and not self.busy:
            self._close()

    def _parse(self) -> None:
        """Feed the parser the backlog, a slice at a time, until it is done or MAX_PENDING requests
        wait (the rest stays in the backlog, with reading paused)."""
        data, at, size = self.backlog, self.backlog_at, len(self.backlog)
        if at == 0 and size <= PARSE_SLICE:
            self.backlog = b""
            self._feed(data)
            return
        pending = self.pending
        while at < size and not self.dead and len(pending) < MAX_PENDING:
            end = min(at + PARSE_SLICE, size)
            self._feed(memoryview(data)[at:end])
            at = end
        if at >= size or self.dead:
            self.backlog, self.backlog_at = b"", 0
        else:
            self.backlog_at = at

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            stop = exc.__context__
            if not isinstance(stop, _Stop):
                raise
            self._fail(stop.status, stop.extra)
        except httptools.HttpParserUpgrade:
            self.dead = True  # the upgrade request was answered; what follows is not HTTP
        except httptools.HttpParserError:
            self._fail(400)
        if self.in_head:
            # A field httptools is still collecting reaches on_header only when complete: bound
            # what it may buffer meanwhile (to the limits plus the read that began the request).
            self.partial += len(data)
            if self.partial > self.max_head + self.max_url + _READ_ALLOWANCE:
                self._fail(431)

    # -- parser callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_head = self.in_request = self.plain = True
        self.since = self.engine.now
        self.head_size = self.partial = 0

    def on_url(self, url: bytes) -> None:
        url = self.url + url
        if len(url) > self.max_url:
            raise _Stop(414)
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        field = len(name) + len(value)
        size = self.head_size + field + 4
        if size > self.max_head or field > self.max_url:  # each field as the request line (nginx)
            raise _Stop(431)
        self.head_size = size
        kind = self.wanted.get(name.lower())
        if kind is None:
            return
        if kind == HOST:
            self.hosts += 1
            if self.host is None:
                self.host = value
        elif kind == TE:
            self.te = value if self.te is None else self.te + b"," + value
        elif kind in (CORE, ACCEPT):
            if kind == ACCEPT and not accept_matters(value):
                return
            if self.fields is None:
                self.fields = [(name, value)]
            else:
                self.fields.append((name, value))
        elif kind == EXPECT:
            self.expect = value
        elif kind == REFERER:
            self.referer = value
        elif kind == AUTH:  # (twice: neither counts, as nginx refuses a second one)
            self.authorization = value if self.authorization is None else b""
        elif kind == LENGTH:
            self.length = value
        elif kind == CTYPE:
            self.ctype = value
        elif kind == ORIGIN:  # (twice: as a cross-site one)
            self.origin = value if self.origin is None else b"null"
        elif kind == FETCH_SITE:
            self.fetch_site = value if self.fetch_site is None else b"cross-site"
        elif kind == XFF:
            self.xff = value if self.xff is None else self.xff + b"," + value
        elif kind == AGENT:
            self.agent = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        hosts, self.hosts = self.hosts, 0
        host, self.host = self.host, None
        engine = self.engine
        if self.xff is not None:
            assert engine.trusted is not None
            self.client = engine.trusted.client(self.xff)
            self.xff = None
        else:
            self.client = None
        te, self.te = self.te, None
        version = self.version = self.parser.get_http_version()
        if version != "1.1" and version != "1.0" and version[:2] != "1.":
            raise _Stop(505)  # HTTP/2.0 (or 0.9) in a request line: this is an HTTP/1.x server (nginx)
        if hosts != 1 and (hosts or version == "1.1"):
            raise _Stop(400)  # RFC 9112 3.2: HTTP/1.1 needs one Host; no request may have two
        if engine.hosts is not None and not engine.hosts.allows(host):
            raise _Stop(421)  # a name this server does not go by: DNS rebinding (_rules.HostRule)
        if te is not None:
            self.plain = False
            if version == "1.0":
                raise _Stop(400)  # RFC 9112 6.1: chunked framing in HTTP/1.0 is not to be trusted
            if te.strip().lower() != b"chunked":
                raise _Stop(501)  # "identity, chunked", "gzip, chunked": codings we do not have (nginx)
        if self.expect is not None:
            self.plain = False
            expect, self.expect = self.expect, None
            self._expect(expect)
        length, self.length = self.length, None
        ctype, self.ctype = self.ctype, None
        origin, self.origin = self.origin, None
        fetch_site, self.fetch_site = self.fetch_site, None
        if engine.uploads is not None and self.parser.get_method() in _UPLOADS:
            if not same_origin(origin, fetch_site, host):
                raise _Stop(403)  # another site's page writing here (_rules.same_origin)
            self._begin_upload(length, ctype)

    def on_message_complete(self) -> None:
        self.in_request = False
        if self.dead:  # an answer already said this connection closes: the rest is not read
            return
        parser = self.parser
        url, self.url = self.url, b""
        fields, self.fields = self.fields, None
        if parser.should_keep_alive():
            mode = KEEP11 if self.version == "1.1" else KEEP10
        else:
            mode = CLOSE
            self.dead = True  # nothing after this request is read
        log = None
        if self.engine.log is not None:
            log = (self.version, self.referer, self.agent)
            self.referer = self.agent = None
        method = parser.get_method()
        exchange = Exchange(method, url, mode, fields, log)
        self.completed += 1
        receiving = self.receiving
        if receiving is not None:  # a PUT's body is all there: it lands, then the answer
            self._upload_complete(receiving, exchange)
            return
        gate = self.engine.gate
        if gate is not None:  # (judged when answered: after the guesses before it; memoised once allowed)
            value, self.authorization = self.authorization, None
            client, self.client = self.client, None
            if not (gate.public_read and method in _GET_HEAD):
                exchange.auth = exchange.guarded = (value, client)
        self.parsed = (
            exchange if fields is None and mode != CLOSE and self.plain and method in _GET_HEAD else None
        )
        if self.busy or self.pending or self.write_paused or self.budget <= 0:
            self.pending.append(exchange)
            if len(self.pending) >= MAX_PENDING:
                self._update_reading()
            return
        self.budget -= 1
        self._respond(exchange)

    # -- answering --------------------------------------------------------------------------

    def _respond(self, exchange: Exchange) -> None:
        if exchange.auth is not None and not self._authorize(exchange):
            return
        method = exchange.method
        if (
            exchange.fields is None
            and method in _GET_HEAD
            and self._known(exchange, exchange.url, exchange.mode, method == _GET)
        ):
            return
        self._decide(exchange)

    def _key_of(self, client: str | None) -> str:
        """What the gate counts a request's failures against: its connection's client, or the
        client a trusted proxy names."""
        return address_key(client) if client is not None and self.proxied else self.key

    def _authorize(self, exchange: Exchange) -> bool:
        """Whether *exchange*'s credentials let it be answered now, judged as it is answered (after the
        answers before it, their failures counted). False: it is refused (401, 429, 503), or its
        password is checked in the gate's thread (reading paused meanwhile, what follows waits)
        and it goes on from there."""
        gate = self.engine.gate
        assert gate is not None
        assert exchange.auth is not None
        value, client = exchange.auth
        verdict = gate.judge(exchange.method, value, self._key_of(client))
        if not isinstance(verdict, float):  # (its password is checked in the gate's thread)
            self.busy = True
            self._update_reading()
            verdict.add_done_callback(functools.partial(self._on_loop, self._authorized, exchange))
            return False
        if verdict != ALLOWED:
            self._refuse(exchange, verdict)
            return False
        exchange.auth = None
        return True

    def _on_loop(self, then: Any, *args: Any) -> None:
        """(In a pool thread, or the gate's.) Hand a job's end to the loop: ``then(*args, job)``
        (unless the loop is gone)."""
        with contextlib.suppress(RuntimeError):
            self.engine.loop.call_soon_threadsafe(then, *args)

    def _authorized(self, exchange: Exchange, job: concurrent.futures.Future[float]) -> None:
        self.busy = False
        self.budget = TURN_BUDGET
        if self.transport is None:
            return
        verdict = _verdict(job)
        if verdict == ALLOWED:
            exchange.auth = None
            self._respond(exchange)
        else:
            self._refuse(exchange, verdict)
        self._resume()

    # -- uploads (PUT, with uploads on: see _upload) -------------------------------------------------

    def on_body(self, body: bytes) -> None:
        r = self.receiving
        if r is None:
            return  # (a GET's body, or a refused method's: read and dropped)
        r.got += len(body)
        self.since = self.engine.now  # progress: a body that stops is cut at header_timeout
        if r.refused is not None:
            return  # (dropped: see _upload_refused)
        limit = self.engine.uploads.max_size  # type: ignore[union-attr]
        if limit is not None and r.got > limit:  # (a chunked body: its length comes as it goes)
            self._abort_upload(r.refuse(413))
            raise _Stop(413)
        r.chunks.append(body)
        r.buffered += len(body)
        if r.full():
            self._update_reading()
        self._upload_pump(r)

    def _begin_upload(self, length: bytes | None, ctype: bytes | None) -> None:
        """A PUT (or form POST) head is complete: refuse it now (the size it announces, its
        credentials, where it goes) or find its place in the pool (after checking a hashed
        password in the gate's thread); its body waits in memory meanwhile (``_upload.BUFFER``:
        reading pauses above). Its answer comes once the file has its name (``landing``):
        requests read behind it wait."""
        engine = self.engine
        uploads = engine.uploads
        assert uploads is not None
        method = self.parser.get_method()
        if self.busy or self.pending or self.landing is not None:
            # Pipelined behind answers not given yet: those are given, then the connection closes
            # without reading this one (a client retries an unanswered PUT: it is idempotent).
            raise _Stop(None)
        size = None
        if length is not None:
            try:
                size = int(length)
            except ValueError:  # (httptools frames the body by it: this is only a second look)
                raise _Stop(400) from None
        if size is not None and uploads.max_size is not None and size > uploads.max_size:
            raise _Stop(413)  # (before the body is read; no 100 Continue)
        verdict: concurrent.futures.Future[float] | float = ALLOWED
        gate = engine.gate
        if gate is not None:
            value, self.authorization = self.authorization, None
            verdict = gate.judge(method, value, self._key_of(self.client))
            if isinstance(verdict, float) and verdict != ALLOWED:
                status, extra = _refusal(verdict)
                raise _Stop(status, *extra)
        split = _split_target(self.url)
        if split is None:
            raise _Stop(400)
        raw_path = split[0]
        upload: Upload | FormUpload
        try:
            if method == b"PUT":
                upload = Upload(upload_target(raw_path, engine.policy), engine.policy, uploads.overwrite)
            else:
                from ._form import FormUpload, form_boundary  # (python-multipart: with uploads only)

                boundary = form_boundary(ctype)
                if boundary is None:
                    raise _Stop(415)  # (a form of files only: multipart/form-data)
                directory = upload_directory(raw_path, engine.policy)
                upload = FormUpload(directory, engine.policy, uploads.overwrite, boundary, _back_to(raw_path))
        except UploadRefused as exc:
            raise _Stop(exc.status) from None
        keep = self.parser.should_keep_alive()
        mode = (KEEP11 if self.version == "1.1" else KEEP10) if keep else CLOSE
        log = (self.version, self.referer, self.agent) if engine.log is not None else None
        r = self.receiving = Receiving(upload, size, mode, log)
        if self._splice_may(r):  # no more reads through the transport: what follows this read is spliced
            r.zero_copy = self.splicing = True
            self._update_reading()
        if not isinstance(verdict, float):  # (its password is checked in the gate's thread first)
            verdict.add_done_callback(functools.partial(self._on_loop, self._upload_verified, r))
        else:
            self._upload_open(r)

    def _upload_verified(self, r: Receiving, job: concurrent.futures.Future[float]) -> None:
        verdict = _verdict(job)
        if self.transport is None or r.refused is not None:
            return
        if verdict != ALLOWED:
            status, extra = _refusal(verdict)
            self._upload_refused(r, status, *extra)
            return
        self._upload_open(r)

    def _upload_open(self, r: Receiving) -> None:
        assert r.upload is not None
        r.working = True
        job = self.engine.executor.submit(r.upload.open)
        job.add_done_callback(functools.partial(self._on_loop, self._upload_opened, r))

    def _upload_opened(self, r: Receiving, job: concurrent.futures.Future[None]) -> None:
        r.working = False
        if self._upload_gone(r):  # (whatever open made is aborted)
            return
        exc = _failure(job)
        if exc is not None:
            self._abort_upload(r.upload)
            r.upload = None
            self._upload_refused(r, status_of(exc))
            return
        r.opened = True
        if self.continue_owed:
            self.continue_owed = False
            self._put(_CONTINUE)
            self._flush()
        self._upload_pump(r)

    def _upload_pump(self, r: Receiving) -> None:
        """Write what waits (one write at a time, in order); once the body is all written, give
        the file its name."""
        if r.working or not r.opened or r.refused is not None or r.upload is None:
            return
        pool = self.engine.executor
        if r.chunks:
            data = r.chunks[0] if len(r.chunks) == 1 else b"".join(r.chunks)
            r.chunks.clear()
            r.working = True
            job = pool.submit(r.upload.write, data)
            job.add_done_callback(functools.partial(self._on_loop, self._upload_written, r, len(data)))
        elif r.done is None and r.zero_copy and self.held is None and self.backlog_at >= len(self.backlog):
            self._upload_splice(r)
        elif r.done is not None:
            r.working = True
            landed = pool.submit(r.upload.commit, r.got)
            landed.add_done_callback(functools.partial(self._on_loop, self._upload_committed, r))

    def _splice_may(self, r: Receiving) -> bool:
        """Whether *r*'s body (but what came with its head) may go zero-copy: announced, large, on
        a socket the kernel splices from."""
        return (
            r.length is not None
            and r.length >= SPLICE_AT
            and r.upload is not None
            and r.upload.zero_copy
            and _platform.HAS_SPLICE
            and type(self.transport) is not TLSTransport
            and self.transport.get_extra_info("socket") is not None
            and not self.transport.is_closing()
        )

    def _upload_splice(self, r: Receiving) -> None:
        """The rest of *r*'s body, socket → pipe → file (``splice_to_file``, as ``recvfile``), with
        the transport's reading paused; then the request ends as the parser would end it."""
        upload = r.upload
        assert isinstance(upload, Upload)
        assert r.length is not None
        r.working = True
        engine = self.engine
        sink = FileSink(
            None, upload.fd, upload.written, r.length - r.got, engine.executor, self._upload_progress
        )
        sock_fd = self.transport.get_extra_info("socket").fileno()
        task = self._start(splice_to_file(sock_fd, sink, None))
        task.add_done_callback(functools.partial(self._upload_spliced, r, sink))

    def _upload_progress(self, _got: int, _total: int) -> None:
        self.since = self.engine.now

    def _upload_spliced(self, r: Receiving, sink: FileSink, task: asyncio.Task[None]) -> None:
        r.working = False
        self.splicing = False
        if self.task is task:
            self.task = None
        # (the bytes that left the socket, landed or not: the next request starts after them)
        r.got += sink.taken
        if isinstance(r.upload, Upload):
            r.upload.written += sink.received
        if self._upload_gone(r):
            return
        exc = task.exception() if not task.cancelled() else ConnectionError("cancelled")
        if exc is not None and isinstance(exc, (EOFError, ConnectionError)):  # the client left mid-body
            self._abort_upload(r.refuse(400))
            self.receiving = None
            self.dead = True
            self.transport.abort()
            return
        # The request ends here, not in the parser (which saw its head and part of its body
        # only): a new parser reads what comes after the body.
        self.parser = httptools.HttpRequestParser(self)
        self.in_request = self.in_head = False
        url, self.url = self.url, b""
        self.fields = self.referer = self.agent = None
        self.authorization = None
        exchange = Exchange(b"PUT", url, r.mode, None, r.log)  # type: ignore[arg-type]
        self.completed += 1
        if exc is not None:  # the file failed (a full disk: 507): the rest of the body is dropped
            status = status_of(exc)
            self._abort_upload(r.refuse(status))
            self.receiving = None
            assert r.length is not None
            self.discard = r.length - r.got
            if self.discard > DISCARD_MAX:
                self.dead = True  # (answered now, and closed)
            self._render(exchange, error(status, "PUT"))
            if self.out:
                self._flush()
            self._update_reading()
            return
        if r.mode == CLOSE:
            self.dead = True
        self._upload_complete(r, exchange)
        self._update_reading()

    def _upload_written(self, r: Receiving, n: int, job: concurrent.futures.Future[None]) -> None:
        r.working = False
        if self._upload_gone(r):
            return
        exc = _failure(job)
        if exc is not None:
            self._upload_refused(r, status_of(exc))
            return
        r.buffered -= n
        self._update_reading()
        self._upload_pump(r)

    def _upload_committed(self, r: Receiving, job: concurrent.futures.Future[Any]) -> None:
        r.working = False
        upload, r.upload = r.upload, None
        exc = _failure(job)
        if exc is not None:
            self._abort_upload(upload)  # (a hidden temporary file left by a failed link)
        if self.transport is None:
            return
        exchange = r.done
        assert isinstance(exchange, Exchange)
        self.landing = None
        self.busy = False
        self.budget = TURN_BUDGET
        if exc is not None:
            self._render(exchange, error(status_of(exc), "PUT"))
        else:
            assert upload is not None
            status, extra = upload.answer(job.result())
            self._render(exchange, Answer(204, [], None) if status == 204 else error(status, "PUT", *extra))
        self._resume()

    def _upload_complete(self, r: Receiving, exchange: Exchange) -> None:
        """(on_message_complete of a PUT.) The body is all there: answer a refusal now, else the
        answer comes once the file has its name; requests behind it wait."""
        r.done = exchange
        self.receiving = None
        self.splicing = False  # (all of it came with the head: nothing to splice)
        if r.refused is not None:
            status, extra = r.refused
            if self.busy or self.pending or self.write_paused:
                self.pending.append(
                    error_response(status, self.engine.clock, mode=exchange.mode, extra=extra)
                )
            else:
                self._render(exchange, error(status, "PUT", *extra))
            return
        self.landing = r
        self.busy = True
        self._update_reading()
        self._upload_pump(r)

    def _upload_refused(self, r: Receiving, status: int, *extra: tuple[str, str], now: bool = False) -> None:
        """Refused before its body is all there: what came is dropped, and the answer waits for
        the rest (read and dropped, so that the client reads the answer, not a reset), unless
        the client waits for 100 Continue, more than ``DISCARD_MAX`` is to come, or *now*: then
        now, and the connection closes."""
        self._abort_upload(r.refuse(status, *extra))
        self.continue_owed, owed = False, self.continue_owed
        self.splicing = False  # (what is still to come is read and dropped, or the connection closes)
        if r.done is not None:
            exchange = r.done
            assert isinstance(exchange, Exchange)
            self.landing = None
            self.busy = False
            self._render(exchange, error(status, "PUT", *extra))
            self._resume()
            return
        to_come = None if r.length is None else r.length - r.got
        if now or owed or to_come is None or to_come > DISCARD_MAX:
            self.receiving = None
            self._fail(status, extra)
            if self.out:
                self._flush()
            if not self.busy:
                self._close()
            return
        self._update_reading()

    def _upload_gone(self, r: Receiving) -> bool:
        """Whether *r* is over for this connection (the connection is gone, or *r* was refused
        meanwhile): then its upload is aborted here (``Receiving.refuse`` and ``drop`` leave that
        to the job that was in the pool)."""
        if self.transport is None or r.refused is not None:
            self._abort_upload(r.upload)
            r.upload = None
            return True
        return False

    def _abort_upload(self, upload: Upload | FormUpload | None) -> None:
        if upload is not None:
            self.engine.executor.submit(upload.abort)

    def _refuse(self, exchange: Exchange, verdict: float) -> None:
        """Answer *exchange* as the gate's *verdict* says (``_refusal``; kept alive: a browser asks again
        on the same connection)."""
        status, extra = _refusal(verdict)
        self._render(exchange, error(status, exchange.method.decode("latin-1"), *extra))

    def _known(self, exchange: Exchange | None, url: bytes, mode: int, get: bool) -> bool:
        """Answer a plain GET (*get*) or HEAD of *url* if its path is memoised: a hot file's bytes
        (or its head alone) once a ``stat`` shows the path still names it, else (GET) sent from
        its file. *exchange* is the request if one was made (its log fields); None for a head read from
        the heads memo. False: not memoised, or the path no longer names the memo's file (the
        memo is forgotten); the request is to be decided."""
        engine = self.engine
        q = url.find(b"?")
        key = url if q < 0 else url[:q]
        known = engine.answers.get(key)
        if known is None:
            return False
        ident, path, head, small = known
        head += engine.clock.tails[mode]
        body = None
        if get:
            body = hot_files.body(path, engine.cache_root, ident) if small else None
            if body is None:  # sent from the file (or read into the hot-file cache again)
                if self._send_known(exchange, url, mode, ident, path, head, small):
                    return True
                engine.forget(key)
                return False
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is None or identity(st) != ident:
            engine.forget(key)
            return False
        data = head + body if body is not None else head
        self.out.append(data)  # (_put, inline: the hot path)
        self.out_size += len(data)
        if self.out_size >= FLUSH_AT:
            self._flush()
        if exchange is not None and exchange.log is not None:
            self._log(exchange, len(body) if body is not None else 0)
        return True

    def _send_known(
        self,
        exchange: Exchange | None,
        url: bytes,
        mode: int,
        ident: tuple[int, ...],
        path: str,
        head: bytes,
        small: bool,
    ) -> bool:
        """GET of a memoised file whose bytes are not in memory: open it again, check by ``fstat``
        it is the file the memo describes, and send it (:meth:`_send_whole`). A *small* one is
        read with one ``RWF_NOWAIT`` read (its probe) if the hot-file cache admits it (then kept
        there) or it is at most ``READ_MAX`` bytes: its pages cached, it is written with its head
        (a working set larger than the cache is sent from its files, not copied in and evicted);
        cold, its transfer waits for them at once. False: it is not that file (nothing was sent)."""
        opened = reopen(path, ident)
        if opened is None:
            return False  # replaced, renamed over, grown, truncated, chmod'ed: another answer
        fd, st = opened
        size = st.st_size
        warm_to = 0  # (the transfer's: size, probed warm; PROBED_COLD; 0, not probed)
        if small:
            body = read_back(fd, st, path, self.engine.cache_root, READ_MAX)
            if body is False:
                warm_to = PROBED_COLD
            elif body is not None:
                self._put(head + body)
                if exchange is not None and exchange.log is not None:
                    self._log(exchange, size)
                return True
        self._send_whole(exchange, url, mode, fd, size, head, warm_to)
        return True

    def _send_whole(
        self, exchange: Exchange | None, url: bytes, mode: int, fd: int, size: int, head: bytes, warm_to: int
    ) -> None:
        """GET of a whole file from *fd* (ours: closed here, or by the transfer) after *head*: a
        memoised one, or a first sight (the core's plain 200). *warm_to*: 0 if its pages were not
        probed yet, PROBED_COLD if they were and are not all cached.
        A file of one chunk, on a connection whose outlet exists and whose transport holds
        nothing, goes straight: the head and the file sent here if its pages are cached and the
        socket takes them, with no answer or transfer object (the common case, as the public
        call's straight line); whatever is left (a full socket, cold pages, an error) goes on as
        a transfer from where this stopped. The request object *exchange* is made only when a transfer
        or the access log needs it."""
        position = 0
        rest = head
        outlet = self.outlet
        if type(outlet) is Outlet and size <= MAX_CHUNK and not self.out and warm_to != PROBED_COLD:
            transport = self.transport
            if not transport.get_write_buffer_size() and not transport.is_closing():
                try:
                    if _outlet._is_cold(fd, 0, size, DEFAULT_OPTIONS):
                        warm_to = PROBED_COLD  # (the transfer waits for its pages at once)
                    else:
                        warm_to = size
                        rest = head[outlet.sock.send(head, outlet.flags) :]
                        if not rest:
                            position = _outlet.sendfile_once(outlet.fd, fd, 0, size)
                except OSError:  # (BlockingIOError: the socket is full) the transfer goes on from here
                    pass
                if position == size:
                    os.close(fd)
                    self.since = self.engine.now
                    if exchange is not None and exchange.log is not None:
                        self._log(exchange, size)
                    return
        if exchange is None:
            exchange = Exchange(_GET, url, mode, None, None)
        body_range = FileRange(fd, position, size - position)
        ans = Answer(200, [], size, body=body_range, fd=fd, close=os.close)
        self._send_body(exchange, ans, body_range, rest, position, warm_to)

    def _decide(self, exchange: Exchange) -> None:
        """Any request but a memoised hot one: through the core, inline or in the cold pool."""
        method = exchange.method
        target = _split_target(exchange.url)
        if target is not None:
            raw, query = target
        elif method in _GET_HEAD:  # "*", authority-form: nothing a file could be
            self._error(exchange, 400)
            return
        else:  # OPTIONS *, CONNECT host:port: the core refuses the method (405) before the path
            raw, query = b"/", b""
        fields = exchange.fields
        request = exchange.request = Request(
            method.decode("latin-1"), raw, query, BytesHeaders(fields) if fields else EMPTY
        )
        exchange.raw = raw
        engine = self.engine
        policy = engine.policy
        path = route(request, policy)
        opened = None
        if isinstance(path, str):
            # Looked up and opened at once where no disk is read (the decision skips its own
            # stat, open and containment check); a lookup that would read it goes to the pool,
            # unless the path was decided a moment ago.
            found = open_cached(path)
            if type(found) is tuple:
                opened = found
            elif not engine.seen(raw) and (found is False or (found is None and not _looked_up(path))):
                self._to_pool(exchange, first=True)
                return
        try:
            ans = path if isinstance(path, Answer) else decide(request, path, policy, opened=opened)
        except DecideInPool:  # a directory listing to build: in the pool, as a first sight
            self._to_pool(exchange, first=True)
            return
        except Exception as exc:
            self._crashed(exchange, exc)
            return
        self._render(exchange, ans)

    def _to_pool(self, exchange: Exchange, *, first: bool) -> None:
        """One hop to the cold pool and back. At a *first* sight the thread only looks the path up
        (``_look``: a ``stat``, which brings its metadata into the kernel's caches; the GIL is
        free meanwhile) and the loop then decides inline, so no decision's Python runs in a
        thread, contending for the GIL with the loop. Otherwise (a listing to build) the thread
        decides with ``POOL_FS``."""
        self.busy = True
        self._update_reading()
        engine = self.engine
        # No task: the pool thread's done callback schedules _cold_done on the loop (one hop back).
        job: concurrent.futures.Future[Answer | None]
        request = exchange.request
        if first:
            job = engine.executor.submit(_look, request, engine.policy)
        else:
            job = engine.executor.submit(answer, request, engine.policy, POOL_FS)
        job.add_done_callback(functools.partial(self._cold_arrived, exchange))

    def _cold_arrived(self, exchange: Exchange, job: concurrent.futures.Future[Answer | None]) -> None:
        """(In the pool thread.) Hand the cold decision to the loop, or close it if the loop is gone."""
        try:
            self.engine.loop.call_soon_threadsafe(self._cold_done, exchange, job)
        except RuntimeError:  # the loop is closed: nobody will send the answer
            if not job.cancelled() and job.exception() is None:
                ans = job.result()
                if ans is not None:
                    ans.close()

    def _cold_done(self, exchange: Exchange, job: concurrent.futures.Future[Answer | None]) -> None:
        """A cold decision is back on the loop: render it (or close it if the connection is gone)."""
        self.busy = False
        self.budget = TURN_BUDGET
        exc = job.exception() if not job.cancelled() else RuntimeError("the cold pool cancelled a decision")
        if exc is not None:
            if not isinstance(exc, Exception):
                raise exc
            self._crashed(exchange, exc)
            self._resume()
            return
        ans = job.result()
        engine = self.engine
        engine.saw(exchange.raw)
        if ans is None:  # looked up: decide now, inline
            if self.transport is None:
                return
            request = exchange.request
            try:
                ans = _decided_inline(request, engine.policy)
            except DecideInPool:  # a directory listing to build: in the pool after all
                self._to_pool(exchange, first=False)
                return
            except Exception as error:
                self._crashed(exchange, error)
                self._resume()
                return
        if self.transport is None:
            ans.close()
            return
        self._render(exchange, ans)
        self._resume()

    def _render(self, exchange: Exchange, ans: Answer) -> None:
        """Write *ans* (or start sending it); it is closed once sent."""
        engine = self.engine
        body = ans.body
        exchange.status = ans.status
        decided = ans.decided
        if decided is not None and exchange.fields is None:  # a plain 200 of a whole file: kept
            head = decided.head
            if head is None or engine.sandbox:  # (under --upload: rendered here, kept in the engine's memo)
                head = head_of(ans, engine.sandbox)
                if not engine.sandbox:
                    decided.head = head
            engine.remember(exchange.raw, decided, head)
            fd = ans.fd
            if fd is not None and exchange.method == _GET and isinstance(body, FileRange):
                # A first sight of a file sent from its descriptor: as a memoised one is sent,
                # the head and the file straight where the socket takes them (a small one read
                # and written from memory, its read the probe), else as a transfer.
                ans.fd = None  # (ours now: the answer closes nothing)
                head += engine.clock.tails[exchange.mode]
                size = decided.size
                if size <= READ_MAX:
                    try:
                        read = _platform.read_nowait(fd, size, 0, decided.identity[0])
                    except OSError:  # (EIO...: the transfer meets it again, and aborts)
                        read = None
                    if type(read) is bytearray and len(read) == size:
                        os.close(fd)
                        self._put(head + read)
                        if exchange.log is not None:
                            self._log(exchange, size)
                        return
                    self._send_whole(
                        exchange,
                        exchange.url,
                        exchange.mode,
                        fd,
                        size,
                        head,
                        PROBED_COLD if read is False else 0,
                    )
                    return
                self._send_whole(exchange, exchange.url, exchange.mode, fd, size, head, 0)
                return
        else:
            head = head_of(ans, self.engine.sandbox)
        head += engine.clock.tails[exchange.mode]
        if ans.head_only or body is None:
            ans.close()
            self._put(head)
            sent = 0
        elif isinstance(body, bytes):
            ans.close()
            self._put(head + body)
            sent = len(body)
        elif isinstance(body, Multipart) and isinstance(body.source, bytes):
            ans.close()
            source = body.source
            chunks = [head]
            for part_head, r in body.parts:
                chunks += (part_head, source[r.start : r.stop])
            chunks.append(body.closing)
            self._put(b"".join(chunks))
            sent = sum(r.length for _, r in body.parts)
        else:
            self._send_body(exchange, ans, body, head)
            return
        if exchange.log is not None:
            self._log(exchange, sent)

    def _send_body(
        self,
        exchange: Exchange,
        ans: Answer,
        body: FileRange | Multipart,
        head: bytes,
        sent: int = 0,
        warm_to: int = 0,
    ) -> None:
        """Send a file body after *head*: on the connection's outlet where it can, else through the
        public ``sendfile`` in a task. *ans* is closed once it is sent (or the connection is gone)."""
        if self.out:
            self._flush()
        self.busy = True
        if self.transport.is_closing():  # the peer is gone (its reset seen; connection_lost not run yet)
            ans.close()
            self.dead = True
            self.transport.abort()
            return
        if type(self.transport) is TLSTransport:
            self._own_tls(exchange, ans, body, head, sent)
            return
        if isinstance(body, FileRange) and self._own(exchange, ans, body, head, sent, warm_to):
            return
        self._update_reading()
        task = self._start(self._send(exchange, ans, head, sent))
        task.add_done_callback(lambda _: ans.close())  # also if cancelled before it ran

    def _own(
        self, exchange: Exchange, ans: Answer, body: FileRange, head: bytes, sent: int = 0, warm_to: int = 0
    ) -> bool:
        """Send *body* after *head* on the connection's outlet (see ``_outlet``); False where the
        public path must do it (TLS, an unknown transport, answers still in the transport's buffer).
        The answer is closed once the body is sent, or the connection is gone."""
        outlet = self.outlet
        if outlet is None:
            try:
                outlet = self.outlet = Outlet.of(self.transport, self.engine.loop) or False
            except OSError:  # no descriptor for the duplicate (EMFILE): the public path, this time
                return False
        if outlet is False or self.transport.get_write_buffer_size():
            return False
        assert isinstance(outlet, Outlet)

        def done(sent: int, exc: Exception | None) -> None:
            self._owned_done(exchange, sent, exc)

        transfer = Transfer(
            outlet,
            head,
            body.fd,
            body.start,
            body.length,
            done,
            self._progress,
            ans.close,
            sent,
            warm_to,
            self.engine,
        )
        self._run_owned(transfer)
        return True

    def _own_tls(
        self, exchange: Exchange, ans: Answer, body: FileRange | Multipart, head: bytes, sent: int = 0
    ) -> None:
        """Send *body* after *head* on the connection's own TLS transport (``_tls_body.TLSBody``).
        The answer is closed once the body is sent, or the connection is gone."""
        if isinstance(body, FileRange):
            fd, segments, closing = body.fd, [(head, body.start, body.length)], b""
        else:
            assert isinstance(body.source, int)
            fd, closing = body.source, body.closing
            segments = [(part_head, r.start, r.length) for part_head, r in body.parts]
            segments[0] = (head + segments[0][0], *segments[0][1:])

        def done(body_sent: int, exc: Exception | None) -> None:
            self._owned_done(exchange, sent + body_sent, exc)

        transport = self.transport
        assert isinstance(transport, TLSTransport)
        self._run_owned(TLSBody(transport, fd, segments, closing, done, self._progress, ans.close))

    def _run_owned(self, transfer: Transfer | TLSBody) -> None:
        """Start *transfer* (``_own``'s or ``_own_tls``'s) as this connection's body in flight."""
        self.owned = transfer
        self.sending = True
        self.since = self.engine.now
        self.starting = True
        try:
            transfer.run()
        finally:
            self.starting = False
        if self.owned is transfer:  # still going: from the loop (the socket was full, a read is cold)
            self._update_reading()

    def _owned_done(self, exchange: Exchange, sent: int, exc: Exception | None) -> None:
        """A file body on the outlet ended: whole (exc None), or the connection is aborted."""
        self.owned = None
        self.sending = False
        if exchange.log is not None:
            self._log(exchange, sent)
        transport = self.transport
        if exc is not None:
            self.dead = True
            if transport is not None:
                transport.abort()
            if not isinstance(exc, (OSError, EOFError)):  # the peer went away, the file shrank: no bug
                self._report(exc, "sending a file body failed")
            return
        self.busy = False
        self.since = self.engine.now
        if not self.starting:  # (else the caller's loop goes on with what waits)
            self.budget = TURN_BUDGET
            self._resume()

    async def _send(self, exchange: Exchange, ans: Answer, head: bytes, sent: int = 0) -> None:
        """Send a file body after its head; abort the connection if it cannot be sent whole.
        *sent*: file bytes already sent before *ans*'s range (for the access log)."""
        transport = self.transport
        body = ans.body
        self.sending = True
        self.since = self.engine.now
        try:
            if isinstance(body, FileRange):
                with io.FileIO(body.fd, "rb", closefd=False) as file:
                    if body.length:
                        sent = await sendfile(
                            transport, file, body.start, body.length, headers=head, on_progress=self._progress
                        )
                    else:
                        transport.write(head)
            else:
                assert isinstance(body, Multipart)
                assert isinstance(body.source, int)
                last = len(body.parts) - 1
                with io.FileIO(body.source, "rb", closefd=False) as file:
                    for i, (part_head, r) in enumerate(body.parts):
                        sent += await sendfile(
                            transport,
                            file,
                            r.start,
                            r.length,
                            headers=head + part_head if i == 0 else part_head,
                            trailers=body.closing if i == last else b"",
                            on_progress=self._progress,
                        )
        except (OSError, SendfileError):  # the peer went away, the file shrank
            self.task = None
            transport.abort()
            return
        except asyncio.CancelledError:  # the connection was lost
            transport.abort()
            raise
        except Exception as exc:  # a bug: abort (never a short body), and report it
            self.task = None
            closing = transport.is_closing()
            transport.abort()
            if not (closing and isinstance(exc, RuntimeError)):  # (else: the peer went meanwhile)
                self._report(exc, "sending a file body failed")
            return
        finally:
            self.sending = False
            if exchange.log is not None:
                self._log(exchange, sent)
        self.task = None
        self.busy = False
        self.since = self.engine.now
        self.budget = TURN_BUDGET
        self._resume()

    def _resume(self) -> None:
        """Answer what waits and parse what was read, within this turn's budget, while nothing is
        in flight and the client keeps up; then write, and read again, go on next turn, or close."""
        pending = self.pending
        while self.transport is not None and not self.busy and not self.write_paused and self.budget > 0:
            if pending:
                self.budget -= 1
                item = pending.popleft()
                if type(item) is bytes:
                    self._put(item)
                else:
                    self._respond(item)  # type: ignore[arg-type]
            elif self.backlog and not self.dead:
                self._parse()  # (answers within the budget as it parses; the rest waits in pending)
            else:
                break
        transport = self.transport
        if transport is None:
            return
        if self.out:
            self._flush()
        if self.busy:
            return
        if pending or (self.backlog and not self.dead):
            if not self.write_paused:  # the budget ran out: the rest next turn
                self._next_turn()
        elif self.dead or self.ended:
            self._close()
            return
        self._update_reading()

    def _next_turn(self) -> None:
        """Go on with what waits in the next turn of the loop (other connections' callbacks first)."""
        if not self.scheduled:
            self.scheduled = True
            self.engine.loop.call_soon(self._turn)

    def _turn(self) -> None:
        if self.engine.spent() and self.transport is not None:
            self.engine.wait_turn(self)  # (behind the connections already waiting; still scheduled)
            return
        self.take_turn()

    def take_turn(self) -> None:
        """Answer what waits, a turn's budget of it (the engine calls this for a waiting connection)."""
        self.scheduled = False
        held = self.held
        if held is not None:
            self.held = None
            if self.transport is not None and not self.dead:
                self._receive(held)  # (as data_received's: what pauses reading pauses it)
                return
        self.budget = TURN_BUDGET
        self._resume()

    def _start(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.task = task
        return task

    # -- expectations, errors, timeouts --------------------------------------------------------

    def _expect(self, value: bytes) -> None:
        parser = self.parser
        if parser.get_http_version() != "1.1":
            return  # HTTP/1.0 has no 100 (Continue); aiohttp ignores it too
        if value.strip().lower() != b"100-continue":
            raise _Stop(417)
        method = parser.get_method()
        if method in _GET_HEAD:
            self._emit(_CONTINUE)
            return
        if method in _UPLOADS and self.engine.uploads is not None:
            self.continue_owed = True  # (once authenticated, and the size and the place allow it)
            return
        # The final answer (405) now, without 100 (Continue): the body is not read, so close after.
        log = (parser.get_http_version(), self.referer, self.agent) if self.engine.log is not None else None
        self.dead = True
        exchange = Exchange(method, self.url, CLOSE, None, log)
        gate = self.engine.gate
        if gate is not None:  # (its credentials first, as for every answer: 401 before 405)
            exchange.auth = exchange.guarded = (self.authorization, self.client)
        if self.busy or self.pending:
            self.pending.append(exchange)
        else:
            self._respond(exchange)
        self.url = b""
        raise _Stop(None)

    def _emit(self, data: bytes) -> None:
        """Bytes answered in order: now if nothing is in flight, else after what waits."""
        if self.busy or self.pending or self.write_paused:
            self.pending.append(data)
        else:
            self._put(data)

    def _fail(self, status: int | None, extra: tuple[tuple[str, str], ...] = ()) -> None:
        """Stop reading; answer *status* (with the *extra* fields) after what is in hand, then close."""
        if self.dead:
            return
        self.dead = True
        self._update_reading()
        if status is not None:
            self._emit(error_response(status, self.engine.clock, extra=extra))
            if self.engine.log is not None:  # (a request the parser refused: no method, no target)
                unparsed = Exchange(b"", b"", CLOSE, None, ("", None, None))
                unparsed.status = status
                self._log(unparsed, 0)

    def _error(self, exchange: Exchange, status: int) -> None:
        """An error answer for a parsed request; the connection closes after it."""
        self.dead = True
        exchange.status = status
        self._put(error_response(status, self.engine.clock, body=exchange.method != _HEAD))
        if exchange.log is not None:
            self._log(exchange, 0)

    def _crashed(self, exchange: Exchange, exc: Exception) -> None:
        """The core raised: answer 500, close, and report it to the loop like any callback error."""
        self._error(exchange, 500)
        self._report(exc, "the static core failed")

    def _report(self, exc: Exception, message: str) -> None:
        asyncio.get_running_loop().call_exception_handler(
            {"message": message, "exception": exc, "protocol": self, "transport": self.transport}
        )

    def _progress(self, sent: int = 0, total: int | None = None) -> None:
        """A file body made progress (the public ``sendfile``'s ``on_progress``, or the outlet's)."""
        self.since = self.engine.now

    def expire(self, now: float, config: ServeConfig) -> None:
        """Close the connection if it has waited too long (called by the engine's timer).

        A client that stops reading is cut after ``send_timeout`` without progress (nginx's
        ``send_timeout``), whether a file body is in flight or answers wait in the transport's
        buffer (then progress is the buffer shrinking), also once the connection is closing: a
        closed connection's ``close()`` waits for its buffer, which such a client never empties.
        """
        transport = self.transport
        if transport is None:
            return
        if self.sending:
            if now - self.since > config.send_timeout:  # the client stopped reading (nginx's send_timeout)
                transport.abort()
            return
        try:
            left = transport.get_write_buffer_size()
        except AttributeError:  # (Python 3.10's TLS transport once its connection is lost: its inner
            return  # transport is None, and the protocol's connection_lost comes a callback later)
        if left:
            if left != self.out_left:
                self.out_left, self.out_since = left, now
            elif now - self.out_since > config.send_timeout:
                transport.abort()
                return
        else:
            self.out_left = 0
        if self.busy or self.pending or transport.is_closing():
            return
        if self.in_request:  # a head or a body not all there yet (slowloris)
            if now - self.since > config.header_timeout:
                self.dead = True
                self._put(error_response(408, self.engine.clock))
                self._flush()
                transport.close()
        elif now - self.since > config.keepalive_timeout:
            self.dead = True
            transport.close()

    def shutdown(self) -> None:
        """Stop taking requests: close now if idle, else after the response in flight."""
        self.dead = True
        transport = self.transport
        if transport is not None and not self.busy:
            self.pending.clear()
            if self.out:
                self._flush()
            self._close()

    # -- plumbing -------------------------------------------------------------------------------

    def _close(self) -> None:
        """Close the transport, once: asyncio's TLS transport tears its TLS layer down at a second
        ``close()`` (its ``get_write_buffer_size()`` then raises until ``connection_lost``), and
        a connection that ends may go on more than once before it is gone."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()

    def _put(self, data: bytes) -> None:
        """Queue *data* for the transport, writing what is queued once it reaches FLUSH_AT bytes."""
        self.out.append(data)
        self.out_size += len(data)
        if self.out_size >= FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        out = self.out
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.out_size = 0
        self.transport.write(data)  # (may call pause_writing)

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.ended or transport.is_closing():
            return  # (after the end of stream the transport reads no more: resuming would read it again)
        paused = (
            self.busy
            or self.dead
            or self.write_paused
            or len(self.pending) >= MAX_PENDING
            or self.backlog_at < len(self.backlog)
            or self.splicing
            or (self.receiving is not None and self.receiving.full())
        )
        if paused != self.read_paused:
            self.read_paused = paused
            try:
                if paused:
                    transport.pause_reading()
                else:
                    transport.resume_reading()
            except AttributeError:  # (Python 3.10's TLS transport once its connection is lost: its
                pass  # inner transport is None, and the protocol's connection_lost comes a callback later)

    def _log(self, exchange: Exchange, sent: int) -> None:
        """The access log's line for *exchange*: its answer's status and the *sent* body bytes."""
        access = self.engine.log
        assert access is not None
        assert exchange.log is not None
        version, referer, agent = exchange.log
        method = exchange.method
        request = method + b" " + exchange.url + b" HTTP/" + version.encode("ascii") if method else b""
        access.line(self.peer, self.engine.clock.log_stamp, request, exchange.status, sent, referer, agent)
