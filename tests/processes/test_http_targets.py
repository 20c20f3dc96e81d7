"""HTTP target jobs end to end: a real dispatcher and a real `rsched worker --http` process send
signed requests to a real local HTTP server (support.http_receiver), allowed through the SSRF
guard by RSCHED_HTTP_ALLOW=127.0.0.1:<its port>; results, retries and dead letters are read
back through the Client and the CLI."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.http_receiver import Receiver, receiver  # noqa: F401 - the fixture
from support.processes import Proc, wait_for
from support.redis_server import free_port

from rsched import Client, Job, Run

pytestmark = pytest.mark.slow

SECRETS = ("new-secret", "old-secret")


METRICS_PORT = free_port()


@pytest.fixture
def http_fleet(redis_url: str, receiver: Receiver, tmp_path: Path  # noqa: F811
               ) -> Iterator[list[Proc]]:
    """A dispatcher and an --http worker (metrics on METRICS_PORT), allowed to reach the
    receiver's port only."""
    env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
               RSCHED_HTTP_ALLOW=f"127.0.0.1:{receiver.port}",
               RSCHED_HTTP_SIGNING_SECRETS=",".join(SECRETS))
    procs = [Proc("dispatcher", ["dispatcher", "--max-sleep-ms", "100"], env, tmp_path),
             Proc("worker", ["--metrics-port", str(METRICS_PORT), "worker", "--http",
                             "--heartbeat-ms", "500", "--concurrency", "8"], env, tmp_path)]
    yield procs
    for p in procs:
        p.stop()


def ended(client: Client, job: Job, procs: list[Proc], timeout_s: float = 60) -> Run:
    """The job's own (first) run once it has ended."""
    def done() -> Run | None:
        run_id = client.get(job.id).last_run_id
        run = client.get_run(run_id) if run_id else None
        return run if run is not None and run.state in ("succeeded", "dead") else None
    run: Run = wait_for(f"job {job.id} ends", done, procs, timeout_s)
    return run


def test_a_request_carries_the_headers_the_body_and_a_signature_per_secret(
        client: Client, receiver: Receiver, http_fleet: list[Proc]) -> None:  # noqa: F811
    job = client.schedule_http(f"{receiver.base}/ok", {"order": 7},
                               headers={"X-Tenant": "acme"})
    run = ended(client, job, http_fleet)
    assert run.state == "succeeded"
    assert run.result["status"] == 200 and run.result["body"] == "thanks"
    assert run.result["latencyMs"] >= 0
    [req] = receiver.of("/ok")
    h = req.headers
    assert req.method == "POST" and json.loads(req.body) == {"order": 7}
    assert h["Content-Type"] == "application/json" and h["X-Tenant"] == "acme"
    assert h["User-Agent"].startswith("rsched/")
    assert h["Rsched-Job-Id"] == job.id and h["Rsched-Run-Id"] == run.id
    assert h["Rsched-Attempt"] == "1" and h["Rsched-Scheduled-At"].endswith("Z")
    # The receiver's check as the docs show it, once per secret of the rotation.
    parts = h["Rsched-Signature"].split(",")
    t = parts[0].removeprefix("t=")
    assert abs(time.time() - int(t)) < 300
    given = [p.removeprefix("v1=") for p in parts[1:]]
    assert len(given) == 2
    for secret, sig in zip(SECRETS, given, strict=True):
        mac = hmac.new(secret.encode(), f"{t}.".encode() + req.body, hashlib.sha256)
        assert hmac.compare_digest(mac.hexdigest(), sig)


def test_a_303_becomes_a_get_and_the_metrics_count_requests_by_status_class(
        client: Client, receiver: Receiver, http_fleet: list[Proc]) -> None:  # noqa: F811
    job = client.schedule_http(f"{receiver.base}/redirect?code=303&to=/ok", {"x": 1})
    run = ended(client, job, http_fleet)
    assert run.state == "succeeded" and run.result["body"] == "thanks"
    [first] = receiver.of("/redirect")
    [then] = receiver.of("/ok")
    assert first.method == "POST" and then.method == "GET" and then.body == b""
    text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics").text
    assert 'rsched_http_requests_total{queue="default",status_class="2xx"} 1.0' in text
    assert 'rsched_http_request_seconds_count{queue="default"} 1.0' in text


