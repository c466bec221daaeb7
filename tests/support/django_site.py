"""A small Django project in one module, for the Django door's tests: its settings, its URLs, its
views and the ASGI factories the servers load (``tests.support.django_site:ours``).

Set ``DJANGO_SETTINGS_MODULE=tests.support.django_site`` and ``AIOSENDFILE_DJANGO_ROOT`` (a
directory holding ``files/``, served by the views, ``static/``, ``STATIC_ROOT``, and ``assets/``,
in ``STATICFILES_DIRS``); ``AIOSENDFILE_DJANGO_DEBUG=1`` sets ``DEBUG``. Factories:
``stock`` (Django's own ``get_asgi_application()``), ``ours`` (``aiosendfile.django``'s handler),
``static_ours`` (``aiosendfile.django.StaticFiles`` around ``ours``), ``accounted_ours`` and
``accounted_stock`` (noting ``request_finished`` when the application returns).
"""

from __future__ import annotations

import contextvars
import io
import os
import threading
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("AIOSENDFILE_DJANGO_ROOT", "/nonexistent"))

# -- settings -----------------------------------------------------------------------------------------

SECRET_KEY = "tests-only"
DEBUG = os.environ.get("AIOSENDFILE_DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = __name__
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
#: ``startproject``'s middleware, and a witness of the thread the request's sync code runs on.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    f"{__name__}.ThreadWitness",
    f"{__name__}.UrlconfByHeader",
]
if os.environ.get("AIOSENDFILE_DJANGO_ASYNC_MIDDLEWARE") == "1":
    MIDDLEWARE.append(f"{__name__}.async_only_middleware")
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
STATIC_URL = "/static/"
STATIC_ROOT = str(ROOT / "static")
STATICFILES_DIRS = [str(ROOT / "assets")]  # (found by the finders: served with DEBUG only)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
}
USE_TZ = True
LOGGING_CONFIG = None

# -- middleware -----------------------------------------------------------------------------------------


def _witness_class() -> Any:
    from django.utils.deprecation import MiddlewareMixin

    class ThreadWitness(MiddlewareMixin):  # type: ignore[misc]
        """Notes the thread ``process_request`` runs on (sync and async capable, as Django's own)."""

        def process_request(self, request: Any) -> None:
            request.witness_thread = threading.get_ident()

    return ThreadWitness


def _urlconf_class() -> Any:
    from django.utils.deprecation import MiddlewareMixin

    class UrlconfByHeader(MiddlewareMixin):  # type: ignore[misc]
        """``X-Urlconf: alt`` sets ``request.urlconf`` (as django-hosts does by host): a URLconf
        whose views ``ROOT_URLCONF`` does not know."""

        def process_request(self, request: Any) -> None:
            if request.headers.get("X-Urlconf") == "alt":
                request.urlconf = _alt_urlconf()

    return UrlconfByHeader


def async_only_middleware(get_response: Any) -> Any:
    """A middleware that can only run async (then ours takes Django's async chain throughout)."""

    async def middleware(request: Any) -> Any:
        response = await get_response(request)
        response["X-Async-Middleware"] = "yes"
        return response

    return middleware


async_only_middleware.sync_capable = False  # type: ignore[attr-defined]  # (what Django reads)
async_only_middleware.async_capable = True  # type: ignore[attr-defined]


# -- views ----------------------------------------------------------------------------------------------


def file_view(request: Any, name: str) -> Any:
    from django.http import FileResponse, Http404

    path = ROOT / "files" / name
    if "/" in name or not path.is_file():
        raise Http404(name)
    f = open(path, "rb")  # noqa: SIM115 - the response closes it
    if request.GET.get("skip"):
        f.seek(int(request.GET["skip"]))
    attachment = bool(request.GET.get("attachment"))
    response = FileResponse(f, as_attachment=attachment, filename=name if attachment else "")
    if request.GET.get("cookie"):
        response.set_cookie("seen", "yes")
    return response


def memory_file_view(request: Any) -> Any:
    from django.http import FileResponse

    return FileResponse(io.BytesIO(b"in memory, not a file"), filename="memory.txt")


