"""``python -m benchmarks`` (from the repository root) runs the raw transfer benchmark."""

from __future__ import annotations

import sys

from benchmarks.raw_transfer import main

if __name__ == "__main__":
    sys.exit(main())