def test_a_503_with_retry_after_waits_at_least_that_long_then_succeeds(
        client: Client, receiver: Receiver, http_fleet: list[Proc]) -> None:  # noqa: F811
    path = "/status/503"
    job = client.schedule_http(f"{receiver.base}{path}?retry_after=2&fail=1",
                               backoff_base_ms=100, max_attempts=3)
    run = ended(client, job, http_fleet)
    assert run.state == "succeeded" and run.attempt == 2
    first, second = receiver.of(path)
    assert second.at - first.at >= 2.0
    assert second.headers["Rsched-Run-Id"] == first.headers["Rsched-Run-Id"] == run.id
    assert second.headers["Rsched-Attempt"] == "2"


def test_a_404_is_dead_lettered_after_one_attempt_with_its_status_in_the_error(
        client: Client, receiver: Receiver, http_fleet: list[Proc]) -> None:  # noqa: F811
    job = client.schedule_http(f"{receiver.base}/status/404", max_attempts=5)
    run = ended(client, job, http_fleet)
    assert run.state == "dead" and run.attempt == 1
    assert run.error is not None and run.error.startswith("HTTP 404 from POST")
    assert len(receiver.of("/status/404")) == 1


def test_a_hanging_receiver_hits_the_timeout_and_the_retry_succeeds(
        client: Client, receiver: Receiver, http_fleet: list[Proc]) -> None:  # noqa: F811
    job = client.schedule_http(f"{receiver.base}/hang?s=8", method="GET", timeout_s=1,
                               backoff_base_ms=100, max_attempts=2)
    run = ended(client, job, http_fleet)
    assert run.state == "succeeded" and run.attempt == 2 and run.result["body"] == "awake"
    [first] = [a for a in client.runs(job.id) if a.attempt == 1]
    assert first.status == "timed_out" or "timed out" in (first.error or ""), first
    assert len(receiver.of("/hang")) == 2


@pytest.mark.parametrize("to", ["http://169.254.169.254/latest/meta-data/",
                                "http://127.0.0.1:{other}/ok", "http://[::ffff:127.0.0.1]/ok"])
def test_a_redirect_to_a_refused_address_is_a_final_failure_naming_it(
        client: Client, receiver: Receiver, http_fleet: list[Proc], to: str) -> None:  # noqa: F811
    """The metadata address, loopback on a port the allow list leaves out, and loopback in
    its IPv4-mapped IPv6 form on port 80."""
    target = to.format(other=receiver.port + 1 if receiver.port < 65535 else 1)
    job = client.schedule_http(f"{receiver.base}/redirect?to={target}", max_attempts=3)
    run = ended(client, job, http_fleet)
    assert run.state == "dead" and run.attempt == 1
    assert run.error is not None and "refused by the SSRF guard" in run.error
    host = target.split("/")[2].rpartition(":")[0].strip("[]") or target.split("/")[2]
    assert f"address {host}" in run.error


def test_a_10_mib_response_fails_the_attempt_without_the_worker_growing(
        client: Client, receiver: Receiver, http_fleet: list[Proc]) -> None:  # noqa: F811
    warm = client.schedule_http(f"{receiver.base}/ok")
    ended(client, warm, http_fleet)
    worker = http_fleet[1].popen.pid
    before = _rss_kib(worker)
    job = client.schedule_http(f"{receiver.base}/big", method="GET", max_attempts=1)
    run = ended(client, job, http_fleet)
    assert run.state == "dead"
    assert run.error is not None and "over 1,048,576 bytes" in run.error
    assert _rss_kib(worker) - before < 8 * 1024  # a few MiB, not the 10 MiB body


def test_the_cli_creates_an_http_target_job(
        redis_url: str, client: Client, receiver: Receiver,  # noqa: F811
        http_fleet: list[Proc]) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "rsched.cli", "--redis-url", redis_url, "jobs", "create",
         "--url", f"{receiver.base}/ok", "--method", "PUT", "--header", "X-Kind: cli",
         "--body", '{"from": "cli"}', "--json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    made = json.loads(res.stdout)
    assert made["type"] == "http" and made["target"]["method"] == "PUT"
    run = ended(client, client.get(made["id"]), http_fleet)
    assert run.state == "succeeded"
    [req] = receiver.of("/ok")
    assert req.method == "PUT" and req.headers["X-Kind"] == "cli"
    assert json.loads(req.body) == {"from": "cli"}


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
