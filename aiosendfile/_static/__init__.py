"""The static-file core: IO-free decisions every door renders (route, resolve, respond → an Answer).

Only ``_fs`` touches the file system; nothing here imports asyncio, aiohttp or socket. A docstring
only, so importing the package loads nothing.
"""
