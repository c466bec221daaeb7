"""Resumable uploads' requests without a body: ``HEAD`` of an upload resource (where it stands),
``DELETE`` (cancel it), ``OPTIONS`` (what the server takes). Their bodies' steps (creation,
``PATCH``) are the upload receiver's (``_receiver``).

Each is judged by the gate as a write (``PATCH``: a ``HEAD`` of an upload needs the password even
with ``--public-read``), stops the request still writing the same upload on another connection
(the client resuming knows it is over), and is answered from the store, in the pool.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import TYPE_CHECKING, Any

from .._static._answer import Answer, error
from ._answering import authorize, render
from ._auth import user_of
from ._partial import Busy, busy_status, wait_for_holder
from ._partial_upload import options_answer, status_answer
from ._refusal import failure
from ._resumable import (
    CANCEL,
    OPTIONS,
    TUS_RESUMABLE,
    Ask,
    ask_of,
    id_of,
    refusal_fields,
    upload_fields,
)
from ._target import split_target
from ._upload import UploadRefused, fields_of, status_of, upload_target

if TYPE_CHECKING:
    from ._exchange import Exchange
    from ._protocol import HttpProtocol

__all__ = ("answer_resumable",)


def answer_resumable(conn: HttpProtocol, exchange: Exchange) -> bool:
    """Answer *exchange* if it is one of these requests (False: it is not; the core answers it)."""
    split = split_target(exchange.url)  # (a HEAD without an upload token does not come here)
    if split is None:
        return False
    raw, query = split
    ask = ask_of(exchange.method, raw.endswith(b"/"), query, upload_fields(exchange.fields), None)
    if ask is None:
        return False
    then = functools.partial(_answer, ask=ask, raw=raw)
    if exchange.auth is not None and not authorize(conn, exchange, b"PATCH", then):  # (as a write)
        return True
    then(conn, exchange)
    return True


def _error(conn: HttpProtocol, exchange: Exchange, ask: Ask, status: int, *extra: tuple[str, str]) -> None:
    fields = (*refusal_fields(ask, status), *extra)
    render(conn, exchange, error(status, exchange.method.decode("latin-1"), *fields))


def _answer(conn: HttpProtocol, exchange: Exchange, ask: Ask, raw: bytes) -> None:
    engine = conn.engine
    store = engine.resumable
    assert store is not None
    if ask.step == OPTIONS:
        render(conn, exchange, options_answer(store.limits))
        return
    if ask.bad:
        _error(conn, exchange, ask, ask.bad)
        return
    try:
        target = upload_target(raw, engine.policy, engine.prefix)
    except UploadRefused as exc:
        _error(conn, exchange, ask, exc.status)
        return
    assert ask.token is not None
    upload_id = id_of(ask.token)
    user = user_of(exchange.guarded[0]) if engine.gate is not None and exchange.guarded else None
    path = store.relative(target.path)
    step = store.cancel if ask.step == CANCEL else store.look
    conn.busy = True
    conn._update_reading()
    _submit(conn, exchange, ask, upload_id, functools.partial(step, upload_id, path, user), 0)


def _submit(conn: HttpProtocol, exchange: Exchange, ask: Ask, upload_id: str, step: Any, tries: int) -> None:
    job = conn.engine.executor.submit(step)
    job.add_done_callback(
        functools.partial(conn._on_loop, _done, conn, exchange, ask, upload_id, step, tries)
    )


def _done(
    conn: HttpProtocol,
    exchange: Exchange,
    ask: Ask,
    upload_id: str,
    step: Any,
    tries: int,
    job: concurrent.futures.Future[Any],
) -> None:
    if conn.transport is None:
        return
    exc = failure(job)
    if isinstance(exc, Busy):
        again = functools.partial(_submit, conn, exchange, ask, upload_id, step, tries + 1)
        if wait_for_holder(conn.engine, upload_id, conn, tries, again):
            return
    conn._free()
    if isinstance(exc, Busy):
        _error(conn, exchange, ask, busy_status(exc))
    elif exc is not None:
        _error(conn, exchange, ask, status_of(exc), *fields_of(exc))
    elif ask.step == CANCEL:
        render(conn, exchange, Answer(204, [TUS_RESUMABLE] if ask.tus else [], None))
    else:
        record, offset = job.result()
        store = conn.engine.resumable
        assert store is not None
        render(conn, exchange, status_answer(ask, record, offset, store.limits))
    conn._resume()
