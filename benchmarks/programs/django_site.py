"""The Django project ``benchmarks.django_files`` serves, one per contender (``BENCH_DJANGO_MODE``):

* ``whitenoise``: WSGI (gunicorn), ``WhiteNoiseMiddleware`` first, the way WhiteNoise's docs set it up;
* ``servestatic``: ASGI, ``ServeStaticMiddleware`` first (ServeStatic, WhiteNoise's ASGI fork);
* ``stock``: ASGI, Django's own handler, static files by ``django.views.static.serve`` (what
  stock Django has without WhiteNoise);
* ``ours``: ASGI, ``aiosendfile.django``: ``StaticFiles(get_asgi_application())``.

``BENCH_DJANGO_MIDDLEWARE``: ``default`` (the default) is ``startproject``'s ``MIDDLEWARE`` and the
apps they need (sessions, auth, messages, CSRF, security, clickjacking), with WhiteNoise's or
ServeStatic's middleware right after ``SecurityMiddleware`` as their docs say; ``none`` is no
middleware but theirs. ``BENCH_DJANGO_ROOT`` holds ``static/`` (``STATIC_ROOT``) and ``files/`` (the
``FileResponse`` view).
Entry points: ``wsgi`` and ``asgi`` (module attributes, made at import).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MODE = os.environ.get("BENCH_DJANGO_MODE", "ours")
ROOT = Path(os.environ.get("BENCH_DJANGO_ROOT", "/nonexistent"))

SECRET_KEY = "benchmark"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = __name__
DEFAULT_MIDDLEWARE = os.environ.get("BENCH_DJANGO_MIDDLEWARE", "default") == "default"
#: What ``django-admin startproject`` writes (Django 5.2).
STARTPROJECT_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
INSTALLED_APPS = ["django.contrib.staticfiles"]
if DEFAULT_MIDDLEWARE:
    INSTALLED_APPS = [
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        *INSTALLED_APPS,
    ]
STATIC_MIDDLEWARE = {
    "whitenoise": ["whitenoise.middleware.WhiteNoiseMiddleware"],
    "servestatic": ["servestatic.middleware.ServeStaticMiddleware"],
}.get(MODE, [])
MIDDLEWARE = (
    [STARTPROJECT_MIDDLEWARE[0], *STATIC_MIDDLEWARE, *STARTPROJECT_MIDDLEWARE[1:]]
    if DEFAULT_MIDDLEWARE
    else STATIC_MIDDLEWARE
)
STATIC_URL = "/static/"
STATIC_ROOT = str(ROOT / "static")
USE_TZ = True
LOGGING_CONFIG = None


def file_view(request: Any, name: str) -> Any:
    from django.http import FileResponse, Http404

    where = ROOT / "files" / name
    if "/" in name or not where.is_file():
        raise Http404(name)
    return FileResponse(open(where, "rb"))


def hello_view(request: Any) -> Any:
    from django.http import HttpResponse

    return HttpResponse(b"hello\n", content_type="text/plain")


def _urls() -> list[Any]:
    from django.urls import path, re_path
    from django.views.static import serve

    urls = [path("file/<str:name>", file_view), path("hello", hello_view)]
    if MODE == "stock":
        urls.append(re_path(r"^static/(?P<path>.*)$", serve, {"document_root": STATIC_ROOT}))
    return urls


def __getattr__(name: str) -> Any:
    if name == "urlpatterns":
        return _urls()
    raise AttributeError(name)


os.environ.setdefault("DJANGO_SETTINGS_MODULE", __name__)

if MODE == "whitenoise":
    from django.core.wsgi import get_wsgi_application

    wsgi = get_wsgi_application()
elif MODE == "ours":
    from aiosendfile.django import StaticFiles, get_asgi_application

    asgi = StaticFiles(get_asgi_application())
else:
    from django.core.asgi import get_asgi_application as _stock

    asgi = _stock()
