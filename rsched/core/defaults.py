"""Every default rsched uses, defined once: the CLI, the engine, the client and the spec read them
from here.  Times are in milliseconds unless the name says otherwise."""

from __future__ import annotations

# Partitions.  Fixed at first start and stored in Redis: a job's partition is in its id.
PARTITIONS = 16

# Durability (rdb.durable): replicas that must confirm a client-facing write before it is
# acknowledged.  WAIT_REPLICAS_BY_URL (-1): 1 for redis+cluster:// and redis+sentinel:// URLs,
# 0 (the primary's word) for one Redis.  A write still unconfirmed after the timeout fails with
# a retryable error.
WAIT_REPLICAS_BY_URL = -1
WAIT_TIMEOUT_MS = 1000

# Connections one client's pool opens at most (per node on a cluster); `?max_connections=N` in
# the Redis URL overrides it.  redis-py 8 caps a pool at 100 and fails the next command at once,
# which an API under load or a threaded caller of Client reaches; Redis's own maxclients is 10000.
REDIS_MAX_CONNECTIONS = 10_000

# Scheduling (service.scheduling).
SCHEDULE_CHUNK = 250  # jobs per schedule script call: bounded argument lists, short Redis pauses
SCHEDULE_FIRST_CHUNK = 32  # a batch's first call: Redis starts early (service.scheduling)
BACKFILL_MAX = 10_000  # occurrences one backfill call may run (POST /jobs/{id}/backfill)
BACKFILL_CHUNK = 500  # occurrences per backfill script call, all sent in one round trip

# Reads (clients, service, API, CLI).
PAGE_LIMIT = 50  # items per page when the caller names no limit
LIMIT_KEYS_PAGE = 500  # limit keys lua/limit_keys.lua looks at a call (SSCAN's COUNT)
BUSIEST_KEYS = 10  # a limit definition's busiest keys shown (GET /limits/{name}, dashboard)
BUSIEST_KEYS_MAX = 100  # the most GET /limits?busiest=N asks for
# Queue-wide limits (docs/limits.md, lua/queue_permit.lua): a permit reserved for a woken
# waiting run is kept this long for it; a run refused for the concurrency asks again after the
# first delay (among the first 2 x concurrency waiting) or the second (later ones; a give
# wakes them earlier); workers read the queues' limits this often.
QUEUE_RESERVE_MS = 5_000
QUEUE_RECHECK_MS = 2_000
QUEUE_RECHECK_LATER_MS = 60_000
QUEUE_LIMITS_REFRESH_S = 0.5

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
DEDUP_MODE = "ttl"  # a dedup window answers the first job for ttlSeconds (docs/dedup.md)
OVERLAP = "allow"  # a recurring job's runs may overlap (docs/schedules.md says why)
BACKFILL_OVERLAP = "bufferAll"  # a backfill's occurrences run one after another (Temporal's)
TZ = "UTC"

# Flow control (core.limits, docs/limits.md).
# A run whose handler raises RateLimited waits without spending an attempt this many times;
# the next one counts as a failed attempt, so maxAttempts still ends a run that never gets in.
MAX_DEFERRALS = 100

# Dispatcher.
# The events streams' bound while no archiver reads them (lua/trim_streams.lua, docs/memory.md).
EVENTS_KEEP = 2_000  # entries kept per partition's stream (one to 100 events each)
EVENTS_KEEP_MS = 86_400_000  # ... and none older than a day
EVENTS_TRIM_EVERY_MS = 5_000  # how often a dispatcher trims the streams of its partitions
STREAM_NODE_ENTRIES = 100  # Redis's stream-node-max-entries: `~` trimming leaves up to a node
# Sizes `rsched doctor` projects with where none can be read live (rsched.service.memory):
# tests/processes/test_memory_bound.py's 100,000 no-op one-off jobs, docs/memory.md.
SCHEDULED_JOB_BYTES = 340  # a scheduled one-off job (loadtest/bench_memory.py)
FINISHED_JOB_BYTES = 325  # a succeeded one-off job kept RSCHED_FINISHED_TTL_MS, its run inside
EVENT_ENTRY_BYTES = 100  # an events stream entry of one event (batched entries hold up to 100)
# Partition lease: renewed every LEASE_MS / 4, so a dispatcher paused up to 1.5 s (GC, a slow
# Redis reply) keeps it, and a dead one's partitions are taken over about LEASE_MS after its last
# renewal (docs/guarantees.md, "Recovery").
LEASE_MS = 2_000
CLAIM_BATCH = 250  # jobs per claim script call: workers' reads and reports interleave
MAX_SLEEP_MS = 1000  # longest idle sleep between rounds

