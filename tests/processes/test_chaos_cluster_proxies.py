"""The cluster scenario's proxies (chaos/fleet.py, chaos/proxyd.py): a dispatcher or worker of
a `--redis cluster` run reaches every node only through proxies of its own, so freezing them
holds that process alone, as on one Redis."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from chaos.config import RunConfig
from chaos.fleet import Fleet
from chaos.sink import read_executions
from rsched import Client
from rsched.rdb import keys

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(120)]


def remote_ports(pid: int) -> set[int]:
    """The remote ports of a process's established TCP connections (Linux /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            cols = line.split()
            if cols[9] in inodes and cols[3] == "01":  # ESTABLISHED
                ports.add(int(cols[2].split(":")[1], 16))
    return ports


def wait_until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.1)


def test_cluster_processes_reach_every_node_through_their_own_proxies_and_freeze_alone(
    redis_available: None, tmp_path: Path
) -> None:
    fleet = Fleet(RunConfig(redis="cluster", dispatchers=1, workers=1), tmp_path)
    try:
        fleet.start_servers()
        assert fleet.cluster is not None
        for m in fleet.members:
            fleet.spawn(m.slot)
        client = Client(fleet.redis_url)
        d, w = fleet.members
        wait_until(lambda: client.r.zscore(keys.dispatchers(), d.id) is not None
                   and client.r.hexists(keys.workers(), w.id), 40, "both to register")
        client.schedule("quick")  # every master's connections in use
        masters = {n.port for n in fleet.cluster.masters()}
        for m in fleet.members:
            assert m.popen is not None
            own = set(fleet.proxy_ports[m.proxy])
            wait_until(lambda m=m, own=own: len(remote_ports(m.popen.pid) & own) >= len(masters),
                       10, f"{m.id} to reach every master")
            ports = remote_ports(m.popen.pid)
            assert not ports & {n.port for n in fleet.cluster.nodes}, (m.id, ports)
            assert ports <= own | {fleet.sink.port}, (m.id, ports, own)

        sink = fleet.sink.client()
        fleet.proxy("freeze", w.slot)
        job = client.schedule("quick")
        time.sleep(1.5)
        assert f"{job.id}@" not in str(list(read_executions(sink))), "ran through a freeze"
        fleet.proxy("thaw", w.slot)
        wait_until(lambda: any(r.startswith(f"{job.id}@") for r in read_executions(sink)), 15,
                   "the job to run once the worker's proxies thawed")
        client.close()
        sink.close()
    finally:
        fleet.close()
