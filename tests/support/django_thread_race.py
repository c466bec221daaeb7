"""``python -m tests.support.django_thread_race LOOP``: a race of ``aiosendfile.django``'s one hop,
made certain, in a process of its own (Django's settings are per process).

A sync view's ``FileResponse`` is written whole by the request's thread (a stand-in for the
server's ``THREAD_WRITE`` offer); its client reads it and leaves (``http.disconnect``), and the
loop gives the request up before the thread goes on. Django closes a response whose client left
once it was sent: the response must be closed once, ``request_finished`` sent once, both by the
time the application returns. Exit status 0 if so; the counts are printed.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any


def main(loop_name: str) -> int:
    import django
    from django.conf import settings

    settings.configure(
        ROOT_URLCONF=__name__, MIDDLEWARE=[], ALLOWED_HOSTS=["*"], DEBUG=False, SECRET_KEY="race"
    )
    django.setup()
    from django.core import signals
    from django.http import FileResponse

    from aiosendfile._asgi._thread_send import THREAD_WRITE
    from aiosendfile._django import _one_hop
    from aiosendfile.django import get_asgi_application

    closes: list[int] = []
    finished: list[int] = []
    signals.request_finished.connect(lambda **kw: finished.append(1), weak=False)

    class Witnessed(FileResponse):
        def close(self) -> None:
            closes.append(1)
            super().close()

    global urlpatterns
    from django.urls import path

    urlpatterns = [path("f", lambda request: Witnessed(open(__file__, "rb")))]  # noqa: SIM115

    gave_up = threading.Event()
    stock_abandon = _one_hop._Hop.abandon

    def abandon(self: Any) -> Any:
        try:
            return stock_abandon(self)
        finally:
            gave_up.set()

    _one_hop._Hop.abandon = abandon  # type: ignore[method-assign]

    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        queue.put_nowait({"type": "http.request", "body": b"", "more_body": False})

        class Writer:
            complete = False

            def write(self, status: int, headers: Any, fd: int, offset: int, count: int) -> bool:
                self.complete = True  # (all of it is out: its client reads it and leaves)
                loop.call_soon_threadsafe(queue.put_nowait, {"type": "http.disconnect"})
                gave_up.wait(10)
                return True

            def release(self) -> None:
                pass

            async def finish(self) -> None:
                pass

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/f",
            "raw_path": b"/f",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"x")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "extensions": {THREAD_WRITE: {"open": Writer}},
        }

        async def send(message: dict[str, Any]) -> None:
            raise AssertionError(f"the loop sent {message['type']}: the thread wrote the response")

        await get_asgi_application()(scope, queue.get, send)
        return len(closes), len(finished)

    if loop_name == "uvloop":
        import uvloop

        got = uvloop.run(run())
    else:
        got = asyncio.run(run())
    print(f"gave up: {gave_up.is_set()}; when the application returned: {got[0]} closes, {got[1]} signals")
    return 0 if gave_up.is_set() and got == (1, 1) else 1


urlpatterns: list[Any] = []

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