# Worker.
CONCURRENCY = 16  # handlers running at once
VISIBILITY_MS = 30_000  # idle time after which another worker reclaims a run (the backstop)
# A worker whose process heartbeat (every DEAD_AFTER_MS / 3, in keys.alive()) is this old is
# dead: another worker takes over all its runs at once, under new fences (docs/workers.md).
DEAD_AFTER_MS = 3_000
MIN_DEAD_AFTER_MS = 300  # shorter: beats would cost Redis more than they save
HEARTBEAT_MS = 5_000  # at most half of VISIBILITY_MS
# A worker that missed this many heartbeats in a row is shown dead (status, dashboard, metrics);
# its registry record goes after WORKER_FORGET_MS more, and `rsched status` stops listing it.
WORKER_DEAD_AFTER_BEATS = 3
WORKER_FORGET_MS = 600_000
CONSUMER_IDLE_MS = 3_600_000  # idle this long, nothing pending: a dead worker's or archiver's
GRACE_S = 30.0  # seconds to finish runs on SIGTERM
START_AFTER_MS = 200  # a run still going this long gets its start recorded on its own
FLUSH_MS = 2.0  # how long reports wait to be batched
FOCUS_COUNT = 32  # with fewer free slots a stream, reads take this many from a few streams...
FOCUS_S = 0.05  # ...and every stream is read at least this often
PROCESSES = 1  # worker processes under one supervisor (rsched worker --processes)
RESTART_MIN_S = 0.5  # a dead worker process is restarted after this...
RESTART_MAX_S = 30.0  # ...doubling per quick death up to this, so a crash loop cannot spin
RESTART_STABLE_S = 30.0  # a process that lived this long starts its backoff over
HUNG_AFTER_S = 30.0  # a worker process that gave no sign of life this long is killed (restarted)
START_SILENCE_S = 60.0  # ...but one not yet up gets at least this long for its first sign
START_TRIES = 5  # worker processes dying before they ever started: the supervisor gives up
ALIVE_EVERY_S = 1.0  # how often a supervised worker process shows it is alive
# Job types and shared queues (docs/workers.md): a worker without a run's handler sets the run
# aside for one that has it; a run no live worker serves is dead-lettered after this long.
HANDLER_WAIT_S = 600.0
ADOPT_POLL_S = 0.25  # how often a worker looks for runs set aside for its handlers

# HTTP API (rsched api, rsched dev).
API_HOST = "127.0.0.1"  # local only unless asked: the API schedules and cancels work
API_PORT = 8600
MAX_BODY_BYTES = 1 << 20  # largest request body...
MAX_BATCH_BYTES = 32 << 20  # ...except POST /jobs/batch (up to 1,000 jobs)
# The HTTP server's bounds (rsched.api.server), checked before any key is: what one client can
# hold of the API's memory and connections.  docs/security.md, "HTTP limits".
MAX_HEAD_BYTES = 32 << 10  # request line and headers together; more is a 431
MAX_HEADERS = 100  # header lines in one request; more is a 431
HEAD_TIMEOUT_S = 10.0  # from a request's first byte (or the connection's start) to its last header
BODY_TIMEOUT_S = 60.0  # from the last header to the body's last byte
KEEP_ALIVE_S = 5  # an idle connection between two requests is closed after this
MAX_CONNECTIONS = 1000  # open connections; one more is answered 503 and closed at once
# Hosts the API answers when bound to a loopback address and given no --allowed-host: a page
# whose own name resolves to 127.0.0.1 (DNS rebinding) sends its own name and is refused.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# /metrics: label values of job types (and queues) beyond this many share the label `other`,
# so a client that creates jobs of many types cannot grow every scrape without bound.
METRICS_MAX_LABELS = 100

# Values callers store (payloads, handler results): arrays and objects nested at most this deep
# (a scalar is 0, [1] is 1).  Deeper ones are refused when written and shown as a placeholder
# when read (core.values): every JSON encoder on the read path, and the faces' answers that
# wrap a value a few levels more, stay far from their own limits.
VALUE_DEPTH = 64

# rsched dev.
DEV_DATA_DIR = ".rsched"  # its Redis data, history, admin key and logs, below the working dir
DEV_URL_FILE = "redis-url"  # in DEV_DATA_DIR while it runs: its Redis (with its password)...
DEV_ARCHIVE_FILE = "archive-url"  # ...and its archive, which the CLI and Client() there use

# --- the overview's history (rsched.service.samples) -----------------------------------------
STATS_SAMPLE_MS = 60_000  # one sample of the cluster's counters per minute, by the API
OPERATION_LEASE_MS = 10_000  # a runner renews it with every chunk of a background operation
OPERATION_KEEP_MS = 7 * 86_400_000  # an ended operation stays readable this long
OPERATION_POLL_S = 1.0  # how often an API process looks for operations to resume
STATS_KEEP_MS = 2 * 3_600_000  # samples kept in Redis: the overview shows the last hour
# Redis's hash-max-listpack-value that `rsched doctor` asks for (and `rsched dev` sets): a job
# hash whose packed spec (payload included) is longer than it leaves the compact listpack
# encoding: about twice the memory per scheduled job at Redis's default 64 as at 256
# (loadtest/bench_memory.py, 1,000,000 jobs with a 2-field payload; docs/performance.md).
HASH_LISTPACK_VALUE = 256
