"""``python -m aiosendfile``: see :mod:`aiosendfile._cli`."""

import sys

from ._cli import main

sys.exit(main())
