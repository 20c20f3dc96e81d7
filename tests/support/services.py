"""A service the tests need (redis-server, Chromium, PostgreSQL) missing: skipped locally, a
failed run under CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_service(message: str) -> NoReturn:
    """Skip locally; under CI stop the whole run with exit code 1."""
    if under_ci():
        pytest.exit(f"{message} (CI is set: a missing service fails the run)", returncode=1)
    pytest.skip(message)
