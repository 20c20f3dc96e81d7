"""What every part of a worker talks to Redis through, in one object."""

from __future__ import annotations

from dataclasses import dataclass, field

from rsched.engine._calls import CallMany
from rsched.rdb import scripts
from rsched.rdb.redis_api import AsyncRedis


@dataclass(slots=True)
class Link:
    """The worker's Redis client, consumer name and streams, shared by its parts: one object,
    so replacing the client or the streams (setup, a cluster test) reaches every part."""

    r: AsyncRedis
    id: str  # consumer name in every group, and the worker's id in the registry
    streams: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (partition, queue)
    call_many: CallMany = scripts.acall_many  # how every part sends its script calls
    # Connections kept between raw round trips (none by default; see Worker).
    held: scripts.Held = field(default_factory=lambda: scripts.Held(0))


