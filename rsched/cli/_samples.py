"""What `rsched dev` (rsched.cli.dev) puts into Redis: an admin key and the sample jobs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from rsched.cli._private import write_private
from rsched.cli._processes import DevError
from rsched.client import Client
from rsched.service import apikeys


def examples_root() -> Path:
    """The folder holding ``examples/``: the source checkout rsched runs from, else the cwd."""
    here = Path(__file__).resolve().parents[2]
    for root in (here, Path.cwd()):
        if (root / "examples" / "handlers.py").is_file():
            return root
    raise DevError("the bundled examples/ come with the rsched source tree only: pass --app "
                   "module:attr, your own rsched.App")


def admin_key(redis_url: str, key_file: Path) -> str:
    """The admin key kept in ``key_file`` if Redis still knows it, else a new one."""
    client = Client(redis_url)
    try:
        client.check()  # dev's first use of Redis: refuse a URL rsched cannot work with
        if key_file.is_file():
            secret = key_file.read_text().strip()
            key = client.run(apikeys.op_lookup(secret))
            if key is not None and key.scope == "admin":
                return secret
        _, secret = client.run(apikeys.op_create_key("rsched-dev", "admin"))
    finally:
        client.close()
    write_private(key_file, secret + "\n")
    return secret


def schedule_samples(redis_url: str, base_url: str) -> tuple[int, int, list[str], set[str]]:
    """Schedule examples/sample_jobs.py, its HTTP target against the API at ``base_url`` too:
    (created, already there, problems, the ids of the jobs that fail on purpose)."""
    root = str(examples_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module("examples.sample_jobs")
    jobs, failing = module.SAMPLE_JOBS, set(getattr(module, "FAIL_ON_PURPOSE", ()))
    jobs = [*jobs, *module.http_jobs(base_url)]
    client = Client(redis_url)
    try:
        results = client.run(client.op_schedule_created(jobs))
    finally:
        client.close()
    created = sum(1 for r in results if isinstance(r, tuple) and r[1])
    existing = sum(1 for r in results if isinstance(r, tuple) and not r[1])
    problems = [f"{spec.idempotency_key}: {r}" for spec, r in zip(jobs, results, strict=True)
                if isinstance(r, Exception)]
    quiet = {r[0].id for r in results if isinstance(r, tuple) and r[0].type in failing}
    return created, existing, problems, quiet
