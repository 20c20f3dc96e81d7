"""What every service operation shares: settings, the partition count and Redis's clock (each
read once and kept), and the run-history archive, opened on first use."""

from __future__ import annotations

import time
from collections.abc import Iterable

from rsched.archive import open_store
from rsched.archive.history import configured_url
from rsched.archive.store import Store
from rsched.core import defaults
from rsched.core.settings import Settings
from rsched.rdb.ops import Op
from rsched.rdb.setup import op_ensure_partitions, op_read_partitions
from rsched.rdb.shared_keys import op_publish_wake, op_redis_time

CLOCK_REFRESH_S = 30  # Redis's clock offset is re-read this often: drift stays far below a ms


class Service:
    """The state operations read; the clients subclass it and add a driver."""

    def __init__(self, settings: Settings, archive_url: str | None = None) -> None:
        self.settings = settings
        self.archive_url = configured_url(archive_url)
        """Run-history store merged into runs (RSCHED_ARCHIVE_URL); None: Redis's history only."""
        self._archive: Store | None = None
        self._partitions: int | None = None
        self._offset_ms = 0
        self._offset_at = 0.0
        self.streams_calls = False
        """The driver writes script calls to Redis as they are built (rdb.ops.streams), so
        scheduling starts a batch with small calls (service.scheduling.call_sizes)."""

    @property
    def archive(self) -> Store | None:
        """The archive store, opened on first use (it connects on its first query)."""
        if self._archive is None and self.archive_url:
            self._archive = open_store(self.archive_url)
        return self._archive

    def op_partitions(self) -> Op[int]:
        """The cluster's partition count, stored in Redis by the first process to start; read
        only, as every read op uses it.  With none stored yet (nothing scheduled, no daemon
        started) the configured count, not kept: storing it here once fixed 16 partitions on a
        Redis a later deployment wanted another count for."""
        if self._partitions is None:
            wanted = self.settings.partitions or defaults.PARTITIONS
            stored = yield from op_read_partitions(wanted, bool(self.settings.partitions))
            if stored is None:
                return wanted
            self._partitions = stored
        return self._partitions

    def op_store_partitions(self) -> Op[int]:
        """The partition count for a write that creates jobs: stored first if none is."""
        if self._partitions is None:
            self._partitions = yield from op_ensure_partitions(
                self.settings.partitions or defaults.PARTITIONS, bool(self.settings.partitions))
        return self._partitions

    def op_now(self) -> Op[int]:
        """Redis's clock, estimated locally from an offset refreshed every CLOCK_REFRESH_S."""
        mono = time.monotonic()
        if mono - self._offset_at > CLOCK_REFRESH_S or not self._offset_at:
            before = time.time()
            redis_ms = yield from op_redis_time()
            after = time.time()
            self._offset_ms = int(redis_ms - (before + after) * 500)
            self._offset_at = mono
        return int(time.time() * 1000) + self._offset_ms


def op_wake(partitions: Iterable[int]) -> Op[None]:
    """Tell the dispatchers these partitions have new due work, so they claim it at once."""
    ps = set(partitions)
    if ps:
        yield from op_publish_wake(ps)