def text_view(request: Any) -> Any:
    from django.http import HttpResponse

    response = HttpResponse("hello from django\n", content_type="text/plain")
    response.set_cookie("flavour", "plain")
    response["X-Extra"] = "yes"
    return response


def stream_view(request: Any) -> Any:
    from django.http import StreamingHttpResponse

    return StreamingHttpResponse(iter([b"one ", b"two ", b"three"]), content_type="text/plain")


#: The endless streams running now, and how many have stopped (a client left, the send cancelled).
_ENDLESS = {"running": 0, "stopped": 0}


def endless_view(request: Any) -> Any:
    """A sync view whose response streams for ever (an async iterator, as an event stream):
    only the client leaving ends it."""
    import asyncio

    from django.http import StreamingHttpResponse

    async def chunks() -> Any:
        _ENDLESS["running"] += 1
        try:
            while True:
                yield b"x" * 1024
                await asyncio.sleep(0.01)
        finally:
            _ENDLESS["running"] -= 1
            _ENDLESS["stopped"] += 1

    return StreamingHttpResponse(chunks(), content_type="text/plain")


def endless_state_view(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse(_ENDLESS)


def status_view(request: Any, code: int) -> Any:
    from django.http import HttpResponse

    return HttpResponse(f"status {code}", status=code)


#: The thread ``thread_view`` ran on, and the one that closed its response.
_WITNESS: dict[str, int | None] = {}
#: Set once ``thread_view``'s response is closed: the client has its bytes before that (Django
#: closes a response after sending it), so ``closed_view`` may run first and must wait.
_CLOSED = threading.Event()


def _witnessed(base: type) -> type:
    """*base*, noting the thread that closes it and how often (this response's closes, not
    another request's)."""

    class Witnessed(base):  # type: ignore[misc, valid-type]
        def close(self) -> None:
            _WITNESS["closed"] = threading.get_ident()
            _WITNESS["closes"] = (_WITNESS.get("closes") or 0) + 1
            _CLOSED.set()
            super().close()

    return Witnessed


def _witness(request: Any) -> dict[str, bool]:
    _CLOSED.clear()
    _WITNESS.update(view=threading.get_ident(), closed=None, closes=0)
    same = getattr(request, "witness_thread", None) == threading.get_ident()
    return {"same_thread": same, "main": threading.current_thread() is threading.main_thread()}


def thread_view(request: Any) -> Any:
    """Whether the view runs on the thread the middleware ran on, and not on the loop's."""
    from django.http import JsonResponse

    return _witnessed(JsonResponse)(_witness(request))


def thread_file_view(request: Any) -> Any:
    """:func:`thread_view` with a ``FileResponse`` (what it saw in its fields)."""
    from django.http import FileResponse

    seen = _witness(request)
    response = _witnessed(FileResponse)(open(ROOT / "files" / "one", "rb"))  # noqa: SIM115
    for name, value in seen.items():
        response[f"X-{name.replace('_', '-')}"] = "yes" if value else "no"
    return response


def closed_view(request: Any) -> Any:
    """Whether the last witnessed response was closed on the thread its view ran on, and how
    often (waiting a while for it to be closed at all)."""
    from django.http import JsonResponse

    _CLOSED.wait(10)
    closes = _WITNESS.get("closes")
    return JsonResponse(
        {"closed_on_its_thread": _WITNESS.get("closed") == _WITNESS.get("view"), "closes": closes}
    )


def echo_view(request: Any) -> Any:
    """The request body's length and digest (a view exempt from CSRF)."""
    import hashlib

    from django.http import JsonResponse

    body = request.body
    return JsonResponse({"length": len(body), "sha256": hashlib.sha256(body).hexdigest()})


def cut_view(request: Any, name: str) -> Any:
    """A ``FileResponse`` whose file is cut to half its length once the response is made (its
    ``Content-Length`` promises the whole)."""
    from django.http import FileResponse

    path = ROOT / "files" / name
    response = FileResponse(open(path, "rb"))  # noqa: SIM115 - the response closes it
    os.truncate(path, path.stat().st_size // 2)
    return response


async def async_view(request: Any) -> Any:
    """An async view: on the loop's thread, as under Django's handler."""
    from django.http import JsonResponse

    return JsonResponse({"main": threading.current_thread() is threading.main_thread()})


def slow_view(request: Any) -> Any:
    """A sync view that takes a while (a client may leave meanwhile)."""
    import time

    from django.http import HttpResponse

    time.sleep(float(request.GET.get("s", "0.5")))
    return HttpResponse("slow\n", content_type="text/plain")


def boom_view(request: Any) -> Any:
    raise RuntimeError("a view that fails (the test expects it)")


def counters_view(request: Any) -> Any:
    """The server process's ``aiosendfile._platform.counters`` (zero-copy bytes) as JSON."""
    import dataclasses

    from django.http import JsonResponse

    from aiosendfile import _platform

    return JsonResponse(dataclasses.asdict(_platform.counters))


#: What ``alt_wait_view`` (an async view) saw: started, finished or cancelled.
_ALT = {"started": 0, "finished": 0, "cancelled": 0}


async def alt_wait_view(request: Any) -> Any:
    """An async view, in the URLconf a middleware sets (:class:`UrlconfByHeader`), that waits."""
    import asyncio

    from django.http import HttpResponse

    _ALT["started"] += 1
    try:
        await asyncio.sleep(float(request.GET.get("s", "1")))
    except asyncio.CancelledError:
        _ALT["cancelled"] += 1
        raise
    _ALT["finished"] += 1
    return HttpResponse("waited\n")


def alt_state_view(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse(_ALT)


_ALT_URLCONF: tuple[Any, ...] = ()


def _alt_urlconf() -> tuple[Any, ...]:
    global _ALT_URLCONF
    if not _ALT_URLCONF:
        from django.urls import path

        _ALT_URLCONF = (path("alt/wait", alt_wait_view),)
    return _ALT_URLCONF


#: For each request the accounting factories served (but ``/_accounting``): how many
#: ``request_finished`` signals it had sent when the application returned.
_ACCOUNTS: list[int] = []
#: The request's own count (signals run in a copy of its context, on its thread too).
_ACCOUNT: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("account", default=None)


def accounting_view(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse({"finished_when_returned": _ACCOUNTS})


def _urls() -> list[Any]:
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    return [
        path("file/<str:name>", file_view),
        path("memory", memory_file_view),
        path("text", text_view),
        path("stream", stream_view),
        path("status/<int:code>", status_view),
        path("thread", thread_view),
        path("thread-file", thread_file_view),
        path("closed", closed_view),
        path("cut/<str:name>", cut_view),
        path("echo", csrf_exempt(echo_view)),
        path("async", async_view),
        path("slash/", text_view),
        path("boom", boom_view),
        path("slow", slow_view),
        path("endless", endless_view),
        path("endless-state", endless_state_view),
        path("_counters", counters_view),
        path("alt-state", alt_state_view),
        path("_accounting", accounting_view),
    ]


def __getattr__(name: str) -> Any:  # what needs Django set up (the settings import this module)
    if name == "urlpatterns":
        return _urls()
    if name == "ThreadWitness":
        return _witness_class()
    if name == "UrlconfByHeader":
        return _urlconf_class()
    raise AttributeError(name)


# -- ASGI factories ---------------------------------------------------------------------------------


def _settings() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", __name__)


def stock() -> Any:
    _settings()
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


def ours() -> Any:
    _settings()
    from aiosendfile.django import get_asgi_application

    return get_asgi_application()


def static_ours() -> Any:
    _settings()
    from aiosendfile.django import StaticFiles, get_asgi_application

    return StaticFiles(get_asgi_application())


def _accounted(app: Any) -> Any:
    """*app*, noting for each request the ``request_finished`` signals it had sent by the time
    the application returned (what a server or a test tool accounting per request sees)."""
    from django.core.signals import request_finished

    def count(**kwargs: Any) -> None:
        account = _ACCOUNT.get()
        if account is not None:
            account[0] += 1

    request_finished.connect(count, weak=False)

    async def accounted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        account = [0]
        _ACCOUNT.set(account)
        await app(scope, receive, send)
        if scope.get("path") != "/_accounting":
            _ACCOUNTS.append(account[0])

    return accounted


def accounted_ours() -> Any:
    return _accounted(ours())


def accounted_stock() -> Any:
    return _accounted(stock())
