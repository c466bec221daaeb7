"""What is being sent to and from: resolve targets and files, decide if zero-copy can work.

Zero-copy is used only where we know the bytes on the socket are exactly the
bytes we hand to the kernel:

* the target is a plain (non-TLS) stream socket, or a transport of a class we
  know writes straight to its socket: asyncio's selector socket transport, or
  uvloop's TCP/Unix transports. A transport of any other class (a TLS
  wrapper, a proxy, a test double) gets the userspace fallback, since it may
  frame or encrypt what it writes;
* the file is a regular file with a real fd;
* the platform has ``os.sendfile``.

``is_tls`` is the package's one test of whether a target speaks TLS. The transport classes
are other libraries' internals: ``_compat`` names them.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import stat
from dataclasses import dataclass
from typing import Any

from . import _compat, _platform

__all__ = ("FileInfo", "Target", "is_tls", "resolve_file", "resolve_target")


@dataclass
class Target:
    """A resolved send target: exactly one of ``transport`` or ``sock`` is set."""

    transport: Any = None
    writer: asyncio.StreamWriter | None = None
    sock: socket.socket | None = None
    sock_fd: int = -1
    zero_copy_reason: str | None = None  # None: zero-copy can work; else why not

    @property
    def zero_copy(self) -> bool:
        return self.zero_copy_reason is None


@dataclass
class FileInfo:
    """A resolved file: ``fd`` and ``size`` are set for regular files only."""

    file: Any
    fd: int | None
    size: int | None
    seekable: bool


def is_tls(target: Any) -> bool:
    """Whether *target* speaks TLS: the one test every module uses.

    A transport or ``StreamWriter`` (asyncio's and uvloop's TLS transports report both their
    ``sslcontext`` and, once the handshake is done, their ``ssl_object``; either counts), or a
    socket (an ``ssl.SSLSocket``). A plain transport, StreamWriter or socket: False.
    """
    if isinstance(target, socket.socket):
        import ssl

        return isinstance(target, ssl.SSLSocket)
    return target.get_extra_info("sslcontext") is not None or target.get_extra_info("ssl_object") is not None


def _carries_tls(transport: Any) -> bool:
    """A raw transport under a TLS layer (kept from before ``start_tls``): writing to it bypasses TLS."""
    return isinstance(transport.get_protocol(), _compat.tls_protocol_types())


def resolve_target(target: Any) -> Target:
    """Accept a StreamWriter, a transport or a non-blocking stream socket."""
    if isinstance(target, socket.socket):
        return resolve_socket(target)
    writer: asyncio.StreamWriter | None = None
    transport: Any = target
    if isinstance(target, asyncio.StreamWriter):
        writer, transport = target, target.transport
    if not all(hasattr(transport, m) for m in ("write", "set_protocol", "get_extra_info")):
        _refuse_unframed(transport)
        raise TypeError(
            "target must be an asyncio.StreamWriter, a transport or a socket.socket, "
            f"not {type(target).__name__}"
        )
    if transport.is_closing():
        raise RuntimeError("Transport is closing")
    if _carries_tls(transport):
        raise RuntimeError("this transport carries TLS (after start_tls): pass the TLS transport instead")
    result = Target(transport=transport, writer=writer)
    native = isinstance(transport, _compat.native_transport_types())  # a bool: keeps ``transport`` Any
    if not _platform.HAS_SENDFILE:
        result.zero_copy_reason = "os.sendfile is not available on this platform"
    elif is_tls(transport):
        result.zero_copy_reason = "TLS transport: the kernel cannot encrypt"
    elif not native:
        _refuse_unframed(transport)
        result.zero_copy_reason = f"unknown transport type {type(transport).__name__}"
    else:
        sock = transport.get_extra_info("socket")
        result.sock_fd = sock.fileno() if sock is not None else -1
        if result.sock_fd < 0:
            result.zero_copy_reason = "transport has no socket"
    return result


def _refuse_unframed(transport: Any) -> None:
    """A datagram transport or a pipe's is refused as ``loop.sendfile`` refuses it (RuntimeError),
    saying which it is: neither is a stream socket's (the copy would fail in the transport's
    ``write`` or ``is_reading``, with a bare ``NotImplementedError``). Asked of transports
    zero-copy does not know only."""
    get = getattr(transport, "get_extra_info", None)
    sock = get("socket") if get is not None else None
    if isinstance(transport, asyncio.DatagramTransport) or getattr(sock, "type", None) == socket.SOCK_DGRAM:
        kind = "a datagram transport carries no byte stream"
    elif isinstance(transport, _compat.pipe_transport_types()) or (
        get is not None and get("pipe") is not None
    ):
        kind = "a pipe (sendfile writes to a stream socket's transport)"
    else:
        return
    raise RuntimeError(f"sendfile is not supported for transport {transport!r}: {kind}")


def resolve_socket(sock: socket.socket) -> Target:
    """Check a raw socket as ``loop.sock_sendfile`` does."""
    if is_tls(sock):
        raise TypeError("Socket cannot be of type SSLSocket")
    if sock.type != socket.SOCK_STREAM:
        raise ValueError("only SOCK_STREAM type sockets are supported")
    if sock.gettimeout() != 0:
        raise ValueError("the socket must be non-blocking")
    if sock.fileno() < 0:
        raise OSError(9, "Bad file descriptor: the socket is closed")
    reason = None if _platform.HAS_SENDFILE else "os.sendfile is not available on this platform"
    return Target(sock=sock, sock_fd=sock.fileno(), zero_copy_reason=reason)


def resolve_file(file: Any) -> FileInfo:
    """Check the file is open, binary and readable; find its fd and size if regular.

    Only a plain OS file (``io.FileIO``, or a buffered reader over one) may use
    its fd. A ``GzipFile``, ``BZ2File`` or ``LZMAFile`` also has ``fileno()``,
    but it decodes what it reads, so it is read through ``read()``.
    """
    mode = getattr(file, "mode", "b")
    if isinstance(file, io.TextIOBase) or (isinstance(mode, str) and "b" not in mode):
        raise ValueError("file should be opened in binary mode")
    if getattr(file, "closed", False):
        raise ValueError("I/O operation on closed file")
    if not callable(getattr(file, "read", None)):
        raise TypeError(f"file must be a binary file object, not {type(file).__name__}")
    readable = getattr(file, "readable", None)
    if callable(readable) and not readable():
        raise ValueError("file is not open for reading")
    seekable = bool(getattr(file, "seekable", lambda: False)())
    if _is_os_file(file):
        fd = file.fileno()
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            return FileInfo(file, fd, st.st_size, seekable)
    return FileInfo(file, None, None, seekable)


def _is_os_file(file: Any) -> bool:
    if isinstance(file, io.FileIO):
        return True
    return isinstance(file, (io.BufferedReader, io.BufferedRandom)) and isinstance(file.raw, io.FileIO)
