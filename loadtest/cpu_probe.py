"""How much the machine itself stalls: time a fixed slice of pure-Python work every 10 ms.

Run beside a benchmark (bench_engine.py does, during its light phase).  On a quiet machine each
slice costs about the same CPU time; a slice that takes several times its median was slowed by
the machine (a virtual CPU held back by its host shows up as CPU time charged to whatever ran),
and every process on it then stalls alike.  Prints one line of JSON.
"""

from __future__ import annotations

import json
import sys
import time


def _slice() -> int:
    s = 0
    for i in range(5_000):
        s += i * i
    return s


def probe(seconds: float) -> dict[str, float]:
    costs: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        c0 = time.process_time()
        _slice()
        costs.append(time.process_time() - c0)
        time.sleep(0.01)
    ordered = sorted(costs)
    median = ordered[len(ordered) // 2] if ordered else 0.0
    slow = [c for c in costs if c > 3 * median]
    return {"slice_median_ms": round(median * 1000, 2),
            "slices_over_3x": len(slow), "slices": len(costs),
            "slice_max_ms": round(max(costs, default=0.0) * 1000, 1)}


if __name__ == "__main__":
    print(json.dumps(probe(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)))
