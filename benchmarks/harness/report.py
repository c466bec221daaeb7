"""Reporting: tables, number formats, the machine description, and the ending of every benchmark.

Every benchmark prints plain-text tables (``table``), writes one JSON document with the machine
it ran on (``machine_info``), and ends alike (``finish``, or ``finish_section`` and
``finish_samples`` for the two usual documents): print the report, write the JSON, say where,
exit 0 only if every trial succeeded. A report warns (``other_load_warning``) when
other processes loaded the machine during the trials.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import asdict, fields
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any

OTHER_LOAD_WARN = 0.25  # median CPUs of other load over the trials that makes the report warn
REPO = Path(__file__).resolve().parent.parent.parent


# ---------------------------------------------------------------------------
# Tables and numbers
# ---------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned, a rule under the header."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for n, r in enumerate([header, *rows]):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ms(v: float | None) -> str:
    """A millisecond figure with two decimals, or ``n/a``."""
    return "n/a" if v is None else f"{v:.2f}"


def median_range(row: dict[str, Any], key: str, fmt: str = ".2f") -> str:
    """``median [min-max]`` from a summary row's ``KEY_median``, ``KEY_min``, ``KEY_max``; else ``n/a``.

    A row without ``KEY_max`` uses ``KEY`` (the worst loop delay's max is stored under its bare name).
    """
    med, lo = row.get(f"{key}_median"), row.get(f"{key}_min")
    hi = row.get(f"{key}_max", row.get(key))
    if med is None or lo is None or hi is None:
        return "n/a"
    return f"{med:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


def median_min_max(name: str, values: list[float]) -> dict[str, float]:
    """``{NAME_median, NAME_min, NAME_max}`` of non-empty *values*, for a summary row."""
    return {
        f"{name}_median": statistics.median(values),
        f"{name}_min": min(values),
        f"{name}_max": max(values),
    }


def summary_row(samples: list[Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """One label's trials: ``runs``, ``ok``, ``errors``, then ``median_min_max`` of each attribute in *keys*.

    The statistics are over the successful samples (``.ok``) whose attribute is not None.
    """
    ok = [s for s in samples if s.ok]
    row: dict[str, Any] = {
        "runs": len(samples),
        "ok": len(ok),
        "errors": [s.error for s in samples if not s.ok],
    }
    for key in keys:
        if got := [v for s in ok if (v := getattr(s, key)) is not None]:
            row |= median_min_max(key, got)
    return row


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def loop_trial_line(s: Any, *, worst: bool = False) -> str:
    """A one-loop trial's progress line (concurrency, receive): MB/s, CPU s/GB, loop delay, other load."""
    if not s.ok:
        return f"ERROR: {s.error}"
    msg = f"{s.mb_per_s:8.0f} MB/s  cpu {s.cpu_s_per_gb:.3f} s/GB  loop p99 {s.loop_delay_p99_ms:.2f} ms"
    if worst:
        msg += f"  worst {s.loop_delay_worst_ms:.2f} ms"
    if s.other_load_cpus:
        msg += f"  other load {s.other_load_cpus:.2f} CPUs"
    return msg


def other_load_warning(loads: list[float]) -> list[str]:
    """The report's warning lines if the largest of *loads* (median CPUs per row) is over OTHER_LOAD_WARN."""
    if not loads or max(loads) <= OTHER_LOAD_WARN:
        return []
    return [
        "",
        f"WARNING: a median of up to {max(loads):.2f} CPUs of other load on this machine during the",
        "trials (other_cpu_s in the JSON samples): these numbers are not from a quiet machine.",
    ]


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


def version(dist: str) -> str | None:
    """The installed version of distribution *dist*, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo), or None."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def machine_info() -> dict[str, Any]:
    """The CPU, kernel, Python, library versions, TCP buffer sysctls, git state and aiosendfile's sources."""
    import aiosendfile

    sysctls = {}
    for name in (
        "net/ipv4/tcp_wmem",
        "net/ipv4/tcp_rmem",
        "net/core/wmem_max",
        "net/core/rmem_max",
        "net/ipv4/tcp_congestion_control",
    ):
        with contextlib.suppress(OSError):
            sysctls[name.replace("/", ".")] = Path("/proc/sys", name).read_text().split()
    git = None
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "aiosendfile"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        git = {"head": head, "aiosendfile_dirty": bool(dirty)}
    digest = hashlib.sha256()
    for src in sorted(Path(aiosendfile.__file__).parent.glob("*.py")):
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    return {
        "uname": platform.uname()._asdict(),
        "cpu_model": cpu_model(),
        "nproc": os.cpu_count(),
        "nproc_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version,
        "python_implementation": platform.python_implementation(),
        "versions": {
            "aiosendfile": aiosendfile.__version__,
            "uvloop": version("uvloop"),
            "aiohttp": version("aiohttp"),
        },
        "sysctl": sysctls,
        "git": git,
        "aiosendfile_sources_sha256": digest.hexdigest(),
        "aiosendfile_path": str(Path(aiosendfile.__file__).parent),
    }


# ---------------------------------------------------------------------------
# The JSON document and the ending
# ---------------------------------------------------------------------------


def document_head(benchmark: str, started: datetime) -> dict[str, Any]:
    """The first keys of a benchmark's JSON document: its name, start time and command line."""
    return {
        "benchmark": benchmark,
        "date": started.isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
    }


def json_default(obj: object) -> object:
    """``json.dumps(default=...)``: refuse anything that is not plain JSON (no silent ``str()``)."""
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def finish(
    text: str,
    document: dict[str, Any],
    path: Path,
    *,
    ok: bool,
    allow_nan: bool = True,
    log: IO[str] | None = None,
) -> int:
    """Every benchmark's ending: print *text* (the report), write *document* to *path*, say where.

    Returns the exit code: 0 if every trial succeeded (*ok*), else 1.
    """
    print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, allow_nan=allow_nan, default=json_default) + "\n")
    print(f"results: {path}", file=log or sys.stderr)
    return 0 if ok else 1


def finish_section(document: dict[str, Any], path: Path) -> int:
    """The ending of a benchmark whose ``run()`` returns its whole document (a ``suite`` section).

    Adds ``machine`` (last), prints the document's ``report``, writes it to *path*; the exit code
    is 1 if any sample failed.
    """
    document["machine"] = machine_info()
    return finish(document["report"], document, path, ok=all(s["ok"] for s in document["samples"]))


def finish_samples(
    text: str, document: dict[str, Any], sample_type: type, samples: list[Any], path: Path, log: IO[str]
) -> int:
    """The ending of a benchmark whose document ends with its samples (dataclasses of *sample_type*).

    Adds ``samples`` and ``sample_fields`` (last), prints *text*, writes strict JSON (no NaN)
    to *path*; the exit code is 1 if any sample failed.
    """
    document["samples"] = [asdict(s) for s in samples]
    document["sample_fields"] = [f.name for f in fields(sample_type)]
    return finish(text, document, path, ok=all(s.ok for s in samples), allow_nan=False, log=log)
