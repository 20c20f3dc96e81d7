"""Prometheus metrics and structured logs: what a worker, a dispatcher and the API's /metrics
report after real runs against a real redis-server, each process's own metrics port, and log
lines that carry the job id, run id and attempt."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import ResponseError
from starlette.testclient import TestClient
from support.helpers import all_jobs, overdue, run_engine, settings
from support.processes import Proc, wait_for
from support.redis_server import free_port

from rsched import App, Client, JobContext, JobSpec
from rsched.api.app import create_app
from rsched.cli.main import cli
from rsched.core.errors import ValidationError
from rsched.core.views import Cluster
from rsched.obs import logs, metrics
from rsched.obs.metrics import LAG_BUCKETS_S, Buckets, RunMetrics
from rsched.rdb import keys
from rsched.service.apikeys import op_create_key
from rsched.service.status import archive_lag_reader, op_cluster

TESTS = Path(__file__).resolve().parents[1]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def families(text: str) -> dict[str, Any]:
    """Parsed Prometheus text (a format error raises), by family name."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(fam: Any, suffix: str = "") -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in fam.samples
            if s.name == fam.name + suffix}


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    c = Client(settings=settings(redis_url))
    yield c
    c.close()


def engine_app(prefix: str) -> App:
    """ok succeeds; flaky fails its first attempt; doomed always fails."""
    app = App("metrics")

    @app.job(f"{prefix}ok")
    def ok(ctx: JobContext) -> int:
        return ctx.attempt

    @app.job(f"{prefix}flaky")
    def flaky(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return ctx.attempt

    @app.job(f"{prefix}doomed")
    def doomed(ctx: JobContext) -> None:
        raise ValueError("never works")

    return app


def run_mix(redis_url: str, client: Client, prefix: str, queue: str) -> list[Any]:
    """Three ok runs, a flaky one and a doomed one (two attempts each) on ``queue``."""
    specs = [JobSpec(type=f"{prefix}ok", queue=queue) for _ in range(3)]
    specs += [JobSpec(type=f"{prefix}{t}", queue=queue, max_attempts=2, backoff_base_ms=0)
              for t in ("flaky", "doomed")]
    jobs = all_jobs(client.schedule_many(specs))

    def done() -> bool:
        return all(client.get(j.id).status.value in ("completed", "dead") for j in jobs)

    asyncio.run(run_engine(redis_url, engine_app(prefix), done, timeout_s=30,
                           worker_kw={"queues": [queue]}))
    return jobs


# --- per-process metrics -------------------------------------------------------------------------


def test_a_worker_counts_runs_by_type_and_queue_and_times_their_lag_and_duration(
    redis_url: str, client: Client
) -> None:
    acquired = sample("rsched_lease_changes_total", change="acquired")
    dispatched = sample("rsched_dispatched_total")
    run_mix(redis_url, client, "w_", "mq1")
    q = "mq1"
    expect = {  # (event, type) -> count
        ("started", "ok"): 3, ("succeeded", "ok"): 3,
        ("started", "flaky"): 2, ("failed", "flaky"): 1, ("retried", "flaky"): 1,
        ("succeeded", "flaky"): 1,
        ("started", "doomed"): 2, ("failed", "doomed"): 2, ("retried", "doomed"): 1,
        ("dead_lettered", "doomed"): 1,
    }
    for (event, t), n in expect.items():
        assert sample(f"rsched_runs_{event}_total", type=f"w_{t}", queue=q) == n, (event, t)
    assert sample("rsched_runs_failed_total", type="w_ok", queue=q) == 0
    assert sample("rsched_runs_fenced_total", type="w_ok", queue=q) == 0
    # Start lag: first attempts only (retries wait for their backoff on purpose).
    assert sample("rsched_start_lag_seconds_count", queue=q) == 5
    assert sample("rsched_start_lag_seconds_bucket", queue=q, le="+Inf") == 5
    assert 0 <= sample("rsched_start_lag_seconds_sum", queue=q) < 5 * 10
    assert sample("rsched_run_duration_seconds_count", type="w_doomed") == 2
    assert sample("rsched_run_duration_seconds_count", type="w_ok") == 3
    # Scheduling counts created jobs; the dispatcher counts its rounds and leases.
    assert sample("rsched_jobs_scheduled_total", type="w_ok", queue=q) == 3
    # 2 retries; the 5 first attempts were due when scheduled, queued by the schedule script
    assert sample("rsched_dispatched_total") - dispatched == 2
    assert sample("rsched_lease_changes_total", change="acquired") - acquired == 16


def test_scheduling_an_existing_idempotency_key_again_counts_no_new_job(client: Client) -> None:
    before = sample("rsched_jobs_scheduled_total", type="idem", queue="default")
    for _ in range(3):
        client.schedule("idem", idempotency_key="count-once", run_at="2099-01-01T00:00:00Z")
    assert sample("rsched_jobs_scheduled_total", type="idem", queue="default") - before == 1


def test_a_batch_counts_each_type_and_queue_it_created_whole_groups_or_job_by_job(
    client: Client,
) -> None:
    pairs = [("cnt_a", "default"), ("cnt_a", "q2"), ("cnt_b", "default")]
    before = {pair: sample("rsched_jobs_scheduled_total", type=pair[0], queue=pair[1])
              for pair in pairs}
    later = "2099-01-01T00:00:00Z"
    specs = [JobSpec("cnt_a", run_at=later)] * 3 + [JobSpec("cnt_a", queue="q2", run_at=later),
                                                    JobSpec("cnt_b", run_at=later)] * 2
    client.schedule_many(specs)  # all created: counted by groups
    keyed = [JobSpec("cnt_a", run_at=later, idempotency_key=f"cnt-{k}") for k in range(2)]
    client.schedule_many([keyed[0]])
    # one existing key among new jobs: counted job by job, the existing one not at all
    client.schedule_many([*keyed, JobSpec("cnt_a", queue="q2", run_at=later),
                          JobSpec("cnt_b", max_attempts=7, run_at=later)])
    assert {pair: sample("rsched_jobs_scheduled_total", type=pair[0], queue=pair[1])
            - before[pair] for pair in pairs} == {pairs[0]: 3 + 1 + 1, pairs[1]: 2 + 1,
                                                  pairs[2]: 2 + 1}


def test_buckets_render_as_a_cumulative_prometheus_histogram() -> None:
    m = RunMetrics()
    for lag in (0.001, 0.02, 0.02, 7.0, 1000.0):
        m.lag.observe("hq", lag)
    m.count("started", "t", "hq", 5)
    text = metrics.render().decode()
    fam = families(text)["rsched_start_lag_seconds"]
    buckets = {s.labels["le"]: s.value for s in fam.samples
               if s.name.endswith("_bucket") and s.labels["queue"] == "hq"}
    assert buckets["0.005"] == 1 and buckets["0.025"] == 3 and buckets["10.0"] == 4
    assert buckets["300.0"] == 4 and buckets["+Inf"] == 5
    assert m.heartbeat()["started"] == 5
    assert m.heartbeat()["lag"][:2] == [1, 0] and sum(m.heartbeat()["lag"][:-1]) == 5


def test_buckets_put_a_value_on_a_bound_in_that_bound_s_bucket() -> None:
    b = Buckets((1.0, 2.0))
    for v in (1.0, 2.0, 2.5):
        b.observe("x", v)
    assert b.series["x"] == [1, 1, 1, 5.5]


# --- the cluster view ---------------------------------------------------------------------------


def test_the_cluster_view_shows_backlog_and_a_partition_without_owner(client: Client) -> None:
    past = "2020-01-01T00:00:00Z"
    jobs = overdue(client, [JobSpec(type="late", run_at=past) for _ in range(4)])
    cluster = client.run(op_cluster(client))
    fam = families(metrics.render(cluster).decode())
    backlog = values(fam["rsched_due_backlog"])
    assert sum(backlog.values()) == 4
    busiest = max(backlog, key=lambda k: backlog[k])
    age = values(fam["rsched_oldest_due_age_seconds"])[busiest]
    assert age > 3600 * 24 * 300  # due since 2020
    assert set(values(fam["rsched_partition_owned"]).values()) == {0}  # no dispatcher runs
    # No archiver has read anything: every entry of the events streams waits (the 'scheduled'
    # events of one schedule call share an entry per partition: see events.expand).
    waiting = values(fam["rsched_archiver_lag_events"])
    assert 0 < sum(waiting.values()) <= 2 * len(jobs)  # and a 'resumed' event each
    assert waiting == {(("partition", str(p)),): client.r.xlen(keys.events(p))
                       for p in range(client.partitions)}
    assert values(fam["rsched_workers"]) == {(): 0}


def test_the_cluster_view_counts_runs_waiting_for_a_handler_by_queue_and_type(
    redis_url: str, client: Client
) -> None:
    job = client.schedule("unserved", queue="mq5")
    app = App("serves-something-else")

    @app.job("other")
    def other(ctx: JobContext) -> None: ...

    def set_aside() -> bool:
        try:
            pending = client.r.xpending_range(keys.stream(job.partition, "mq5"), keys.GROUP,
                                              "-", "+", 10)
        except ResponseError:  # NOGROUP: the worker has not joined the queue's group yet
            return False
        return [e["consumer"] for e in pending] == [keys.parked_consumer("unserved").encode()]

    asyncio.run(run_engine(redis_url, app, set_aside, timeout_s=30,
                           worker_kw={"queues": ["mq5"], "heartbeat_ms": 100}))
    fam = families(metrics.render(client.run(op_cluster(client))).decode())
    assert values(fam["rsched_runs_waiting_for_handler"]) == {
        (("queue", "mq5"), ("served", "false"), ("type", "unserved")): 1}


def test_the_cluster_view_adds_up_dead_letters_counters_and_live_workers_start_lag(
    redis_url: str, client: Client
) -> None:
    seen: list[Cluster] = []

    def look() -> bool:
        # Workers report a run as started when its handler starts, before its outcome is
        # recorded: wait for the outcomes too.
        c = client.run(op_cluster(client))
        done = {k: sum(pc.stats.get(k, 0) for pc in c.counters)
                for k in ("succeeded", "dead_lettered")}
        if c.runs_started >= 7 and done["succeeded"] >= 5 and done["dead_lettered"] >= 1:
            seen.append(c)
        return bool(seen)

    specs = [JobSpec(type="c_ok", queue="mq2") for _ in range(5)]
    specs.append(JobSpec(type="c_doomed", queue="mq2", max_attempts=2, backoff_base_ms=0))
    client.schedule_many(specs)
    app = engine_app("c_")
    asyncio.run(run_engine(redis_url, app, look, timeout_s=30,
                           worker_kw={"queues": ["mq2"], "heartbeat_ms": 100}))
    fam = families(metrics.render(seen[0]).decode())
    assert sum(values(fam["rsched_dead_letters"]).values()) == 1
    assert sum(values(fam["rsched_partition_succeeded"], "_total").values()) == 5
    assert sum(values(fam["rsched_partition_dead_lettered"], "_total").values()) == 1
    assert set(values(fam["rsched_partition_owned"]).values()) == {1}
    assert values(fam["rsched_workers"]) == {(): 1}
    assert values(fam["rsched_cluster_runs_started"], "_total") == {(): 7}
    lag = fam["rsched_cluster_start_lag_seconds"]
    assert values(lag, "_count") == {(): 6}  # first attempts of the live worker
    assert len(values(lag, "_bucket")) == len(LAG_BUCKETS_S) + 1


def test_the_api_serves_metrics_without_a_key_and_the_dashboard_and_its_session(
    redis_url: str, client: Client
) -> None:
    _, read = client.run(op_create_key("viewer", "read"))
    client.schedule("api_metrics", run_at="2099-01-01T00:00:00Z")
    with TestClient(create_app(settings(redis_url))) as api:
        res = api.get("/metrics")
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/plain")
        fam = families(res.text)
        assert len(values(fam["rsched_due_backlog"])) == client.partitions
        assert values(fam["rsched_jobs_scheduled"], "_total")[
            (("queue", "default"), ("type", "api_metrics"))] >= 1
        # Relative: the Location never repeats the Host header (docs/security.md).
        assert api.get("/ui", follow_redirects=False).headers["location"] == "ui/"
        page = api.get("/ui/")
        assert page.status_code == 200 and '<script type="module" src="app.js">' in page.text
        for asset in ("app.js", "api.js", "charts.js", "style.css"):
            assert api.get(f"/ui/{asset}").status_code == 200, asset
        assert api.get("/ui/session").status_code == 401
        me = api.get("/ui/session", headers={"Authorization": f"Bearer {read}"}).json()
        assert me == {"auth": True, "scope": "read", "keyId": me["keyId"], "keyName": "viewer"}
    with TestClient(create_app(settings(redis_url), auth=False)) as open_api:
        assert open_api.get("/ui/session").json()["scope"] == "admin"


def test_the_dashboard_loads_nothing_from_another_host() -> None:
    static = Path(metrics.__file__).parents[1] / "api" / "static"
    for f in static.iterdir():
        text = f.read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), f.name
        assert "import(" not in text and "http://" not in text and "https://" not in text, f.name


