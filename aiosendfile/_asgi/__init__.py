"""The ASGI door: uvicorn protocol classes that carry out pathsend/zerocopysend, and ASGI static-file apps.

Public faces are ``aiosendfile.uvicorn`` and ``aiosendfile.asgi``. A docstring only, so that
``python -m aiosendfile`` imports nothing here.
"""
