"""URLs rsched cannot work with on a Redis Cluster, refused by every process and CLI command in
one line: a cluster URL whose writes wait for a replica on masters without any (each write
would be applied and reported as failed, and retried into duplicates), and a plain redis://
URL at one cluster node (a MOVED reply, or part of the partitions).  Real `rsched` processes
against one 3-master cluster without replicas for the module."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from support.redis_server import RedisCluster, free_port

from rsched.aclient import AsyncClient
from rsched.client import Client
from rsched.core.errors import ClusterNodeUrl, NotFound
from rsched.core.settings import Settings

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
NO_REPLICAS = "RSCHED_WAIT_REPLICAS=0"
PLAIN_URL = "redis+cluster://"
# One command of each family that talks to Redis (stats reads only the run-history archive).
COMMANDS = [["status"], ["jobs", "add", "--type", "t", "--run-at", "2030-01-01T00:00:00Z"],
            ["jobs", "list"], ["dlq", "list"], ["dlq", "purge", "--dry-run"], ["keys", "list"],
            ["operations", "list"], ["preview", "--job", "0-P84AAAAAAAAAAAAAAAAAA"]]
STARTED = re.compile(r"(dispatcher|worker|archiver) \S+ started|Application startup complete")


@pytest.fixture()
def empty(cluster: RedisCluster) -> Iterator[RedisCluster]:
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            r.flushall()
    yield cluster


def stored(cluster: RedisCluster) -> int:
    """Keys on all masters together."""
    total = 0
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            total += int(r.dbsize())
    return total


def env_for(url: str, tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RSCHED_WAIT_REPLICAS", None)
    return {**env, "RSCHED_DEBUG": "", "RSCHED_REDIS_URL": url,
            "RSCHED_ARCHIVE_URL": f"sqlite:///{tmp / 'history.db'}",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), **extra}


def rsched(args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rsched.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env)


def each(commands: Sequence[Sequence[str]], env: dict[str, str]
         ) -> list[subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda a: rsched(a, env), commands))


def refused_in_one_line(res: subprocess.CompletedProcess[str], naming: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1, res
    assert lines and lines[-1].startswith("error: ") and naming in lines[-1], res
    assert "Traceback" not in res.stderr and not res.stdout, res


def processes(port: int) -> dict[str, list[str]]:
    return {"dispatcher": ["dispatcher"],
            "worker": ["worker", "--app", "support.dashboard_app:app"],
            # a supervisor: refused once, not each child restarted forever
            "worker --processes 2": ["worker", "--app", "support.dashboard_app:app",
                                     "--processes", "2"],
            "archiver": ["archiver"],
            "api": ["api", "--no-auth", "--port", str(port)]}


def start_all(env: dict[str, str], timeout_s: float = 60) -> dict[str, tuple[int | None, str]]:
    """Start each process; once it exits on its own or says it started (then SIGTERM), its exit
    code (None: it started) and stderr."""
    procs = {name: subprocess.Popen([sys.executable, "-m", "rsched.cli", *args], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
             for name, args in processes(free_port()).items()}

    def watch(name: str) -> tuple[int | None, str]:
        p = procs[name]
        assert p.stderr is not None
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        for line in p.stderr:  # ends when the process exits
            seen.append(line)
            if STARTED.search(line):
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
                return None, "".join(seen)
            assert time.monotonic() < deadline, f"{name} neither started nor exited: {seen}"
        return p.wait(timeout=30), "".join(seen)

    try:
        with ThreadPoolExecutor(len(procs)) as pool:
            return dict(zip(procs, pool.map(watch, procs), strict=True))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            assert p.stderr is not None
            p.stderr.close()


# --- writes waiting for replicas the masters lack ----------------------------------------------


def test_every_cli_command_refuses_writes_waiting_for_replicas_the_masters_lack(
        empty: RedisCluster, tmp_path: Path) -> None:
    for res in each(COMMANDS, env_for(empty.cluster_url, tmp_path)):
        refused_in_one_line(res, NO_REPLICAS)
    assert stored(empty) == 0  # refused before anything was written


def test_with_the_wait_off_every_cli_command_works_on_the_cluster(
        empty: RedisCluster, tmp_path: Path) -> None:
    env = env_for(empty.cluster_url, tmp_path, RSCHED_WAIT_REPLICAS="0")
    added = rsched(["jobs", "add", "--type", "t", "--cron", "0 * * * *"], env)
    assert added.returncode == 0, added
    job_id = added.stdout.strip()
    commands = [c for c in COMMANDS if c[0] != "preview"] + [
        ["preview", "--job", job_id], ["jobs", "show", job_id], ["doctor"]]
    for args, res in zip(commands, each(commands, env), strict=True):
        assert res.returncode == 0, (args, res)
        assert "Traceback" not in res.stderr
    assert job_id in rsched(["jobs", "list"], env).stdout


def test_doctor_names_the_setting_as_an_error_and_exits_non_zero(
        empty: RedisCluster, tmp_path: Path) -> None:
    res = rsched(["doctor"], env_for(empty.cluster_url, tmp_path))
    assert res.returncode == 1, res
    fails = [line for line in res.stdout.splitlines() if " FAIL " in line]
    assert len(fails) == 3 and all("replicas" in f for f in fails), res.stdout
    assert NO_REPLICAS in res.stdout


def test_every_process_refuses_to_start_then_starts_with_the_wait_off(
        empty: RedisCluster, tmp_path: Path) -> None:
    for name, (code, err) in start_all(env_for(empty.cluster_url, tmp_path)).items():
        lines = err.strip().splitlines()
        assert code == 1, (name, err)
        assert lines[-1].startswith("error: ") and NO_REPLICAS in lines[-1], (name, err)
    off = env_for(empty.cluster_url, tmp_path, RSCHED_WAIT_REPLICAS="0")
    for name, (code, err) in start_all(off).items():
        assert code is None and "Traceback" not in err, (name, err)  # it said it started


# --- a plain URL at one cluster node ------------------------------------------------------------


def test_every_cli_command_refuses_a_plain_url_at_a_cluster_node(
        empty: RedisCluster, tmp_path: Path) -> None:
    env = env_for(empty.url, tmp_path)
    for res in each([*COMMANDS, ["doctor"]], env):
        refused_in_one_line(res, PLAIN_URL)
    assert stored(empty) == 0


def test_every_process_refuses_a_plain_url_at_a_cluster_node(
        empty: RedisCluster, tmp_path: Path) -> None:
    env = env_for(empty.url, tmp_path)
    for name, (code, err) in start_all(env).items():
        assert code == 1, (name, err)
        assert err.strip().splitlines()[-1] == (
            "error: this Redis is a Redis Cluster node: use a redis+cluster://host:port"
            "[,host:port...] URL so every master is used"), (name, err)


def test_a_moved_reply_to_a_plain_client_is_the_same_refusal_never_the_raw_reply(
        empty: RedisCluster) -> None:
    """A library client is not checked at construction: the redirection it meets says it."""
    settings = Settings(redis_url=empty.url, wait_replicas=0)
    ids = [f"{p}-P84AAAAAAAAAAAAAAAAAA" for p in range(16)]
    with Client(settings=settings) as c:
        outcomes = []
        for job_id in ids:
            with pytest.raises((NotFound, ClusterNodeUrl)) as e:
                c.get(job_id)
            outcomes.append(type(e.value))
    assert NotFound in outcomes and ClusterNodeUrl in outcomes  # partitions on this node or not

    async def on_asyncio() -> set[type]:
        c = AsyncClient(settings=settings)
        try:
            return {type(e) for e in await asyncio.gather(*(c.get(i) for i in ids),
                                                           return_exceptions=True)}
        finally:
            await c.close()

    assert asyncio.run(on_asyncio()) == {NotFound, ClusterNodeUrl}


def test_rsched_dev_on_the_cluster_refuses_both_in_one_line(
        empty: RedisCluster, tmp_path: Path) -> None:
    """Before it starts anything: its children would refuse one by one."""
    for url, naming in ((empty.cluster_url, NO_REPLICAS), (empty.url, PLAIN_URL)):
        res = rsched(["dev", "--redis-url", url, "--port", str(free_port()), "--data-dir",
                      str(tmp_path / "dev"), "--no-metrics-ports"], env_for(url, tmp_path))
        refused_in_one_line(res, naming)
    assert stored(empty) == 0
