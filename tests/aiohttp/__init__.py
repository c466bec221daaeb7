"""The aiohttp door's tests: ``aiosendfile.aiohttp`` (``static``, ``FileResponse``) as a plugin and as
a drop-in for aiohttp's classes."""
