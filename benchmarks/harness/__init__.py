"""The benchmarks' harness: what every benchmark measures and runs with, so each is only its contenders.

One job per module: ``measure`` (loop-delay ticker, delay statistics, process, process-tree and
whole-machine CPU, other load, perf windows), ``children`` (the spawned server process and its
result), ``files`` (making, warming and evicting the test files, page-cache state), ``netns`` (veth
pairs between network namespaces), ``report`` (tables, number formats, machine description, the JSON
document and the ending every benchmark's ``main`` shares), ``cli`` (checked comma-separated lists
such as ``--contenders``, the rotating round order), ``senders`` (the server-side send strategies),
``transfer`` (the one-file trial of ``raw_transfer`` and ``loop_stall``), ``servers`` (external
server processes, pinning, free ports, wrk/nginx/caddy install and versions, the descriptor limit),
``wrk`` (its command, a path-picking Lua script, run, report parsing), ``http_trial`` (the HTTP(S)
trial ``http_static`` and ``tls_static`` share). This module holds the units and the error every one
of them uses.
"""

from __future__ import annotations

MiB = 1 << 20
MB = 1_000_000  # throughput is in MB/s (10**6 bytes)
GB = 1_000_000_000  # CPU cost is in seconds per 10**9 bytes


class TrialError(RuntimeError):
    """One trial failed; its message goes into the sample's ``error`` (the run goes on)."""
