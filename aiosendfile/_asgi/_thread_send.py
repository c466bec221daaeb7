"""A file response written by the request's own thread, as a WSGI server writes it.

A sync view's request already runs on a thread of its own. A WSGI server (gunicorn) has that
thread write the response too, ``sendfile`` and all, and close it: the request's objects die
young and no hop back to the loop is needed to send. :class:`ThreadWrite` does the same for a
server that offers it (our uvicorn protocol, plain TCP and Unix sockets), without letting a peer
hold the thread: every call is non-blocking, and what would have to wait (a full socket) is left
to the loop, which carries on from where the thread stopped.

The socket is reached through a duplicate of the transport's descriptor, made on the request's
thread and checked to be the same socket (a socket, its device and inode, taken on the loop's
thread), so a connection the loop closes meanwhile never sends to another's reused descriptor.
Nothing else writes on the connection while the thread may: the server marks the response
started when it offers the write, until the loop gives it back (nothing written) or completes
it; the loop reads what the thread did (:class:`ThreadWrite`'s fields) only after the thread is
done.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from .. import _platform
from .._target import resolve_target

__all__ = ("THREAD_WRITE", "ThreadSocket", "ThreadWrite")

#: The extension a server offering this lists: ``scope["extensions"][THREAD_WRITE]["open"]()``,
#: on the loop's thread, gives an object with ``write(status, headers, fd, offset, count)`` (on
#: the request's thread; False: nothing sent), ``complete`` and ``await finish()`` (on the loop's,
#: whenever ``write`` returned True, else ``release()``: the response is the loop's to send), or
#: None where the thread cannot write.
THREAD_WRITE = "aiosendfile.thread_write"


class ThreadSocket:
    """A connection's socket as a request's thread reaches it: its descriptor and the identity
    of what it names (device and inode), taken on the loop's thread (once a connection:
    :meth:`of`). The thread writes only if a duplicate of the descriptor still names that socket:
    a number closed and reused meanwhile (a file, another socket) is left alone."""

    __slots__ = ("fd", "identity")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            raise TypeError("not a socket")
        self.identity = (st.st_dev, st.st_ino)

    def names(self, fd: int) -> bool:
        """Whether *fd* is this socket."""
        st = os.fstat(fd)
        return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self.identity

    @staticmethod
    def of(transport: Any) -> ThreadSocket | None:
        """*transport*'s socket, or None where a thread must not write on it: where ``sendfile``
        would not go zero-copy (TLS, a foreign transport, no socket)."""
        try:
            target = resolve_target(transport)
            return ThreadSocket(target.sock_fd) if target.zero_copy else None
        except (OSError, RuntimeError, TypeError):
            return None


class ThreadWrite:
    """One response's write from the request's thread (see the module).

    Made on the loop's thread; :meth:`write` runs on the request's thread, once; the loop reads
    the outcome after it.
    """

    __slots__ = ("_socket", "attempted", "error", "file_left", "file_offset", "head_left", "truncated")

    def __init__(self, sock: ThreadSocket) -> None:
        self._socket = sock
        self.attempted = False  # write() began sending (the loop must finish the response)
        self.head_left = b""  # what the thread did not send, the loop sends: head bytes,
        self.file_offset = 0  # then the file from here,
        self.file_left = 0  # this many bytes
        self.error: OSError | None = None  # the connection failed (the loop gives it up)
        self.truncated = False  # the file ended before its count

    @property
    def complete(self) -> bool:
        """The whole response went out from the thread."""
        return self.attempted and not (self.error or self.truncated or self.head_left or self.file_left)

    def write(self, head: bytes, fd: int, offset: int, count: int) -> bool:
        """On the request's thread: send *head*, then *count* bytes of *fd* from *offset*, as far
        as the socket takes them now. False if nothing was tried (the descriptor is no longer
        the connection's socket): the loop sends it all its own way."""
        sock = self._socket
        try:
            out = os.dup(sock.fd)
        except OSError:
            return False
        try:
            if not sock.names(out):
                return False
            self.attempted = True
            self._write(out, memoryview(head), fd, offset, count)
        finally:
            os.close(out)
        return True

    def _write(self, out: int, head: memoryview, fd: int, offset: int, count: int) -> None:
        try:
            while head:
                head = head[os.write(out, head) :]
            while count:
                sent = _platform.sendfile_once(out, fd, offset, count)
                if sent == 0:
                    self.truncated = True
                    break
                offset += sent
                count -= sent
        except (BlockingIOError, _platform.NotSupportedBySendfile):
            pass  # the socket is full (the loop waits for it), or the file needs the loop's copy
        except OSError as exc:
            self.error = exc
        self.head_left = bytes(head)
        self.file_offset = offset
        self.file_left = count
