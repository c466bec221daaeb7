"""``http_static``'s ratios and report: contender / nginx, the ASGI rows' A / B pairs, the tables.

Every ratio is of medians over rounds (req/s, which is MB/s in one case, and the server's CPU per
request), with the per-round ratios beside it. Where an issue set a target for a ratio (the table
in ``benchmarks.http_targets``), the JSON entry carries ``target`` and ``meets_target`` and the
table says "met" or "NOT MET". The hot-file probe's cases (the ``probe`` set) get a table of their
own: the probe's p50, p99 and max beside wrk's figures of the same trials, and each contender's probe
p99 over nginx's.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from benchmarks.harness.http_trial import Context, Sample
from benchmarks.harness.report import OTHER_LOAD_WARN, median_or_none, median_range, table
from benchmarks.http_contenders import BASE
from benchmarks.http_targets import TARGETS, Target

__all__ = ["PAIRS", "RATIO_HEADER", "pair_ratios", "probe_ratios", "ratios", "report", "target"]

# The ASGI rows' A / B ratios (#16), reported in every case where both ran, in this order.
PAIRS: tuple[tuple[str, str], ...] = (
    ("uvicorn+asf/starlette", "uvicorn/starlette"),
    ("uvicorn+asf/asf.asgi", "granian/starlette"),
    ("uvicorn+asf/asf.asgi", "uvicorn/starlette"),
    ("uvicorn+asf/fastapi", "uvicorn/fastapi"),
    ("uvicorn/asf.asgi", "uvicorn/starlette"),
    ("granian/asf.asgi", "granian/starlette"),
)
_TARGETS = {(t.contender, t.base, t.case): t for t in TARGETS}
if len(_TARGETS) != len(TARGETS):
    raise ValueError("benchmarks.http_targets: two targets for one ratio")
if stray := [t for t in TARGETS if t.base != BASE and (t.contender, t.base) not in PAIRS]:
    raise ValueError(f"benchmarks.http_targets: targets for ratios the report never makes: {stray}")


def target(name: str, base: str, label: str) -> Target | None:
    """The target for ``name`` / ``base`` in case ``label`` (of ``benchmarks.http_targets``), or None."""
    return _TARGETS.get((name, base, label))


def _with_target(entry: dict[str, Any], name: str, base: str, label: str) -> dict[str, Any]:
    """``entry`` (from :func:`_ratio`) with ``target`` and ``meets_target`` if a target applies."""
    goal = target(name, base, label)
    if goal is not None and goal.metric in entry:
        entry["target"] = goal.at_least
        entry["meets_target"] = entry[goal.metric]["median"] >= goal.at_least
    return entry


def _by_round(samples: list[Sample], name: str, label: str, key: str) -> dict[int, float]:
    """round -> value of one (contender, case)'s kept, successful trials."""
    return {
        s.round: v
        for s in samples
        if s.ok
        and not s.discarded
        and s.contender == name
        and s.case == label
        and (v := getattr(s, key)) is not None
    }


def _ratio(samples: list[Sample], name: str, base: str, label: str) -> dict[str, Any]:
    """``name`` / ``base`` in case ``label``, on req/s and server CPU per request ({} if either has no trial).

    ``median`` is the ratio of the medians; ``paired`` are per-round ratios (the
    two trials of a round ran minutes apart at most, under similar machine load).
    """
    entry: dict[str, Any] = {}
    for key in ("req_per_s", "server_cpu_us_per_req"):
        mine = _by_round(samples, name, label, key)
        theirs = _by_round(samples, base, label, key)
        if not mine or not theirs:
            continue
        paired = [mine[r] / theirs[r] for r in sorted(mine.keys() & theirs.keys()) if theirs[r]]
        entry[key] = {
            "median": statistics.median(mine.values()) / statistics.median(theirs.values()),
            "paired": paired,
            "paired_median": median_or_none(paired),
        }
    return entry


def ratios(samples: list[Sample], contenders: list[str], labels: list[str]) -> dict[str, Any]:
    """case -> contender -> contender / nginx, on req/s (= body MB/s for a case) and server CPU per request.

    See :func:`_ratio`. ``target``/``meets_target``: the issue's goal for that ratio, if it has one.
    """
    out: dict[str, Any] = {}
    if BASE not in contenders:
        return out
    for label in labels:
        for name in contenders:
            if name == BASE:
                continue
            entry = _ratio(samples, name, BASE, label)
            if not entry:
                continue
            out.setdefault(label, {})[name] = _with_target(entry, name, BASE, label)
    return out


