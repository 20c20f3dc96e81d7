"""The CLI refuses bad input at start, naming the flag (issue 15, items 6 and 9), in real
processes: exit code 2 is click's usage error, and nothing starts."""

from __future__ import annotations

import pytest
from helpers import settings
from test_cli import run_main

from rsched import App, ValidationError
from rsched.engine.worker import Worker


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
