"""The CLI refuses bad input at start, naming the flag (issue 15, items 6 and 9), in real
processes: exit code 2 is click's usage error, and nothing starts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient
from support.cli import run_main
from support.helpers import Rig, settings

from rsched import App, JobContext, ValidationError
from rsched.api.app import create_app
from rsched.engine.worker import Worker

LATER = "2030-01-01T00:00:00Z"


@pytest.fixture
def api(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings(redis_url), auth=False)) as client:
        yield client


@pytest.mark.parametrize("queues", ["", " , ", ",,"])
def test_a_worker_with_no_queue_is_refused_at_start_with_exit_code_2(
    redis_url: str, queues: str
) -> None:
    # the app need not exist: the queues are checked first, before anything is imported
    res = run_main(redis_url, "worker", "--app", "no_such_module:app", "--queues", queues)
    assert res.returncode == 2, res
    assert "--queues" in res.stderr and "names no queue" in res.stderr
    assert "Traceback" not in res.stderr and "ZeroDivision" not in res.stderr


def test_a_worker_with_a_bad_queue_name_is_refused_naming_it(redis_url: str) -> None:
    res = run_main(redis_url, "worker", "--app", "no_such_module:app", "--queues", "ok,b a d")
    assert res.returncode == 2, res
    assert "--queues" in res.stderr and "'b a d'" in res.stderr


def test_a_worker_built_from_python_with_no_queue_is_refused_naming_queues(
    redis_url: str
) -> None:
    with pytest.raises(ValidationError) as e:
        Worker(App("none"), settings(redis_url), queues=[])
    assert e.value.field == "queues"


@pytest.mark.parametrize(("args", "message"), [
    (["--run-at", "2030-01-01T00:00:00"], "error: --run-at: "),
    (["--run-at", "2030-01-01T00:00:00Z", "--cron", "* * * * *"], "error: --run-at: "),
    (["--cron", "* * * * *", "--tz", ""], "error: --tz: must not be empty"),
    (["--run-at", "2030-01-01T00:00:00Z", "--tz", ""], "error: --tz: must not be empty"),
    (["--max-attempts", "0"], "error: --max-attempts: "),
    (["--queue", "no queue"], "error: --queue: "),
    (["--payload", '{"a": [18446744073709551616]}'],
     "error: --payload: at a[0]: integer beyond 64 bits"),
])
def test_jobs_add_errors_name_the_flag_the_user_typed(
    redis_url: str, args: list[str], message: str
) -> None:
    res = run_main(redis_url, "jobs", "add", "--type", "t", *args)
    assert res.returncode == 1, res
    assert res.stderr.startswith(message), res.stderr
    assert "runAt" not in res.stderr and "timeZone" not in res.stderr


def test_preview_keys_create_and_jobs_list_name_their_flags(redis_url: str) -> None:
    res = run_main(redis_url, "preview", "* * * * *", "--tz", "")
    assert res.returncode == 1 and res.stderr.startswith("error: --tz: must not be empty"), res
    res = run_main(redis_url, "keys", "create", "--scope", "read", "--name", "a/b")
    assert res.returncode == 1 and res.stderr.startswith("error: --name: "), res
    for flag, value in (("--status", "sleeping"), ("--limit", "0"), ("--cursor", "nope")):
        res = run_main(redis_url, "jobs", "list", flag, value)
        assert res.returncode == 1 and res.stderr.startswith(f"error: {flag}: "), res


def test_the_api_refuses_an_empty_time_zone_for_a_cron_job_too(api: TestClient) -> None:
    res = api.post("/jobs", json={"type": "t", "cron": "* * * * *", "timeZone": ""})
    assert res.status_code == 422, res.text
    assert res.json()["errors"][0]["field"] == "timeZone"


def _typed_app() -> App:
    app = App("typed")

    @app.job("known")
    def known(ctx: JobContext) -> None:
        return None

    return app


def test_jobs_add_warns_when_no_live_worker_handles_the_type_on_its_queue(
    redis_url: str
) -> None:
    async def beat() -> None:  # a live worker for 'known' on 'default', as its heartbeat says
        async with Rig(redis_url, _typed_app()) as rig:
            await rig.worker.heartbeat_once()

    asyncio.run(beat())
    known = run_main(redis_url, "jobs", "add", "--type", "known", "--run-at", LATER)
    assert known.returncode == 0 and known.stderr == "", known
    for args, what, then in (
        (["--type", "knwon"], "'knwon' on queue 'default'",
         "; the workers reading it set its runs aside unrun, and each run is dead-lettered if "
         "none with that handler serves the queue within 600 s (their --handler-wait; start "
         "one: rsched worker --app ... --queues default)"),
        (["--type", "known", "--queue", "other"], "'known' on queue 'other'",
         ", and none reads that queue: the job waits there until one starts (start one: "
         "rsched worker --app ... --queues other)"),
    ):
        res = run_main(redis_url, "jobs", "add", *args, "--run-at", LATER)
        assert res.returncode == 0, res  # scheduled all the same: a worker may come later
        assert res.stdout.strip()
        assert res.stderr == f"warning: no live worker has a handler for job type {what}{then}\n"

