"""Helpers the test modules share; fixtures and hooks stay in the ``conftest.py`` files.

One harness per door: ``serve`` (the serve engine in the test's loop or a process),
``asgi_servers`` and ``asgi_apps`` (uvicorn, hypercorn and granian as subprocesses, and the ASGI
app factories they serve), ``uvicorn_inproc`` (uvicorn in the test's loop, and the apps its
protocol tests write), ``asgi_fake_server`` (a fake ASGI server in process), ``django_site`` and
``django_thread_race`` (the Django project), ``pair`` (the send/recv processes and a hand-written
peer). ``raw_http`` is the one HTTP/1.1 response reader (asyncio stream, bytes, blocking socket),
with a raw client and a multipart/byteranges parser.

Beside them, one module per job: ``files`` (test data, the load tests' download mix, page-cache
eviction, a slow disk), ``connections`` (server/client pairs over TCP, Unix and TLS), ``waiting``
(polling until something holds), ``fds`` (open descriptors), ``processes`` (``python -m
aiosendfile`` subprocesses and the ``serve`` server), ``static_cases`` (the static-file cases and
tests both doors run), ``static_requests`` (the golden requests), ``fake_fs`` (the static core's
fake file system), ``ranges`` (a reference model of RFC 9110 Range requests), ``cancellations``
(transfers cancelled at random points), ``tls_duplex``, ``browser``, ``uploads``.
``stress_clients.py`` is the client process of the stress tests.
"""
