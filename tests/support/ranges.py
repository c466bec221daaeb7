"""A reference model of RFC 9110 Range requests (section 14) with nginx's guards.

Written from the README's rules, independently of ``aiosendfile._static._http``, so the property
tests compare the server's answers with something that did not share its code.
"""

from __future__ import annotations

import itertools
import re

OWS = " \t"
MAX_RANGES = 16


def model(header: str | None, size: int) -> tuple[str, list[tuple[int, int]]]:
    """RFC 9110 §14 with nginx's guards: ("full"|"416"|"ranges", [(start, stop), ...]).

    Another unit is ignored (§14.2); an invalid ``bytes`` range set is rejected with 416, as
    nginx and aiohttp do. Independent of aiosendfile._static._http: written from the README's rules.
    """
    if header is None:
        return "full", []
    unit, eq, rest = header.partition("=")
    if not eq or unit.strip(OWS).lower() != "bytes":
        return "full", []
    specs = [s.strip(OWS) for s in rest.split(",")]
    specs = [s for s in specs if s]
    if not specs:
        return "416", []
    wanted: list[tuple[int, int]] = []
    for spec in specs:
        m = re.fullmatch(r"([0-9]*)-([0-9]*)", spec)
        if not m or (not m[1] and not m[2]):
            return "416", []
        if m[1]:
            first = int(m[1])
            if m[2] and int(m[2]) < first:
                return "416", []
            stop = min(int(m[2]) + 1, size) if m[2] else size
            if first < size:
                wanted.append((first, stop))
        else:
            suffix = int(m[2])
            if suffix > 0 and size > 0:
                wanted.append((max(size - suffix, 0), size))
    if not wanted:
        return "416", []
    if sum(stop - start for start, stop in wanted) > size:
        return "full", []
    ordered = sorted(wanted)
    if any(a[1] >= b[0] for a, b in itertools.pairwise(ordered)):
        merged = [ordered[0]]
        for start, stop in ordered[1:]:
            if start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        wanted = merged
    if len(wanted) > MAX_RANGES:
        return "full", []
    return "ranges", wanted
