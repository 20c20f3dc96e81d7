"""Deleting dead letters: one by one (by run id) or every one a filter matches (purge).

Each deletion runs lua/delete_dead.lua, which records it in the run's history (who, when) and
emits a 'dead_deleted' event, so an operator can tell later where a dead letter went.  A purge
walks each partition's dead set in chunks of PURGE_CHUNK, oldest first, reading the runs only
when the filter needs their fields: a dry run answers how many match, a real one deletes each
chunk's matches with one script call per partition.  A purge runs in the background
(service.operations).  A letter dead-lettered during a purge may be missed (run it again); a
letter replayed meanwhile is not deleted.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rsched.core import defaults
from rsched.core.codes import DeleteDeadCode
from rsched.core.errors import ValidationError
from rsched.core.models import Run, job_of_run, partition_of
from rsched.core.spec import QUEUE_PATTERN, TYPE_PATTERN
from rsched.rdb import job_scripts
from rsched.rdb.ops import Op, Scripts
from rsched.service.context import Service

PURGE_CHUNK = 500  # dead letters read (and deleted) per round trip of a purge
MAX_ERROR_FILTER = 1000  # characters of errorContains
MAX_AGE_S = 100 * 365 * 86400
_TYPE, _QUEUE = re.compile(TYPE_PATTERN), re.compile(QUEUE_PATTERN)


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead letters a purge (or a filtered listing) takes; None matches every one."""

    type: str | None = None
    queue: str | None = None
    error_contains: str | None = None  # case-insensitive substring of the last error
    older_than_s: float | None = None  # dead-lettered at least this long ago

    def __post_init__(self) -> None:
        if self.type is not None and not (isinstance(self.type, str)
                                           and _TYPE.fullmatch(self.type)):
            raise ValidationError("type", "not a job type (letters, digits and _.:- up to 128)")
        if self.queue is not None and not (isinstance(self.queue, str)
                                            and _QUEUE.fullmatch(self.queue)):
            raise ValidationError("queue", "not a queue name")
        e = self.error_contains
        if e is not None and not (isinstance(e, str) and 0 < len(e) <= MAX_ERROR_FILTER):
            raise ValidationError("errorContains",
                                  f"must be a non-empty string of at most {MAX_ERROR_FILTER}")
        age = self.older_than_s
        if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float))
                                or not 0 <= age <= MAX_AGE_S):
            raise ValidationError("olderThanSeconds",
                                  f"must be a number of seconds between 0 and {MAX_AGE_S}")

    @property
    def reads_runs(self) -> bool:
        """Whether matching needs the runs' fields (the age is the dead set's score)."""
        return (self.type, self.queue, self.error_contains) != (None, None, None)

    def matches(self, run: Run) -> bool:
        return ((self.type is None or run.type == self.type)
                and (self.queue is None or run.queue == self.queue)
                and (self.error_contains is None
                     or self.error_contains.casefold() in (run.error or "").casefold()))

    def max_score(self, now_ms: int) -> int | str:
        """The newest dead-letter time (ms) the filter takes, for ZRANGEBYSCORE."""
        return "+inf" if self.older_than_s is None else now_ms - int(self.older_than_s * 1000)


def filter_from_json(body: dict[str, Any]) -> DeadFilter:
    """The filter fields of a request body or query, camelCase as the API names them."""
    return DeadFilter(body.get("type"), body.get("queue"), body.get("errorContains"),
                      body.get("olderThanSeconds"))


def op_delete(svc: Service, run_ids: Sequence[str], who: str, op_id: str = ""
              ) -> Op[list[bool]]:
    """Delete these dead letters, one script call per partition in one round trip; per run id,
    whether it was a dead letter (and is now deleted).  A purge passes its operation's id, which
    counts the deletions in Redis (service.operations)."""
    by_part: dict[int, list[int]] = defaultdict(list)
    for i, rid in enumerate(run_ids):
        if "@" not in rid:
            raise ValidationError("runId", f"not a run id: {rid!r}")
        by_part[partition_of(job_of_run(rid))].append(i)
    calls, order = [], []
    for p, idx in by_part.items():
        for at in range(0, len(idx), PURGE_CHUNK):
            chunk = idx[at:at + PURGE_CHUNK]
            calls.append(job_scripts.delete_dead(
                p, [run_ids[i] for i in chunk], svc.settings.events_maxlen, who,
                svc.settings.history_len, op_id, defaults.OPERATION_KEEP_MS))
            order.append(chunk)
    out = [False] * len(run_ids)
    if not calls:
        return out
    results = yield Scripts(calls)
    for chunk, res in zip(order, results, strict=True):
        if isinstance(res, Exception):
            raise res
        for i, code in zip(chunk, job_scripts.deleted(res), strict=True):
            out[i] = code == DeleteDeadCode.DELETED
    return out


__all__ = ["PURGE_CHUNK", "DeadFilter", "filter_from_json", "op_delete"]
