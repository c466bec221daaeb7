"""A connection's upload receiver (``serve --upload``): a ``PUT`` or form ``POST`` body, from the
request reader's head to its file's name, then the answer.

The head is judged first (the size it announces, its credentials, where it goes: refused at once,
no body read), then the file is opened in the cold pool; the body waits in memory meanwhile
(``_upload.BUFFER``: reading pauses above it) and is written one chunk at a time in the pool, in
order. A large announced body on a plain socket goes zero-copy instead: socket → pipe → file
(``splice_to_file``, as ``recvfile``), the transport's reading paused. Once all of it is there the
file is committed (flushed, named) and the answer given; requests read behind it wait. A refusal
before the body is all there drops what comes, and answers once the rest is read (or at once,
closing, when the client waits for ``100 Continue`` or too much is to come).

A step of a resumable upload with a body (a creation, a ``PATCH``: ``_resumable``) takes the same
way into a :class:`~._partial_upload.ResumableUpload`: its partial file is opened (found busy, it is
tried again, and the request of this worker still writing it is stopped), a creation's ``104`` is
sent once the upload exists, and a request cut short keeps what it wrote.

What it uses of its connection (:class:`~._protocol.HttpProtocol`) is its state (``transport``,
``reader``, ``engine``, ``busy``, ``pending``, ``write_paused``, ``dead``, ``since``, ``budget``)
and its steps (``_put``, ``_flush``, ``_fail``, ``_close``, ``_free``, ``_resume``,
``_update_reading``, ``_start``, ``_on_loop``, ``_key_of``); it answers through ``_answering.render``.
Nothing else reaches into it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .._platform import HAS_SPLICE
from .._sink import FileSink
from .._splice import splice_to_file
from .._static._answer import error
from ._answering import render
from ._auth import ALLOWED, user_of
from ._date import CLOSE
from ._exchange import Exchange
from ._partial import Busy, busy_status, wait_for_holder
from ._partial_upload import ResumableUpload
from ._reader import EarlyHead, Stop
from ._refusal import failure, refusal, verdict_of
from ._render import error_response
from ._resumable import (
    CREATE,
    TUS_TYPE,
    Ask,
    ask_of,
    limit_field,
    new_token,
    refusal_fields,
    tus_filename,
    upload_fields,
)
from ._target import split_target
from ._tls import TLSTransport
from ._upload import (
    DISCARD_MAX,
    SPLICE_AT,
    Receiving,
    Upload,
    UploadRefused,
    bad_name,
    fields_of,
    status_of,
    upload_directory,
    upload_target,
)

if TYPE_CHECKING:
    from ._form import FormUpload
    from ._protocol import HttpProtocol

__all__ = ("CONTINUE", "UploadReceiver")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: A PATCH of no upload resource (with Expect: 100-continue: answered now, not read)
ALLOW = ("Allow", "GET,HEAD,POST,PUT")


def _back_to(raw_path: bytes) -> str:
    """The ``Location`` of a form POST's 303: the directory it was posted to, relative (right
    behind a proxy's prefix too): ``./`` for ``/a/b/``, ``b/`` for ``/a/b``."""
    if raw_path.endswith(b"/"):
        return "./"
    return raw_path.rsplit(b"/", 1)[-1].decode("latin-1") + "/"


