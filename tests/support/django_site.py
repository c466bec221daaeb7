"""A small Django project in one module, for the Django door's tests: its settings, its URLs, its
views and the ASGI factories the servers load (``tests.support.django_site:ours``).

Set ``DJANGO_SETTINGS_MODULE=tests.support.django_site`` and ``AIOSENDFILE_DJANGO_ROOT`` (a
directory holding ``files/``, served by the views, ``static/``, ``STATIC_ROOT``, and ``assets/``,
in ``STATICFILES_DIRS``); ``AIOSENDFILE_DJANGO_DEBUG=1`` sets ``DEBUG``. Factories:
``stock`` (Django's own ``get_asgi_application()``), ``ours`` (``aiosendfile.django``'s handler),
``static_ours`` (``aiosendfile.django.StaticFiles`` around ``ours``).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("AIOSENDFILE_DJANGO_ROOT", "/nonexistent"))

# -- settings -----------------------------------------------------------------------------------------

SECRET_KEY = "tests-only"
DEBUG = os.environ.get("AIOSENDFILE_DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = __name__
INSTALLED_APPS = ["django.contrib.staticfiles"]
MIDDLEWARE: list[str] = []
STATIC_URL = "/static/"
STATIC_ROOT = str(ROOT / "static")
STATICFILES_DIRS = [str(ROOT / "assets")]  # (found by the finders: served with DEBUG only)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
}
USE_TZ = True
LOGGING_CONFIG = None

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


def status_view(request: Any, code: int) -> Any:
    from django.http import HttpResponse

    return HttpResponse(f"status {code}", status=code)


def counters_view(request: Any) -> Any:
    """The server process's ``aiosendfile._platform.counters`` (zero-copy bytes) as JSON."""
    import dataclasses

    from django.http import JsonResponse

    from aiosendfile import _platform

    return JsonResponse(dataclasses.asdict(_platform.counters))


def _urls() -> list[Any]:
    from django.urls import path

    return [
        path("file/<str:name>", file_view),
        path("memory", memory_file_view),
        path("text", text_view),
        path("stream", stream_view),
        path("status/<int:code>", status_view),
        path("_counters", counters_view),
    ]


def __getattr__(name: str) -> Any:  # urlpatterns once Django is set up (the settings import this module)
    if name == "urlpatterns":
        return _urls()
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
