"""The command line: ``python -m aiosendfile`` and its ``serve``/``send``/``recv`` commands.

A docstring only, so that ``__main__`` installs its quiet signal exit before anything heavy loads.
"""
