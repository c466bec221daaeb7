"""The issues' targets for ``http_static``'s ratios: data, read by ``http_report``.

One row per target: in case ``case``, the ratio ``contender / base`` of ``metric`` (a key of a
ratio entry: ``req_per_s``, the ratio of the median req/s, = MB/s in one case) must be at least
``at_least``; ``issue`` is the issue whose "done when" it is. The report marks such a ratio
"met" or "NOT MET" and the JSON entry gets ``target`` and ``meets_target``. A ratio to nginx
(``base="nginx"``) is in the table of ratios to nginx; any other base must be one of
``http_report.PAIRS`` (the A / B table), which ``http_report`` checks when it is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TARGETS", "Target"]


@dataclass(frozen=True)
class Target:
    """``contender / base`` on ``metric`` in ``case`` is at least ``at_least`` (from ``issue``)."""

    contender: str
    base: str
    case: str
    metric: str
    at_least: float
    issue: str


TARGETS: tuple[Target, ...] = (
    # #15: the serve command >= nginx in req/s on one file at 64 connections.
    Target("serve", "nginx", "4KiB c64", "req_per_s", 1.0, "#15"),
    Target("serve", "nginx", "1MiB c64", "req_per_s", 1.0, "#15"),
    # #16: the ASGI door. Our protocol under stock Starlette, against stock uvicorn.
    Target("uvicorn+asf/starlette", "uvicorn/starlette", "1MiB c64", "req_per_s", 4.0, "#16"),
    # aiosendfile.asgi under our protocol, against granian + Starlette and against stock uvicorn.
    Target("uvicorn+asf/asf.asgi", "granian/starlette", "4KiB c64", "req_per_s", 1.0, "#16"),
    Target("uvicorn+asf/asf.asgi", "granian/starlette", "1MiB c64", "req_per_s", 1.0, "#16"),
    Target("uvicorn+asf/asf.asgi", "uvicorn/starlette", "4KiB c64", "req_per_s", 3.0, "#16"),
)
