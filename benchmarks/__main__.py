"""``python -m benchmarks`` (from the repository root) runs the benchmark suite (``benchmarks/suite.py``)."""

from __future__ import annotations

import sys

from benchmarks.suite import main

if __name__ == "__main__":
    sys.exit(main())
