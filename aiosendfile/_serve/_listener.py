"""The engine's own accept loop: many connections per wakeup, bounded, on both loops.

uvloop's ``create_server`` accepts one connection per wakeup of the listening socket (libuv >=
1.45 leaves the rest to level-triggered polling: libuv PR #3696). While the loop is saturated a
turn lasts 50-300 ms, so a burst of new connections is accepted at 3-20 a second: measured with
``wrk -c1024`` on the mixed cold set, up to 200 connections waited in the listen queue for
seconds, and wrk counted their first requests as timeouts (stock asyncio, which accepts up to the
backlog per wakeup, had none). :class:`Listener` accepts up to ``ACCEPT_BATCH`` connections per
wakeup instead (bounded work per turn, as nginx's ``multi_accept``), and hands each to the loop
with the public ``connect_accepted_socket``.

A new connection costs what it must and no more (one request per connection is what health
checks, scripts and every browser's first request pay): the descriptor comes from ``accept4``
alone (``_platform.acceptor``: no address formatted, no exception for the EAGAIN that ends each
batch, no ``ioctl`` making it blocking only for the loop to make it non-blocking again) into a
socket class whose family and type are plain attributes (the loop reads them three times; for
uvloop no socket object at all, ``_compat.AdoptedSocket``), and
``connect_accepted_socket``'s coroutine is stepped here, at once, up to its one wait (for the
protocol's ``connection_made``), and finished from that future's callback: no task per
connection (its creation, its entry in asyncio's set of tasks, and a turn of the loop before its
first step). The instructions these save are counted in docs/performance.md.

:func:`listening_socket` makes the socket, for the engine and for the command line (which binds
before its workers start). :class:`Listener` is what :func:`~._server.start_server` returns:
``close()`` stops accepting (connections in their TLS handshake are cancelled), ``wait_closed()``
waits for that, ``sockets`` is the listening socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import socket
import ssl as _ssl
import stat
from collections.abc import Callable, Coroutine
from typing import Any

from .. import _compat, _platform
from ._tls import HANDSHAKE_TIMEOUT, TLSTransport

try:
    import fcntl
except ImportError:  # (Windows)
    fcntl = None  # type: ignore[assignment]

__all__ = ("ACCEPT_BATCH", "ACCEPT_RETRY_DELAY", "BACKLOG", "Listener", "grow_fd_table", "listening_socket")

#: At a stop, the TLS connections still lingering (see ``_tls``) get this long to end, then close.
LINGER_AT_STOP = 0.5
LINGER_AT_STOP_STEPS = 10

#: The listen queue (the kernel caps it at ``net.core.somaxconn``).
BACKLOG = 4096

#: Connections accepted per wakeup of the listening socket, at most (each costs tens of µs).
ACCEPT_BATCH = 256
#: Out of descriptors or memory: accepting pauses this long (asyncio's own figure), then resumes.
ACCEPT_RETRY_DELAY = 1.0
_SHORTAGE = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
_NONE_WAITING = (-errno.EAGAIN, -errno.EWOULDBLOCK, -errno.EINTR)
_TCP = (socket.AF_INET, socket.AF_INET6)


#: Descriptors :func:`grow_fd_table` sizes the table for at most (its pointers: 512 KiB).
FD_TABLE_MAX = 65536
_fd_table_grown = (0, 0)  # (pid, descriptors): a forked child's table is sized afresh by the kernel


def grow_fd_table(count: int = FD_TABLE_MAX) -> int:
    """Size this process's descriptor table for *count* descriptors now (at most the soft
    ``RLIMIT_NOFILE``), once: what it is sized for (0: not here).

    The kernel grows the table by doubling as descriptors are opened, and in a process with
    threads each growth waits for an RCU grace period on the thread that opened one: measured
    6-20 ms at 256, 512, 1,024... descriptors on this project's 2-vCPU VM, on a server the loop's
    thread (an ``accept``, an ``open``, a ``dup``) while every connection waits. Grown here at a
    server's start, it never grows while serving (the table never shrinks). A descriptor is
    placed past the top with ``F_DUPFD`` (the lowest free one from there: nothing open is
    touched) and closed again."""
    global _fd_table_grown
    pid = os.getpid()
    grown = _fd_table_grown[1] if _fd_table_grown[0] == pid else 0
    if fcntl is None or count <= grown:
        return grown
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 0
    if soft != resource.RLIM_INFINITY:
        count = min(count, soft)
    if count <= 64:  # (the table a process starts with)
        return 0
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, count - 1))
    except OSError as exc:
        if exc.errno != errno.EMFILE:  # (EMFILE: every one from there is open, so the table is there)
            return grown
    finally:
        os.close(fd)
    _fd_table_grown = (pid, count)
    return count


def listening_socket(
    host: str | None,
    port: int | None,
    *,
    path: str | None = None,
    reuse_port: bool = False,
    listen: bool = True,
) -> socket.socket:
    """A socket bound to the Unix *path* (a stale socket file there replaced, as asyncio's
    ``create_unix_server`` does) or to *host*/*port* (``SO_REUSEADDR``; ``SO_REUSEPORT`` with
    *reuse_port*), listening with :data:`BACKLOG` unless *listen* is False."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.stat(path).st_mode):
                os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: Any = path
    else:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port or 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    try:
        if path is None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class Listener:
    """Accepts connections on a listening socket for *factory*'s protocols (see the module)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        ssl: _ssl.SSLContext | None,
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._factory = factory
        self._ssl = ssl
        self._handshake_timeout = handshake_timeout
        # Accepted sockets take the listening socket's proto, and asyncio sets TCP_NODELAY only
        # where it is IPPROTO_TCP (a socket made with proto 0, as socket.socket() makes it); our
        # TLS transport sets none.
        self._nodelay = sock.family in _TCP and (ssl is not None or sock.proto != socket.IPPROTO_TCP)
        self._accept_fd = _platform.acceptor(sock)
        self._family, self._kind, self._proto = sock.family, sock.type, sock.proto
        # (the family and type as plain class attributes: socket.socket's are properties that
        # convert them to enums at each read)
        self._accepted = type(
            "AcceptedSocket", (socket.socket,), {"__slots__": (), "family": self._family, "type": self._kind}
        )
        # uvloop takes the descriptor alone (it sets TCP_NODELAY itself): no socket object
        self._adopt = ssl is None and _compat.adopts_descriptors(loop)
        # Plain connections being set up: connect_accepted_socket's coroutine, by the future it
        # waits for. TLS ones (our own transport, see _tls) in their handshake.
        self._setups: dict[asyncio.Future[Any], Coroutine[Any, Any, Any]] = {}
        self._tls_setups: set[TLSTransport] = set()
        # TLS connections closed, reading what their clients still send (see _tls); closed by
        # wait_closed.
        self._lingering: set[TLSTransport] = set()
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._accept)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._closed else (self._sock,)

    def _accept(self) -> None:
        if self._closed:  # (the compiled accept holds the descriptor's number, which may be reused)
            return
        sock, accept_fd = self._sock, self._accept_fd
        for _ in range(ACCEPT_BATCH):
            fd = accept_fd()
            if fd < 0:
                if fd in _NONE_WAITING:
                    return
                if fd == -errno.ECONNABORTED:  # reset while in the queue
                    continue
                exc = OSError(-fd, os.strerror(-fd))
                if -fd not in _SHORTAGE:
                    raise exc
                # Out of descriptors: stop reading the listening socket a while (the queue keeps
                # the connections), as asyncio does, instead of spinning on it.
                self._loop.remove_reader(sock.fileno())
                self._retry = self._loop.call_later(ACCEPT_RETRY_DELAY, self._resume)
                self._loop.call_exception_handler(
                    {"message": "serve: out of descriptors accepting connections; retrying", "exception": exc}
                )
                return
            self._attach(fd)

    def _attach(self, fd: int) -> None:
        """Set the connection *fd* up: its transport and protocol."""
        if self._adopt:
            adopted = _compat.AdoptedSocket(fd, self._family, self._kind)
            setup = self._loop.connect_accepted_socket(self._factory, adopted)  # type: ignore[arg-type]
            self._step(setup, None, adopted)
            return
        # (family, type and protocol given: CPython asks the kernel none of them)
        conn = self._accepted(self._family, self._kind, self._proto, fileno=fd)
        # connect_accepted_socket makes the socket non-blocking on both loops, and sets TCP_NODELAY
        # (uvloop always, asyncio where the socket's proto says TCP): two syscalls a connection
        # not made twice.
        if self._nodelay:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            try:
                transport = TLSTransport(
                    self._loop,
                    conn,
                    self._ssl,
                    self._factory,
                    handshake_timeout=self._handshake_timeout,
                    on_ready=self._tls_ready,
                    lingering=self._lingering,
                )
            except (OSError, ValueError):  # reset before its set-up began: nothing to set up
                conn.close()
                return
            if transport.in_setup:
                self._tls_setups.add(transport)
            return
        # connect_accepted_socket's first step makes the protocol and the transport (which owns
        # *conn* from then on; connection_made comes in the loop's next turn) and waits for a
        # future the loop resolves then. Should that step fail, *conn* is closed in _step.
        self._step(self._loop.connect_accepted_socket(self._factory, conn), None, conn)

    def _step(
        self,
        setup: Coroutine[Any, Any, Any],
        waited: asyncio.Future[Any] | None = None,
        given: socket.socket | _compat.AdoptedSocket | None = None,
    ) -> None:
        """Run *setup* (``connect_accepted_socket``'s coroutine) to its next wait, as a task
        would: the future it yields is awaited by a callback that steps it again. *given*: the
        connection its first step is given, closed here if that step fails (neither loop closes
        it when the protocol cannot be made; closing it again after the transport's own close is
        a no-op, and an adopted descriptor is closed only if no transport took it)."""
        if waited is not None:
            self._setups.pop(waited, None)
        try:
            future = setup.send(None)
        except StopIteration:
            return
        except (OSError, asyncio.CancelledError) as exc:
            _abandon(given, exc)
            return  # a reset: the peer's problem, not ours
        except Exception as exc:
            _abandon(given, exc)
            self._loop.call_exception_handler(
                {"message": "serve: a connection could not be set up", "exception": exc}
            )
            return
        if not isinstance(future, asyncio.Future):  # (a bare yield: a task would step it next turn)
            self._loop.call_soon(self._step, setup)
            return
        self._setups[future] = setup
        future.add_done_callback(functools.partial(self._step, setup))

    def _tls_ready(self, transport: TLSTransport) -> None:
        """A TLS set-up ended: its handshake done (its protocol is made next) or failed."""
        self._tls_setups.discard(transport)

    def _resume(self) -> None:
        self._retry = None
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting; close the connections still in their TLS handshake. A plain set-up
        (begun at its accept) is left to finish within its turn; the engine closes a connection
        made while it stops."""
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        else:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for transport in list(self._tls_setups):
            transport.cancel_setup()

    async def wait_closed(self) -> None:
        if self._setups:
            await asyncio.wait(list(self._setups))
        for _ in range(LINGER_AT_STOP_STEPS):  # the lingering close of the last answers, briefly
            if not self._lingering:
                break
            await asyncio.sleep(LINGER_AT_STOP / LINGER_AT_STOP_STEPS)
        for transport in list(self._lingering):
            transport.end_linger()


def _abandon(given: socket.socket | _compat.AdoptedSocket | None, exc: BaseException) -> None:
    """A connection whose set-up failed with *exc*: closed, unless a transport took it."""
    if isinstance(given, _compat.AdoptedSocket):
        given.abandon(exc)
    elif given is not None:
        given.close()
