"""One HTTP/1.1 connection of ``serve``: the transport's callbacks, the order of answers, turns,
flow control and timeouts.

Its jobs are split by module: the request reader (``_reader``, sans-IO) turns bytes into requests
and refusals; answering (``_answering``) replays or decides each request and renders its answer
into ``out``; body senders (``_sending``) send file bodies; the upload receiver (``_receiver``)
takes ``PUT`` and form bodies into files. This module keeps what ties them to one transport:

- A read that is exactly a plain request head parsed before (``Engine.heads``: a client asking
  again sends the same bytes) is not parsed again: its method, target and keep-alive mode come
  from that memo, and it goes on as a parsed one would. Everything a ``data_received`` produced
  leaves in one ``transport.write`` (pipelined requests share it).
- Ordering: at most one answer is in flight at a time (``busy``: a cold decision, a file body, a
  password check, an upload landing). Meanwhile the requests already parsed wait in ``pending``
  (reading pauses past ``MAX_PENDING``), answered in order when it ends.
- Turns: at most ``TURN_BUDGET`` answers in one callback; once the engine's time for answering in
  this loop iteration is spent, a read waits for the connection's turn (``Engine.wait_turn``).
- Timeouts, from the engine's timer (:meth:`HttpProtocol.expire`): a head not complete in
  ``header_timeout`` → 408; idle longer than ``keepalive_timeout`` → closed; no progress for
  ``send_timeout`` while a body is in flight or answers wait in the transport → aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any

from .._bodies import ColdWhole, Transfer
from .._outlet import Outlet
from ._answering import replay, respond
from ._archive_body import ArchiveBody
from ._auth import address_key
from ._bounds import FLUSH_AT, MAX_PENDING, TURN_BUDGET
from ._date import CLOSE
from ._exchange import Exchange, Item
from ._reader import GET_HEAD, PARSE_SLICE, UPLOADS, WRITES, EarlyHead, RequestReader, Stop
from ._receiver import CONTINUE, UploadReceiver
from ._render import error_response
from ._resumable import MARK, redacted
from ._rules import same_origin

if TYPE_CHECKING:
    from ._sending import BodySender
    from ._server import Engine, ServeConfig

__all__ = ("HttpProtocol",)

_GET = b"GET"


class HttpProtocol(asyncio.Protocol):
    """An HTTP/1.1 server connection of one :class:`~._server.Engine` (see the module); the
    request reader's consumer (``_reader.Consumer``)."""

    __slots__ = (
        "budget",
        "busy",
        "dead",
        "ended",
        "engine",
        "held",
        "key",
        "out",
        "out_left",
        "out_since",
        "out_size",
        "outlet",
        "owned",
        "peer",
        "pending",
        "proxied",
        "read_paused",
        "reader",
        "scheduled",
        "sending",
        "since",
        "starting",
        "task",
        "transport",
        "uploads",
        "write_paused",
    )

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.reader = RequestReader(self, engine.rules)
        self.transport: Any = None
        self.uploads: UploadReceiver | None = None  # made at the first upload head (with uploads on)
        self.key = "-"  # what the gate locks this connection's client out as (address_key)
        self.proxied = False  # the peer is a trusted proxy: its requests' clients are their own
        # A fresh connection gets header_timeout, not keepalive_timeout, to send its first request.
        self.since = engine.now - engine.config.keepalive_timeout + engine.config.header_timeout
        self.busy = False  # an answer is in flight (a cold decision, a file body, a check, an upload)
        self.sending = False  # a file body is in flight: since = its last progress
        self.dead = False  # no more requests will be read: close once everything is answered
        self.ended = False  # the client's end of stream came: answer what it sent, then close
        self.pending: deque[Item] = deque()
        self.held: bytes | None = None  # a read waiting, as it came, for a turn (see _hold)
        self.budget = TURN_BUDGET  # requests this turn may still answer
        self.scheduled = False  # a next turn is scheduled (call_soon, or in the engine's waiting queue)
        self.out: list[bytes] = []
        self.out_size = 0  # bytes in out
        self.out_left = 0  # the transport's write buffer at the last tick, and since when
        self.out_since = 0.0
        self.task: asyncio.Task[None] | None = None  # an upload's body spliced into its file
        self.outlet: Outlet | bool | None = None  # made at the first file body; False: none here
        self.owned: BodySender | None = None  # the file body in flight (_sending)
        self.starting = False  # in a body sender's first run: a body that ends there goes on in the caller
        self.read_paused = False
        self.write_paused = False
        self.peer = "-"

    # -- transport callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.engine.connections.add(self)
        engine = self.engine
        if engine.log is not None or engine.gate is not None or engine.uploads is not None:
            # (logged; locked out by address; an address's share of uploads in progress)
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
        self.reader.release()  # (no cycle left: this connection's objects go by reference counting)
        self.held = None
        self.out.clear()
        self.out_size = 0
        if self.task is not None:
            self.task.cancel()
        if self.owned is not None:
            self.owned.stop()  # (closes the body's file once no pool thread sends from it)
            self.owned = None
        if self.uploads is not None:
            self.uploads.lost()  # (nothing stays: temporary files go)
        if isinstance(self.outlet, Outlet):
            self.outlet.close()
        self.engine.lost(self)

    def eof_received(self) -> bool | None:
        """The client's end of stream (a half-close: ``nc``, health checks; over TLS its
        ``close_notify``). What it sent before and is still to be answered (a read held for a
        turn, a backlog, requests waiting, a body in flight) is answered first, then the
        connection closes, as nginx does; with nothing to answer it closes now."""
        if self.held is None and not self.reader.backlog and not self.pending and not self.busy:
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
        if type(self.owned) is ArchiveBody:  # (it writes through the transport between files)
            self.owned.resumed()
        self.budget = TURN_BUDGET
        self._resume()

    def data_received(self, data: bytes) -> None:
        if self.dead:
            return
        uploads = self.uploads
        if uploads is not None and uploads.discard:  # the rest of a body that failed half-way: dropped
            n = min(uploads.discard, len(data))
            uploads.discard -= n
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
        if not self.reader.in_request:  # (a head's later bytes do not restart its header timeout)
            self.since = self.engine.now
        held = self.held
        if held is None and not self.reader.backlog and not self.pending and len(data) <= PARSE_SLICE:
            self.held = data
        else:  # (the transport delivered once more after the pause, or a large read)
            self.held = None
            self.reader.to_backlog(data if held is None else held + data)
            self._update_reading()
        if not self.scheduled:
            self.scheduled = True
            self.engine.wait_turn(self)

    def _receive(self, data: bytes) -> None:
        self.budget = TURN_BUDGET
        if self.held is not None:  # (a read held for a turn comes first)
            data, self.held = self.held + data, None
        reader = self.reader
        if reader.backlog or len(data) > PARSE_SLICE or self.pending or self.busy or self.write_paused:
            reader.to_backlog(data)
            self._resume()
            if self.busy:  # (a read while a file body is sent: its backlog pauses reading)
                self._update_reading()
            return
        # The common case, a read of one request or a few while nothing waits: parsed at once
        # (a slice's worth: at most a few hundred requests), answered within the turn's budget.
        # A read that is exactly a request head parsed before is not parsed again (``heads``).
        if reader.in_request:
            self._feed(data)
        else:
            engine = self.engine
            head = engine.heads.get(data)
            if head is None:
                head = engine.head_like(data)  # (a new target in a head block seen before)
            if head is not None:
                self.since = engine.now
                self.budget -= 1
                # (a plain GET with no access log: answered with no request object if memoised)
                method, url, mode, log, guard, field = head
                if mode == CLOSE:  # (nothing after it is read: closed once answered)
                    self.dead = True
                if guard is not None or method != _GET or log is not None:
                    exchange = Exchange(method, url, mode, None if field is None else [field], log)
                    exchange.auth = exchange.guarded = guard
                    respond(self, exchange)
                elif not replay(self, None, url, mode, True, field is not None):
                    # (not kept as it stands: a browser's is asked again as a plain one where
                    # there are no pre-compressed siblings, as respond decides)
                    exchange = Exchange(method, url, mode, None if field is None else [field], None)
                    respond(self, exchange, field is None or self.engine.policy.precompressed)
            else:
                reader.completed = 0
                self._feed(data)
                parsed, reader.parsed = reader.parsed, None
                if (
                    reader.completed == 1
                    and parsed is not None
                    and parsed.auth is None  # (allowed by now, if a gate had to)
                    and not reader.in_request
                    and (not self.dead or parsed.mode == CLOSE)
                ):
                    engine.learn(data, parsed)
        if self.out:
            self._flush()
        if self.pending or reader.backlog:
            if not self.busy and not self.write_paused:
                self._next_turn()  # (the budget ran out)
        elif (self.dead or self.ended) and not self.busy:
            self._close()

    def _parse(self) -> None:
        """Parse the backlog, a slice at a time, until it is done or MAX_PENDING requests wait (the
        rest stays in the backlog, with reading paused)."""
        reader = self.reader
        reader.parse_backlog(self._room)
        if self.dead:
            reader.drop_backlog()
        if reader.began:
            reader.began = False
            self.since = self.engine.now

    def _room(self) -> bool:
        return not self.dead and len(self.pending) < MAX_PENDING

    def _feed(self, data: bytes | memoryview) -> None:
        """Parse *data*; a request begun in it starts its header timeout."""
        reader = self.reader
        reader.feed(data)
        if reader.began:
            reader.began = False
            self.since = self.engine.now

    # -- the request reader's events (_reader.Consumer) ------------------------------------------

    def refused(self, status: int | None, extra: tuple[tuple[str, str], ...]) -> None:
        self._fail(status, extra)

    def head(self, head: EarlyHead) -> None:
        """A head to judge before its body: its ``100 Continue``, and with uploads on a ``PUT`` or
        ``POST``'s origin and place (``UploadReceiver.begin``)."""
        if self.dead:  # an answer already said this connection closes: nothing after it is read
            raise Stop(None)
        engine = self.engine
        method = head.method
        if head.expects_continue:
            if method in GET_HEAD:
                self._emit(CONTINUE)
            elif method in UPLOADS and engine.uploads is not None:
                self._uploads().continue_owed = (
                    True  # (once authenticated, and the size and the place allow it)
                )
            else:
                # The final answer (405) now, without 100 (Continue): the body is not read, so close after.
                self.dead = True
                exchange = Exchange(method, head.url, CLOSE, None, head.log(self.reader.rules))
                if engine.gate is not None:  # (its credentials first, as for every answer: 401 before 405)
                    exchange.auth = exchange.guarded = (head.authorization, head.client)
                if self.busy or self.pending:
                    self.pending.append(exchange)
                    self._update_reading()  # (dead: a body in flight had left reading on)
                else:
                    respond(self, exchange)
                raise Stop(None)
        if engine.uploads is not None and method in WRITES:
            if not same_origin(head.origin, head.fetch_site, head.host):
                raise Stop(403)  # another site's page writing here (_rules.same_origin)
            if method in UPLOADS:
                self._uploads().begin(head)

    def body(self, data: bytes) -> None:
        if self.uploads is not None:
            self.uploads.body(data)
        # (else a GET's body, or a refused method's: read and dropped)

    def request(self, exchange: Exchange) -> None:
        if self.dead:  # an answer already said this connection closes: the rest is not read
            return
        if exchange.mode == CLOSE:
            self.dead = True  # nothing after this request is read
        uploads = self.uploads
        if uploads is not None and uploads.receiving is not None:  # its body is all there: it lands
            uploads.complete(uploads.receiving, exchange)
            return
        if self.busy or self.pending or self.write_paused or self.budget <= 0:
            self.pending.append(exchange)
            if len(self.pending) >= MAX_PENDING or self.dead:  # (a body in flight left reading on)
                self._update_reading()
            return
        self.budget -= 1
        respond(self, exchange)

    def _uploads(self) -> UploadReceiver:
        if self.uploads is None:
            self.uploads = UploadReceiver(self)
        return self.uploads

    # -- what answering, body senders and the upload receiver use ----------------------------------

    def _key_of(self, client: str | None) -> str:
        """What the gate counts a request's failures against: its connection's client, or the
        client a trusted proxy names."""
        return address_key(client) if client is not None and self.proxied else self.key

    def _on_loop(self, then: Any, *args: Any) -> None:
        """(In a pool thread, or the gate's.) Hand a job's end to the loop: ``then(*args, job)``
        (unless the loop is gone)."""
        with contextlib.suppress(RuntimeError):
            self.engine.loop.call_soon_threadsafe(then, *args)

    def _free(self) -> None:
        """The answer in flight is given (or given up): what waits may go, with a fresh budget."""
        self.busy = False
        self.budget = TURN_BUDGET

    # -- turns ------------------------------------------------------------------------------------

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
                    respond(self, item)  # type: ignore[arg-type]
            elif self.reader.backlog and not self.dead:
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
        if pending or (self.reader.backlog and not self.dead):
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

    # -- errors, timeouts -------------------------------------------------------------------------

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
            body = not self.reader.refused_head()  # (a HEAD's answer has none, its errors' too)
            answer = error_response(status, self.engine.clock, body=body, extra=extra)
            self._emit(answer)
            if self.engine.log is not None:  # (its request line as far as it was read)
                method, url, log = self.reader.refused_request()
                refused = Exchange(method, url, CLOSE, None, log)
                refused.status = status
                self._log(refused, len(answer) - answer.find(b"\r\n\r\n") - 4)

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
        if self.reader.in_request:  # a head or a body not all there yet (slowloris)
            if now - self.since > config.header_timeout:
                self.dead = True
                self._put(error_response(408, self.engine.clock, body=not self.reader.refused_head()))
                self._flush()
                transport.close()
        elif now - self.since > config.keepalive_timeout:
            self.dead = True
            transport.close()

    def shutdown(self) -> None:
        """Stop taking requests: close now if idle, else after the response in flight."""
        self.dead = True
        if self.busy:
            self._update_reading()  # (a body in flight left reading on: nothing more is read)
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
        # A file body sent on the connection's own duplicate (a Transfer: a cold chunk's wait, a
        # full socket; a ColdWhole, sent by the page reader's thread) leaves reading on: pausing
        # and resuming around it cost two epoll_ctl a body, and a client that waits for its
        # answer sends nothing meanwhile; a read that comes is kept in the backlog, which pauses
        # reading then.
        owned = self.owned
        paused = (
            (self.busy and type(owned) is not Transfer and type(owned) is not ColdWhole)
            or self.dead
            or self.write_paused
            or len(self.pending) >= MAX_PENDING
            or self.reader.unparsed()
            or (self.uploads is not None and self.uploads.holds_reading())
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
        version, referer, agent, client = exchange.log
        method = exchange.method
        url = exchange.url
        if MARK in url:  # a resumable upload's token is its capability: not for the log
            url = redacted(url)
        request = method + b" " + url if method else b""
        if method and version:  # (no version: a request refused in its request line)
            request += b" HTTP/" + version.encode("ascii")
        peer = client if client is not None and self.proxied else self.peer  # (a trusted proxy's word)
        access.line(peer, self.engine.clock.log_stamp, request, exchange.status, sent, referer, agent)
