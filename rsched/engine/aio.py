"""The event loop of the long-running processes (dispatcher, worker).

uvloop where it is installed (a declared dependency except on Windows): its loop primitives
(call_soon, handles, socket reads) are compiled, and a worker schedules a task and two loop
callbacks per run, and uvloop cuts the worker's CPU per run by about a tenth (`make bench`,
docs/performance.md).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any

# A young collection every this many container allocations (CPython's default: 700).
GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """For a long-running process, once its start-up is done: what is alive then (modules,
    functions, classes) is frozen out of every pass of the cyclic collector, and a young pass
    runs every GC_YOUNG_THRESHOLD allocations, since nearly everything a job allocates is freed
    by reference counting.  Under CPython's defaults the collector ran every 700 allocations
    and every hundredth pass walked the whole start-up heap, a quarter of the dispatcher's CPU
    per claimed job (docs/performance.md)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


def run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # no uvloop on Windows: the standard loop
        asyncio.run(main)
        return
    uvloop.run(main)