def pair_ratios(samples: list[Sample], contenders: list[str], labels: list[str]) -> dict[str, Any]:
    """case -> "A / B" -> the ASGI rows' ratios of :data:`PAIRS` that ran, with #16's targets where set."""
    out: dict[str, Any] = {}
    for label in labels:
        for name, base in PAIRS:
            if name not in contenders or base not in contenders:
                continue
            entry = _ratio(samples, name, base, label)
            if not entry:
                continue
            out.setdefault(label, {})[f"{name} / {base}"] = _with_target(entry, name, base, label)
    return out


def probe_ratios(samples: list[Sample], contenders: list[str], labels: list[str]) -> dict[str, Any]:
    """case -> contender -> the probe's p99 / nginx's probe p99 (median of each over rounds, and per round).

    Only the cases that ran the hot-file probe; above 1: the other client waited longer than with nginx.
    """
    out: dict[str, Any] = {}
    if BASE not in contenders:
        return out
    for label in labels:
        theirs = _by_round(samples, BASE, label, "probe_p99_ms")
        if not theirs:
            continue
        for name in contenders:
            mine = _by_round(samples, name, label, "probe_p99_ms")
            if name == BASE or not mine:
                continue
            paired = [mine[r] / theirs[r] for r in sorted(mine.keys() & theirs.keys()) if theirs[r]]
            out.setdefault(label, {})[name] = {
                "probe_p99_ms": {
                    "median": statistics.median(mine.values()) / statistics.median(theirs.values()),
                    "paired": paired,
                    "paired_median": median_or_none(paired),
                }
            }
    return out


def _probe_rows(summary: dict[str, Any], probe_rat: dict[str, Any]) -> list[list[str]]:
    """The probe table's rows: every contender of every case that ran the probe."""
    rows = []
    for label, by_name in summary.items():
        for name, row in by_name.items():
            if "probe_p99_ms_median" not in row:
                continue
            vs = probe_rat.get(label, {}).get(name, {}).get("probe_p99_ms")
            paired = vs["paired"] if vs else []
            rows.append(
                [
                    name,
                    label,
                    median_range(row, "probe_p50_ms", ".2f"),
                    median_range(row, "probe_p99_ms", ".2f"),
                    _num(row, "probe_max_ms_median", ".1f") + " / " + _num(row, "probe_max_ms_max", ".1f"),
                    "1.00x"
                    if name == BASE and label in probe_rat
                    else (f"{vs['median']:.2f}x [{min(paired):.2f}-{max(paired):.2f}]" if paired else ""),
                    _num(row, "probe_requests_median", ".0f"),
                    f"{row['probe_errors_total']}/{row['probe_reconnects_total']}/{row['probe_late_ticks_total']}"
                    f"/{row.get('probe_unfinished_total', 0)}",
                    median_range(row, "req_per_s", ".0f"),
                    _num(row, "latency_p99_ms_median", ".2f"),
                    str(row["socket_errors_total"]),
                ]
            )
    return rows


