"""The job hash's stored field names, defined once: Python reads them from here and every Lua
script from the generated `--!include layout` (rdb.scripts), as J.<name> and OWN.<name>.

Every job stores them, so they are one or two characters: a name takes its length plus two
bytes of a job hash's listpack, and a million jobs' hashes fall a jemalloc size class or two
(docs/performance.md).  Code says the long names; only Redis sees the short ones.  Job-hash
fields not listed here (version, gap, runs, fails, active, buffered, cancel, ov, paused_* and
resumed_*, h:<stream id>:<attempt>, nh: an own run set aside for want of a handler, lua/park.lua)
are rare and keep their names.

Values left out when they hold their default (readers fill it in): ``max_attempts``
(defaults.MAX_ATTEMPTS), ``queue`` (defaults.QUEUE), ``status`` 'scheduled', ``last_run_id``
while the own run is the last, the own run's ``result`` for a handler's None, ``updated_ms``
when the own run completes the job (its ``ended_ms``: models._updated_ms), and, in the spec,
a runAt (models._LEFT_OUT).  A job's ``type`` is always stored, which is how a script tells an
existing job from none.
"""

from __future__ import annotations

import re
from typing import Generic, NamedTuple, TypeVar

from rsched.core import defaults

S = TypeVar("S", str, bytes)


class JobFields(NamedTuple, Generic[S]):
    """The names as text (J) or as the bytes a raw hash's keys are (JB)."""

    type: S
    queue: S
    status: S
    next_ms: S
    spec: S
    cron: S
    max_attempts: S
    created_ms: S
    updated_ms: S
    body_hash: S
    last_run_id: S
    own_run: S
    limit_key: S  # absent: the job has none (core.limits; placed in its key's partition)


class OwnRunFields(NamedTuple):
    """A one-off job's own run kept in its job hash (see lua/include/util.lua run_fields): the
    run hash's field names (the keys) under these names; its type and queue are the job's."""

    state: str
    attempt: str
    fence: str
    worker: str
    stream_id: str
    dispatched_ms: str
    started_ms: str
    ended_ms: str
    duration_ms: str
    result: str
    error: str
    hb_ms: str
    waiting: str  # the limit definition a waiting run waits for (lua/include/limits.lua)


J: JobFields[str] = JobFields(type="t", queue="q", status="s", next_ms="n", spec="x", cron="k",
              max_attempts="m", created_ms="c", updated_ms="u", body_hash="b", last_run_id="l",
              own_run="o", limit_key="lk")
OWN = OwnRunFields(state="rs", attempt="ra", fence="rf", worker="rw", stream_id="ri",
                   dispatched_ms="rd", started_ms="rt", ended_ms="re", duration_ms="rl",
                   result="rr", error="rx", hb_ms="rh", waiting="ry")
assert len({*J, *OWN}) == len(J) + len(OWN)  # no two fields share a stored name

STATUS_DEFAULT = "scheduled"
"""The status of a job hash without a ``status`` field (lua/schedule.lua leaves it out)."""

# The byte-keyed forms readers of raw hashes use.
JB: JobFields[bytes] = JobFields(*(name.encode() for name in J))
OWN_BYTES = {own.encode(): plain.encode() for plain, own in OWN._asdict().items()}
"""An own run's stored field -> the run hash's name for it (models.run_fields)."""


def lua() -> str:
    """The `--!include layout` of a script: the defaults of fields left out.  J and OWN are no
    Lua tables: `literals` writes each J.<name> and OWN.<name> as its stored name."""
    return ("-- Job-hash field names (rsched.core.layout): J.<name> of the job, OWN.<name> of a\n"
            "-- one-off job's own run kept in it, each written as its stored name, quoted, when\n"
            "-- the script is loaded (rdb.scripts).\n"
            "-- Values not stored when they are the default (a job hash always has J.type).\n"
            f"local DEFAULT_QUEUE = '{defaults.QUEUE}'\n"
            f"local DEFAULT_STATUS = '{STATUS_DEFAULT}'\n")


_NAME = re.compile(r"(?<![\w.])(J|OWN)\.(\w+)")
_TABLES = {"J": J._asdict(), "OWN": OWN._asdict()}


def literals(source: str) -> str:
    """A script's source with each J.<name> and OWN.<name> written as its stored name, quoted
    (``'s'``), so no script call builds the two tables at run time (a visible share of a
    complete call: docs/performance.md).  A name not in the layout is an error."""
    def one(m: re.Match[str]) -> str:
        names = _TABLES[m.group(1)]
        if m.group(2) not in names:
            raise ValueError(f"{m.group(0)}: no such field in core.layout")
        return f"'{names[m.group(2)]}'"
    return _NAME.sub(one, source)
