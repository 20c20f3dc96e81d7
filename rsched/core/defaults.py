"""Every default rsched uses, defined once: the CLI, the engine, the client and the spec read them
from here.  Times are in milliseconds unless the name says otherwise."""

from __future__ import annotations

# Partitions.  Fixed at first start and stored in Redis: a job's partition is in its id.
PARTITIONS = 16

# A job's settings when the caller gives none (core.spec.JobSpec; core.models.Job reads a spec
# blob without them with the same values).
QUEUE = "default"
MAX_ATTEMPTS = 3
BACKOFF_BASE_MS = 1000  # first retry's delay; doubles per attempt (core.retry)
BACKOFF_CAP_MS = 3_600_000  # a retry waits at most an hour
TIMEOUT_MS = 300_000  # a handler running longer is timed out
PRIORITY = 0
JITTER_MS = 0
CATCH_UP_WINDOW_MS = 60_000  # occurrences missed by less than this all run (core.catchup)
OVERLAP = "allow"  # a recurring job's runs may overlap (README, "Overlap" says why)
TZ = "UTC"

# Dispatcher.
LEASE_MS = 10_000  # partition lease: renewed every LEASE_MS / 3, so it outlives two missed rounds
CLAIM_BATCH = 250  # jobs per claim script call: workers' reads and reports interleave
MAX_SLEEP_MS = 1000  # longest idle sleep between rounds

# Worker.
CONCURRENCY = 16  # handlers running at once
VISIBILITY_MS = 30_000  # idle time after which another worker reclaims a run
HEARTBEAT_MS = 5_000  # at most half of VISIBILITY_MS
GRACE_S = 30.0  # seconds to finish runs on SIGTERM
START_AFTER_MS = 200  # a run still going this long gets its start recorded on its own
FLUSH_MS = 2.0  # how long reports wait to be batched

# HTTP API (rsched api, rsched dev).
API_HOST = "127.0.0.1"  # local only unless asked: the API schedules and cancels work
API_PORT = 8600
MAX_BODY_BYTES = 1 << 20  # largest request body...
MAX_BATCH_BYTES = 32 << 20  # ...except POST /jobs/batch (up to 1,000 jobs)