# --- each process's own port --------------------------------------------------------------------


def scrape(port: int) -> dict[str, Any]:
    return families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)


@pytest.mark.slow
def test_the_dispatcher_worker_and_archiver_each_serve_metrics_on_their_port(
    redis_url: str, client: Client, tmp_path: Path
) -> None:
    ports = {name: free_port() for name in ("dispatcher", "worker", "archiver")}
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    procs = [
        Proc("dispatcher", ["--metrics-port", str(ports["dispatcher"]), "dispatcher",
                            "--max-sleep-ms", "200"], env, tmp_path),
        Proc("worker", ["--metrics-port", str(ports["worker"]), "--log-format", "json", "worker",
                        "--app", "support.dashboard_app:app", "--heartbeat-ms", "500"], env,
             tmp_path),
        Proc("archiver", ["--metrics-port", f"127.0.0.1:{ports['archiver']}", "archiver",
                          "--archive-url", f"sqlite:///{tmp_path / 'h.db'}", "--poll-ms", "50"],
             env, tmp_path),
    ]
    try:
        # Due in a second: the dispatcher dispatches them (due now, they would go straight to
        # their queue and the dispatcher would count none).
        client.schedule_many([JobSpec(type="tick", run_at=client.now_ms() + 1000)
                              for _ in range(3)])

        def ticks() -> float:
            try:
                fam = scrape(ports["worker"])["rsched_runs_succeeded"]
            except (httpx.TransportError, KeyError):
                return 0
            return values(fam, "_total").get((("queue", "default"), ("type", "tick")), 0)

        wait_for("the worker's port counts 3 ticks", lambda: ticks() == 3, procs)
        d = scrape(ports["dispatcher"])
        assert values(d["rsched_partitions_owned"]) == {(): 16}
        assert values(d["rsched_dispatched"], "_total") == {(): 3}

        def archived() -> bool:
            try:
                fam = scrape(ports["archiver"])
            except httpx.TransportError:
                return False
            return sum(values(fam["rsched_archiver_lag_events"]).values()) == 0

        wait_for("the archiver's port reports no lag", archived, procs)
    finally:
        for p in procs:
            p.stop()
    # --log-format json: every worker line is a JSON object
    lines = [ln for ln in (tmp_path / "worker.log").read_text().splitlines() if ln.strip()]
    assert lines and all(json.loads(ln)["logger"] for ln in lines)


