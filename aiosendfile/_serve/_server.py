"""The engine's API: :class:`ServeConfig`, :func:`start_server` and :func:`shutdown`.

One :class:`Engine` per server holds what its connections share: the directory policy, the answer
cache (raw target path → :data:`Known`: what the core's ``Decided`` says of a plain 200 of a file
of any size, with the engine's rendered head), the set of paths decided in the last
``RECENT_SECONDS`` (``_static._recent``: decided inline, as is a path whose lookup the kernel's
caches hold; any other is looked up in the cold pool first), the clock of per-second tails, the
access log, the queue of connections (and file bodies whose cold pages came in) waiting for the
loop's next iteration (``ITERATION_BUDGET``) and a timer. Connections come from its own accept
loop (``_listener``). The timer ticks at each wall-clock second (more often when a timeout is
shorter than 4 s): it re-renders the ``Date`` tails, flushes the access log and closes
connections past their header, keep-alive or send timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import ssl as _ssl
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple, TextIO

from .._bodies import Turn
from .._coldread import PageWaits
from .._options import default_cold_executor
from .._static._answers import Decided
from .._static._archive import DEFAULT_MAX_ENTRIES
from .._static._fs import directory_policy
from .._static._memo import MEMO_MAX_KEY, Memo
from .._static._recent import RecentPaths
from ._accesslog import AccessLog
from ._auth import Gate, Secret, TrustedProxies
from ._date import Clock
from ._exchange import Exchange, Head, LogFields
from ._listener import BACKLOG, Listener, grow_fd_table, listening_socket
from ._partial import AVAILABLE, Limits, Store
from ._protocol import HttpProtocol
from ._reader import ReaderRules, header_kinds
from ._rules import HostRule
from ._target import split_head

__all__ = ("ANSWERS_ENTRIES", "Engine", "Known", "ServeConfig", "Uploads", "shutdown", "start_server")

#: What the engine keeps of a plain 200 (the core's ``Decided``, with its rendering): the file's
#: identity, its path, the rendered head (without the per-second tail), whether it is small
#: enough to be answered from the hot-file cache, and for an answer a browser's request may have
#: (``Accept-Encoding`` alone, decided with no name a pre-compressed sibling could have beside
#: the file) the file's directory and its identity then (``_fs.folder_identity``), else two
#: None: an answer kept for a plain request says nothing of siblings, so a browser's is decided.
#: No body: a small file's bytes are the hot-file cache's (``_static._hot``, bounded on its own),
#: any other file is opened again, checked against the identity by ``fstat``, and sent from it. A
#: tuple of atomic values, which the garbage collector stops tracking after its first passes: a
#: working set of ten thousand answers adds nothing to its passes (docs/performance.md, "Caches
#: the collector does not walk").
Known = tuple[tuple[int, ...], str, bytes, bool, "str | None", "tuple[int, ...] | None"]

#: Entries in the engine's answer cache (each charged its key, path, head and ``ENTRY_OVERHEAD``:
#: about 900 bytes, so its 16 MiB hold them all): a site's working set of files, not a few hot ones.
ANSWERS_ENTRIES = 16384
#: The heads memo (``Engine.heads``): a client asking again for what it asked before (a browser's
#: keep-alive requests, a health check, a load test) sends the same bytes, and their parse is
#: skipped. A head longer than ``HEADS_MAX_KEY`` is parsed each time; ``HEADS_ENTRIES`` heads of
#: ``HEADS_MAX_BYTES`` at most (each charged its key, its target and logged fields, and
#: ``ENTRY_OVERHEAD``), those not used longest going first (``_memo``).
HEADS_ENTRIES = 16384
HEADS_MAX_BYTES = 8 * 1024 * 1024
HEADS_MAX_KEY = 2048
#: Head blocks (``_target.split_head``: a request line without its target, and the header fields
#: after it) whose parse the engine knows (``Engine.blocks``): a client asks for new paths with the
#: same fields each time (a browser, a crawler, a load test), and such a head is not parsed
#: either. Bounded as the heads memo (a peer that sends a new block each time only churns it).
BLOCKS_ENTRIES = 1024
BLOCKS_MAX_BYTES = 2 * 1024 * 1024
#: What a known block parses to: the method, the mode, the logged fields, a browser's
#: Accept-Encoding (``Head`` but the target, and no guard: blocks are kept only without a gate),
#: and what the logged fields are charged in the heads memo.
Block = tuple[bytes, int, "LogFields | None", "tuple[bytes, bytes] | None", int]
#: How long the connections may answer requests in one iteration of the event loop. Past it, a
#: connection with a new read (or a turn to take) waits for the next iteration, in arrival order:
#: the loop's timers, its other callbacks and its new events run in between, so no iteration grows
#: with the number of busy connections (1,024 of them, at about 20 µs a request, held the loop
#: 20 ms). Chosen with ``benchmarks.mixed_stall``: 0.5 ms gave a lower p99.9 loop delay than 1 ms
#: on both loops, 2 ms a higher one, at no cost per request measurable on hot 4 KiB files.
ITERATION_BUDGET = 0.0005
#: The share of it on stock asyncio. There an iteration runs the turns scheduled in the one before
#: (``call_soon``) ahead of its due timers, and a woken task's step a further iteration later, so
#: a sleeping task waits through two batches of turns where uvloop (timers first) makes it wait
#: through one: half the budget gives both loops the same delay.
CALLBACKS_FIRST_SHARE = 0.5
#: Expired partial uploads are looked for at the start and this often (seconds; more often when
#: they expire sooner).
SWEEP_EVERY = 600.0


@dataclass(frozen=True)
class ServeConfig:
    """What ``serve`` serves and how (one per server; workers each build the same)."""

    directory: str
    show_index: bool = False
    follow_symlinks: bool = False
    show_dotfiles: bool = False
    access_log: TextIO | None = None  # a line per response (access_log_format: combined, common, json)
    access_log_format: str = "combined"
    header_timeout: float = 20.0  # a request head must arrive within this (slowloris): 408, close
    keepalive_timeout: float = 75.0  # an idle keep-alive connection is closed after this (nginx)
    send_timeout: float = 60.0  # a file body that makes no progress this long is aborted (nginx)
    max_request_line: int = 8190  # longer request target: 414; a longer header field: 431
    max_header_bytes: int = 16384  # larger header fields together: 431
    auth: tuple[tuple[bytes, Secret], ...] = ()  # users who may come in (HTTP Basic); none: anyone
    public_read: bool = False  # with auth: GET and HEAD need none
    upload: bool = False  # PUT writes files (see _upload)
    overwrite: bool = False  # ... and may replace one
    max_upload_size: int | None = None  # bytes; a larger body is refused (413)
    resumable: bool = True  # with upload: resumable uploads (IETF draft, tus 1.0; see _partial)
    upload_expiry: float = 86400.0  # seconds without progress before a partial upload is removed
    max_partial_uploads: int = 16  # uploads in progress per user (or address)
    max_partial_size: int = 64 << 30  # and their bytes
    hosts: HostRule | None = None  # the Host names served (421 for others); None: any
    trusted_proxies: tuple[str, ...] = ()  # proxies whose forwarded client is locked out and logged
    path_prefix: str = ""  # served under this path ("/files": /files/a.txt is DIRECTORY/a.txt); 404 outside
    archives: bool = False  # with show_index: GET /folder/?tar is the folder as a tar archive
    max_archive_entries: int = DEFAULT_MAX_ENTRIES  # an archive of a larger folder: 413
    max_archive_size: int | None = None  # bytes of files; a larger folder's archive: 413


class Uploads(NamedTuple):
    """What ``PUT`` may do (the engine's, when uploads are on)."""

    overwrite: bool
    max_size: int | None


class Engine:
    """The state the connections of one server share (see the module docstring)."""

    def __init__(self, config: ServeConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.policy = directory_policy(
            config.directory,
            listings=config.show_index,
            dotfiles=config.show_dotfiles,
            follow_symlinks=config.follow_symlinks,
            upload_form=config.upload,
            resumable_uploads=config.upload and config.resumable and AVAILABLE,
            archives=config.archives,
            max_archive_entries=config.max_archive_entries,
            max_archive_size=config.max_archive_size,
            relative_locations=True,
        )
        self.cache_root = self.policy.cache_root  # (read on the hot path)
        #: the path everything is served under, decoded, without its trailing "/" ("" for none)
        self.prefix = config.path_prefix.rstrip("/")
        self.clock = Clock(private=bool(config.auth) and not config.public_read)
        self.log = (
            AccessLog(config.access_log, config.access_log_format) if config.access_log is not None else None
        )
        #: who may come in (``_auth``): None without ``auth``
        self.gate = Gate(dict(config.auth), config.public_read) if config.auth else None
        #: what PUT may do: None without ``upload``
        self.uploads = Uploads(config.overwrite, config.max_upload_size) if config.upload else None
        #: resumable uploads' records and partial files: None without them
        self.resumable = (
            Store(
                self.policy,
                config.overwrite,
                Limits(
                    config.upload_expiry,
                    config.max_partial_uploads,
                    config.max_partial_size,
                    config.max_upload_size,
                ),
            )
            if config.upload and config.resumable and AVAILABLE
            else None
        )
        #: resumable upload id → the connection writing it (a newer request for it stops that one)
        self.appending: dict[str, HttpProtocol] = {}
        #: uploads' jobs under way in the pool (``shutdown`` waits for them): each one's open,
        #: write or commit until its end ran on the loop, and the abort of one refused or cut
        self.cleanups: set[concurrent.futures.Future[Any]] = set()
        self.next_sweep = 0.0  # (loop time) when expired partial uploads are next looked for
        #: the proxies whose forwarded client address names the client, for the gate (with auth),
        #: the access log and uploads' shares: None without any of them
        self.trusted = (
            TrustedProxies(config.trusted_proxies)
            if config.trusted_proxies and (config.auth or config.access_log is not None or config.upload)
            else None
        )
        self.hosts = config.hosts
        self.sandbox = config.upload  # answers of types that run script get CSP sandbox (_rules)
        #: what each connection's request reader checks and keeps
        self.rules = ReaderRules(
            header_kinds(
                self.log is not None,
                self.gate is not None,
                self.uploads is not None,
                self.trusted is not None,
            ),
            config.max_request_line,
            config.max_header_bytes,
            hosts=self.hosts,
            trusted=self.trusted,
            log=self.log is not None,
            gated=self.gate is not None,
            public_read=self.gate is not None and self.gate.public_read,
            uploads=self.uploads is not None,
        )
        #: raw target path → the plain 200 of a file of any size; bounded with its keys.
        self.answers: Memo[bytes, Known] = Memo(max_entries=ANSWERS_ENTRIES)
        #: a read that was exactly one plain request head → what it parsed to; bounded with its keys.
        self.heads: Memo[bytes, Head] = Memo(max_entries=HEADS_ENTRIES, max_bytes=HEADS_MAX_BYTES)
        #: a head block the parser judged → what a head of it parses to (None with a gate, whose
        #: judgement depends on the target)
        self.blocks: Memo[bytes, Block] | None = (
            Memo(max_entries=BLOCKS_ENTRIES, max_bytes=BLOCKS_MAX_BYTES) if self.gate is None else None
        )
        self.recent = RecentPaths()
        self.executor = default_cold_executor()
        #: cold pages read in off the loop, each body told once they are in (None: on a timer)
        self.pages = PageWaits.here(loop)
        self.connections: set[HttpProtocol] = set()
        self.now = loop.time()
        self.iteration_open = False  # a request was answered in this iteration of the loop
        self.iteration_start = 0.0  # (time.perf_counter) when the first one began
        # (asyncio's own loops run callbacks before timers; uvloop is no BaseEventLoop)
        self.budget_share = CALLBACKS_FIRST_SHARE if isinstance(loop, asyncio.BaseEventLoop) else 1.0
        #: connections (and file bodies whose pages came in) waiting for an iteration's time
        self.waiting: deque[Turn] = deque()
        timeouts = (config.header_timeout, config.keepalive_timeout, config.send_timeout)
        self.period = min(1.0, *(t / 4 for t in timeouts))
        self.timer: asyncio.TimerHandle | None = None
        self.all_gone: asyncio.Future[None] | None = None
        self.stopping = False  # shutdown() has begun
        self._tick()

    def protocol(self) -> HttpProtocol:
        return HttpProtocol(self)

    # -- what connections ask ----------------------------------------------------------------

    def remember(
        self, raw: bytes, decided: Decided, head: bytes, folder: tuple[str, tuple[int, ...]] | None = None
    ) -> bool:
        """Keep the plain 200 of *raw* (its *head* rendered; a browser's may have it with its
        *folder*) as a :data:`Known` (:meth:`keep`)."""
        return self.keep(raw, decided.identity, decided.path, head, decided.small, folder)

    def keep(
        self,
        raw: bytes,
        identity: tuple[int, ...],
        path: str,
        head: bytes,
        small: bool,
        folder: tuple[str, tuple[int, ...]] | None = None,
    ) -> bool:
        """Keep the plain 200 of *raw*, the file *path* of *identity*, as a :data:`Known`, charged
        its key, path, head and folder; False if the key is too long."""
        if len(raw) > MEMO_MAX_KEY:
            return False
        cost = len(raw) + len(path) + len(head)
        where, ident = None, None
        if folder is not None:
            where, ident = folder
            cost += len(where)
        return self.answers.put(raw, (identity, path, head, small, where, ident), cost)

    def learn(self, data: bytes, x: Exchange) -> None:
        """Remember that the read *data* was exactly the plain request *x* (a parse is a function
        of its bytes alone: the limits and what is logged are the engine's, fixed at its start)."""
        if len(data) <= HEADS_MAX_KEY:
            url, log, guarded, fields = x.url, x.log, x.guarded, x.fields  # (copies: charged too)
            logged = 0 if log is None else len(log[1] or b"") + len(log[2] or b"") + len(log[3] or "")
            if guarded is not None:
                logged += len(guarded[0] or b"") + len(guarded[1] or "")
            field = None
            if fields is not None:  # (a browser's Accept-Encoding alone: the reader's parsed)
                field = fields[0]
                logged += len(field[0]) + len(field[1])
            self.heads.put(data, (x.method, url, x.mode, log, guarded, field), len(data) + len(url) + logged)
            blocks = self.blocks
            if blocks is not None:
                split = split_head(data, self.rules.max_url)
                if split is not None and split[1] == url:  # (the target the parser read)
                    blocks.put(split[0], (x.method, x.mode, log, field, logged), len(split[0]) + logged)

    def head_like(self, data: bytes) -> Head | None:
        """What the read *data* parses to, if it is a known block (:meth:`learn`) with a plain
        target (``_target.split_head``), then kept in the heads memo as a parsed head is (a
        client asking for that path again is recognised at once); else None (parsed)."""
        blocks = self.blocks
        if blocks is None:
            return None
        split = split_head(data, self.rules.max_url)
        if split is None:
            return None
        block = blocks.get(split[0])
        if block is None:
            return None
        method, mode, log, field, logged = block
        target = split[1]
        head = method, target, mode, log, None, field
        if len(data) <= HEADS_MAX_KEY:
            self.heads.put(data, head, len(data) + len(target) + logged)
        return head

    def forget(self, raw: bytes) -> None:
        self.answers.pop(raw)

    def saw(self, raw: bytes) -> None:
        self.recent.saw(raw, self.now)

    def spent(self) -> bool:
        """Whether this iteration of the loop has used its :data:`ITERATION_BUDGET` (its
        :data:`CALLBACKS_FIRST_SHARE` on stock asyncio). The first call in an iteration starts its
        clock and schedules its end: a callback scheduled now runs at the start of the next
        iteration, before that iteration's new events."""
        now = time.perf_counter()
        if self.iteration_open:
            return now - self.iteration_start > ITERATION_BUDGET * self.budget_share
        self.iteration_open = True
        self.iteration_start = now
        self.loop.call_soon(self._iteration_over)
        return False

    def wait_turn(self, conn: Turn) -> None:
        """*conn* has something to answer (or a file body to go on with) and this iteration's time
        is spent: it takes a turn in a following iteration, after those that waited before it."""
        self.waiting.append(conn)

    def _iteration_over(self) -> None:
        """(The start of the next iteration.) Give the waiting connections their turns, in order,
        until this iteration's time is spent too; the rest wait on."""
        self.iteration_open = False
        waiting = self.waiting
        while waiting and not self.spent():
            waiting.popleft().take_turn()

    def lost(self, conn: HttpProtocol) -> None:
        self.connections.discard(conn)
        if not self.connections and self.all_gone is not None and not self.all_gone.done():
            self.all_gone.set_result(None)

    # -- the timer -----------------------------------------------------------------------------

    def _tick(self) -> None:
        wall = time.time()
        delay = self.period
        if delay >= 1.0:
            delay = 1.0 - (wall - int(wall)) + 0.001  # just past the next wall-clock second
        self.timer = self.loop.call_later(delay, self._tick)  # first: nothing below can stop the clock
        self.clock.update(wall)
        self.now = now = self.loop.time()
        if self.log is not None:
            self.log.flush()
        config = self.config
        for conn in list(self.connections):
            conn.expire(now, config)
        if self.resumable is not None and now >= self.next_sweep:
            self.next_sweep = now + min(SWEEP_EVERY, config.upload_expiry / 4)
            self.executor.submit(self._sweep)

    def _sweep(self) -> None:
        """(In the pool.) Remove the partial uploads that expired (a failure waits for next time)."""
        assert self.resumable is not None
        with contextlib.suppress(Exception):
            self.resumable.sweep()

    def stop(self) -> None:
        if self.pages is not None:
            self.pages.close()
        if self.gate is not None:
            self.gate.close()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.log is not None:
            self.log.flush()


_engines: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()


async def start_server(
    config: ServeConfig,
    *,
    sock: socket.socket | None = None,
    host: str | None = None,
    port: int | None = None,
    path: str | None = None,
    ssl: _ssl.SSLContext | None = None,
) -> Listener:
    """Serve *config* on the running loop: on *sock* (bound; listening or not), a Unix socket
    *path*, or *host*/*port*. Stop it with :func:`shutdown`."""
    loop = asyncio.get_running_loop()
    grow_fd_table()  # (no growth, so no wait for an RCU grace period, while serving)
    engine = Engine(config, loop)
    try:
        if sock is None:
            sock = listening_socket(host, port, path=path)
        else:
            sock.listen(BACKLOG)
        # A TLS handshake is part of the request's head: bounded by header_timeout, as nginx does.
        server = Listener(loop, sock, engine.protocol, ssl, handshake_timeout=config.header_timeout)
    except BaseException:
        engine.stop()
        raise
    _engines[server] = engine
    return server


async def shutdown(server: Any, timeout: float = 10.0) -> None:
    """Stop *server*: no new connections, idle ones closed at once, responses in flight given up
    to *timeout* seconds to finish, then every connection left aborted."""
    server.close()
    engine = _engines.pop(server, None)
    if engine is not None:
        engine.stopping = True  # (a connection whose set-up ends after this closes at once)
        for conn in list(engine.connections):
            conn.shutdown()
        if engine.connections:
            engine.all_gone = engine.loop.create_future()
            _, pending = await asyncio.wait([engine.all_gone], timeout=timeout)
            if pending:
                for conn in list(engine.connections):
                    if conn.transport is not None:
                        conn.transport.abort()
                await asyncio.wait([engine.all_gone], timeout=1.0)
        # Uploads' jobs ending (each may submit an abort on the loop as it ends), their temporary
        # files going, resumable ones' records noted: until none is left, within the timeout.
        deadline = engine.loop.time() + timeout
        while engine.cleanups and (left := deadline - engine.loop.time()) > 0:
            await asyncio.wait([asyncio.wrap_future(job) for job in list(engine.cleanups)], timeout=left)
            await asyncio.sleep(0)  # (an ended job's callback runs on the loop)
        engine.stop()
    await server.wait_closed()
