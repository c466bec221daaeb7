"""The ``send``/``recv`` pair: a file over one TCP connection, checked end to end.

A docstring only: ``python -m aiosendfile`` imports nothing here until a command needs it.
"""
