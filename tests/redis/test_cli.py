"""The `rsched` operator commands against the real session redis-server: tables by default,
JSON with --json, and errors as one line on stderr with a non-zero exit code."""

from __future__ import annotations

import asyncio

import pytest
import redis
from support.cli import as_json, ok, rsched, run_main
from support.helpers import Rig, hgetall, overdue

from rsched import App, Client, JobContext, JobSpec
from rsched.core.settings import Settings
from rsched.rdb import keys


def test_jobs_add_prints_the_id_and_show_list_runs_read_it_back(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "report", "--payload", '{"n": 1}',
                "--cron", "30 2 * * *", "--tz", "America/New_York", "--max-attempts", "4",
                "--idempotency-key", "nightly").strip()
    assert job_id.split("-")[0].isdigit()
    again = ok(redis_url, "jobs", "add", "--type", "report", "--payload", '{"n": 1}', "--cron",
               "30 2 * * *", "--tz", "America/New_York", "--max-attempts", "4",
               "--idempotency-key", "nightly").strip()
    assert again == job_id
    shown = as_json(redis_url, "jobs", "show", job_id)
    assert (shown["cron"], shown["timeZone"], shown["maxAttempts"]) == (
        "30 2 * * *", "America/New_York", 4)
    assert shown["payload"] == {"n": 1}
    table = ok(redis_url, "jobs", "show", job_id)
    assert "America/New_York" in table and table.splitlines()[0].split() == ["FIELD", "VALUE"]
    listed = as_json(redis_url, "jobs", "list")
    assert [j["id"] for j in listed["jobs"]] == [job_id] and listed["nextCursor"] is None
    lines = ok(redis_url, "jobs", "list", "--status", "scheduled").splitlines()
    assert lines[0].split()[:4] == ["ID", "TYPE", "QUEUE", "STATUS"] and job_id in lines[1]
    assert as_json(redis_url, "jobs", "list", "--status", "paused")["jobs"] == []
    assert as_json(redis_url, "jobs", "runs", job_id) == {"runs": [], "nextCursor": None}


def test_jobs_add_takes_the_catch_up_window_and_misfire_policy(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "tick", "--cron", "@hourly",
                "--catch-up-window", "300", "--misfire", "skip", "--overlap", "skip").strip()
    shown = as_json(redis_url, "jobs", "show", job_id)
    assert (shown["cron"], shown["catchUpWindowSeconds"], shown["misfire"]) == (
        "@hourly", 300, "skip")
    assert shown["lastGap"] is None and shown["overlap"] == "skip"


def test_control_commands_take_if_match_and_name_the_flag_on_a_mismatch(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "tick", "--cron", "@hourly").strip()
    assert ok(redis_url, "jobs", "pause", job_id, "--if-match", "1").strip() == f"{job_id} paused"
    stale = run_main(redis_url, "jobs", "resume", job_id, "--if-match", "1")
    assert stale.returncode == 1
    assert stale.stderr.startswith("error: --if-match: the job is at another version than 1")
    assert as_json(redis_url, "jobs", "show", job_id)["status"] == "paused"
    assert ok(redis_url, "jobs", "resume", job_id, "--if-match", "2").strip() == \
        f"{job_id} scheduled"


def test_pause_resume_cancel_and_trigger_change_the_job(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "t", "--run-at",
                "2030-01-01T00:00:00Z").strip()
    assert ok(redis_url, "jobs", "pause", job_id).strip() == f"{job_id} paused"
    assert ok(redis_url, "jobs", "resume", job_id).strip() == f"{job_id} scheduled"
    run_id = ok(redis_url, "jobs", "trigger", job_id).strip()
    assert run_id.startswith(f"{job_id}@")
    assert ok(redis_url, "jobs", "cancel", job_id).strip() == f"{job_id} cancelled"


def test_preview_prints_the_dst_adjusted_fire_times(redis_url: str) -> None:
    args = ["preview", "30 2 * * *", "--tz", "America/New_York", "--from",
            "2026-03-07T00:00:00Z", "--count", "4"]
    lines = ok(redis_url, *args).splitlines()
    assert lines[0].split() == ["UTC", "LOCAL"]
    assert [ln.split()[0] for ln in lines[1:]] == [
        "2026-03-07T07:30:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z",
        "2026-03-10T06:30:00.000Z"]
    assert as_json(redis_url, *args)[1]["local"] == "2026-03-08T03:00:00-04:00"


