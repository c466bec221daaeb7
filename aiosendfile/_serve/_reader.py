"""serve's request reader: bytes in, requests out, under HTTP/1.1's framing rules and serve's limits.

Sans-IO, in the manner of h11: a :class:`RequestReader` owns no socket and no clock. It is fed
bytes (:meth:`~RequestReader.feed`, or a backlog parsed a slice at a time) and tells its
consumer (:class:`Consumer`) what they hold: a refusal with its status, a head to judge before
its body (an ``Expect`` to answer, an upload to place), body data, a complete request (an
:class:`~._exchange.Exchange`). llhttp (through httptools) does the parsing; the reader applies
what llhttp leaves to a server:

- limits: a target over ``max_url`` → 414; header fields over ``max_head`` together, or one over
  ``max_url`` → 431; a head llhttp still buffers past the limits plus one read → 431;
- framing: anything llhttp refuses → 400, but a method it does not know that is a token → 501
  (first in its read); an HTTP/1.1 head without exactly one ``Host``, or any
  head with two → 400; a ``Host`` the server does not go by → 421 (an absolute-form target's
  authority is judged instead of the field); ``Transfer-Encoding`` in HTTP/1.0 → 400, other than
  ``chunked`` → 501; a version other than 1.x → 505 (a later 1.x is read as 1.1); an ``Expect``
  other than ``100-continue`` (HTTP/1.1) → 417; a chunked body's trailer fields are dropped
  (bounded as the head's); an upgrade is answered as HTTP/1.1, and closes;
- pipelining: a backlog is parsed a slice (``PARSE_SLICE``) at a time, while the consumer has
  room for more requests.

Events are delivered as llhttp finds them (it parses by pushing), and a consumer stops the parse
by raising :class:`Stop` from a callback: a refused upload's body is never parsed. Its rules are
tested by tables (``tests/serve/test_serve_reader.py``), without sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import httptools

from .._static._request import BytesHeaders, accept_encoding_alone, accept_matters
from ._date import CLOSE, KEEP10, KEEP11
from ._exchange import Exchange, LogFields
from ._resumable import MARK
from ._resumable import WANTED as RESUMABLE_FIELDS
from ._target import target_authority

if TYPE_CHECKING:
    from ._auth import TrustedProxies
    from ._rules import HostRule

__all__ = (
    "ACCEPT",
    "AGENT",
    "AUTH",
    "CORE",
    "CTYPE",
    "EXPECT",
    "FETCH_SITE",
    "GET_HEAD",
    "HOST",
    "LENGTH",
    "ORIGIN",
    "PARSE_SLICE",
    "REFERER",
    "TE",
    "UPLOADS",
    "WRITES",
    "XFF",
    "Consumer",
    "EarlyHead",
    "ReaderRules",
    "RequestReader",
    "Stop",
    "header_kinds",
)

#: What a wanted request header is kept for (``ReaderRules.wanted`` maps lowercase names to these).
HOST, CORE, EXPECT, REFERER, AGENT, TE, ACCEPT, AUTH, LENGTH, CTYPE = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
ORIGIN, FETCH_SITE, XFF = 10, 11, 12

#: What the parser is fed at a time from a backlog: between two slices the consumer may say it
#: has no room for more requests (the rest is kept), so a read of 256 KiB of tiny pipelined
#: requests is not parsed all at once.
PARSE_SLICE = 8 * 1024

#: What one read may bring beyond the head limits before an unfinished head counts as too large.
_READ_ALLOWANCE = 256 * 1024

#: A method is a token (RFC 9110 5.6.2, 9.1).
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _unknown_method(data: bytes | memoryview) -> int:
    """The status of a request llhttp refused at its method, *data* beginning with it: a token
    that names no method llhttp knows is 501 (RFC 9110 9.1: a method the server does not
    implement); anything else, 400. (A method llhttp knows but a server does not take is the
    server's 405.)"""
    line = bytes(data[:72]).lstrip(b"\r\n")  # (llhttp skips empty lines before a request)
    method, space, _ = line.partition(b" ")
    if space and method and not method.translate(None, _TOKEN_BYTES):
        return 501
    return 400


GET_HEAD = (b"GET", b"HEAD")
UPLOADS = (b"PUT", b"POST", b"PATCH")  # (with uploads on: a file, a form of files, an upload's part)
#: What writes with uploads on, its head judged before its body (its origin: ``_rules.same_origin``):
#: the uploads and an upload's cancel.
WRITES = (*UPLOADS, b"DELETE")


def header_kinds(
    logging: bool, auth: bool = False, uploads: bool = False, proxied: bool = False
) -> dict[bytes, int]:
    """The request headers a connection keeps (lowercase name → what for): the core's (``Accept``
    only when it names JSON), ``Expect``, ``Host``, ``Transfer-Encoding``, and with an access log
    ``Referer`` and ``User-Agent``; with authentication ``Authorization`` (a request with it stays
    plain: the heads memo keys on the whole read, credentials included); behind trusted proxies
    (for the gate or the log) their ``X-Forwarded-For``; with uploads what a body needs and
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
        kinds.update(dict.fromkeys(RESUMABLE_FIELDS, CORE))  # (a request with them is never memoised)
        kinds[b"content-length"] = LENGTH
        kinds[b"content-type"] = CTYPE
        kinds[b"origin"] = ORIGIN
        kinds[b"sec-fetch-site"] = FETCH_SITE
    if logging:
        kinds[b"referer"] = REFERER
        kinds[b"user-agent"] = AGENT
    return kinds


class Stop(Exception):
    """Raised in a consumer's callback (or the reader's) to stop parsing: answer *status* (None:
    nothing more), with the *extra* fields, then close."""

    def __init__(self, status: int | None, *extra: tuple[str, str]) -> None:
        super().__init__(status)
        self.status = status
        self.extra = extra


class ReaderRules:
    """What a server's reader checks and keeps, made once per server (``Engine.rules``).

    *wanted*: :func:`header_kinds`; *max_url*, *max_head*: the limits; *hosts*: the names the
    server goes by (None: any); *trusted*: the proxies whose ``X-Forwarded-For`` names the client;
    *log*: keep the access log's fields; *gated*: keep each request's credentials for the gate
    (*public_read*: not a ``GET``'s or ``HEAD``'s); *uploads*: ``PUT``/``POST`` heads go to the
    consumer to place."""

    __slots__ = (
        "gated",
        "hosts",
        "log",
        "max_head",
        "max_url",
        "public_read",
        "trusted",
        "uploads",
        "wanted",
    )

    def __init__(
        self,
        wanted: dict[bytes, int],
        max_url: int,
        max_head: int,
        *,
        hosts: HostRule | None = None,
        trusted: TrustedProxies | None = None,
        log: bool = False,
        gated: bool = False,
        public_read: bool = False,
        uploads: bool = False,
    ) -> None:
        self.wanted = wanted
        self.max_url = max_url
        self.max_head = max_head
        self.hosts = hosts
        self.trusted = trusted
        self.log = log
        self.gated = gated
        self.public_read = public_read
        self.uploads = uploads


class EarlyHead:
    """A head its consumer judges before the body is read (:meth:`Consumer.head`): one that asks
    for ``100 Continue`` (HTTP/1.1), or, with uploads on, a ``PUT`` or ``POST``."""

    __slots__ = (
        "agent",
        "authorization",
        "chunked",
        "client",
        "ctype",
        "expects_continue",
        "fetch_site",
        "fields",
        "host",
        "length",
        "method",
        "mode",
        "origin",
        "referer",
        "url",
        "version",
    )

    def __init__(
        self, reader: RequestReader, method: bytes, host: bytes | None, expects_continue: bool
    ) -> None:
        self.method = method
        self.url = reader.url
        self.version = reader.version
        self.mode = reader.mode()
        self.host = host
        self.expects_continue = expects_continue
        kept = reader.kept
        self.authorization = kept.get(AUTH)
        self.client = reader.client
        self.length = kept.get(LENGTH)
        self.chunked = reader.chunked  # (a body framed by chunks: no length, yet a body)
        self.ctype = kept.get(CTYPE)
        self.origin = kept.get(ORIGIN)
        self.fetch_site = kept.get(FETCH_SITE)
        self.referer = kept.get(REFERER)
        self.agent = kept.get(AGENT)
        self.fields = reader.fields  # (the core's pairs: a resumable upload's fields among them)

    def log(self, rules: ReaderRules) -> LogFields | None:
        """The access log's fields of this request (None without an access log)."""
        return (self.version, self.referer, self.agent, self.client) if rules.log else None


