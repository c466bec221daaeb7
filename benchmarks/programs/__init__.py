"""The server programs the benchmarks spawn: one runnable module each, ``python -m benchmarks.programs.NAME``.

A benchmark starts these as child processes (``benchmarks.harness.servers.start_server``) rather
than formatting source text into ``python -c``, so that they are type-checked and linted with the
rest. ``aiohttp_app``: a static directory (aiohttp's own or the plugin's) or in-memory bodies in a
``web.Application`` on uvloop, over HTTP or HTTPS.
"""
