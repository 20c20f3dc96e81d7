"""Where a test belongs, by what it needs: tests/unit (no Redis), tests/redis (one real
redis-server), tests/processes (fleets, clusters, Sentinel, Chromium: everything else).  The
root conftest checks every collected test against its folder with ``misplaced``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
FOLDERS = ("unit", "redis", "processes")
# Every Redis fixture depends on this one (conftest.py).
REDIS = "redis_available"
# Fixtures that start more than one server.
MANY_SERVERS = frozenset({"cluster", "redis_cluster_replicas", "redis_sentinel"})


def misplaced(path: Path, fixtures: Iterable[str]) -> str | None:
    """Why a test in the file ``path`` asking for ``fixtures`` is in the wrong folder, or None."""
    folder = path.resolve().parent.name
    needs = set(fixtures)
    if folder == "unit" and REDIS in needs:
        return "needs Redis: it belongs in tests/redis (one server) or tests/processes"
    if folder == "redis" and needs & MANY_SERVERS:
        many = ", ".join(sorted(needs & MANY_SERVERS))
        return f"needs {many}: it belongs in tests/processes"
    return None