class Consumer(Protocol):
    """What a :class:`RequestReader` tells (the connection): each callback runs while the parser
    runs, and may raise :class:`Stop` to stop it."""

    def refused(self, status: int | None, extra: tuple[tuple[str, str], ...]) -> None:
        """The reader stops: answer *status* (None: nothing, an upgrade or a consumer's stop)
        after what is in hand, then close. Called once at most."""

    def head(self, head: EarlyHead) -> None:
        """A head to judge before its body (:class:`EarlyHead`)."""

    def body(self, data: bytes) -> None:
        """Body bytes of the request being read (a GET's too: the consumer drops them)."""

    def request(self, exchange: Exchange) -> None:
        """A request is complete (its body read)."""


class _Nobody:
    """The consumer of a released reader (its connection is gone): nothing is told to anybody."""

    def refused(self, status: int | None, extra: tuple[tuple[str, str], ...]) -> None:
        pass

    def head(self, head: EarlyHead) -> None:
        pass

    def body(self, data: bytes) -> None:
        pass

    def request(self, exchange: Exchange) -> None:
        pass


_NOBODY = _Nobody()


class RequestReader:
    """One connection's request reader (see the module). ``in_request``: from a request's first
    byte to its body's last; ``began``: a request began (its consumer resets it); ``completed``:
    requests completed (its consumer resets it); ``parsed``: the last one, if it is plain (the
    heads memo may keep its head)."""

    __slots__ = (
        "backlog",
        "backlog_at",
        "began",
        "chunked",
        "client",
        "completed",
        "consumer",
        "fields",
        "head_size",
        "host",
        "hosts",
        "in_head",
        "in_request",
        "kept",
        "max_head",
        "max_url",
        "parsed",
        "parser",
        "partial",
        "plain",
        "rules",
        "stopped",
        "te",
        "trailing",
        "url",
        "version",
        "wanted",
    )

    def __init__(self, consumer: Consumer, rules: ReaderRules) -> None:
        self.consumer = consumer
        self.rules = rules
        self.wanted = rules.wanted
        self.max_url = rules.max_url
        self.max_head = rules.max_head
        # (made at the first read the heads memo does not know: a connection answered from the memo
        # alone never makes one)
        self.parser: httptools.HttpRequestParser | None = None
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] | None = None  # the core's header pairs
        self.kept: dict[int, bytes] = {}  # the other wanted values, by kind
        self.head_size = 0
        self.hosts = 0  # Host fields in this request's head
        self.host: bytes | None = None  # the first one's value
        self.te: bytes | None = None  # Transfer-Encoding, its fields joined
        self.chunked = False  # the head being judged frames its body by chunks
        self.client: str | None = None  # the client a trusted proxy names (TrustedProxies.client)
        self.version = "1.1"  # the HTTP version of the request being read ("1.0", "1.1")
        self.partial = 0
        self.in_head = False
        self.trailing = False  # after a chunk's size line, before its data: maybe the trailer section
        self.in_request = False
        self.plain = True  # the request being read has no Expect and no Transfer-Encoding
        self.completed = 0
        self.began = False  # a request began since the consumer last looked (its header timeout starts)
        self.parsed: Exchange | None = None
        self.stopped = False  # refused: nothing more is parsed
        self.backlog = b""  # bytes not parsed yet, past backlog_at (while the consumer has no room)
        self.backlog_at = 0

    # -- feeding ----------------------------------------------------------------------------

    def feed(self, data: bytes | memoryview) -> None:
        """Parse *data*, telling the consumer what it holds (nothing once refused)."""
        if self.stopped:
            return
        parser = self.parser
        if parser is None:
            parser = self.parser = httptools.HttpRequestParser(self)
            # Any one-digit version reaches on_headers_complete, which judges it: a later
            # HTTP/1.x is read as HTTP/1.1 (RFC 9112 2.3), another major is 505 (nginx, Go).
            parser.set_dangerous_leniencies(lenient_version=True)
        completed = self.completed
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            stop = exc.__context__
            if not isinstance(stop, Stop):
                raise
            status, extra = stop.status, stop.extra
            del stop  # (its traceback holds this frame: no cycle left for the garbage collector)
            self._refuse(status, extra)
        except httptools.HttpParserUpgrade:
            self._refuse(None, ())  # the upgrade request was answered; what follows is not HTTP
        except httptools.HttpParserInvalidMethodError:
            self._refuse(_unknown_method(data) if self.completed == completed else 400, ())
        except httptools.HttpParserError:
            self._refuse(400, ())
        if self.in_head or self.trailing:
            # A field llhttp is still collecting reaches on_header only when complete: bound
            # what it may buffer meanwhile (to the limits plus the read that began the request),
            # in the head and in a chunked body's trailer section alike.
            self.partial += len(data)
            if self.partial > self.max_head + self.max_url + _READ_ALLOWANCE:
                self._refuse(431, ())

    def to_backlog(self, data: bytes) -> None:
        """Keep *data* after what is still unparsed of the backlog."""
        if self.backlog_at < len(self.backlog):
            self.backlog = self.backlog[self.backlog_at :] + data
        else:
            self.backlog = data
        self.backlog_at = 0

    def unparsed(self) -> bool:
        """Whether some of the backlog is not parsed yet."""
        return self.backlog_at < len(self.backlog)

    def parse_backlog(self, room: Callable[[], bool]) -> None:
        """Feed the backlog, a slice at a time, while *room()* says the consumer takes more (the
        rest stays in the backlog) and the reader is not stopped."""
        data, at, size = self.backlog, self.backlog_at, len(self.backlog)
        if at == 0 and size <= PARSE_SLICE:
            self.backlog = b""
            self.feed(data)
            return
        while at < size and not self.stopped and room():
            end = min(at + PARSE_SLICE, size)
            self.feed(memoryview(data)[at:end])
            at = end
        if at >= size or self.stopped:
            self.backlog, self.backlog_at = b"", 0
        else:
            self.backlog_at = at

    def drop_backlog(self) -> None:
        self.backlog, self.backlog_at = b"", 0

    def release(self) -> None:
        """The connection is gone: parse nothing more, and let go of the parser and the consumer.
        The parser holds the reader's callbacks and the consumer holds the reader: dropped here,
        a closed connection's objects are freed at once, not left as cycles for the garbage
        collector (which, with one request per connection, ran a collection every ~60
        connections)."""
        self.stopped = True
        self.parser = None
        self.consumer = _NOBODY
        self.drop_backlog()

    def restart(self) -> bytes:
        """The request being read ended outside the parser (its body went from the socket to a
        file): a new parser reads what comes after it. Returns its target."""
        self.parser = None  # (a new one at the next feed)
        self.in_request = self.in_head = self.trailing = False
        url, self.url = self.url, b""
        self.fields = None
        self.kept = {}
        return url

    def mode(self) -> int:
        """How the request being read ends (``_date``'s ``CLOSE``, ``KEEP11``, ``KEEP10``). An
        upgrade (``Upgrade`` with ``Connection: upgrade``, or ``CONNECT``) is answered as HTTP/1.1
        and closes: no ``101`` is sent, and what follows it would be another protocol's (a proxy
        in front that took it for a tunnel must not get requests answered through it)."""
        parser = self.parser
        assert parser is not None  # (asked from the parser's callbacks)
        if parser.should_keep_alive() and not parser.should_upgrade():
            return KEEP11 if self.version == "1.1" else KEEP10
        return CLOSE

    def refused_head(self) -> bool:
        """Whether the request a refusal is for is a ``HEAD`` (its answer then has no body): known
        once its target began, else not (a request line llhttp refused has no method)."""
        parser = self.parser
        return parser is not None and self.url != b"" and parser.get_method() == b"HEAD"

    def refused_request(self) -> tuple[bytes, bytes, LogFields]:
        """The method, target and log fields of the request a refusal is for, as far as it was
        read (the access log's line, as nginx logs its 400s): none before its target began; its
        version once its request line was read whole, else ``""``."""
        parser = self.parser
        url = self.url
        if parser is None or not url or not self.in_request:
            return b"", b"", ("", None, None, None)
        version = parser.get_http_version() if self.head_size or not self.in_head else ""
        kept = self.kept
        return parser.get_method(), url, (version, kept.get(REFERER), kept.get(AGENT), self.client)

    def _refuse(self, status: int | None, extra: tuple[tuple[str, str], ...]) -> None:
        if not self.stopped:
            self.stopped = True
            self.consumer.refused(status, extra)

    # -- llhttp's callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_head = self.in_request = self.plain = self.began = True
        self.head_size = self.partial = 0

    def on_url(self, url: bytes) -> None:
        url = self.url + url
        self.url = url  # (a refusal's answer is told whether it is a HEAD's: refused_head)
        if len(url) > self.max_url:
            raise Stop(414)

    def on_header(self, name: bytes, value: bytes) -> None:
        field = len(name) + len(value)
        size = self.head_size + field + 4
        if size > self.max_head or field > self.max_url:  # each field as the request line (nginx)
            raise Stop(431)
        self.head_size = size
        kind = self.wanted.get(name.lower())
        if kind is None:
            return
        if not self.in_head:
            # A trailer field (after a chunked body): bounded with the head, never merged into
            # it (RFC 9110 6.5.1), as nginx drops them; else a trailer's Host, Range or
            # Authorization would judge this request, or count in the next one's head.
            return
        if kind in (CORE, ACCEPT):
            if kind == ACCEPT and not accept_matters(value):
                return
            if self.fields is None:
                self.fields = [(name, value)]
            else:
                self.fields.append((name, value))
        elif kind == HOST:
            self.hosts += 1
            if self.host is None:
                self.host = value
        elif kind == TE:
            self.te = value if self.te is None else self.te + b"," + value
        else:
            kept = self.kept
            before = kept.get(kind)
            if before is not None:  # a field given twice
                if kind == AUTH:
                    value = b""  # neither counts, as nginx refuses a second one
                elif kind == ORIGIN:
                    value = b"null"  # as a cross-site one
                elif kind == FETCH_SITE:
                    value = b"cross-site"
                elif kind == XFF:
                    value = before + b"," + value
            kept[kind] = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        hosts, self.hosts = self.hosts, 0
        host, self.host = self.host, None
        rules = self.rules
        kept = self.kept
        if kept:
            xff = kept.pop(XFF, None)
            if xff is not None:
                assert rules.trusted is not None
                self.client = rules.trusted.client(xff)
            else:
                self.client = None
        else:
            self.client = None
        te, self.te = self.te, None
        self.chunked = te is not None
        parser = self.parser
        assert parser is not None  # (this is its callback)
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            if version[:2] != "1.":
                raise Stop(505)  # HTTP/2.0, 3.0 (or 0.9) in a request line: an HTTP/1.x server (nginx)
            version = "1.1"  # HTTP/1.2 and later: the highest minor version this server has
        self.version = version
        if hosts != 1 and (hosts or version == "1.1"):
            raise Stop(400)  # RFC 9112 3.2: HTTP/1.1 needs one Host; no request may have two
        url = self.url
        if url[:1] != b"/" and url != b"*":  # absolute-form: its authority stands for Host (RFC 9112 3.2.2)
            authority = target_authority(url)
            if authority is not None:  # (not CONNECT's authority-form: its Host is judged)
                host = authority
        if rules.hosts is not None and not rules.hosts.allows(host):
            raise Stop(421)  # a name this server does not go by: DNS rebinding (_rules.HostRule)
        if te is not None:
            self.plain = False
            if version == "1.0":
                raise Stop(400)  # RFC 9112 6.1: chunked framing in HTTP/1.0 is not to be trusted
            if te.strip().lower() != b"chunked":
                raise Stop(501)  # "identity, chunked", "gzip, chunked": codings we do not have (nginx)
        expects_continue = False
        if kept:
            expect = kept.pop(EXPECT, None)
            if expect is not None:
                self.plain = False
                if version == "1.1":  # (HTTP/1.0 has no 100 Continue; aiohttp ignores it too)
                    if expect.strip().lower() != b"100-continue":
                        raise Stop(417)
                    expects_continue = True
        if expects_continue or (rules.uploads and parser.get_method() in WRITES):
            self.consumer.head(EarlyHead(self, parser.get_method(), host, expects_continue))

    def on_body(self, body: bytes) -> None:
        self.trailing = False
        self.consumer.body(body)

    def on_chunk_header(self) -> None:
        self.trailing = True  # (the last chunk's is followed by the trailer section)
        self.partial = 0

    def on_chunk_complete(self) -> None:
        self.trailing = False

    def on_message_complete(self) -> None:
        self.in_request = False
        if self.stopped:  # (a consumer's answer said the connection closes: the rest is not read)
            return
        url, self.url = self.url, b""
        fields, self.fields = self.fields, None
        parser = self.parser
        assert parser is not None  # (this is its callback)
        mode = self.mode()
        rules = self.rules
        kept = self.kept
        log = None
        if rules.log:
            log = (self.version, kept.get(REFERER), kept.get(AGENT), self.client)
        method = parser.get_method()
        exchange = Exchange(method, url, mode, fields, log)
        self.completed += 1
        if rules.gated and not (rules.public_read and method in GET_HEAD and MARK not in url):
            # (judged when answered: after the guesses before it; memoised once allowed)
            exchange.auth = exchange.guarded = (kept.get(AUTH), self.client)
        if kept:
            self.kept = {}
        self.client = None
        plain = fields is None or accept_encoding_alone(fields)  # (a browser's: Accept-Encoding alone)
        self.parsed = exchange if plain and self.plain and method in GET_HEAD else None
        self.consumer.request(exchange)
