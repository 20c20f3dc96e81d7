"""The one place a Redis key string is built.

Every key that belongs to a partition embeds the partition's hash tag ``{pN-k}``, so all of a
partition's keys live in one Redis Cluster slot and a script can touch them together.  Global
keys (config, registries) are only ever used by plain commands, never inside a script with
partition keys.

Placement: the suffix ``k`` is the first that puts partition N's slot in the 16-slot window at
the bit-reversed N (0, 8192, 4096, 12288, ...: the van der Corput sequence), so the first 2^j
partitions land one per 1/2^j of the slot range.  On a cluster sliced evenly over 3 masters,
16 partitions fall 6/5/5 and 64 fall 22/21/21 (with the plain CRC16 of ``{pN}``: 4/5/7 and
20/20/24); a count that is not a power of two spreads less evenly (10: 4/4/2).
"""

from __future__ import annotations

import hashlib
from itertools import count

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from rsched.core.ids import sorted64

PREFIX = "rsched"
SLOTS = REDIS_CLUSTER_HASH_SLOTS
_BITS = 14  # SLOTS == 2 ** _BITS
_WINDOW = 16  # slots per placement window: even spread up to SLOTS / _WINDOW partitions
_tags: list[str] = []


def slot(key: str) -> int:
    """The Redis Cluster slot of a key (CRC16 of its hash tag, or of the whole key)."""
    return key_slot(key.encode())


