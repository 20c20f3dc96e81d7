"""A backfill of 10,000 occurrences computes its times off the API's event loop: requests that
arrive meanwhile are answered at once, not after it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from support.api_process import running_api

from rsched import Client
from rsched.core.settings import Settings
from rsched.core.times import ms_to_iso

MINUTE = 60_000


def test_healthz_answers_while_a_10000_occurrence_backfill_is_computed(
        redis_url: str, tmp_path: Path) -> None:
    with running_api(redis_url, tmp_path) as api:
        client = Client(settings=Settings.from_env(redis_url=redis_url))
        job = client.schedule("report", cron="* * * * *", tz="Europe/Berlin", paused=True)
        now = client.now_ms() // MINUTE * MINUTE
        client.close()
        body = {"from": ms_to_iso(now - 9_999 * MINUTE), "to": ms_to_iso(now), "dryRun": True}
        answered: list[float] = []
        with api.http(api.admin) as http, api.http() as probe:
            assert probe.get("/healthz").status_code == 200  # connected and warm
            for _ in range(3):  # the backfill's own duration, alone (the best of three)
                t0 = time.perf_counter()
                res = http.post(f"/jobs/{job.id}/backfill", json=body)
                alone = time.perf_counter() - t0
                assert res.status_code == 200 and res.json()["count"] == 9_999, res.text
            done = threading.Event()

            def backfill() -> None:
                http.post(f"/jobs/{job.id}/backfill", json=body)
                done.set()

            worker = threading.Thread(target=backfill)
            t0 = time.perf_counter()
            worker.start()
            while not done.is_set():
                s = time.perf_counter()
                assert probe.get("/healthz").status_code == 200
                answered.append(time.perf_counter() - s)
            worker.join()
            total = time.perf_counter() - t0
    # Blocked, a probe would wait out the times' computation: most of the backfill's duration.
    # Off the loop it waits a few switches of the GIL.
    assert len(answered) >= 3, (answered, total)
    assert max(answered) < max(alone, total) / 2, (answered, alone, total)
