"""The examples of the README and of Getting started run as written, against a real Redis and a
real `rsched api` process: each Python block in a fresh interpreter, each shell block in bash
with the installed `rsched` on PATH, in the page's order, in one working directory (so a block
that is a file, `# jobs.py`, is importable by the next). The only rewrite is the API's address:
the pages say http://127.0.0.1:8600, the test's API listens on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.api_process import running_api
from support.cli import as_json
from support.doc_examples import PAGES, Block, blocks

DOCUMENTED_API = "http://127.0.0.1:8600"
# What each page's examples schedule: its recurring jobs' cron expressions and its keys.
EXPECTED: dict[str, dict[str, Any]] = {
    "README.md": {"crons": ["0 9 * * MON", "30 2 * * *", "30 2 * * *"],
                  "keys": {"eu-nightly", "eu-nightly-http"}},
    "docs/getting-started.md": {"crons": ["30 2 * * *", "30 2 * * *"], "keys": set()},
}


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if block.file_name:
        (cwd / block.file_name).write_text(block.code + "\n")
        argv = [sys.executable, "-c", f"import {block.file_name.removesuffix('.py')}"]
    elif block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          check=False, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("page", PAGES)
def test_every_example_of_the_page_runs_against_a_real_redis_and_api(
        page: str, redis_url: str, tmp_path: Path) -> None:
    runnable = [b for b in blocks(page) if b.runs]
    assert runnable, f"{page} has no example the test runs"
    with running_api(redis_url, tmp_path) as api:
        env = dict(os.environ, RSCHED_REDIS_URL=redis_url, PYTHONPATH=str(tmp_path),
                   RSCHED_ARCHIVE_URL=f"sqlite:///{tmp_path / 'history.db'}",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        for block in runnable:
            code = block.code.replace(DOCUMENTED_API, api.base)
            result = run_block(Block(block.page, block.line, block.lang, code, None),
                               tmp_path, env)
            assert result.returncode == 0, (f"{block} failed ({result.returncode}):\n"
                                            f"{result.stdout}\n{result.stderr}")
    # Not only exit codes: the jobs the page scheduled are there, as it says.
    listed = as_json(redis_url, "jobs", "list", "--type", "send-report", "--limit", "1000")
    jobs = listed["jobs"] if isinstance(listed, dict) else listed
    assert len(jobs) >= len(EXPECTED[page]["crons"]) + 1
    assert sorted(j.get("cron") for j in jobs if j.get("cron")) == EXPECTED[page]["crons"]
    assert EXPECTED[page]["keys"] <= {j.get("idempotencyKey") for j in jobs}
