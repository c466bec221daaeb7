"""A Django project in one file, under ASGI, with its static files and downloads sent as files.

    python examples/django_app.py [DIRECTORY] [--port 8000] [--loop uvloop|asyncio]

DIRECTORY (default: the current one) holds the files ``/download/<name>`` returns, and its
``static/`` folder is ``STATIC_ROOT`` (what ``manage.py collectstatic`` fills in a real project).

In a real project the change is two lines of ``asgi.py``::

    from aiosendfile.django import StaticFiles, get_asgi_application

    application = StaticFiles(get_asgi_application())

- ``/static/...`` is answered by ``StaticFiles`` from ``STATIC_ROOT`` (ranges, conditional
  requests, ``.br``/``.gz`` siblings, WhiteNoise's ``Cache-Control``); a miss goes to Django;
- ``/download/<name>`` is an ordinary Django view returning ``FileResponse(open(...))``: with
  aiosendfile's ``get_asgi_application`` it leaves as a file instead of being read whole into
  memory, as Django's own ASGI handler does;
- ``/`` is an ordinary view.

uvicorn runs with ``aiosendfile.uvicorn.HttpToolsProtocol``: the bodies leave with ``sendfile(2)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import FileResponse, Http404, HttpResponse
from django.urls import path
from django.utils._os import safe_join

DIRECTORY = Path(".").resolve()


def index(request: Any) -> HttpResponse:
    return HttpResponse("try /static/... or /download/<name>\n", content_type="text/plain")


def download(request: Any, name: str) -> FileResponse:
    try:
        where = Path(safe_join(DIRECTORY, name))  # (a name out of DIRECTORY is refused)
    except Exception:
        raise Http404(name) from None
    if not where.is_file():
        raise Http404(name)
    return FileResponse(open(where, "rb"), as_attachment=True, filename=where.name)


urlpatterns = [path("", index), path("download/<path:name>", download)]


def make_application(directory: Path) -> Any:
    global DIRECTORY
    DIRECTORY = directory
    settings.configure(
        DEBUG=False,
        SECRET_KEY="an example: use a secret one",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=["django.contrib.staticfiles"],
        STATIC_URL="/static/",
        STATIC_ROOT=str(directory / "static"),
    )
    from aiosendfile.django import StaticFiles, get_asgi_application

    return StaticFiles(get_asgi_application())


def _directory(arg: str) -> Path:
    where = Path(arg).resolve()
    if not where.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {arg}")
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description="A Django project serving DIRECTORY, zero-copy.")
    parser.add_argument("directory", nargs="?", default=".", type=_directory, help="default: .")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()

    import uvicorn

    from aiosendfile.uvicorn import HttpToolsProtocol

    application = make_application(args.directory)
    print(f"serving {args.directory} on http://{args.host}:{args.port}/ (Ctrl-C to stop)", flush=True)
    uvicorn.run(application, host=args.host, port=args.port, loop=args.loop, http=HttpToolsProtocol)


if __name__ == "__main__":
    main()
