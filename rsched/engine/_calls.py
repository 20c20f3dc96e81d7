"""How the engine's loops send their batches of script calls, as one injectable callable."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rsched.rdb import scripts

# scripts.acall_many, or a wrapper around it (a test records or holds back calls this way).
CallMany = Callable[[Any, list[scripts.Call]], Awaitable[list[Any]]]
