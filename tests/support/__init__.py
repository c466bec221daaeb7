"""Helpers the test modules share; fixtures and hooks stay in ``conftest``.

One module per job: ``files`` (test data, the load tests' download mix, page-cache eviction, a
slow disk), ``connections`` (server/client pairs over TCP, Unix and TLS), ``waiting`` (polling
the loop until something holds), ``fds`` (open descriptors), ``processes`` (``python -m
aiosendfile`` subprocesses and the ``serve`` server), ``raw_http`` (a raw HTTP client and a
multipart/byteranges parser), ``native`` (the native engine in the test's loop or a process),
``static_cases`` (the static-file cases and tests both doors run), ``static_requests`` (the
golden requests), ``ranges`` (a reference model of RFC 9110 Range requests),
``cancellations`` (transfers cancelled at random points), ``asgi_servers`` (uvicorn, hypercorn
and granian as subprocesses) and ``asgi_apps`` (the ASGI app factories they serve).
``stress_clients.py`` is the client process of the stress tests.
"""