def test_a_bad_or_busy_metrics_address_is_an_error_naming_the_option() -> None:
    with pytest.raises(ValidationError, match="--metrics-port"):
        metrics.serve("localhost:http")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ValidationError, match="--metrics-port: cannot listen"):
            metrics.serve(f"127.0.0.1:{s.getsockname()[1]}")


# --- structured logs ----------------------------------------------------------------------------


@pytest.fixture
def log_to() -> Iterator[Any]:
    handlers: list[logging.Handler] = []

    def setup(fmt: str) -> io.StringIO:
        buf = io.StringIO()
        handlers.append(logs.setup("INFO", fmt, buf))
        return buf

    yield setup
    for h in handlers:
        logging.getLogger().removeHandler(h)


def test_json_logs_put_job_run_and_attempt_on_every_line_about_a_run(
    redis_url: str, client: Client, log_to: Any
) -> None:
    buf = log_to("json")
    jobs = run_mix(redis_url, client, "l_", "mq3")
    lines = [json.loads(ln) for ln in buf.getvalue().splitlines()]
    about_runs = [ln for ln in lines if "@" in ln["msg"] and ln["logger"] == "rsched.worker"]
    dead = [j for j in jobs if j.type == "l_doomed"][0]
    # flaky fails once, doomed fails twice (the second is dead-lettered, logged twice)
    assert len(about_runs) == 4
    for ln in about_runs:
        assert {"ts", "level", "logger", "msg", "job_id", "run_id", "attempt"} <= set(ln)
        assert ln["run_id"] in ln["msg"] and ln["run_id"].startswith(ln["job_id"] + "@")
    alert = [ln for ln in about_runs if "dead-lettered" in ln["msg"]]
    assert [(a["job_id"], a["attempt"], a["level"]) for a in alert] == [(dead.id, 2, "error")]


