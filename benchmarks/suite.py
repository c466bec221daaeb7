"""The benchmark suite: ``python -m benchmarks`` (from the repository root).

Runs these sections one after another in this process tree, each with its
own interleaved rounds and medians (see ``benchmarks/README.md``):

1. ``raw``: large-file transfer, one connection (``raw_transfer.py``). As root,
   across a veth pair between two network namespaces the suite makes and
   removes (``harness/netns.py``); otherwise, or with ``--loopback``, over loopback.
   The output and the JSON say which network, and why not veth.
2. ``concurrency``: 1, 16 and 256 simultaneous downloads of a 16 MiB file from
   one server loop (``concurrency.py``).
3. ``http``: wrk against ``serve``, the aiohttp plugin, aiohttp's static, nginx, caddy and
   http.server (``http_static.py``).
4. ``tls``: wrk over HTTPS, the plugin's fallback path vs aiohttp's static (``tls_static.py``).
5. ``receive``: one 512 MiB upload, ``recvfile`` vs ``StreamReader.read`` + ``write`` (``receive.py``).

Writes ``benchmarks/results/suite.json`` (every raw sample, the machine
description, each section's report) and ``benchmarks/results/suite.png``
(throughput with min-max whiskers, CPU s/GB, loop delay), and prints one
summary table at the end. ``--quick`` is a smoke run of well under a minute;
``--readme-plot`` also copies the figure to ``benchmarks/plots/suite.png``,
the one ``benchmarks/README.md`` shows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks import concurrency, http_static, raw_transfer, receive, tls_static
from benchmarks.harness import netns
from benchmarks.harness.cli import comma_list
from benchmarks.harness.report import OTHER_LOAD_WARN, document_head, json_default, machine_info, table
from benchmarks.harness.senders import unavailable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README_PLOT = HERE / "plots" / "suite.png"
SECTIONS = ("raw", "concurrency", "http", "tls", "receive")


# ---------------------------------------------------------------------------
# Progress display: tqdm on a terminal when installed, plain lines otherwise
# ---------------------------------------------------------------------------


class Progress:
    """One bar over all trials of the suite; trial lines go above it (or plainly to stderr)."""

    def __init__(self, total: int) -> None:
        self.bar: Any = None
        if sys.stderr.isatty():
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="trial", file=sys.stderr, dynamic_ncols=True, leave=False)

    def section(self, name: str) -> None:
        if self.bar is not None:
            self.bar.set_description(name)
        self.write(f"== {name} ==")

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def trial(self, line: str) -> None:
        self.write(line)
        if self.bar is not None:
            self.bar.update(1)

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    @contextlib.contextmanager
    def external(self) -> Iterator[None]:
        """For sections that print to stderr themselves: clear the bar meanwhile."""
        if self.bar is None:
            yield
            return
        with self.bar.external_write_mode(file=sys.stderr):
            yield

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------


def _plan(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per section: its parameters and how many trials it will run."""
    q = args.quick
    raw_contenders = [c for c in raw_transfer.CONTENDERS if not unavailable(c)]
    conc_levels = [1, 16, 256]
    plan: dict[str, dict[str, Any]] = {
        "raw": {
            "size_mib": 128 if q else 1024,
            "rounds": args.rounds or (2 if q else 5),
            "network": args.network,  # asked for; the section's "network" says what was used
        },
        "concurrency": {
            "size_mib": 4 if q else 16,
            "levels": conc_levels,
            "rounds": args.rounds or (1 if q else 3),
        },
        "http": {"duration": 1 if q else 10, "rounds": args.rounds or (1 if q else 3)},
        "tls": {"duration": 1 if q else 5, "rounds": args.rounds or (1 if q else 3)},
        "receive": {"size_mib": 64 if q else 512, "rounds": args.rounds or (1 if q else 5)},
    }
    plan["raw"]["trials"] = plan["raw"]["rounds"] * len(raw_contenders)
    conc = plan["concurrency"]
    conc["trials"] = conc["rounds"] * len(conc_levels) * len(concurrency.CONTENDERS)
    plan["http"]["files"] = ["1MiB"] if q else [f[0] for f in http_static.FILES]
    plan["http"]["trials"] = (
        plan["http"]["rounds"] * len(plan["http"]["files"]) * len(http_static.DEFAULT_CONTENDERS)
    )
    plan["tls"]["trials"] = plan["tls"]["rounds"] * len(tls_static.CONTENDERS)
    plan["receive"]["trials"] = plan["receive"]["rounds"] * len(receive.CONTENDERS)
    return plan


