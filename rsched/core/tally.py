"""Counts a process keeps on its write path and rsched.obs.metrics reads when Prometheus scrapes:
the service counts here without importing obs, as the worker counts in its RunMetrics."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Tally(Generic[K]):
    """Counts by key, safe to add to from several threads: one lock per batch, not per item."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: defaultdict[K, int] = defaultdict(int)
        self._lock = threading.Lock()

    def add(self, counts: Iterable[tuple[K, int]]) -> None:
        with self._lock:
            for key, n in counts:
                self._counts[key] += n

    def snapshot(self) -> dict[K, int]:
        with self._lock:
            return dict(self._counts)


SCHEDULED: Tally[tuple[str, str]] = Tally()  # jobs this process created, by (type, queue)

__all__ = ["SCHEDULED", "Tally"]
