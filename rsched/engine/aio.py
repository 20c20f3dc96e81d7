"""The event loop of the long-running processes (dispatcher, worker).

uvloop where it is installed (a declared dependency except on Windows): its loop primitives
(call_soon, handles, socket reads) are compiled, and a worker schedules a task and two loop
callbacks per run.  Measured with `make bench`: worker CPU 49-53 -> 43-45 us per run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # no uvloop on Windows: the standard loop
        asyncio.run(main)
        return
    uvloop.run(main)
