"""What a swap plugin of this folder checked, written where the runner reads it
(``$AIOSENDFILE_SWAP_REPORT``, one ``swap checked: NAME`` line each; ``_pytest_host`` reads them).
Kept out of the ``tests`` package, as the plugins are: a host's tests may be a package of that name."""

from __future__ import annotations

import os

__all__ = ("report",)


def report(checked: list[str]) -> None:
    """Append *checked* (the names found holding our classes) to the runner's report, if any."""
    path = os.environ.get("AIOSENDFILE_SWAP_REPORT")
    if path and checked:
        with open(path, "a") as f:
            f.write("".join(f"swap checked: {name}\n" for name in checked))
