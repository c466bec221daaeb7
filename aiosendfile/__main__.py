"""``python -m aiosendfile`` and the ``aiosendfile`` script: see :mod:`aiosendfile._cli._main`.

Ctrl-C/SIGTERM are taken over first, before the command line (and asyncio) is
imported, so a signal that lands while the program starts ends it quietly.
"""

import sys

from ._cli._common import quiet_exit_on_signals


def main() -> int:
    quiet_exit_on_signals(sys.argv[1] if len(sys.argv) > 1 else "")
    from ._cli._main import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
