"""Operations on worker processes from outside them (a supervisor's)."""

from __future__ import annotations

from rsched.core.settings import Settings
from rsched.rdb import worker_registry
from rsched.rdb.connect import connect


def release_worker(settings: Settings, worker_id: str) -> None:
    """Worker ``worker_id`` died (its supervisor saw the process end): mark it dead in the
    process heartbeats, so live workers take over its runs at their next beat instead of
    after its missed beats (docs/workers.md, "When a worker dies")."""
    r = connect(settings.redis_url, wait=0)
    try:
        worker_registry.mark_dead(r, worker_id)
    finally:
        r.close()
