"""Short questions to a running redis-server, and waiting for an answer: used by the cluster and
Sentinel fixtures (redis_server.py, redis_sentinel.py) to tell when a topology has settled."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Self, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

HOST = "127.0.0.1"
_T = TypeVar("_T")


class RedisServerError(RuntimeError):
    """The server did not come up (or went away); the message carries its log."""


class NotYet(Exception):
    """Raised by a wait_for() check: the state is not reached; the message says what is missing."""


class NodeGroup:
    """Base of the multi-node fixtures: `with` starts the group and stops it on leaving, and a
    start that fails stops the nodes it did start (no servers left until the run ends)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def command(port: int, *args: str | int) -> Any:
    """One command on a fresh connection, no retries, 2 s timeouts: a dead or paused node
    raises at once instead of hanging a wait. Replies are decoded; redis-py parses those of
    commands it knows by their first word (INFO, SENTINEL: dicts), not CLUSTER's."""
    with redis.Redis(
        host=HOST, port=port, decode_responses=True, socket_timeout=2,
        socket_connect_timeout=2, retry=Retry(NoBackoff(), 0),
    ) as probe:  # fmt: skip
        return probe.execute_command(*args)


def wait_for(check: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """Poll check() until it returns instead of raising NotYet; a node that is down or still
    loading counts as not yet. On timeout the error names `what` and the last thing missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except (NotYet, redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise RedisServerError(f"{what}: not within {timeout_s} s: {exc}") from exc
        time.sleep(0.05)


def role(port: int) -> str:
    """ "master", "slave" or "sentinel", as the server itself says (ROLE)."""
    return str(command(port, "ROLE")[0])


def replicating_from(port: int) -> int | None:
    """The port of the master this replica is in sync with (link up), else None."""
    info = command(port, "INFO", "replication")
    if info["role"] != "slave" or info["master_link_status"] != "up":
        return None
    return int(info["master_port"])


def streams_to(port: int) -> int:
    """How many replicas this master sends its stream to (online)."""
    info = command(port, "INFO", "replication")
    if info["role"] != "master":
        return 0
    return sum(
        1 for key, value in info.items() if key.startswith("slave") and value["state"] == "online"
    )


def slot_ranges(port: int) -> list[tuple[int, int, str]]:
    """(first slot, last slot, owner id) per range, in this node's view (CLUSTER SLOTS)."""
    return [(int(r[0]), int(r[1]), str(r[2][2])) for r in command(port, "CLUSTER", "SLOTS")]


def view_counts(port: int) -> dict[str, int]:
    """Masters with slots and replicas in this node's view (CLUSTER NODES); {} while any entry
    is marked failing, in handshake, without address or disconnected."""
    counts = {"master": 0, "slave": 0}
    for line in str(command(port, "CLUSTER", "NODES")).splitlines():
        fields = line.split()
        flags = set(fields[2].split(","))
        if flags & {"fail", "fail?", "handshake", "noaddr"} or fields[7] != "connected":
            return {}
        if "slave" in flags:
            counts["slave"] += 1
        elif "master" in flags and len(fields) > 8:
            counts["master"] += 1
    return counts
