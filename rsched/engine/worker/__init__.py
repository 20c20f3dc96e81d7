"""Workers: read the queue streams, run handlers, heartbeat, reclaim runs of dead workers."""

from rsched.engine.worker.worker import Worker

__all__ = ["Worker"]
