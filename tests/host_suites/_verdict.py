"""The verdict of a host's own tests run against one of our drop-ins: red when the swap was not
checked, when nothing was read, or, where our run failed, when a test that passes with the stock
class fails with ours, runs stock but not with ours, or ours leaves more unclosed files. A runner
may excuse tests by name (each with its reason, which the verdict prints), and may run the tests
that failed with ours once more, alone, with ours: one that passes then failed by chance (a port
another test took, a slow start on a loaded machine), and the verdict names it with its first
run's failure report. (A failure that ours caused through a state an earlier test left would pass
alone too: the printed report is what tells such a case apart.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ("Run", "failure_report", "judge")

#: At most this many lines of a first run's report on a test that passed when run again.
REPORT_LINES = 40


@dataclass
class Run:
    """One run of a host's tests: its exit code, each test's outcome (passed, failed, skipped),
    its output, and the unclosed-file ``ResourceWarning``\\s it printed (where counted)."""

    code: int
    results: dict[str, str]
    output: str
    warnings: int = 0

    def counts(self) -> str:
        kinds = list(self.results.values())
        return (
            f"{kinds.count('passed')} passed, {kinds.count('failed')} failed, "
            f"{kinds.count('skipped')} skipped, {self.warnings} ResourceWarning(s)"
        )


def judge(
    ours: Run,
    swapped: str | None,
    stock_run: Callable[[], Run],
    drop_in: str,
    host: str,
    excused: Callable[[str], str | None] = lambda name: None,
    rerun: Callable[[list[str]], Run] | None = None,
) -> int:
    """0 (green) or 1 (red) for *ours*, a run with *drop_in* swapped in (*swapped*: what the run
    checked of the swap, None if it did not); *stock_run* runs the tests stock, only if needed;
    *excused* gives why a test may fail or be missing with ours (None: it may not); *rerun* runs
    the named tests once more with ours (None: the runner cannot)."""
    print(f"{host}'s tests with {drop_in}: {ours.counts()}")
    if swapped is None:
        print(ours.output)
        print("The swap was not checked: the run proves nothing.")
        return 1
    print(swapped)
    if not ours.results:
        print(ours.output)
        print("No test results were read from the run.")
        return 1
    failed = sorted(name for name, kind in ours.results.items() if kind == "failed")
    by_chance: list[str] = []
    if failed and rerun is not None and ours.code == 1:  # (1: tests failed; not an interrupted run)
        again = rerun(failed).results
        by_chance = [name for name in failed if again.get(name) == "passed"]
        for name in by_chance:
            print(f"FAILED ONCE WITH {drop_in}, PASSED ON A SECOND RUN: {name}")
            print("".join(f"    {line}\n" for line in failure_report(ours.output, name)), end="")
        failed = [name for name in failed if name not in by_chance]
    if not failed and not ours.warnings and (ours.code == 0 or by_chance):
        return 0
    stock = stock_run()
    print(f"stock {host}: {stock.counts()}")
    worse = [name for name in failed if stock.results.get(name) == "passed"]
    missing = sorted(set(stock.results) - set(ours.results))
    reasons = {name: why for name in sorted({*worse, *missing}) if (why := excused(name)) is not None}
    for why in dict.fromkeys(reasons.values()):
        names = [name for name, reason in reasons.items() if reason == why]
        print(f"EXCUSED, {len(names)} test(s) that pass stock: {why}")
        print("".join(f"    {name}\n" for name in names), end="")
    worse = [name for name in worse if name not in reasons]
    missing = [name for name in missing if name not in reasons]
    for name in worse:
        print(f"FAILS WITH {drop_in}, PASSES STOCK: {name}")
    for name in missing:
        print(f"RAN STOCK, NOT WITH {drop_in}: {name}")
    if ours.warnings > stock.warnings:
        print(f"MORE ResourceWarnings THAN STOCK: {ours.warnings} against {stock.warnings}")
    if worse or missing or ours.warnings > stock.warnings:
        print(ours.output)
        return 1
    return 0


def failure_report(output: str, name: str) -> list[str]:
    """pytest's report of the test *name* (``classname::test``) in a run's *output*: its section
    (``____ test ____`` to the next section or summary line), at most :data:`REPORT_LINES` lines,
    else the lines that name it."""
    test = name.rpartition("::")[2]
    lines = output.splitlines()
    for start, line in enumerate(lines):
        if re.fullmatch(rf"_+ (\S+\.)?{re.escape(test)} _+", line.strip()):
            section = [line]
            for more in lines[start + 1 :]:
                if re.match(r"_{3,} \S.* _{3,}$|={3,} ", more.strip()):
                    break
                section.append(more)
            return section[:REPORT_LINES]
    return [line for line in lines if test in line][:REPORT_LINES]
