"""Answers as bytes: the status line and fields of a core ``Answer``, and the protocol's own errors.

A head is ``HTTP/1.1 <status> <reason>``, the answer's fields (latin-1), ``Content-Length``
(unless the answer has none: 304), then a tail from :mod:`._date` (``Date``, ``Server``,
``X-Content-Type-Options``, ``Connection``, the blank line). The reason phrases and the error
bodies are aiohttp's (``http.HTTPStatus`` phrases; ``"<status>: <reason>"`` as ``text/plain;
charset=utf-8``), so the doors answer byte for byte alike. The engine always answers
``HTTP/1.1``, as nginx does.
"""

from __future__ import annotations

from http import HTTPStatus

from .._static._answer import Answer, error
from ._date import CLOSE, Clock
from ._rules import SANDBOX, runs_script

__all__ = ("error_response", "head_of", "status_line")

_STATUS_LINES: dict[int, bytes] = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("latin-1")) for s in HTTPStatus
}


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d \r\n" % status
    return line


def head_of(answer: Answer, sandbox: bool = False) -> bytes:
    """The status line, fields and Content-Length of *answer*: its head without the tail. With
    *sandbox* (``serve --upload``), a type that runs script gets ``Content-Security-Policy:
    sandbox`` unless it has a policy of its own (``_rules``)."""
    pairs = answer.fields
    if (
        sandbox
        and any(n == "Content-Type" and runs_script(v) for n, v in pairs)
        and not any(n == "Content-Security-Policy" for n, _ in pairs)
    ):
        pairs = [*pairs, SANDBOX]
    fields = "".join([f"{name}: {value}\r\n" for name, value in pairs]).encode("latin-1")
    head = status_line(answer.status) + fields
    if answer.length is not None:
        head += b"Content-Length: %d\r\n" % answer.length
    return head


def error_response(
    status: int,
    clock: Clock,
    *,
    body: bool = True,
    mode: int = CLOSE,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A whole response for an error the protocol finds itself (400, 408, 414, 431, 417, 500; an
    upload's 401, 413, 429 with their *extra* fields), rendered from the core's error answer, so
    its text and fields are the core's."""
    answer = error(status, "GET" if body else "HEAD", *extra)
    text = answer.body if body else b""
    assert isinstance(text, bytes)
    return head_of(answer) + clock.tails[mode] + text
