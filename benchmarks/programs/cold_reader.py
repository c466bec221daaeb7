"""Read files from the disk for a while, from several threads: ``mixed_stall``'s load for its floor row.

``python -m benchmarks.programs.cold_reader LIST SECONDS THREADS``

LIST is a file of paths, one a line (the mixed set, evicted by the caller). Each thread reads whole
files in its own seeded random order until SECONDS have passed (starting the list again if it ends).
Prints one JSON line: ``{"files": N, "bytes": B, "seconds": S}``.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time


def main(argv: list[str]) -> int:
    with open(argv[0]) as listing:
        paths = [p for p in listing.read().splitlines() if p]
    seconds, threads = float(argv[1]), int(argv[2])
    counts = [[0, 0] for _ in range(threads)]
    start = time.perf_counter()
    deadline = start + seconds

    def read(n: int) -> None:
        order = paths[:]
        random.Random(n).shuffle(order)
        i = 0
        while time.perf_counter() < deadline:
            with open(order[i % len(order)], "rb") as f:
                counts[n][1] += len(f.read())
            counts[n][0] += 1
            i += 1

    workers = [threading.Thread(target=read, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.perf_counter() - start
    print(
        json.dumps({"files": sum(c[0] for c in counts), "bytes": sum(c[1] for c in counts), "seconds": took})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
