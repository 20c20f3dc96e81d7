"""`rsched jobs update`: each flag changes one field as PATCH /jobs/{id} does, at a version when
asked; errors name the flag; `jobs show` carries the latest run as `jobs list` does."""

from __future__ import annotations

from support.cli import as_json, ok, rsched, run_main


def test_jobs_update_changes_the_fields_given_and_prints_the_new_version(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "report", "--cron", "0 * * * *",
                "--payload", '{"n": 1}').strip()
    before = as_json(redis_url, "jobs", "show", job_id)
    out = ok(redis_url, "jobs", "update", job_id, "--cron", "30 2 * * *", "--tz",
             "Asia/Kolkata", "--max-runs", "3", "--overlap", "skip", "--payload", '{"n": 2}',
             "--if-version", str(before["version"])).strip()
    after = as_json(redis_url, "jobs", "show", job_id)
    assert out == f"{job_id} version {after['version']}" and after["version"] > before["version"]
    assert (after["cron"], after["timeZone"], after["maxRuns"], after["overlap"],
            after["payload"]) == ("30 2 * * *", "Asia/Kolkata", 3, "skip", {"n": 2})
    removed = as_json(redis_url, "jobs", "update", job_id, "--max-runs", "none")
    assert removed["maxRuns"] is None and removed["version"] > after["version"]
    assert removed["cron"] == "30 2 * * *"  # what no flag names stays


def test_jobs_update_refuses_a_stale_version_and_names_each_bad_flag(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "report", "--cron", "0 * * * *").strip()
    version = as_json(redis_url, "jobs", "show", job_id)["version"]
    ok(redis_url, "jobs", "update", job_id, "--priority", "5")
    stale = run_main(redis_url, "jobs", "update", job_id, "--priority", "7",
                     "--if-version", str(version))
    assert stale.returncode == 1 and "Traceback" not in stale.stderr
    assert stale.stderr.startswith(f"error: --if-match: the job is at another version than "
                                   f"{version}")
    assert "retry with its version" in stale.stderr
    assert as_json(redis_url, "jobs", "show", job_id)["priority"] == 5  # nothing changed
    for args, flag in [(["--cron", "61 * * * *"], "--cron"), (["--tz", "Mars/Olympus"], "--tz"),
                       (["--max-runs", "many"], "--max-runs"),
                       (["--payload", "{nope"], "--payload"),
                       (["--run-at", "2030-01-01T00:00:00Z", "--cron", "@daily"], "--run-at"),
                       (["--overlap", "sometimes"], "--overlap")]:
        bad = run_main(redis_url, "jobs", "update", job_id, *args)
        assert bad.returncode == 1 and bad.stderr.startswith(f"error: {flag}"), (args, bad)
    nothing = rsched(redis_url, "jobs", "update", job_id)
    assert nothing.exit_code == 2 and "nothing to change" in nothing.stderr
    missing = run_main(redis_url, "jobs", "update", "3-NOPE", "--priority", "1")
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_jobs_show_carries_the_latest_run_as_the_list_does(redis_url: str) -> None:
    job_id = ok(redis_url, "jobs", "add", "--type", "report", "--cron", "0 * * * *").strip()
    shown = as_json(redis_url, "jobs", "show", job_id)
    listed = as_json(redis_url, "jobs", "list")["jobs"]
    assert [shown] == listed and shown["lastRun"]["failureStreak"] == 0
    assert "lastRun" in ok(redis_url, "jobs", "show", job_id)
