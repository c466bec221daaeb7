"""What the benchmarks' command lines and run loops share: a checked comma-separated list, the round order.

``--contenders`` (and lists like it) is a comma-separated subset of known names; an unknown
name is an argparse error. Trials are interleaved: every round runs every contender once, and
the order rotates by one each round so that no contender always runs first.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import TypeVar

__all__ = ["comma_list", "rotated"]

_T = TypeVar("_T")


def comma_list(
    parser: argparse.ArgumentParser, value: str, known: Iterable[str], what: str = "contenders"
) -> list[str]:
    """The names in the comma-separated *value*, in order.

    A name not in *known* is ``parser.error("unknown WHAT ['x']; choose from a, b")``.
    """
    names = [c.strip() for c in value.split(",") if c.strip()]
    choices = list(known)
    if unknown := set(names) - set(choices):
        parser.error(f"unknown {what} {sorted(unknown)}; choose from {', '.join(choices)}")
    return names


def rotated(items: Sequence[_T], rnd: int) -> list[_T]:
    """Round *rnd*'s order (rounds count from 1): *items* rotated left by ``rnd - 1``."""
    shift = (rnd - 1) % len(items)
    return [*items[shift:], *items[:shift]]
