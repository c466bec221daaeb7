"""What ``serve``'s TLS connections (:mod:`._tls`) decide without a socket: plain HTTP met where a
ClientHello belongs, and its answer; what the banner says of kernel TLS on this machine.

Plain HTTP on the HTTPS port gets a plain 400 that says so, as nginx answers it. OpenSSL names
plain HTTP for ``GET``, ``HEAD``, ``POST``, ``PUT`` (and ``CONNECT``) only: any other method is a
bad version number to it, told here from what follows the five bytes it took for a record
header, as nginx tells plain HTTP from TLS by its first byte whatever the method.
"""

from __future__ import annotations

import re
import ssl

__all__ = ("PLAIN_REFUSAL", "kernel_tls", "plain_http", "tls_path")

_PLAIN_TEXT = b"400: a plain HTTP request was sent to an HTTPS port (ask with https://)\n"
#: The answer to plain HTTP on the HTTPS port (see ``TLSTransport._plain_refusal``).
PLAIN_REFUSAL = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"X-Content-Type-Options: nosniff\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
    % (len(_PLAIN_TEXT), _PLAIN_TEXT)
)
#: OpenSSL's reasons for a handshake that met plain HTTP (a request line, CONNECT's).
_PLAIN_REASONS = frozenset(("HTTP_REQUEST", "HTTPS_PROXY_REQUEST"))
#: The rest of a request line once OpenSSL took its first five bytes for a record header: the
#: method's end and a space (unless the five bytes held them: ``LOCK /``), the rest of a
#: target, a space, ``HTTP/x.y``.
_REQUEST_LINE_END = re.compile(rb"(?:[!-~]* )?[!-~]* HTTP/\d\.\d\r?")
_ULP = "/proc/sys/net/ipv4/tcp_available_ulp"


def plain_http(reason: str | None, after: bytes) -> bool:
    """Whether a handshake OpenSSL refused for *reason* met plain HTTP: a reason that says so, or
    *after* (the bytes that follow the refused record header, as far as they came) the rest of
    a request line."""
    if reason in _PLAIN_REASONS:
        return True
    line, end, _ = after.partition(b"\n")
    return bool(end) and _REQUEST_LINE_END.fullmatch(line) is not None


def kernel_tls() -> str | None:
    """None where this machine offers kernel TLS (Python's ``ssl.OP_ENABLE_KTLS`` and the kernel's
    ``tls`` module), else why not. It is not used yet: with it, ``sendfile`` on a TLS socket would
    be zero-copy (nginx's ``ssl_conf_command Options KTLS``), and nothing here can test that."""
    if not hasattr(ssl, "OP_ENABLE_KTLS"):
        return "needs Python 3.12+"
    try:
        with open(_ULP) as f:
            ulps = f.read().split()
    except OSError:
        return "not a Linux kernel that offers it"
    return None if "tls" in ulps else "the kernel has no tls module"


def tls_path() -> str:
    """What the banner says of the TLS path in use."""
    why_not = kernel_tls()
    ktls = "available, not used yet" if why_not is None else f"not available: {why_not}"
    return f"TLS: OpenSSL on the socket, userspace encryption; kernel TLS {ktls}"