class UploadReceiver:
    """The uploads of one connection (made at its first upload head; see the module)."""

    __slots__ = ("conn", "continue_owed", "discard", "engine", "landing", "receiving", "splicing")

    def __init__(self, conn: HttpProtocol) -> None:
        self.conn = conn
        self.engine = conn.engine
        self.continue_owed = False  # a PUT's Expect: 100-continue, answered once it may come
        self.receiving: Receiving | None = None  # a body on its way to a file
        self.landing: Receiving | None = None  # a body all there, being written and named
        self.splicing = False  # a body goes from the socket to its file (reading paused)
        self.discard = 0  # bytes still to come of a body that failed half-way: dropped unparsed

    def holds_reading(self) -> bool:
        """Whether reading must pause: a body is spliced, or enough of one waits in memory."""
        return self.splicing or (self.receiving is not None and self.receiving.full())

    def lost(self) -> None:
        """The connection is gone: nothing stays (temporary files go; a resumable upload keeps
        what it was given)."""
        for r in (self.receiving, self.landing):
            if r is not None:
                self._let_go(r.upload)
                r.drop()
        self.receiving = self.landing = None

    # -- from the request reader --------------------------------------------------------------

    def begin(self, head: EarlyHead) -> None:
        """A PUT (or form POST) head is complete: refuse it now (the size it announces, its
        credentials, where it goes) or find its place in the pool (after checking a hashed
        password in the gate's thread); its body waits in memory meanwhile (``_upload.BUFFER``:
        reading pauses above). Its answer comes once the file has its name (``landing``):
        requests read behind it wait."""
        conn = self.conn
        engine = self.engine
        uploads = engine.uploads
        assert uploads is not None
        method = head.method
        if conn.busy or conn.pending or self.landing is not None:
            # Pipelined behind answers not given yet: those are given, then the connection closes
            # without reading this one (a client retries an unanswered PUT: it is idempotent).
            raise Stop(None)
        size = None
        if head.length is not None:
            try:
                size = int(head.length)
            except ValueError:  # (httptools frames the body by it: this is only a second look)
                raise Stop(400) from None
        split = split_target(head.url)
        if split is None:
            raise Stop(400)
        raw_path, query = split
        upload: Upload | FormUpload
        ask = None
        interim = False  # a resumable creation's 104 would reach its client
        if engine.resumable is not None:
            ask = ask_of(method, raw_path.endswith(b"/"), query, upload_fields(head.fields), head.ctype)
            interim = ask is not None and self._interim_reaches(ask, head, size)
            if (
                ask is not None
                and ask.complete
                and method == b"PUT"
                and ask.step == CREATE
                and not ask.bad
                and not interim
            ):
                # All of it in one request, and no 104 can tell the client where the upload is:
                # it could never resume it. The field is ignored (as the draft lets a server do)
                # and the body is a plain PUT's, not a partial file held for the whole expiry.
                ask = None
        if size is not None and uploads.max_size is not None and size > uploads.max_size:
            raise Stop(413, *self._too_large(ask))  # (before the body is read; no 100 Continue)
        verdict: concurrent.futures.Future[float] | float = ALLOWED
        gate = engine.gate
        if gate is not None:
            verdict = gate.judge(method, head.authorization, conn._key_of(head.client))
            if isinstance(verdict, float) and verdict != ALLOWED:
                status, extra = refusal(verdict)
                raise Stop(status, *extra)
        if ask is None and method == b"PATCH":  # not an upload's: the core refuses it (405), body dropped
            if self.continue_owed:
                self.continue_owed = False
                raise Stop(405, ALLOW)
            return
        try:
            if ask is not None:
                upload = self._resumable(head, ask, raw_path, size)
            elif method == b"PUT":
                upload = Upload(
                    upload_target(raw_path, engine.policy, engine.prefix), engine.policy, uploads.overwrite
                )
            else:
                from ._form import FormUpload, form_boundary  # (python-multipart: with uploads only)

                boundary = form_boundary(head.ctype)
                if boundary is None:
                    raise Stop(415)  # (a form of files only: multipart/form-data)
                directory = upload_directory(raw_path, engine.policy, engine.prefix)
                upload = FormUpload(directory, engine.policy, uploads.overwrite, boundary, _back_to(raw_path))
        except UploadRefused as exc:
            raise Stop(exc.status) from None
        r = self.receiving = Receiving(upload, size, head.mode, head.log(conn.reader.rules), method)
        r.interim = interim
        if self._splice_may(r):  # no more reads through the transport: what follows this read is spliced
            r.zero_copy = self.splicing = True
            conn._update_reading()
        if not isinstance(verdict, float):  # (its password is checked in the gate's thread first)
            verdict.add_done_callback(functools.partial(conn._on_loop, self._verified, r))
        else:
            self._open(r)

    def _resumable(self, head: EarlyHead, ask: Ask, raw_path: bytes, size: int | None) -> ResumableUpload:
        """The upload a step of a resumable upload (``_resumable``) writes: a new one's, or the one
        its token names (whose request under way, if any, is stopped: a client resuming knows
        that request is over). Stop for a request that is not one."""
        engine = self.engine
        store = engine.resumable
        assert store is not None
        asked = raw_path  # (the request's own path: the upload's address is relative to it)
        if ask.bad:
            raise Stop(ask.bad, *refusal_fields(ask, ask.bad))
        extra = refusal_fields(ask, 0)  # (what the refusals below carry: none is a 412)
        user = user_of(head.authorization) if engine.gate is not None else None
        owner = f"user:{user}" if user is not None else f"address:{self.conn._key_of(head.client)}"
        if ask.step == CREATE:
            token = new_token()
            if ask.tus:
                has_body = head.chunked or bool(size)
                if has_body and (head.ctype or b"").partition(b";")[0].strip().lower() != TUS_TYPE:
                    raise Stop(415, *extra)
                try:
                    name = tus_filename(ask.metadata)
                except ValueError:
                    raise Stop(400, *extra) from None
                if name is None:
                    raise Stop(400, *extra)  # (where it goes: Upload-Metadata's filename)
                if bad_name(name):
                    raise Stop(403, *extra)
                if not raw_path.endswith(b"/"):  # (the folder named without its slash)
                    raw_path += b"/"
                raw_path += quote(name, safe="").encode()
        else:
            assert ask.token is not None
            token = ask.token
        try:
            target = upload_target(raw_path, engine.policy, engine.prefix)
        except UploadRefused as exc:
            raise Stop(exc.status, *extra) from None
        # Relative to the request's path (right behind a proxy that strips a prefix, as a folder's
        # redirect): its last step, or a folder's named without its slash and the new name; "./"
        # so that a name with a colon is no scheme.
        step = raw_path[asked.rfind(b"/") + 1 :]
        location = "./" + step.decode("latin-1") + "?upload=" + token.decode()
        path = store.relative(target.path)
        return ResumableUpload(store, ask, target, path, token, user, owner, location, size)

    def _too_large(self, ask: Ask | None) -> tuple[tuple[str, str], ...]:
        """The fields of a 413 for a body over ``--max-upload-size``: a resumable upload's (tus's
        version; the IETF draft's ``Upload-Limit``, which its 413 MUST carry), none for a plain
        one's."""
        if ask is None:
            return ()
        if ask.tus:
            return refusal_fields(ask, 413)
        return (limit_field(self.engine.uploads.max_size),)  # type: ignore[union-attr]

    def body(self, data: bytes) -> None:
        """Body bytes of the upload being received (or dropped, refused)."""
        r = self.receiving
        if r is None:
            return  # (a GET's body, or a refused method's: read and dropped)
        r.got += len(data)
        conn = self.conn
        conn.since = self.engine.now  # progress: a body that stops is cut at header_timeout
        if r.refused is not None:
            return  # (dropped: see _refused)
        limit = self.engine.uploads.max_size  # type: ignore[union-attr]
        if limit is not None and r.got > limit:  # (a chunked body: its length comes as it goes)
            upload = r.upload
            self._abort(r.refuse(413))
            raise Stop(413, *self._too_large(upload.ask if isinstance(upload, ResumableUpload) else None))
        r.chunks.append(data)
        r.buffered += len(data)
        if r.full():
            conn._update_reading()
        self._pump(r)

    def complete(self, r: Receiving, exchange: Exchange) -> None:
        """The body is all there: answer a refusal now, else the answer comes once the file has
        its name; requests behind it wait."""
        conn = self.conn
        r.done = exchange
        self.receiving = None
        self.splicing = False  # (all of it came with the head: nothing to splice)
        if r.refused is not None:
            status, extra = r.refused
            if conn.busy or conn.pending or conn.write_paused:
                conn.pending.append(
                    error_response(status, self.engine.clock, mode=exchange.mode, extra=extra)
                )
            else:
                render(conn, exchange, error(status, "PUT", *extra))
            return
        self.landing = r
        conn.busy = True
        conn._update_reading()
        self._pump(r)

    # -- its steps in the pool, each back on the loop -------------------------------------------

    def _verified(self, r: Receiving, job: concurrent.futures.Future[float]) -> None:
        verdict = verdict_of(job)
        if self.conn.transport is None or r.refused is not None:
            return
        if verdict != ALLOWED:
            status, extra = refusal(verdict)
            self._refused(r, status, *extra)
            return
        self._open(r)

    def _open(self, r: Receiving) -> None:
        assert r.upload is not None
        r.working = True
        self._submit(r.upload.open, self._opened, r)

    def _submit(self, work: Callable[[], object], then: Callable[..., None], *args: object) -> None:
        """Run *work* in the pool, then ``then(*args, job)`` on the loop. Until then has run, the
        job counts with the engine's cleanups: a stop waits for it, and for the abort it submits
        when the connection is gone (else a stop meanwhile left what it made: a partial file, a
        temporary one, a descriptor)."""
        engine = self.engine
        job: concurrent.futures.Future[Any] = engine.executor.submit(work)
        engine.cleanups.add(job)
        job.add_done_callback(functools.partial(self.conn._on_loop, self._after, then, args))

    def _after(
        self, then: Callable[..., None], args: tuple[object, ...], job: concurrent.futures.Future[Any]
    ) -> None:
        try:
            then(*args, job)
        finally:
            self.engine.cleanups.discard(job)

    def _open_again(self, r: Receiving) -> None:
        if self.conn.transport is not None and r.refused is None and r.upload is not None:
            self._open(r)

    def _opened(self, r: Receiving, job: concurrent.futures.Future[None]) -> None:
        r.working = False
        if self._gone(r):  # (whatever open made is aborted)
            return
        exc = failure(job)
        if exc is not None:
            upload = r.upload
            if isinstance(exc, Busy) and isinstance(upload, ResumableUpload):
                # (written by another request: soon free; open left nothing open, it is tried again)
                if wait_for_holder(
                    self.engine, upload.id, self.conn, r.tries, functools.partial(self._open_again, r)
                ):
                    r.tries += 1
                    return
                self._abort(upload)
                r.upload = None
                self._refused(r, busy_status(exc), *upload.fields(None, None))
                return
            self._abort(upload)
            r.upload = None
            self._refused(r, status_of(exc), *fields_of(exc))
            return
        r.opened = True
        if isinstance(r.upload, ResumableUpload):
            self.engine.appending[r.upload.id] = self.conn  # (a newer request for it stops this one)
            early = r.upload.interim() if r.interim else None
            if early is not None:  # 104: where the client resumes if this connection breaks
                self.conn._put(early)
                self.conn._flush()
        if self.continue_owed:
            self.continue_owed = False
            self.conn._put(CONTINUE)
            self.conn._flush()
        self._pump(r)

    def _interim_reaches(self, ask: Ask, head: EarlyHead, size: int | None) -> bool:
        """Whether a creation's ``104`` would reach its client: one of this interop version, over
        HTTP/1.1, with a body to come (without one, its final answer follows at once), and not
        through a trusted proxy (nginx, 1.22 at least, takes an upstream's 1xx for its final
        answer, then waits for the real one until its timeout: every upload failed behind it)."""
        return ask.interop and head.version == "1.1" and size != 0 and not self.conn.proxied

    def _pump(self, r: Receiving) -> None:
        """Write what waits (one write at a time, in order); once the body is all written, give
        the file its name."""
        if r.working or not r.opened or r.refused is not None or r.upload is None:
            return
        conn = self.conn
        if r.chunks:
            data = r.chunks[0] if len(r.chunks) == 1 else b"".join(r.chunks)
            r.chunks.clear()
            r.working = True
            self._submit(functools.partial(r.upload.write, data), self._written, r, len(data))
        elif r.done is None and r.zero_copy and conn.held is None and not conn.reader.unparsed():
            self._splice(r)
        elif r.done is not None:
            r.working = True
            self._submit(functools.partial(r.upload.commit, r.got), self._committed, r)

    def _splice_may(self, r: Receiving) -> bool:
        """Whether *r*'s body (but what came with its head) may go zero-copy: announced, large, on
        a socket the kernel splices from."""
        transport = self.conn.transport
        return (
            r.length is not None
            and r.length >= SPLICE_AT
            and r.upload is not None
            and r.upload.zero_copy
            and HAS_SPLICE
            and type(transport) is not TLSTransport
            and transport.get_extra_info("socket") is not None
            and not transport.is_closing()
        )

    def _splice(self, r: Receiving) -> None:
        """The rest of *r*'s body, socket → pipe → file (``splice_to_file``, as ``recvfile``), with
        the transport's reading paused; then the request ends as the parser would end it."""
        upload = r.upload
        assert isinstance(upload, Upload)
        assert r.length is not None
        r.working = True
        conn = self.conn
        sink = FileSink(
            None, upload.fd, upload.written, r.length - r.got, self.engine.executor, self._progress
        )
        sock_fd = conn.transport.get_extra_info("socket").fileno()
        task = conn._start(splice_to_file(sock_fd, sink, None))
        task.add_done_callback(functools.partial(self._spliced, r, sink))

    def _progress(self, _got: int, _total: int) -> None:
        self.conn.since = self.engine.now

    def _spliced(self, r: Receiving, sink: FileSink, task: asyncio.Task[None]) -> None:
        r.working = False
        self.splicing = False
        conn = self.conn
        if conn.task is task:
            conn.task = None
        # (the bytes that left the socket, landed or not: the next request starts after them)
        r.got += sink.taken
        if isinstance(r.upload, Upload):
            r.upload.written += sink.received
        if self._gone(r):
            return
        exc = task.exception() if not task.cancelled() else ConnectionError("cancelled")
        if exc is not None and isinstance(exc, (EOFError, ConnectionError)):  # the client left mid-body
            self._abort(r.refuse(400))
            self.receiving = None
            conn.dead = True
            conn.transport.abort()
            return
        # The request ends here, not in the parser (which saw its head and part of its body
        # only): a new parser reads what comes after the body.
        url = conn.reader.restart()
        exchange = Exchange(r.method, url, r.mode, None, r.log)  # type: ignore[arg-type]
        if exc is not None:  # the file failed (a full disk: 507): the rest of the body is dropped
            status = status_of(exc)
            self._abort(r.refuse(status))
            self.receiving = None
            assert r.length is not None
            self.discard = r.length - r.got
            if self.discard > DISCARD_MAX:
                conn.dead = True  # (answered now, and closed)
            render(conn, exchange, error(status, "PUT", *fields_of(exc)))
            if conn.out:
                conn._flush()
            conn._update_reading()
            return
        if r.mode == CLOSE:
            conn.dead = True
        self.complete(r, exchange)
        conn._update_reading()

    def _written(self, r: Receiving, n: int, job: concurrent.futures.Future[None]) -> None:
        r.working = False
        if self._gone(r):
            return
        exc = failure(job)
        if exc is not None:
            self._refused(r, status_of(exc), *fields_of(exc))
            return
        r.buffered -= n
        self.conn._update_reading()
        self._pump(r)

    def _committed(self, r: Receiving, job: concurrent.futures.Future[Any]) -> None:
        r.working = False
        upload, r.upload = r.upload, None
        exc = failure(job)
        if exc is not None:
            self._abort(upload)  # (a hidden temporary file left by a failed link)
        self._let_go(upload)
        conn = self.conn
        if conn.transport is None:
            return
        exchange = r.done
        assert isinstance(exchange, Exchange)
        self.landing = None
        conn._free()
        if exc is not None:
            render(conn, exchange, error(status_of(exc), "PUT", *fields_of(exc)))
        else:
            assert upload is not None
            render(conn, exchange, upload.answer(job.result()))
        conn._resume()

    def _refused(self, r: Receiving, status: int, *extra: tuple[str, str], now: bool = False) -> None:
        """Refused before its body is all there: what came is dropped, and the answer waits for
        the rest (read and dropped, so that the client reads the answer, not a reset), unless
        the client waits for 100 Continue, more than ``DISCARD_MAX`` is to come, or *now*: then
        now, and the connection closes."""
        self._abort(r.refuse(status, *extra))
        self.continue_owed, owed = False, self.continue_owed
        self.splicing = False  # (what is still to come is read and dropped, or the connection closes)
        conn = self.conn
        if r.done is not None:
            exchange = r.done
            assert isinstance(exchange, Exchange)
            self.landing = None
            conn.busy = False
            render(conn, exchange, error(status, "PUT", *extra))
            conn._resume()
            return
        to_come = None if r.length is None else r.length - r.got
        if now or owed or to_come is None or to_come > DISCARD_MAX:
            self.receiving = None
            conn._fail(status, extra)
            if conn.out:
                conn._flush()
            if not conn.busy:
                conn._close()
            return
        conn._update_reading()

    def _gone(self, r: Receiving) -> bool:
        """Whether *r* is over for this connection (the connection is gone, or *r* was refused
        meanwhile): then its upload is aborted here (``Receiving.refuse`` and ``drop`` leave that
        to the job that was in the pool)."""
        if self.conn.transport is None or r.refused is not None:
            self._abort(r.upload)
            r.upload = None
            return True
        return False

    def _abort(self, upload: Upload | FormUpload | None) -> None:
        if upload is not None:
            self._let_go(upload)
            job = self.engine.executor.submit(upload.abort)
            cleanups = self.engine.cleanups
            cleanups.add(job)
            job.add_done_callback(cleanups.discard)

    def _let_go(self, upload: Upload | FormUpload | None) -> None:
        """*upload*'s request is over: no newer request has this connection to stop."""
        if isinstance(upload, ResumableUpload) and self.engine.appending.get(upload.id) is self.conn:
            del self.engine.appending[upload.id]
