"""The pair's tests: ``python -m aiosendfile send`` and ``recv`` as subprocesses."""