def target_slot(partition: int) -> int:
    """Where partition N's window starts: N's low bits reversed over the slot range."""
    n = partition % (SLOTS // _WINDOW)
    return int(f"{n:0{_BITS}b}"[::-1], 2)


def _placed(partition: int) -> str:
    lo = target_slot(partition)
    for k in count():
        t = f"p{partition}-{k}"
        if lo <= key_slot(t.encode()) < lo + _WINDOW:
            return t
    raise AssertionError("unreachable")


def tag(partition: int) -> str:
    """Hash tag shared by every key of one partition (braces included)."""
    try:
        return _tags[partition]
    except IndexError:
        while len(_tags) <= partition:
            _tags.append(f"{{{_placed(len(_tags))}}}")
        return _tags[partition]


def _pk(partition: int, name: str) -> str:
    return f"{PREFIX}:{tag(partition)}:{name}"


# --- global keys -----------------------------------------------------------------------------


def config() -> str:
    """HASH: cluster-wide settings fixed at first start (``partitions``)."""
    return f"{PREFIX}:config"


def stats_samples() -> str:
    """ZSET: JSON sample of the cluster's counters -> its bucket's start (ms): the overview's
    history (service.samples); global, never used inside a script."""
    return f"{PREFIX}:stats:samples"


def dispatchers() -> str:
    """ZSET: dispatcher id -> membership expiry (ms, two renewals after its last round); only
    members in it are planned partitions or offered any."""
    return f"{PREFIX}:dispatchers"


def workers() -> str:
    """HASH: worker id -> msgpack heartbeat record (queues, in-flight runs, last beat)."""
    return f"{PREFIX}:workers"


def start_lag() -> str:
    """HASH: the cluster's start-lag histogram, which every worker adds its new observations to
    at each heartbeat: '<i>' -> first attempts whose lag fell in bucket i of LAG_BUCKETS_S (i =
    len: +Inf), 'sum' -> their lags' sum in seconds.  Kept when a worker dies."""
    return f"{PREFIX}:startlag"


def alive() -> str:
    """ZSET: worker id -> its last process heartbeat (ms, Redis's clock; 0: left with runs to
    take over now); lua/alive.lua writes and reads it."""
    return f"{PREFIX}:alive"


def parked() -> str:
    """HASH: JSON [queue, job type] -> how many times a worker lacking the type set runs of it
    aside (monotonic): a worker with the handler looks for them when the count moves."""
    return f"{PREFIX}:parked"


def wake_channel() -> str:
    """PUB/SUB channel: payload is a partition number whose earliest due time moved earlier."""
    return f"{PREFIX}:wake"


def limits_index() -> str:
    """HASH: limit name -> packed definition (core.limits.Limit.packed): what GET /limits lists.
    Every partition holds a copy (``limits``), which is what the scripts read."""
    return f"{PREFIX}:limits"


def queue_limits_index() -> str:
    """HASH: queue -> packed definition of its queue-wide limit (core.limits.Limit.packed): what
    GET /queues/{queue}/limits and the workers read."""
    return f"{PREFIX}:qlimits"


def _qk(queue: str, name: str) -> str:
    # A queue's limit state on a slot of its own (queue names hold no brace: QUEUE_PATTERN).
    return f"{PREFIX}:{{ql:{queue}}}:{name}"


def queue_limit(queue: str) -> str:
    """STRING: the queue's limit as lua/queue_permit.lua reads it, on the queue's own slot."""
    return _qk(queue, "qlim")


def queue_permits(queue: str) -> str:
    """ZSET: '<run id> <worker id>' (a permit) or '> <run id>' (a reservation) -> expires ms."""
    return _qk(queue, "qheld")


def queue_limit_log(queue: str) -> str:
    """ZSET: '<run id> <ms>' -> start ms, the queue's rate window."""
    return _qk(queue, "qlog")


def queue_limit_told(queue: str) -> str:
    """ZSET: run id -> ms a run held by the queue's rate was told to ask again."""
    return _qk(queue, "qrate")


def queue_limit_waiting(queue: str) -> str:
    """ZSET: '<partition> <run id>' -> scheduled ms, runs waiting for the queue's limit."""
    return _qk(queue, "qwait")


def api_keys() -> str:
    """HASH: sha256(secret) -> msgpack API key record."""
    return f"{PREFIX}:apikeys"


def operation(op_id: str) -> str:
    """HASH: one background operation (a dead-letter purge): its request, lease and progress
    (service.operations)."""
    return f"{PREFIX}:operation:{op_id}"


def operations() -> str:
    """ZSET, every score 0: operation ids (ULIDs, so lexical order is creation order)."""
    return f"{PREFIX}:operations"


def operations_running() -> str:
    """SET: ids of operations not ended yet, which an API process's runner resumes when their
    lease has expired."""
    return f"{PREFIX}:operations:running"


# --- partition keys --------------------------------------------------------------------------


def due(p: int) -> str:
    """ZSET: job id -> due time (ms, jitter applied) of the job's next regular occurrence."""
    return _pk(p, "due")


def retry(p: int) -> str:
    """ZSET: run id -> time (ms) its next attempt is due (retries and replays)."""
    return _pk(p, "retry")


def dead(p: int) -> str:
    """ZSET: run id -> time (ms) it was dead-lettered."""
    return _pk(p, "dead")


def op_counts(p: int) -> str:
    """HASH: background operation id -> dead letters its purge deleted in this partition
    (lua/delete_dead.lua)."""
    return _pk(p, "opcounts")


def lease(p: int) -> str:
    """HASH: owner, expires_ms (of a free one: when it became free), fence (monotonic; never
    deleted), offer (the member its owner hands it over to once that member takes it)."""
    return _pk(p, "lease")


def events(p: int) -> str:
    """STREAM: every state change of every job and run in the partition (history source)."""
    return _pk(p, "events")


def stats(p: int) -> str:
    """HASH: monotonically increasing counters (dispatched, succeeded, dead_lettered, ...)."""
    return _pk(p, "stats")


def replicated_mark(p: int) -> str:
    """STRING: written by an archiver with each read under the durability setting, so that its
    WAIT covers the events it read (WAIT waits for the connection's own last write)."""
    return _pk(p, "archive-mark")


def queues(p: int) -> str:
    """SET: queue names that have jobs in the partition (tells the dispatcher which streams)."""
    return _pk(p, "queues")


def stream(p: int, queue: str) -> str:
    """STREAM: the work queue of ``queue`` in the partition, read through GROUP."""
    return _pk(p, f"q:{queue}")


def queue_of(stream_key: str) -> str:
    """The queue a work queue stream's key (stream) names."""
    return stream_key.split("}:q:", 1)[1]


def job(p: int, job_id: str) -> str:
    """HASH: the job (see models.Job)."""
    return _pk(p, f"job:{job_id}")


def dedup(p: int, dedup_key: str) -> str:
    """STRING: the id of the job a dedup key answers with, expiring with its window
    (lua/schedule.lua).  Named by 120 bits of the key's hash: a key's own text (200
    characters, any but controls) could read as another key's pattern (``}:job:``)."""
    digest = hashlib.blake2b(dedup_key.encode(), digest_size=15).digest()
    return _pk(p, f"dedup:{sorted64(digest)}")


def job_pattern() -> str:
    """SCAN MATCH pattern of every partition's job hashes (rsched.service.listings)."""
    return f"{PREFIX}:{{p*}}:job:*"


def job_id_of(job_key: str) -> str:
    """The job id a job key (``job``) ends with: the job hash holds no id field of its own."""
    return job_key.partition("}:job:")[2]


def run(p: int, run_id: str) -> str:
    """HASH: one occurrence of a job and its current attempt (see models.Run)."""
    return _pk(p, f"run:{run_id}")


def history(p: int, job_id: str) -> str:
    """LIST: JSON records of the job's most recent finished attempts, newest first, bounded."""
    return _pk(p, f"hist:{job_id}")


def limits(p: int) -> str:
    """HASH: limit name -> packed definition, every definition in every partition (lua/limit.lua
    writes it; lua/include/limits.lua reads it); field '' holds the family names."""
    return _pk(p, "limits")


def limits_waiting(p: int) -> str:
    """SET: limit keys of the partition that have waiting runs."""
    return _pk(p, "limwait")


def limits_running(p: int) -> str:
    """SET: limit keys of the partition that took a slot since lua/limit_keys.lua last found
    them idle (include limits adds them)."""
    return _pk(p, "limrun")


def limit_stats(p: int) -> str:
    """HASH: limit definition name -> runs that started waiting for it (include limits)."""
    return _pk(p, "limstats")


def limit_running(p: int, key: str) -> str:
    """SET: run ids holding one of limit key ``key``'s slots (built in Lua too: include
    limits, whose names these must match)."""
    return _pk(p, f"lim:{key}:run")


def limit_waiting(p: int, key: str) -> str:
    """ZSET: run id -> scheduled ms, runs waiting for limit key ``key`` (include limits)."""
    return _pk(p, f"lim:{key}:wait")


def limit_log(p: int, key: str) -> str:
    """ZSET: '<run id> <ms>' -> start ms, the rate window of limit key ``key``."""
    return _pk(p, f"lim:{key}:log")


GROUP = "workers"
"""Consumer group every worker reads the queue streams through."""

PARKED_CONSUMER = "nohandler:"
"""Prefix of the consumer (in GROUP) that holds the runs of one job type set aside by workers
without its handler (``parked_consumer``); no worker id starts with it."""


def parked_consumer(job_type: str) -> str:
    """The consumer name runs of ``job_type`` wait under until a worker with its handler
    takes them (lua/park.lua, lua/start.lua)."""
    return PARKED_CONSUMER + job_type


EVENTS_GROUP = "archivers"
"""Consumer group the archiver reads the events streams through."""
