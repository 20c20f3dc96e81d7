"""The `rsched` command line in tests: in this process through click's runner (``rsched``,
``ok``, ``as_json``) or as a real process (``run_main``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from click.testing import CliRunner, Result

from rsched.cli.main import cli


def rsched(redis_url: str, *args: str) -> Result:
    result = CliRunner().invoke(cli, ["--redis-url", redis_url, "--log-level", "ERROR", *args],
                                catch_exceptions=False)
    return result


def ok(redis_url: str, *args: str) -> str:
    result = rsched(redis_url, *args)
    assert result.exit_code == 0, result.output + result.stderr
    return result.stdout


def as_json(redis_url: str, *args: str) -> Any:
    return json.loads(ok(redis_url, *args, "--json"))


def run_main(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed entry point in a real process: what an operator's shell sees."""
    return subprocess.run(
        [sys.executable, "-m", "rsched.cli", "--redis-url", redis_url, *args],
        capture_output=True, text=True, timeout=60, check=False,
        env=dict(os.environ, RSCHED_DEBUG=""),
    )
