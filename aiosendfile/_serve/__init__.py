"""The native HTTP/1.1 engine behind ``python -m aiosendfile serve``: an asyncio protocol on httptools
that renders the static core's answers straight to its transport (``_server`` is its API)."""