def test_status_and_doctor_report_on_redis(redis_url: str, r: redis.Redis) -> None:
    with Client(settings=Settings(redis_url=redis_url)) as c:  # one job overdue in a due set
        overdue(c, [JobSpec("t", run_at="2000-01-01T00:00:00Z")])
    status = as_json(redis_url, "status")
    assert len(status["partitions"]) == 16 and status["dueBacklog"] == 1
    assert "due backlog 1" in ok(redis_url, "status")
    checks = {c["check"]: c for c in as_json(redis_url, "doctor")}
    assert checks["version"]["level"] == "ok"
    assert checks["appendonly"]["level"] == "warn"  # the test server runs without AOF
    assert "appendonly yes" in checks["appendonly"]["message"]
    listpack = str(r.config_get("hash-max-listpack-value")["hash-max-listpack-value"])
    assert checks["hash-max-listpack-value"]["level"] == ("ok" if int(listpack) >= 256 else "warn")
    r.config_set("hash-max-listpack-value", 64)  # Redis's default
    try:
        found = {c["check"]: c for c in as_json(redis_url, "doctor")}["hash-max-listpack-value"]
        assert found["level"] == "warn" and "hash-max-listpack-value 256" in found["message"]
        r.config_set("hash-max-listpack-value", 256)
        found = {c["check"]: c for c in as_json(redis_url, "doctor")}["hash-max-listpack-value"]
        assert (found["level"], found["message"]) == ("ok", "256")
    finally:
        r.config_set("hash-max-listpack-value", listpack)
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        bad = rsched(redis_url, "doctor")
        assert bad.exit_code == 1
        assert "noeviction" in bad.stdout and "FAIL" in bad.stdout
    finally:
        r.config_set("maxmemory-policy", "noeviction")


def test_dlq_list_shows_a_real_dead_letter_and_replay_sends_it_back(redis_url: str) -> None:
    assert as_json(redis_url, "dlq", "list") == {"deadLetters": [], "nextCursor": None}
    job_id = ok(redis_url, "jobs", "add", "--type", "boom", "--max-attempts", "1").strip()
    app = App("cli-test")

    @app.job("boom")
    def boom(ctx: JobContext) -> None:
        raise ValueError("no such customer")

    async def run_once() -> None:
        async with Rig(redis_url, app) as rig:
            await rig.cycle()

    asyncio.run(run_once())
    dead = as_json(redis_url, "dlq", "list")["deadLetters"]
    assert [d["jobId"] for d in dead] == [job_id]
    lines = ok(redis_url, "dlq", "list").splitlines()
    assert lines[0].split()[:3] == ["RUN", "TYPE", "ATTEMPT"]
    assert "ValueError: no such customer" in lines[1]
    run_id = dead[0]["runId"]
    assert ok(redis_url, "dlq", "replay", run_id).strip() == f"{run_id} retry_wait"
    assert as_json(redis_url, "dlq", "list")["deadLetters"] == []


def test_keys_create_prints_the_secret_once_list_hides_it_and_revoke_removes_it(
    redis_url: str, r: redis.Redis
) -> None:
    made = rsched(redis_url, "keys", "create", "--scope", "write", "--name", "billing")
    assert made.exit_code == 0
    secret = made.stdout.strip()
    assert secret.startswith("rsk_") and "shown once" in made.stderr
    listed = as_json(redis_url, "keys", "list")
    assert [(k["name"], k["scope"]) for k in listed] == [("billing", "write")]
    assert secret not in ok(redis_url, "keys", "list")
    assert secret.encode() not in b"".join(hgetall(r, keys.api_keys()).values())
    assert ok(redis_url, "keys", "revoke", "billing").startswith(f"revoked {listed[0]['id']}")
    assert as_json(redis_url, "keys", "list") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["jobs", "show", "3-NOPE"], "error: job '3-NOPE' not found"),
        (["jobs", "add", "--type", "t", "--cron", "61 * * * *"], "error: --cron: bad minute"),
        (["jobs", "add", "--type", "t", "--payload", "{nope"], "error: --payload: not JSON"),
        (["jobs", "add", "--type", "t", "--cron", "@daily", "--catch-up-window", "-1"],
         "error: --catch-up-window: must be between 0 and 2592000 seconds"),
        (["jobs", "add", "--type", "t", "--cron", "@daily", "--overlap", "twice"],
         "error: --overlap: must be 'allow', 'skip', 'bufferOne' or 'cancelPrevious'"),
        (["jobs", "backfill", "3-NOPE", "--from", "soon", "--to", "2026-01-01T00:00:00Z"],
         "error: --from: not an ISO-8601 time"),
        (["jobs", "backfill", "3-NOPE", "--from", "2026-01-02T00:00:00Z", "--to",
          "2026-01-01T00:00:00Z"], "error: --from: must be before the end of the range"),
        (["jobs", "backfill", "3-NOPE", "--from", "2026-01-01T00:00:00Z", "--to",
          "2026-01-01T00:01:00Z"], "error: job '3-NOPE' not found"),
        (["jobs", "add", "--type", "t", "--cron", "@daily", "--misfire", "later"],
         "error: --misfire: must be 'run_once'"),
                (["preview", "* * * * *", "--tz", "Mars/Base"], "error: --tz: unknown time zone"),
        (["keys", "revoke", "nobody"], "error: API key 'nobody' not found"),
    ],
)
def test_errors_are_one_line_on_stderr_with_a_non_zero_exit_and_no_traceback(
    redis_url: str, args: list[str], message: str
) -> None:
    done = run_main(redis_url, *args)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_an_unreachable_redis_is_one_line_too() -> None:
    done = run_main("redis://127.0.0.1:1/0", "status")
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot reach Redis")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_client_and_the_cli_share_one_service_layer(redis_url: str) -> None:
    client = Client(settings=Settings.from_env(redis_url=redis_url))
    job = client.schedule("shared", {"k": "v"}, run_at=1893456000000)
    client.close()
    assert as_json(redis_url, "jobs", "show", job.id)["nextRunAt"] == "2030-01-01T00:00:00.000Z"
