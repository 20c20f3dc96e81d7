"""The archive tests' two stores and their helpers: ``archive_url`` runs a test once per store
(SQLite, and Postgres with a schema of its own in the session's database), ``store`` opens it,
and the rest write events into the partition streams and read what the archiver stored.  A test
module imports the fixtures it uses by name."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import redis
from redis.typing import EncodableT

from rsched.archive import (
    Archiver,
    ArchiverConfig,
    Store,
    open_store,
)
from rsched.archive.events import expand
from rsched.rdb import keys
from support.helpers import (
    redis_now_ms,
    xrange,
)

PARTITIONS = 4


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def archive_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty archive: a SQLite file, or a Postgres schema of this test's own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/archive.db"
        return
    with postgres_schema(request.getfixturevalue("pg_dsn")) as url:
        yield url


@contextmanager
def postgres_schema(dsn: str) -> Iterator[str]:
    """A schema of its own in the database of ``dsn``, dropped after: the URL that uses it."""
    schema = f"t_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{dsn}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def store(archive_url: str) -> Iterator[Store]:
    s = open_store(archive_url)
    try:
        yield s
    finally:
        s.close()


def archiver(r: redis.Redis, store: Store, **config: Any) -> Archiver:
    a = Archiver(r, store, PARTITIONS, ArchiverConfig(**{"poll_ms": 10, **config}))
    a.setup()
    return a


def emit(client: redis.Redis, job_id: str, e: str, sid: str = "*", **fields: Any) -> str:
    """XADD one event the way the engine's scripts write it (partition from the job id)."""
    p = int(job_id.split("-")[0])
    body: dict[EncodableT, EncodableT] = {"e": e, "j": job_id,
                                          **{k: str(v) for k, v in fields.items()}}
    return cast(bytes, client.xadd(keys.events(p), body, id=sid)).decode()


def attempt_events(r: redis.Redis, job_id: str, sched: int, a: int, outcome: str, *,
                   worker: str = "w1", d: int = 5, err: str | None = None,
                   res: str | None = None) -> None:
    """dispatched, started, then the outcome of one attempt."""
    rid = f"{job_id}@{sched}"
    base = {"r": rid, "a": str(a), "ty": "email", "s": str(sched)}
    emit(r, job_id, "dispatched", **base, t=sched, q="default")
    emit(r, job_id, "started", **base, t=sched + 1, w=worker, f=a)
    extra = {"err": err} if err else {"res": res or '{"ok":true}'}
    emit(r, job_id, outcome, **base, t=sched + 1 + d, w=worker, d=d, q="default", **extra)


def drain(a: Archiver) -> int:
    total = 0
    while True:
        res = a.run_once()
        total += res.read
        if not res.read:
            return total


def stored(store: Store) -> list[tuple[int, int, int]]:
    return [tuple(row) for row in store.fetchall(
        "SELECT sid_ms, sid_seq, part FROM events ORDER BY sid_ms, sid_seq, part")]


def redis_ids(r: redis.Redis, partitions: int = PARTITIONS) -> list[tuple[int, int, int]]:
    out = []
    for p in range(partitions):
        for entry_id, f in xrange(r, keys.events(p)):
            for sid, _ in expand(entry_id, f):  # several events per entry: ids of their own
                ms, seq = sid.decode().split("-")
                out.append((int(ms), int(seq), p))
    return sorted(out)


def stream_lengths(r: redis.Redis) -> list[int]:
    return [r.xlen(keys.events(p)) for p in range(PARTITIONS)]


def produce(r: redis.Redis, runs: int, partitions: int = PARTITIONS) -> list[tuple[int, int, int]]:
    """`runs` three-event runs spread over the partitions; returns every (ms, seq, partition)."""
    now = redis_now_ms(r)
    pipe = r.pipeline(transaction=False)
    for i in range(runs):
        job = f"{i % partitions}-J{i}"
        for e in ("dispatched", "started", "succeeded"):
            pipe.xadd(keys.events(i % partitions),
                      {"e": e, "j": job, "r": f"{job}@{now}", "a": 1, "t": now, "ty": "bulk",
                       "d": i % 97, "w": "w1"})
    ids = []
    for i, sid in enumerate(pipe.execute()):
        ms, seq = sid.decode().split("-")
        ids.append((int(ms), int(seq), (i // 3) % partitions))
    return sorted(ids)
