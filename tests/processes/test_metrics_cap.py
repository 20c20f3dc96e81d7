"""/metrics does not grow with every job type a client makes up (the types past
METRICS_MAX_LABELS share the label `other`), and `rsched api --metrics-auth` asks a key for it:
against real `rsched api` processes, and the cap's rules on their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.api_process import Api, running_api
from support.redis_server import RedisServer

from rsched.core import defaults
from rsched.obs import metrics
from rsched.obs.metrics import OTHER, LabelCap, RunMetrics, _WorkerCollector

pytestmark = pytest.mark.slow

CAP = defaults.METRICS_MAX_LABELS


def scheduled(text: str) -> dict[str, float]:
    """rsched_jobs_scheduled_total by type (queue `default`)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "rsched_jobs_scheduled_total":
                assert s.labels["queue"] == "default"
                out[s.labels["type"]] = s.value
    return out


def create(api: Api, types: list[str]) -> None:
    with api.http(api.admin) as http:
        for i in range(0, len(types), 1000):
            jobs = [{"type": t, "runAt": "2099-01-01T00:00:00Z"} for t in types[i:i + 1000]]
            res = http.post("/jobs/batch", json={"jobs": jobs})
            assert res.status_code in (200, 201), res.text


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    redis_server.resume()
    with running_api(redis_server.url, tmp_path_factory.mktemp("metrics-cap")) as a:
        yield a


def test_three_thousand_job_types_make_at_most_the_cap_of_series_and_other(api: Api) -> None:
    create(api, ["heavy"] * 20 + [f"few-{i}" for i in range(CAP // 2)])
    with api.http() as http:
        small = http.get("/metrics").text
        assert set(scheduled(small)) == {"heavy", *(f"few-{i}" for i in range(CAP // 2))}
        create(api, [f"t-{i:04}" for i in range(3000)])
        big = http.get("/metrics")
        assert big.status_code == 200
        counts = scheduled(big.text)
        assert len(counts) == CAP + 1 and OTHER in counts
        assert counts["heavy"] == 20  # the largest by volume keep their series
        assert all(f"few-{i}" in counts for i in range(CAP // 2))
        assert sum(counts.values()) == 20 + CAP // 2 + 3000  # nothing lost, all counted
        # The scrape grows with the cap, not with the types: each kept type is a few series.
        assert len(big.content) < len(small) + 40_000, (len(small), len(big.content))

        # More new types go to `other`; no counter moves between series or goes backwards.
        create(api, [f"u-{i}" for i in range(200)])
        after = scheduled(http.get("/metrics").text)
        assert set(after) == set(counts)
        assert after[OTHER] == counts[OTHER] + 200
        assert all(after[t] >= n for t, n in counts.items())


def test_metrics_is_open_by_default(api: Api) -> None:
    with api.http() as http:
        assert http.get("/metrics").status_code == 200


def test_metrics_auth_asks_a_read_key(redis_server: RedisServer,
                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    redis_server.resume()
    with running_api(redis_server.url, tmp_path_factory.mktemp("metrics-auth"),
                     "--metrics-auth") as a:
        with a.http() as http:
            res = http.get("/metrics")
            assert res.status_code == 401 and res.headers["www-authenticate"].startswith("Bearer")
            assert "rsched_" not in res.text
        with a.http("rsk_not-a-key") as http:
            assert http.get("/metrics").status_code == 401
        with a.http(a.read) as http:
            res = http.get("/metrics")
            assert res.status_code == 200 and "rsched_due_backlog" in res.text
            assert http.get("/healthz").status_code == 200  # probes stay open


def test_the_cap_keeps_the_largest_values_when_it_fills_and_then_keeps_them() -> None:
    cap = LabelCap(3)
    show = cap.mapper({"a": 1, "b": 50, "c": 7, "d": 7, "e": 2})
    # The three largest (ties by name), the rest `other`.
    assert [show(v) for v in "abcde"] == [OTHER, "b", "c", "d", OTHER]
    # A value that grows past them later stays in `other`: its counter must not move.
    show = cap.mapper({"a": 10_000, "b": 50, "c": 7, "d": 7})
    assert show("a") == OTHER and show("b") == "b"
    # Room left: new values are admitted, largest first.
    roomy = LabelCap(2)
    assert roomy.mapper({"x": 1})("x") == "x"
    show = roomy.mapper({"x": 1, "y": 2, "z": 3})
    assert (show("x"), show("y"), show("z")) == ("x", OTHER, "z")


def test_a_workers_run_counts_and_durations_are_capped_and_summed_into_other() -> None:
    m = RunMetrics()
    try:
        for i in range(CAP + 50):
            m.count("succeeded", f"w-{i}", "default", n=1 + (i == 0) * 1000)
            m.duration.observe(f"w-{i}", 0.01)
        reg = CollectorRegistry()
        reg.register(_WorkerCollector())  # a cap of its own, not the process's
        text = generate_latest(reg).decode()
    finally:  # the process's collector must never see these types (other tests count theirs)
        with metrics._lock:
            metrics._workers.remove(m)
    types, runs = set(), 0.0
    durations = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "rsched_runs_succeeded_total" and s.labels["type"].startswith("w-") \
                    or s.labels.get("type") == OTHER and s.name == "rsched_runs_succeeded_total":
                types.add(s.labels["type"])
                runs += s.value
            if s.name == "rsched_run_duration_seconds_count":
                durations[s.labels["type"]] = s.value
    assert "w-0" in types and OTHER in types
    assert len(set(durations)) <= CAP + 1
    assert sum(durations.values()) >= CAP + 50  # every observation counted, some as `other`
    assert runs >= 1000 + CAP + 49