def _run_cli_section(
    main: Callable[[list[str] | None], int], argv: list[str], json_path: Path
) -> dict[str, Any]:
    """Run an existing benchmark's main() (it prints its own progress and report); load its JSON."""
    json_path.unlink(missing_ok=True)
    rc = main([*argv, "--json", str(json_path)])
    if not json_path.exists():
        raise RuntimeError(f"exited {rc} without results in {json_path} (its error is above)")
    doc: dict[str, Any] = json.loads(json_path.read_text())
    return doc


def run_section(name: str, p: dict[str, Any], args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    d = ["--dir", args.dir] if args.dir else []
    if name == "raw":
        # raw_transfer makes the veth pair itself (and removes it, on errors and Ctrl-C too).
        argv = ["--size", str(p["size_mib"]), "--rounds", str(p["rounds"]), "--network", p["network"], *d]
        if args.veth_mtu:
            argv += ["--veth-mtu", str(args.veth_mtu)]
        with progress.external():
            doc = _run_cli_section(
                raw_transfer.main, argv, args.json.with_name(args.json.stem + "_raw_transfer.json")
            )
        progress.advance(p["trials"])
        net = doc["params"]["networks"]
        doc["network"] = "veth" if "veth" in net["used"] else "loopback"
        # why not veth (None over veth)
        doc["network_note"] = "asked for (--loopback)" if p["network"] == "loopback" else net["loopback_why"]
        doc["veth"] = net["veth"]
        return doc
    if name == "http":
        argv = [
            "--duration",
            str(p["duration"]),
            "--rounds",
            str(p["rounds"]),
            "--files",
            ",".join(p["files"]),
            "--connections",  # the suite's scope: 64 connections, one worker (the grid is http_static's own)
            "64",
            "--workers",
            "1",
        ]
        with progress.external():
            doc = _run_cli_section(
                http_static.main, [*argv, *d], args.json.with_name(args.json.stem + "_http_static.json")
            )
        progress.advance(p["trials"])
        return doc
    if name == "concurrency":
        return concurrency.run(
            p["size_mib"],
            p["levels"],
            p["rounds"],
            list(concurrency.CONTENDERS),
            directory=args.dir,
            progress=progress.trial,
        )
    if name == "tls":
        return tls_static.run(
            p["duration"], p["rounds"], list(tls_static.CONTENDERS), progress=progress.trial
        )
    if name == "receive":
        return receive.run(
            p["size_mib"], p["rounds"], list(receive.CONTENDERS), directory=args.dir, progress=progress.trial
        )
    raise ValueError(name)


# ---------------------------------------------------------------------------
# One normalized row per (section, contender): the summary table and the plots
# ---------------------------------------------------------------------------


def _get(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def headline_rows(sections: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(
        section: str, label: str, r: dict[str, Any], cpu: str, p99: str | None, worst: str | None
    ) -> None:
        rows.append(
            {
                "section": section,
                "label": label,
                "ok": bool(r.get("ok")),
                "mb_per_s": _get(r, "mb_per_s_median"),
                "mb_per_s_min": _get(r, "mb_per_s_min"),
                "mb_per_s_max": _get(r, "mb_per_s_max"),
                "cpu_s_per_gb": _get(r, cpu + "_median"),
                "cpu_s_per_gb_min": _get(r, cpu + "_min"),
                "cpu_s_per_gb_max": _get(r, cpu + "_max"),
                "loop_p99_ms": _get(r, p99) if p99 else None,
                "loop_worst_ms": _get(r, worst) if worst else None,
                "other_load_cpus": _get(r, "other_load_cpus_median"),
            }
        )

    if doc := sections.get("raw"):
        net = doc.get("network", "loopback")
        for name, r in doc["summary"].items():
            add(
                f"raw ({net})",
                name,
                r,
                "cpu_total_s_per_gb",
                "loop_delay_p99_ms_median",
                "loop_delay_worst_ms",
            )
    if doc := sections.get("concurrency"):
        for name, r in doc["summary"].items():
            add("concurrency", name, r, "cpu_s_per_gb", "loop_delay_p99_ms_median", "loop_delay_worst_ms_max")
    if doc := sections.get("http"):
        for file_label, per in doc["summary"].items():
            for name, r in per.items():
                add(f"http {file_label}", name, r, "server_cpu_s_per_gb", None, None)
    if doc := sections.get("tls"):
        for file_label, per in doc["summary"].items():
            for name, r in per.items():
                add(f"tls {file_label}", name, r, "server_cpu_s_per_gb", None, None)
    if doc := sections.get("receive"):
        for name, r in doc["summary"].items():
            add("receive", name, r, "cpu_s_per_gb", "loop_delay_p99_ms_median", "loop_delay_worst_ms_max")
    return rows


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def summary_table(rows: list[dict[str, Any]]) -> str:
    body = []
    for r in rows:
        if not r["ok"] or r["mb_per_s"] is None:
            body.append([r["section"], r["label"], "ERROR", "", "", "", ""])
            continue
        body.append(
            [
                r["section"],
                r["label"],
                f"{r['mb_per_s']:.0f} [{r['mb_per_s_min']:.0f}-{r['mb_per_s_max']:.0f}]",
                _f(r["cpu_s_per_gb"], ".3f"),
                _f(r["loop_p99_ms"], ".2f"),
                _f(r["loop_worst_ms"], ".2f"),
                _f(r["other_load_cpus"], ".2f"),
            ]
        )
    return table(
        ["section", "row", "MB/s median [min-max]", "CPU s/GB", "loop p99 ms", "loop worst ms", "other load"],
        body,
    )


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    """One figure: a row of panels per section (MB/s with min-max whiskers, CPU s/GB, loop delay)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return False
    sections = list(dict.fromkeys(r["section"] for r in rows))
    if not sections:
        return False
    heights = [max(1.6, 0.28 * sum(r["section"] == s for r in rows) + 0.8) for s in sections]
    fig, axes = plt.subplots(
        len(sections),
        3,
        figsize=(13, sum(heights) + 0.8),
        gridspec_kw={"height_ratios": heights, "width_ratios": [1.4, 1, 1]},
        squeeze=False,
    )
    for i, section in enumerate(sections):
        mine = [r for r in rows if r["section"] == section and r["mb_per_s"] is not None]
        labels = [r["label"] for r in mine]
        y = list(range(len(mine)))
        ours = [lb == "serve" or "aiosendfile" in lb or "recvfile" in lb for lb in labels]
        colors = ["tab:blue" if is_ours else "tab:gray" for is_ours in ours]
        panels = [
            ("mb_per_s", "MB/s (median, min-max)"),
            ("cpu_s_per_gb", "server CPU s/GB"),
            ("loop_p99_ms", "loop delay p99 ms (worst: x)"),
        ]
        for j, (key, xlabel) in enumerate(panels):
            ax = axes[i][j]
            vals = [r[key] if r[key] is not None else 0.0 for r in mine]
            err = None
            lo_key, hi_key = key + "_min", key + "_max"
            if mine and lo_key in mine[0]:
                err = [
                    [
                        max(0.0, v - (r[lo_key] if r[lo_key] is not None else v))
                        for v, r in zip(vals, mine, strict=True)
                    ],
                    [
                        max(0.0, (r[hi_key] if r[hi_key] is not None else v) - v)
                        for v, r in zip(vals, mine, strict=True)
                    ],
                ]
            if key == "loop_p99_ms" and all(r[key] is None for r in mine):
                ax.set_axis_off()
                continue
            ax.barh(y, vals, xerr=err, color=colors, capsize=2, error_kw={"elinewidth": 0.8})
            if key == "loop_p99_ms":
                worst = [
                    (k, r["loop_worst_ms"]) for k, r in enumerate(mine) if r["loop_worst_ms"] is not None
                ]
                if worst:
                    ax.scatter(
                        [w for _, w in worst], [k for k, _ in worst], marker="x", color="tab:red", s=14
                    )
                    ax.set_xscale("symlog", linthresh=1.0)
            ax.set_yticks(y)
            ax.set_yticklabels(labels if j == 0 else [""] * len(labels), fontsize=7)
            ax.invert_yaxis()
            ax.tick_params(axis="x", labelsize=7)
            ax.grid(axis="x", alpha=0.3)
            ax.set_xlabel(xlabel, fontsize=7)
            if j == 0:
                ax.set_title(section, fontsize=9, loc="left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run of every section (well under a minute)")
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds for every section (default: each its own)",
    )
    p.add_argument("--json", type=Path, default=RESULTS / "suite.json")
    p.add_argument("--plot", type=Path, default=RESULTS / "suite.png")
    p.add_argument("--readme-plot", action="store_true", help=f"also copy the figure to {README_PLOT}")
    net = p.add_mutually_exclusive_group()
    net.add_argument(
        "--veth",
        dest="network",
        action="store_const",
        const="veth",
        help="the raw section across a veth pair, or an error if one cannot be made here "
        "(the default as root: veth when it can be made, else loopback; the output says which and why)",
    )
    net.add_argument(
        "--loopback",
        dest="network",
        action="store_const",
        const="loopback",
        help="the raw section over loopback even as root",
    )
    p.set_defaults(network="auto")
    p.add_argument("--veth-mtu", type=int, default=None, help="MTU of the veth pair (default 1500)")
    p.add_argument("--dir", default=None, help="where to create temporary files (default: system temp)")
    p.add_argument(
        "--replot",
        type=Path,
        default=None,
        metavar="JSON",
        help="run nothing: redraw the figure (and table) from a suite JSON file",
    )
    args = p.parse_args(argv)
    args.sections = comma_list(p, args.sections, SECTIONS, "sections")
    if args.network == "veth" and not args.replot and (why := netns.available()):
        p.error(f"--veth: a veth pair cannot be made here: {why}")
    return args


def network_line(sections: dict[str, dict[str, Any]]) -> str | None:
    """Which network the raw section crossed, and on loopback why not veth."""
    doc = sections.get("raw")
    if not doc:
        return None
    if doc.get("network") == "veth" and (v := doc.get("veth")):
        return (
            f"raw section network: veth pair between network namespaces {v['server_ns']} "
            f"({v['server_addr']}, server) and {v['client_ns']} ({v['client_addr']}, reader), "
            f"MTU {v['mtu']}; the other sections ran over loopback"
        )
    why = doc.get("network_note") or "not recorded"
    return f"raw section network: loopback (veth not used: {why}); the other sections ran over loopback"


def _title(document: dict[str, Any]) -> str:
    m = document["machine"]
    return (
        f"aiosendfile benchmarks ({document['mode']}), {document['date'][:10]}, {m['cpu_model']}, "
        f"{m['nproc']} CPUs, Linux {m['uname']['release']}, Python {m['python'].split()[0]}"
    )


def replot(args: argparse.Namespace) -> int:
    document = json.loads(args.replot.read_text())
    rows = headline_rows(document["sections"])
    print(summary_table(rows))
    if line := network_line(document["sections"]):
        print("\n" + line)
    return 0 if _save_plot(rows, args, _title(document)) else 1


def _save_plot(rows: list[dict[str, Any]], args: argparse.Namespace, title: str) -> bool:
    if not plot(rows, args.plot, title):
        return False
    print(f"plot: {args.plot}")
    if args.readme_plot:
        README_PLOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.plot, README_PLOT)
        print(f"plot: {README_PLOT} ({os.path.getsize(README_PLOT) // 1024} KiB)")
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        return replot(args)
    plan = _plan(args)
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    progress = Progress(sum(plan[s]["trials"] for s in args.sections))
    sections: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    if "raw" in args.sections:
        progress.write(
            {
                "auto": "raw section: veth pair between two network namespaces if it can be made here "
                "(root), else loopback",
                "veth": "raw section: veth pair between two network namespaces (--veth)",
                "loopback": "raw section: loopback (--loopback)",
            }[args.network]
        )
    try:
        for n, name in enumerate(args.sections, 1):
            progress.section(f"[{n}/{len(args.sections)}] {name}")
            try:
                sections[name] = run_section(name, plan[name], args, progress)
            except Exception as exc:  # one broken section should not lose the others
                failed[name] = repr(exc)
                progress.write(f"section {name} FAILED: {exc!r}")
                continue
            if "report" in sections[name]:
                print("\n" + sections[name]["report"] + "\n", flush=True)
    except (KeyboardInterrupt, netns.Terminated) as exc:
        # The veth pair, if any, is already removed (netns.veth_pair's finally).
        progress.close()
        print(f"\ninterrupted ({exc!r}); no results written", file=sys.stderr)
        return 128 + getattr(exc, "signum", 2)
    finally:
        progress.close()
    elapsed = time.perf_counter() - t0

    rows = headline_rows(sections)
    mode = "quick" if args.quick else "full"
    print(f"\nsuite summary ({mode} run, {elapsed:.0f} s; medians over interleaved rounds)\n")
    print(summary_table(rows))
    if line := network_line(sections):
        print("\n" + line)
    loads = [r["other_load_cpus"] for r in rows if r["other_load_cpus"] is not None]
    if loads and max(loads) > OTHER_LOAD_WARN:
        print(
            f"\nWARNING: up to {max(loads):.2f} CPUs (median per row) of other load on this machine "
            "during the trials: these numbers are not from a quiet machine."
        )
    if failed:
        print("\nfailed sections: " + ", ".join(f"{k} ({v})" for k, v in failed.items()))

    document = {
        **document_head("suite", started),
        "mode": mode,
        "plan": plan,
        "elapsed_s": elapsed,
        "network": {
            "raw": (sections.get("raw") or {}).get("network"),
            "raw_loopback_why": (sections.get("raw") or {}).get("network_note"),
            "raw_veth": (sections.get("raw") or {}).get("veth"),
            "other_sections": "loopback",
        },
        "machine": machine_info(),
        "headline": rows,
        "failed_sections": failed,
        "sections": sections,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2, default=json_default) + "\n")
    print(f"\nresults: {args.json}")
    _save_plot(rows, args, _title(document))
    ok = not failed and all(r["ok"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