def _num(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "n/a" if value is None else f"{value:{fmt}}"


def _nonzero(summary: dict[str, Any], key: str) -> list[str]:
    """``"contender case: N"`` for each summary row whose count ``key`` is not 0."""
    return [
        f"{name} {label}: {row[key]}"
        for label, by_name in summary.items()
        for name, row in by_name.items()
        if row[key]
    ]


RATIO_HEADER = ["ratio", "case", "req/s = MB/s", "per-round range", "CPU us/req", "target"]


def _ratio_rows(rat: dict[str, Any], suffix: str) -> list[list[str]]:
    """The ratio table's rows: case -> name -> entry (from :func:`ratios` or :func:`pair_ratios`)."""
    rows = []
    for label, by_other in rat.items():
        for other, entry in by_other.items():
            rps, cpu = entry.get("req_per_s"), entry.get("server_cpu_us_per_req")
            if rps is None:
                continue
            paired = rps["paired"]
            target = ""
            if "target" in entry:
                target = f">= {entry['target']:.1f}x: " + ("met" if entry["meets_target"] else "NOT MET")
            rows.append(
                [
                    other + suffix,
                    label,
                    f"{rps['median']:.2f}x",
                    f"{min(paired):.2f}-{max(paired):.2f}" if paired else "n/a",
                    "n/a" if cpu is None else f"{cpu['median']:.2f}x",
                    target,
                ]
            )
    return rows


def report(
    summary: dict[str, Any],
    rat: dict[str, Any],
    ctx: Context,
    rounds: int,
    *,
    multi_cpus: str | None = None,
    skipped: dict[str, str] | None = None,
    mixed: dict[str, Any] | None = None,
    pairs: dict[str, Any] | None = None,
    cpu_model: str | None = None,
    probe: dict[str, Any] | None = None,
    probe_rat: dict[str, Any] | None = None,
    tls: dict[str, Any] | None = None,
) -> str:
    rows = []
    for label, by_name in summary.items():
        for name, row in by_name.items():
            tag = name + (f" ({row['runs'] - row['ok']} failed)" if row["ok"] < row["runs"] else "")
            if not row["ok"]:
                rows.append([tag, label, "ERROR", "", "", "", "", "", "", "", "", "", "", ""])
                continue
            vs = rat.get(label, {}).get(name, {}).get("req_per_s")
            rows.append(
                [
                    tag,
                    label,
                    median_range(row, "req_per_s", ".0f"),
                    median_range(row, "mb_per_s", ".1f"),
                    "1.00x" if name == BASE and label in rat else (f"{vs['median']:.2f}x" if vs else ""),
                    _num(row, "latency_p50_ms_median", ".2f"),
                    _num(row, "latency_p99_ms_median", ".2f")
                    + " / "
                    + _num(row, "latency_p99_ms_max", ".2f"),
                    str(row["socket_errors_total"]),
                    _num(row, "server_cpu_us_per_req_median", ".1f"),
                    _num(row, "server_user_us_per_req_median", ".1f"),
                    _num(row, "server_cpu_s_per_gb_median", ".2f"),
                    _num(row, "server_cpus_busy_median", ".2f"),
                    _num(row, "wrk_cpus_busy_median", ".2f"),
                    _num(row, "other_load_cpus_median", ".2f"),
                ]
            )
    pin = (
        f"servers on CPU {ctx.server_cpus}, wrk on CPU {ctx.client_cpus}"
        if ctx.server_cpus or ctx.client_cpus
        else "no CPU pinning"
    )
    out = [
        f"http_static: wrk -t {ctx.threads} -c N -d {ctx.duration}s, {rounds} interleaved rounds, {pin} "
        "(medians [min-max]; MB = 10^6 bytes)",
        f"CPU: {cpu_model or 'unknown'} ({os.cpu_count()} CPUs): ratios vary with the CPU model.",
    ]
    if any(" w" in label for label in summary):
        where = f"on CPUs {multi_cpus}" if multi_cpus else "unpinned"
        out.append(
            f"wN cases: N server worker processes {where}; wrk "
            + (f"on CPU {ctx.client_cpus}" if ctx.client_cpus else "unpinned")
            + " shares a core with them there."
        )
    if mixed:
        out.append(
            f"mixed: {mixed['files']} files, {mixed['total_bytes'] / 1e6:.0f} MB, "
            f"sizes {mixed['min']}-{mixed['max']} B "
            f"(median {mixed['median']:.0f}, mean {mixed['mean']:.0f}), "
            f"seed {mixed['seed']}; wrk picks them at random (Lua, seeded); page cache evicted before "
            "every measured run (cold at its start, warming as it reads)."
        )
    colds = [
        f"{label} {name} {median_range(row, 'cold_read_us', '.0f')}"
        for label, by_name in summary.items()
        for name, row in by_name.items()
        if "cold_read_us_median" in row
    ]
    if colds:
        out.append(
            "cold reads (a 4 KiB read of a file just evicted, before each run; median [min-max] us; "
            "tens of us: the VM host's cache, where blocking on the disk costs little): " + ", ".join(colds)
        )
    if probe:
        out.append(
            f"probe: wrk loads the mixed set (as above) while one more client, its own process on CPU "
            f"{probe['cpus'] or '(unpinned)'}, GETs {probe['path']} ({probe['bytes']} B, in the page cache) "
            f"every {probe['interval_ms']:.0f} ms over one keep-alive HTTP/1.1 connection."
        )
        if probe.get("slow_disk"):
            out.append(f"slow disk: {probe['slow_disk']}.")
    if tls:
        out.append(
            "*-tls: the file over HTTPS, " + " and ".join(tls["contenders"]) + " with the same "
            f"{tls['certificate']} certificate; no kTLS (both encrypt in user space)."
        )
    out += [
        "",
        table(
            [
                "contender",
                "case",
                "req/s",
                "MB/s (body)",
                "x nginx",
                "p50 ms",
                "p99 ms med/max",
                "sock errs",
                "CPU us/req",
                "user us/req",
                "CPU s/GB",
                "server CPUs",
                "wrk CPUs",
                "other load",
            ],
            rows,
        ),
        "",
        "case: file set, cN = wrk connections, wN = server workers. MB/s: body bytes (req/s x file size;",
        "mixed: x the mean file size). x nginx: req/s median / nginx's in the same case. p99: median over",
        "rounds / worst round. sock errs: wrk's socket errors, all rounds (connect/read/write/timeout:",
        "listed below when any). CPU: the server's process tree (utime+stime from /proc/PID/stat) over the",
        "wrk run, per request and per 10^9 body bytes; user: its utime alone (the interpreter's share;",
        "the rest is the kernel's). server CPUs, wrk CPUs: CPU seconds / wall seconds;",
        "1.00 = that side's pinned core is saturated, so it is the limit.",
        "Other load: CPUs' worth of busy time on the machine (/proc/stat) that was neither server nor wrk.",
        "p99 and max include each run's connection ramp-up (see benchmarks/README.md, caveats).",
    ]
    if ratio_rows := _ratio_rows(rat, f" / {BASE}"):
        out += [
            "",
            table(RATIO_HEADER, ratio_rows),
            "",
            "req/s = MB/s: ratio of the medians (in one case the req/s and MB/s ratios are the same).",
            "CPU us/req: the contender's server CPU per request / nginx's (below 1: cheaper than nginx).",
        ]
    if probe_rows := _probe_rows(summary, probe_rat or {}):
        out += [
            "",
            "The hot-file probe (issue #24: another client's latency while wrk loads the server):",
            table(
                [
                    "contender",
                    "case",
                    "probe p50 ms",
                    "probe p99 ms",
                    "probe max ms med/max",
                    "p99 x nginx [rounds]",
                    "GETs",
                    "err/reconn/late/unans",
                    "wrk req/s",
                    "wrk p99 ms",
                    "wrk sock errs",
                ],
                probe_rows,
            ),
            "",
            "probe: one GET per 10 ms tick, timed from its first byte sent to its last body byte; only the",
            "GETs that started inside wrk's run; medians [min-max] over rounds (max: median / worst round).",
            "p99 x nginx: the probe's p99 median over nginx's in the same case [per-round ratios].",
            "GETs: answered per trial (median). err/reconn/late/unans, all rounds: failed GETs, GETs that",
            "had to connect first (the server closed the connection), ticks skipped while a GET was still",
            "running, GETs unanswered when wrk's run ended (counted as the time waited, a lower bound).",
            "wrk req/s, p99, sock errs: the same trials' wrk figures.",
        ]
        for label, by_name in (probe_rat or {}).items():
            if (vs := by_name.get("serve", {}).get("probe_p99_ms")) is not None:
                per_round = ", ".join(f"{v:.2f}" for v in vs["paired"])
                out.append(
                    f"{label}: serve probe p99 / nginx probe p99 = {vs['median']:.2f} "
                    f"(per round: {per_round})"
                )
    if pair_rows := _ratio_rows(pairs or {}, ""):
        out += [
            "",
            "The ASGI rows (issue #16), A / B in the same case:",
            table(RATIO_HEADER, pair_rows),
            "",
            "req/s = MB/s: A's median over B's; per-round range: A / B round by round.",
            "CPU us/req: A's server CPU per request / B's (below 1: A is cheaper).",
            'target: the issue\'s "done when".',
        ]
    if skipped:
        out += ["", *(f"{name}: skipped: {why}" for name, why in skipped.items())]
    errors = [
        f"  {name} {label}: {err}"
        for label, by_name in summary.items()
        for name, row in by_name.items()
        for err in row["errors"]
    ]
    if errors:
        out += ["", "FAILED TRIALS:", *errors]
    if sock_errs := _nonzero(summary, "socket_errors_total"):
        out += ["", "wrk socket errors (connect/read/write/timeout, all rounds): " + ", ".join(sock_errs)]
    if unclean := _nonzero(summary, "unclean_server_exits"):
        out += ["", "servers that did not exit with status 0 on the clean stop: " + ", ".join(unclean)]
    loads = [
        v
        for by_name in summary.values()
        for row in by_name.values()
        if (v := row.get("other_load_cpus_median")) is not None
    ]
    if loads and max(loads) > OTHER_LOAD_WARN:
        out += [
            "",
            f"WARNING: a median of up to {max(loads):.2f} CPUs of other load on this machine during the",
            "trials (other_load_cpus in the JSON samples): these numbers are not from a quiet machine.",
        ]
    return "\n".join(out)
