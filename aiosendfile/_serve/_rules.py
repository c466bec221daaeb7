"""What a browser may ask of ``serve``: IO-free rules on a request's ``Host`` and ``Origin``, and
on the files it serves under ``--upload``.

* :class:`HostRule`: the names a request's ``Host`` may carry. A page on ``evil.example`` whose
  name the attacker re-points at 127.0.0.1 (DNS rebinding) is same-origin with itself, so the
  browser lets its script read and write the server's answers; the only thing that tells it
  from a visit to the server is the ``Host`` it sends. Allowed: any IP literal (a rebinding
  needs a name), ``localhost`` and ``*.localhost``, this machine's host name (and its ``.local``),
  and the names given (``--host``, ``--allow-host NAME``, ``.example.org`` for a domain and its
  subdomains, ``*`` for any). Anything else: 421 Misdirected Request.
* :func:`same_origin`: a write (``PUT``, a form ``POST``) from another site's page is refused,
  as Go's ``CrossOriginProtection`` does: ``Sec-Fetch-Site`` (every current browser sends it)
  must say ``same-origin`` or ``none`` (typed by the user); without it, an ``Origin`` must name
  the request's own ``Host``. A request with neither is not a browser's (``curl``): allowed.
* :func:`runs_script`: content types a browser runs script in when it shows them (HTML, SVG,
  XML with stylesheets). Under ``--upload`` these are served with ``Content-Security-Policy:
  sandbox`` (:data:`SANDBOX`): a file someone uploaded is shown in a unique origin, without
  script, so it cannot act with a visitor's credentials.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ("SANDBOX", "HostRule", "runs_script", "same_origin")

#: The field an answer of a type that runs script gets under ``--upload``.
SANDBOX = ("Content-Security-Policy", "sandbox")

#: Distinct Host values whose verdict is remembered (a peer sending a new one each time is judged
#: each time: the rule is cheap, the memo only spares the common case).
_MEMO_MAX = 256


def _split_host(host: str) -> str:
    """The name or address of a ``Host`` value (``[::1]:8000`` → ``::1``; ``a.b:80`` → ``a.b``),
    lowercase, without a trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    if "%" in name and ":" not in name:
        return False  # (a zone belongs to an IPv6 address only)
    try:
        ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        return False
    return True


class HostRule:
    """Which ``Host`` values are served (see the module): :meth:`allows`."""

    def __init__(self, names: tuple[str, ...] = (), *, this_machine: bool = True) -> None:
        exact: set[str] = {"localhost"}
        suffixes: list[str] = [".localhost"]
        self.any = False
        if this_machine:
            with_domain = socket.gethostname().lower().rstrip(".")
            if with_domain:
                exact.update((with_domain, with_domain.split(".")[0], with_domain.split(".")[0] + ".local"))
        for name in names:
            name = name.strip().lower()
            if name == "*":
                self.any = True
                continue
            name = name.rstrip(".")
            if name in ("", "*"):
                continue  # ("*." names nothing: not every host)
            if name.startswith("."):
                suffixes.append(name)
                exact.add(name[1:])
            elif name.startswith("*."):
                suffixes.append(name[1:])
            elif name and not _is_ip(_split_host(name)):
                exact.add(_split_host(name))
        self.exact = frozenset(exact)
        self.suffixes = tuple(suffixes)
        self._memo: dict[bytes, bool] = {}

    def allows(self, host: bytes | None) -> bool:
        """Whether a request with this ``Host`` value (None: none, HTTP/1.0) is served."""
        if self.any or host is None:
            return True
        known = self._memo.get(host)
        if known is not None:
            return known
        name = _split_host(host.decode("latin-1"))
        ok = (
            bool(name)
            and all(c.isalnum() or c in "-._:%" for c in name)
            and (_is_ip(name) or name in self.exact or name.endswith(self.suffixes))
        )
        if len(host) <= 255:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[host] = ok
        return ok


def _default_port_stripped(authority: str, scheme: str) -> str:
    default = {"http": ":80", "https": ":443"}.get(scheme)
    if default is not None and authority.endswith(default):
        return authority[: -len(default)]
    return authority


def same_origin(origin: bytes | None, fetch_site: bytes | None, host: bytes | None) -> bool:
    """Whether a write may come from where the browser says it comes from (see the module). The
    ``Origin``'s host and port are compared with ``Host`` (not its scheme: a proxy in front may
    end TLS), as Go does."""
    if fetch_site is not None:
        return fetch_site.strip().lower() in (b"same-origin", b"none")
    if origin is None:
        return True
    text = origin.decode("latin-1").strip().lower()
    their_scheme, sep, authority = text.partition("://")
    if not sep or host is None or "/" in authority:
        return False  # ("null": a sandboxed page, a redirect across sites; or malformed)
    ours = _default_port_stripped(host.decode("latin-1").strip().lower(), their_scheme)
    return _default_port_stripped(authority, their_scheme) == ours


_SCRIPTED = frozenset(
    (
        "text/html",
        "application/xhtml+xml",
        "image/svg+xml",
        "text/xml",
        "application/xml",
        "text/xsl",
        "application/xslt+xml",
        "application/vnd.wap.xhtml+xml",
        "multipart/x-mixed-replace",
    )
)


def runs_script(content_type: str) -> bool:
    """Whether a browser may run script in a document of this ``Content-Type``."""
    kind = content_type.partition(";")[0].strip().lower()
    return kind in _SCRIPTED or kind.endswith("+xml")
