"""The claim script's call (lua/claim.lua): KEYS and ARGV in the order of its header, built
from one partition's queues, its one-off jobs' ids as read and its claim items; and its reply
as a named tuple.

A claim round builds one call per partition: the per-job work is what the argument layout asks
for (a key and an id per one-off job, the id kept as the bytes read: no decoding, no call per
job).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rsched.core.codes import ClaimCode
from rsched.core.wire import ClaimItem, as_text
from rsched.rdb import keys
from rsched.rdb.scripts import Call

_INF = float("inf")


def call(p: int, owner: str, fence: int, now_ms: int, events_maxlen: int, run_ttl_ms: int,
         history_len: int, queues: Sequence[str], items: Sequence[ClaimItem],
         once: Sequence[bytes] = (), actives: Sequence[str] = ()) -> Call:
    """The claim call of partition ``p`` under the lease ``owner`` holds with ``fence``:
    ``queues`` every queue of the partition (their streams are KEYS), ``items`` claim items,
    ``once`` one-off jobs' ids as read from the due set (bytes), ``actives`` the active runs of
    items under an overlap policy as read (the script lets go of one that has ended);
    ``history_len`` the bound of a job's history list (runs ended in the claim are recorded);
    ``now_ms`` 0: Redis TIME."""
    ks: list[Any] = [keys.lease(p), keys.due(p), keys.retry(p), keys.events(p), keys.stats(p)]
    ks += [keys.stream(p, q) for q in queues]
    args: list[Any] = [owner, fence, now_ms, events_maxlen, len(queues), len(items),
                       keys.GROUP, len(once), run_ttl_ms, history_len]
    # One-off jobs: a key and their id each, the key the job key's prefix and the bytes read.
    prefix = keys.job(p, "").encode()
    ks += [prefix + m for m in once]
    args += once
    for it in items:
        ks += [keys.job(p, it.job_id), keys.run(p, it.run_id), keys.history(p, it.job_id)]
        args += it
    ks += [keys.run(p, run_id) for run_id in actives]
    args += actives
    ks.append(keys.dead(p))  # last: the header's KEYS[#KEYS]
    return ("claim", ks, args)


class ClaimReply(NamedTuple):
    """claim.lua's reply: how many occurrences it dispatched and skipped, the earliest due
    score it saw left in the partition (inf: nothing left), and the ids it handed back (job
    ids to send again as claim items, run ids of retries whose queue stream was not passed).
    ``dispatched`` is ClaimCode.STALE_LEASE when the lease or fence was stale (``stale``)."""

    dispatched: int
    skipped: int
    left: float
    handed: frozenset[str]

    @property
    def stale(self) -> bool:
        """The caller's lease or fence was stale: nothing was written."""
        return self.dispatched == ClaimCode.STALE_LEASE

    @classmethod
    def of(cls, reply: Any) -> ClaimReply:
        dispatched = int(reply[0])
        if dispatched == ClaimCode.STALE_LEASE:
            return cls(dispatched, 0, _INF, frozenset())
        left = float(reply[2]) if reply[2] not in (b"", "") else _INF
        handed = frozenset(as_text(x) for x in reply[3:]) if len(reply) > 3 else frozenset()
        return cls(dispatched, int(reply[1]), left, handed)


__all__ = ["ClaimReply", "call"]