def test_text_logs_end_with_the_run_fields_and_a_bad_format_is_refused(
    log_to: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = log_to("text")
    logging.getLogger("rsched.worker").warning(
        "run %s failed", "7-x@5", extra={"run_id": "7-x@5", "attempt": 3})
    assert buf.getvalue().rstrip().endswith("run 7-x@5 failed  job=7-x run=7-x@5 attempt=3")
    monkeypatch.setenv("RSCHED_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError, match="RSCHED_LOG_FORMAT"):
        logs.setup("INFO", None, io.StringIO())
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 2 and "--log-format" in result.output


def test_an_unreachable_redis_leaves_an_archiver_scrape_with_its_own_metrics() -> None:
    collector = metrics.ArchiveLagCollector(
        archive_lag_reader(f"redis://127.0.0.1:{free_port()}/0"))
    assert list(collector.collect()) == []


# --- deploy/: the alert rules and the Grafana dashboard -------------------------------------------

DEPLOY = TESTS.parent / "deploy"


def exported_names(redis_url: str, client: Client) -> set[str]:
    """Every metric name a scrape of the API, a worker, a dispatcher or an archiver can show."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "gauge": ("",)}
    text = metrics.render(client.run(op_cluster(client))).decode()
    lag = metrics.ArchiveLagCollector(archive_lag_reader(redis_url))
    fams = [*text_string_to_metric_families(text), *lag.collect()]
    return {f.name + s for f in fams for s in suffixes.get(f.type, ("",))}


def test_the_alert_rules_and_the_grafana_dashboard_use_only_exported_metrics(
    redis_url: str, client: Client
) -> None:
    run_mix(redis_url, client, "d_", "mq4")  # fills the partitions' counters (Lua stats)
    names = exported_names(redis_url, client)
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    dashboard = json.loads((DEPLOY / "grafana" / "rsched-dashboard.json").read_text())
    exprs = re.findall(r"expr:\s*(?:>-\s*)?([^\n]+(?:\n {10,}[^\n]+)*)", alerts)
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\brsched_[a-z_]+", e)}
    assert len(exprs) >= 25 and len(used) >= 20
    assert used - names == set()
    for alert in ("RschedDeadLettersGrowing", "RschedStartLagHigh", "RschedPartitionWithoutOwner"):
        assert f"alert: {alert}" in alerts
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
