"""A purge outlives the API process that started it: killed with -9 mid-way, the operation is
resumed by another API process once its lease lapses, from the place last recorded, and ends
with every dead letter deleted and counted exactly once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import redis
from support.api_process import running_api
from support.processes import wait_for

from rsched.core import defaults
from rsched.rdb import keys
from rsched.service.dead_letters import PURGE_CHUNK

PARTITIONS = 16
PER_PARTITION = 12_000  # 192,000 letters: a few hundred chunks, seconds of work


def test_a_purge_killed_with_its_api_is_resumed_by_another_api(
        redis_url: str, tmp_path: Path) -> None:
    with running_api(redis_url, tmp_path) as first:
        with redis.Redis.from_url(redis_url) as r:
            parts = int(r.hget(keys.config(), "partitions") or PARTITIONS)
            for p in range(parts):  # dead letters as delete_dead.lua knows them
                pipe = r.pipeline(transaction=False)
                ids = [f"{p}-fake{i}@1" for i in range(PER_PARTITION)]
                pipe.zadd(keys.dead(p), {rid: 1_000 + i for i, rid in enumerate(ids)})
                for rid in ids:
                    pipe.hset(keys.run(p, rid), mapping={"state": "dead", "attempt": 1})
                pipe.execute()
        total = parts * PER_PARTITION
        with first.http(first.admin) as http:
            op: dict[str, Any] = http.post("/dead-letters/purge", json={"dryRun": False}).json()
            assert op["total"] == total
            url = f"/operations/{op['id']}"
            wait_for("a first chunk", lambda: http.get(url).json()["scanned"] > 0, [first.proc])
        first.proc.popen.send_signal(signal.SIGSTOP)  # frozen mid-way...
        with redis.Redis.from_url(redis_url) as r:
            left = sum(r.zcard(keys.dead(p)) for p in range(parts))
            assert 0 < left < total, "the purge ended before the API was stopped"
        first.proc.popen.kill()  # ... then killed
        first.proc.popen.wait()
        with running_api(redis_url, tmp_path, again=first) as second, \
                second.http(second.read) as http:
            timeout = defaults.OPERATION_LEASE_MS / 1000 + 60
            done = wait_for("the purge resumed and ended",
                            lambda: (o := http.get(url).json())["status"] != "running" and o,
                            [second.proc], timeout_s=timeout)
    assert done["status"] == "succeeded", done
    assert done["deleted"] == total  # exact, the chunk deleted before the kill included
    # Read once each, but for a chunk the first API deleted and did not get to record.
    assert total - PURGE_CHUNK <= done["scanned"] == done["matched"] <= total
    with redis.Redis.from_url(redis_url) as r:
        assert sum(r.zcard(keys.dead(p)) for p in range(parts)) == 0
