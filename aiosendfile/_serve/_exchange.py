"""What a parsed request is on its way to its answer: :class:`Exchange`, and the memo's tuples.

The request reader (``_reader``) makes an exchange when it completes a request; answering, the
body senders, the upload receiver and the access log all take it instead of the five to seven
values it would pass on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._static._request import Request

__all__ = ("Exchange", "Guard", "Head", "Item", "LogFields")

#: What the access log needs besides method and target: (HTTP version, Referer, User-Agent, the
#: client a trusted proxy names: ``TrustedProxies.client``, None without one).
LogFields = tuple[str, "bytes | None", "bytes | None", "str | None"]

#: What the gate checks of a request: its ``Authorization`` value, and the client a trusted proxy
#: names (``TrustedProxies.client``; None: none, or no trusted proxy).
Guard = tuple["bytes | None", "str | None"]


class Exchange:
    """One request on its way to its answer (uvicorn's ``RequestResponseCycle`` shape).

    Its method, target, how its head ends (``mode``: the keep-alive tail, ``_date``'s ``CLOSE``,
    ``KEEP11`` or ``KEEP10``), the core's header pairs (None: a plain request, the memo's case),
    the access log's fields, and, once decided, the raw path, the core's ``Request`` and the
    answer's status.
    """

    __slots__ = (
        "auth",
        "fields",
        "folder",
        "guarded",
        "log",
        "method",
        "mode",
        "raw",
        "request",
        "status",
        "url",
    )

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
        # A browser's request (Accept-Encoding its only field the core reads): its file's folder
        # and that folder's identity, looked at before the core looks for siblings
        # (_inline.browser_folder); None for any other.
        self.folder: tuple[str, tuple[int, ...]] | None = None
        # Set by answering before anything reads them: raw (the target's path, raw) and request.


#: A plain keep-alive request as its head parses (``Engine.heads``, the heads memo): method, target,
#: mode, log fields, its credentials (checked again each time it is replayed), and a browser's
#: ``Accept-Encoding`` field (its name and value as sent; None for a plain request). A plain tuple,
#: unpacked by these names where it is read: the garbage collector stops tracking an exact tuple of
#: untracked values (a NamedTuple stays tracked), and the memo holds thousands.
Head = tuple[bytes, bytes, int, "LogFields | None", "Guard | None", "tuple[bytes, bytes] | None"]


#: What waits in a connection's ``pending``: a request, or prebuilt bytes (a 100 Continue, an error).
Item = Exchange | bytes
