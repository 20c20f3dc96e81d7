"""rsched on Redis Cluster: the router (rdb.cluster), the URL schemes (rdb.connect), placement,
and the engine's behaviour end to end on a real 3-master cluster."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import AskError
from starlette.testclient import TestClient
from support.helpers import Rig, keys_in_partition, overdue, run_engine
from support.redis_probe import command
from support.redis_server import RedisCluster, free_port
from support.tcp_proxy import proxies_for

from rsched import App, Client, JobContext, JobSpec
from rsched.api.app import create_app
from rsched.core.errors import UnsafeRedis
from rsched.core.models import Job
from rsched.core.settings import Settings
from rsched.engine.dispatcher.claimer import Claimer
from rsched.rdb import keys
from rsched.rdb.cluster import ClusterRedis, clock_routes, same_slot_groups
from rsched.rdb.connect import BadRedisUrl, connect, connect_async, parse
from rsched.rdb.setup import check_redis, cluster_replicas, replicas_short
from rsched.rdb.slots import ROUTE_BY, SlotMap, key_of, sendable
from rsched.service.listings import op_list_jobs

# --- pure: routing keys, slot maps, URLs, placement --------------------------------------------


@pytest.mark.parametrize(("args", "key"), [
    (("HSET", "k", "f", "v"), "k"),
    (("EVALSHA", "sha", 2, "a", "b", "x"), "a"),
    (("EVALSHA", "sha", 0, "x"), None),
    (("XREADGROUP", "GROUP", "g", "c", "COUNT", 5, "BLOCK", 10, "STREAMS", "s1", "s2", ">", ">"),
     "s1"),
    (("XGROUP CREATE", "s", "g", "0", "MKSTREAM"), "s"),
    (("XINFO", "GROUPS", "s"), "s"),
    (("XINFO GROUPS", "s"), "s"),
    (("CONFIG GET", "maxmemory-policy"), None),
    (("TIME",), None),
    (("SCAN", 0, "MATCH", "x*"), None),
    (("PUBLISH", "ch", "1"), None),
])
def test_key_of_finds_the_key_a_command_is_routed_by(args: tuple[Any, ...], key: Any) -> None:
    assert key_of(args) == key


def test_slot_map_parses_cluster_slots_and_names_an_uncovered_slot() -> None:
    m = SlotMap.parse([
        [10923, 16383, [b"127.0.0.1", 7003, b"c"], [b"127.0.0.1", 7006, b"f"]],
        [0, 5460, [b"127.0.0.1", 7001, b"a"]],
    ])
    assert m.masters == [("127.0.0.1", 7001), ("127.0.0.1", 7003)]
    assert m.replicas[("127.0.0.1", 7003)] == [("127.0.0.1", 7006)]
    assert m.slots_per_master() == {("127.0.0.1", 7001): 5461, ("127.0.0.1", 7003): 5461}
    assert m.node_for(("GET", "{a}")) == ("127.0.0.1", 7003 if key_slot(b"a") > 10922 else 7001)
    uncovered = next(k for k in (f"k{i}" for i in range(1000))
                     if 5460 < key_slot(k.encode()) < 10923)
    with pytest.raises(redis.exceptions.ClusterDownError, match=uncovered):
        m.node_for(("GET", uncovered))
    assert m.node_for(("SCAN", 0), {"target_node": 1}) == ("127.0.0.1", 7003)


@pytest.mark.parametrize(("host", "meta", "reached_at"), [
    (b"", None, "10.0.0.9"),  # a node that does not know its own address yet
    (None, {b"ip": b"10.0.0.5"}, "10.0.0.9"),  # unknown-endpoint: the host that answered
    (b"?", {b"ip": b"10.0.0.5"}, "10.0.0.5"),  # hostnames preferred, none announced: its IP
    (b"?", [b"ip", b"10.0.0.5"], "10.0.0.5"),  # the same metadata as a RESP2 flat list
    (b"node-1.example", {b"ip": b"10.0.0.5"}, "node-1.example"),
])
def test_slot_map_reaches_a_node_without_a_usable_endpoint_where_the_reference_says(
        host: Any, meta: Any, reached_at: str) -> None:
    def entry(port: int) -> list[Any]:
        return [host, port, b"id", *([meta] if meta is not None else [])]

    m = SlotMap.parse([[0, 16383, entry(7001), entry(7004)]], "10.0.0.9")
    assert m.masters == [(reached_at, 7001)]
    assert m.replicas[(reached_at, 7001)] == [(reached_at, 7004)]


def test_slot_map_leaves_a_range_uncovered_when_its_master_names_no_host() -> None:
    m = SlotMap.parse([[0, 8191, [b"?", 7001, b"a"]], [8192, 16383, [b"h2", 7002, b"b"]]], "h1")
    assert m.masters == [("h2", 7002)]
    low = next(k for k in (f"k{i}" for i in range(1000)) if key_slot(k.encode()) < 8192)
    with pytest.raises(redis.exceptions.ClusterDownError, match=low):
        m.node_for(("GET", low))


def test_slot_map_remaps_every_advertised_address() -> None:
    outside = {("10.0.0.1", 6379): ("127.0.0.1", 7001), ("10.0.0.2", 6379): ("127.0.0.1", 7002)}
    m = SlotMap.parse([[0, 16383, [b"10.0.0.1", 6379, b"a"], [b"10.0.0.2", 6379, b"b"]]],
                      "127.0.0.1", lambda a: outside.get(a, a))
    assert m.masters == [("127.0.0.1", 7001)]
    assert m.replicas[("127.0.0.1", 7001)] == [("127.0.0.1", 7002)]


def test_an_ask_without_a_host_goes_to_the_host_that_answered_then_is_remapped() -> None:
    """Nodes with unknown endpoints answer "ASK <slot> :<port>", as CLUSTER SLOTS names them
    NULL: the host is the one of the node that sent the ASK."""
    rc = ClusterRedis([("h1", 7001)], lambda h, p: None)
    assert rc._redirect(AskError("3999 :7002"), ("h1", 7001)) == ("h1", 7002)
    assert rc._redirect(AskError("3999 h3:7003"), ("h1", 7001)) == ("h3", 7003)
    rc = ClusterRedis([("h1", 7001)], lambda h, p: None, remap=lambda a: ("nat", a[1] + 100))
    assert rc._redirect(AskError("3999 :7002"), ("h1", 7001)) == ("nat", 7102)


def _per_master(n: int, masters: int) -> list[int]:
    edges = [(keys.SLOTS * j) // masters for j in range(1, masters)]
    counts = [0] * masters
    for p in range(n):
        counts[sum(key_slot(keys.due(p).encode()) >= e for e in edges)] += 1
    return counts


def test_partitions_spread_evenly_over_an_evenly_sliced_cluster() -> None:
    assert _per_master(16, 3) == [6, 5, 5]
    assert _per_master(64, 3) == [22, 21, 21]
    assert _per_master(16, 4) == [4, 4, 4, 4]
    assert _per_master(64, 8) == [8] * 8
    for p in range(64):  # every key of a partition shares its slot
        slots = {key_slot(k.encode()) for k in (keys.due(p), keys.lease(p), keys.job(p, "x"),
                                                 keys.stream(p, "q"), keys.events(p))}
        assert slots == {keys.slot(keys.due(p))}


@pytest.mark.parametrize(("url", "kind", "nodes", "extra"), [
    ("redis://h:1/0", "single", (), {}),
    ("redis+cluster://h1:7001,h2:7002", "cluster", (("h1", 7001), ("h2", 7002)), {}),
    ("rediss+cluster://u:p%40ss@h1:7001/?socket_timeout=5", "cluster", (("h1", 7001),),
     {"tls": True, "username": "u", "password": "p@ss", "options": {"socket_timeout": "5"}}),
    ("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/2", "sentinel",
     (("s1", 26379), ("s2", 26380)), {"service": "mymaster", "db": 2, "password": "pw"}),
])
def test_redis_urls_parse(url: str, kind: str, nodes: tuple[Any, ...],
                          extra: dict[str, Any]) -> None:
    t = parse(url)
    assert (t.kind, t.nodes) == (kind, nodes)
    for k, v in extra.items():
        assert getattr(t, k) == v


def test_address_remap_pairs_parse_from_a_cluster_url_and_stay_out_of_the_node_urls() -> None:
    t = parse("redis+cluster://h1:7001?socket_timeout=5&address_remap="
              "10.0.0.1:6379=h1:7001,[fd00::2]:6379=h1:7002")
    assert t.remap == {("10.0.0.1", 6379): ("h1", 7001), ("fd00::2", 6379): ("h1", 7002)}
    assert t.node_url("h1", 7001) == "redis://h1:7001/0?socket_timeout=5"


@pytest.mark.parametrize(("url", "says"), [
    ("redis+cluster://h1:7001?address_remap=10.0.0.1:6379", "'10.0.0.1:6379' is not host:port"),
    ("redis+cluster://h1:7001?address_remap=a:1=b", "'a:1=b' is not host:port=host:port"),
    ("redis://h1:6379/0?address_remap=a:1=b:2", "redis+cluster:// and rediss+cluster://"),
    ("redis+sentinel://s1:26379/m?address_remap=a:1=b:2", "URLs only"),
])
def test_a_bad_or_misplaced_address_remap_is_refused_naming_it(url: str, says: str) -> None:
    with pytest.raises(BadRedisUrl, match=f"address_remap.*{re.escape(says)}"):
        parse(url)
    with pytest.raises(BadRedisUrl, match="address_remap applies to"):
        connect("redis://h1:6379/0", address_remap=lambda a: a)


@pytest.mark.parametrize(("url", "says"), [
    ("http://h:1", "scheme must be one of"),
    ("redis+cluster://", "at least one host:port"),
    ("redis+cluster://h1:x", "'h1:x' is not host:port"),
    ("redis+cluster://h1:7001/3", "only database 0"),
    ("redis+sentinel://s1:26379", "name the Sentinel service"),
    ("redis+sentinel://:secret@s1:26379/a/b/c", "/<service>[/<db>]"),
])
def test_bad_redis_urls_are_refused_with_the_reason(url: str, says: str) -> None:
    with pytest.raises(BadRedisUrl, match=says.replace("[", r"\[").replace("]", r"\]")) as e:
        parse(url)
    assert "secret" not in str(e.value)


def node(node_id: str, flags: str, master_id: str = "-", slots: bool = False) -> dict[str, Any]:
    return {"node_id": node_id, "flags": flags, "master_id": master_id,
            "slots": [["0", "100"]] if slots else []}


@pytest.mark.parametrize(("nodes", "counts"), [
    ({"a:1": node("A", "myself,master", slots=True), "b:1": node("B", "slave", "A"),
      "c:1": node("C", "master", slots=True)}, {"a:1": 1, "c:1": 0}),
    # a failed replica is still its master's; a master without slots (failed over) is none
    ({"a:1": node("A", "master", slots=True), "b:1": node("B", "slave,fail", "A"),
      "c:1": node("C", "master,fail")}, {"a:1": 1}),
])
def test_cluster_nodes_give_each_masters_replicas(nodes: dict[str, Any],
                                                  counts: dict[str, int]) -> None:
    assert cluster_replicas(nodes) == counts


@pytest.mark.parametrize(("wanted", "replicas", "refused"), [
    (0, {"a": 0}, False), (1, {"a": 1}, False), (1, {"a": 0}, True), (2, {"a": 1}, True),
    (1, {"a": 0, "b": 1, "c": 1}, False),  # one master just failed over: doctor's, not a refusal
    (1, {"a": 0, "b": 0, "c": 0}, True),
])
def test_writes_waiting_for_more_replicas_than_any_master_has_are_refused(
        wanted: int, replicas: dict[str, int], refused: bool) -> None:
    why = replicas_short(wanted, replicas)
    assert (why is not None) == refused
    most = max(replicas.values())
    assert why is None or f"or set RSCHED_WAIT_REPLICAS={most}" in why


# --- a real cluster ------------------------------------------------------------------------


NO_WAIT = {"wait_replicas": 0}  # the test cluster has no replicas to confirm writes


def cluster_url(c: RedisCluster) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in c.nodes[:2])


@pytest.fixture()
def url(cluster: RedisCluster) -> str:
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            r.flushall()
            r.script_flush()
    return cluster_url(cluster)


def test_a_plain_url_at_a_cluster_node_is_refused_naming_the_scheme(url: str,
                                                                     cluster: RedisCluster) -> None:
    with redis.Redis.from_url(cluster.nodes[0].url) as r, \
            pytest.raises(UnsafeRedis, match=r"redis\+cluster://"):
        check_redis(r)
    with connect(url, wait=0) as rc:
        check_redis(rc)  # the cluster URL passes


def test_a_cluster_without_replicas_is_refused_while_writes_wait_for_one(url: str) -> None:
    """Each write would be applied and reported as failed (WAIT 1 on a master without
    replicas): refused at the start, naming the setting that accepts it."""
    with connect(url) as rc, pytest.raises(UnsafeRedis, match="RSCHED_WAIT_REPLICAS=0"):
        check_redis(rc)


def test_a_cluster_client_is_built_while_the_cluster_is_away_and_fails_only_when_used() -> None:
    """A daemon builds its client before its start-up loop waits for Redis."""
    with connect(f"redis+cluster://127.0.0.1:{free_port()}") as rc:
        with pytest.raises(redis.exceptions.ConnectionError, match="no node of the cluster"):
            rc.get("k")


def test_a_pipeline_over_every_master_returns_each_reply_in_place(url: str) -> None:
    with connect(url) as rc:
        assert isinstance(rc, ClusterRedis)
        rc.ready()
        assert len(rc.slots.masters) == 3
        names = [f"k{i}" for i in range(300)]
        pipe: Any = rc.pipeline()
        for i, n in enumerate(names):
            pipe.set(n, i)
        assert pipe.execute() == [True] * 300
        pipe = rc.pipeline()
        for n in names:
            pipe.get(n)
        pipe.time()
        *vals, now = pipe.execute()
        assert vals == [str(i).encode() for i in range(300)]
        assert abs(now[0] - time.time()) < 5
        assert len(same_slot_groups(rc, [keys.due(p) for p in range(16)])) == 16


def test_one_node_failing_fails_only_its_commands(url: str, cluster: RedisCluster) -> None:
    with connect(url, socket_timeout=2, socket_connect_timeout=1) as rc:
        rc.ready()
        dead = cluster.nodes[2]
        dead_addr = ("127.0.0.1", dead.port)
        names = [f"k{i}" for i in range(60)]
        on_dead = [n for n in names if rc.slots.node_for(("GET", n)) == dead_addr]
        assert 0 < len(on_dead) < len(names)
        dead.pause()
        try:
            t0 = time.monotonic()
            pipe = rc.pipeline()
            for n in names:
                pipe.set(n, "v")
            res = pipe.execute(raise_on_error=False)
            took = time.monotonic() - t0
        finally:
            dead.resume()
        failed = [n for n, r in zip(names, res, strict=True) if isinstance(r, Exception)]
        assert failed == on_dead
        assert all(r is True for n, r in zip(names, res, strict=True) if n not in on_dead)
        # The healthy masters' parts do not wait for the frozen one beyond its timeouts.
        assert took < 20, took


def test_the_engine_runs_every_job_once_with_every_partition_served(url: str) -> None:
    ran: list[str] = []
    app = App("cluster")

    @app.job("t")
    async def t(ctx: JobContext) -> None:
        ran.append(ctx.run_id)

    with Client(settings=Settings(redis_url=url, wait_replicas=0)) as c:
        now = c.now_ms()
        specs = [JobSpec(type="t", run_at=now, idempotency_key=k)
                 for p in range(16) for k in keys_in_partition(p, 5, f"p{p}")]
        jobs = c.schedule_many([*specs, *(JobSpec(type="t", run_at=now) for _ in range(320))])
        assert all(isinstance(j, Job) for j in jobs)
        parts = {int(j.id.split("-")[0]) for j in jobs if isinstance(j, Job)}
        assert parts == set(range(16))
        asyncio.run(run_engine(url, app, lambda: len(ran) >= 400, timeout_s=30,
                               settings_kw=NO_WAIT))
        assert len(ran) == len(set(ran)) == 400


def test_retries_dead_letters_replay_pause_cancel_and_idempotency(url: str) -> None:
    calls: list[tuple[str, int]] = []
    app = App("cluster")

    @app.job("bad")
    async def bad(ctx: JobContext) -> None:
        calls.append((ctx.run_id, ctx.attempt))
        if ctx.payload.get("fail"):
            raise RuntimeError("on purpose")

    with Client(settings=Settings(redis_url=url, wait_replicas=0)) as c:
        now = c.now_ms()
        failing = [c.schedule("bad", {"fail": True}, run_at=now, max_attempts=2,
                              backoff_base_ms=50, backoff_cap_ms=50) for _ in range(6)]
        same = c.schedule("bad", {}, run_at=now + 60_000, idempotency_key="once")
        again = c.schedule("bad", {}, run_at=now + 60_000, idempotency_key="once")
        assert same.id == again.id
        assert c.pause(same.id).status.value == "paused"
        assert c.cancel(same.id).status.value == "cancelled"

        def dead() -> bool:
            return len(c.dead_letters()) >= 6

        asyncio.run(run_engine(url, app, dead, timeout_s=30, settings_kw=NO_WAIT))
        assert sorted(a for _, a in calls) == [1] * 6 + [2] * 6
        letters = c.dead_letters()
        assert {r.job_id for r in letters} == {j.id for j in failing}
        replayed = c.replay(letters[0].id)
        n = len(calls)
        asyncio.run(run_engine(url, app, lambda: len(calls) > n, timeout_s=20, settings_kw=NO_WAIT))
        assert calls[-1][0] == replayed.id


def test_listing_jobs_walks_every_master_across_pages(url: str) -> None:
    with Client(settings=Settings(redis_url=url, wait_replicas=0)) as c:
        now = c.now_ms()
        jobs = c.schedule_many([JobSpec(type="t", run_at=now + 3_600_000) for _ in range(50)])
        want = {j.id for j in jobs if isinstance(j, Job)}
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = c.run(op_list_jobs(limit=7, cursor=cursor))
            seen += [j.id for j in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert sorted(seen) == sorted(want)


def doctor_rows(url: str, **env: str) -> tuple[int, dict[str, dict[str, str]]]:
    done = subprocess.run([sys.executable, "-m", "rsched.cli", "doctor", "--json"],
                          env={**os.environ, "RSCHED_REDIS_URL": url, **env},
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, {r["check"]: r for r in json.loads(done.stdout)}


def test_doctor_calls_masters_without_the_replicas_writes_wait_for_an_error(url: str) -> None:
    code, rows = doctor_rows(url)
    failed = {k: r["message"] for k, r in rows.items() if r["level"] == "fail"}
    assert code == 1
    assert len(failed) == 3
    assert all(k.endswith(" replicas") and "RSCHED_WAIT_REPLICAS=0" in m
               for k, m in failed.items()), failed


def test_doctor_checks_every_master_and_shows_where_the_partitions_live(url: str) -> None:
    code, rows = doctor_rows(url, RSCHED_WAIT_REPLICAS="0")
    assert code == 0, [r for r in rows.values() if r["level"] == "fail"]
    assert rows["cluster_state"]["level"] == "ok"
    assert rows["slots"]["message"].startswith("16384 of 16384")
    placed = {k: v for k, v in rows.items() if k.endswith(" partitions")}
    assert len(placed) == 3
    assert sorted(int(r["message"].split()[0]) for r in placed.values()) == [5, 5, 6]
    assert all(r["level"] == "ok" for r in placed.values())
    assert all(rows[k.replace("partitions", "replicas")]["level"] == "warn" for k in placed)
    assert all(rows[k.replace("partitions", "maxmemory-policy")]["level"] == "ok"
               for k in placed)
    # The test cluster keeps Redis's default, which stalls every master while one is down.
    assert all(rows[k.replace("partitions", "cluster-require-full-coverage")]["level"] == "warn"
               for k in placed)


def test_the_api_serves_a_cluster_status_jobs_and_dead_letters(url: str) -> None:
    s = Settings(redis_url=url, wait_replicas=0)
    with TestClient(create_app(s, auth=False)) as api:
        made = [api.post("/jobs", json={"type": "t", "runAt": "2099-01-01T00:00:00Z"})
                for _ in range(30)]
        assert {r.status_code for r in made} == {201}
        ids: set[str] = set()
        cursor = ""
        while True:
            page = api.get("/jobs", params={"limit": 4, **({"cursor": cursor} if cursor else {})})
            assert page.status_code == 200, page.text
            ids |= {j["id"] for j in page.json()["jobs"]}
            cursor = page.json().get("nextCursor") or ""
            if not cursor:
                break
        assert ids == {r.json()["id"] for r in made}
        for path in ("/status", "/metrics", "/dead-letters", "/readyz"):
            assert api.get(path).status_code == 200, path


def test_a_fence_reissued_after_a_failover_does_not_let_its_former_owner_write(url: str) -> None:
    """A failover can roll a partition's lease back past a renewal, so another dispatcher can
    be issued the same fence number: every check compares the owner too."""
    async def go() -> None:
        async with Rig(url, dispatcher_id="d-a",
                       settings_overrides={"wait_replicas": 0}) as rig:
            await rig.lease()
            assert rig.dispatcher.leases is not None
            fence = rig.dispatcher.leases.owned[0]
            with Client(settings=Settings(redis_url=url, wait_replicas=0)) as c:
                [job] = overdue(c, [JobSpec("t", run_at=c.now_ms(),
                                            idempotency_key=keys_in_partition(0, 1)[0])])
                c.r.hset(keys.lease(0), mapping={"owner": "d-b", "fence": fence,
                                                 "expires_ms": c.now_ms() + 60_000})
                res = await rig.claim(renew=False)
                assert 0 in res.lost
                assert c.get(job.id).status.value == "scheduled"  # not dispatched by d-a

    asyncio.run(go())


def test_a_keyless_command_routed_by_a_key_goes_to_that_keys_master() -> None:
    reply = [[0, 5460, [b"127.0.0.1", 7000]], [5461, 10922, [b"127.0.0.1", 7001]],
             [10923, 16383, [b"127.0.0.1", 7002]]]
    m = SlotMap.parse(reply)
    for p in range(16):
        key = keys.due(p)
        assert m.node_for(("TIME",), {ROUTE_BY: key}) == m.node_for(("ZCARD", key))
    assert m.node_for(("TIME",)) == ("127.0.0.1", 7000)  # unrouted: the first master
    assert sendable({ROUTE_BY: "k", "x": 1}) == {"x": 1}


def test_the_claimer_judges_each_partition_by_its_own_masters_time(
    url: str, cluster: RedisCluster
) -> None:
    """One TIME per master in each round, each in that master's part of the pipeline: a
    partition's due entries and cron catch-up are decided by the clock its claim script reads
    (docs/redis.md, "Time per node")."""
    def time_calls() -> dict[int, int]:
        out = {}
        for node in cluster.masters():
            stats = command(node.port, "INFO", "commandstats")
            out[node.port] = int(stats.get("cmdstat_time", {}).get("calls", 0))
        return out

    async def go() -> tuple[dict[int, int], Any]:
        r = connect_async(url)
        try:
            claimer = Claimer(r, owner="clock-test")
            await claimer.run_once({p: 1 for p in range(16)})  # reads the slot map
            for node in cluster.masters():
                command(node.port, "CONFIG", "RESETSTAT")
            res = await claimer.run_once({p: 1 for p in range(16)})
            return time_calls(), res
        finally:
            await r.aclose()

    calls, res = asyncio.run(go())
    assert calls == dict.fromkeys(calls, 1), calls  # every master asked once, none skipped
    assert res.now_ms is not None and abs(res.now_ms - time.time() * 1000) < 5000
    with connect(url) as rc:
        rc.ready()
        names = [keys.due(p) for p in range(16)]
        routes, index = clock_routes(rc, names)
        assert len(routes) == 3
        for name, i in zip(names, index, strict=True):
            route = routes[i]
            assert route is not None
            assert rc.slots.node_for(("ZCARD", route)) == rc.slots.node_for(("ZCARD", name))


def test_a_pipeline_follows_ask_during_a_real_slot_migration(url: str, cluster: RedisCluster
                                                             ) -> None:
    """Mid-migration (source MIGRATING, target IMPORTING, one key already MIGRATEd) the source
    answers ASK for keys it no longer has: each such command goes, once, with ASKING to the
    target; the slot map is not changed, and commands on other slots are unaffected."""
    moved, stays, new = "{ask}moved", "{ask}stays", "{ask}new"
    slot = key_slot(moved.encode())
    source = cluster.master_of_slot(slot)
    target = next(n for n in cluster.masters() if n is not source)
    src_id, dst_id = (command(n.port, "CLUSTER", "MYID") for n in (source, target))
    other = next(f"other{i}" for i in range(100)
                 if cluster.master_of_slot(key_slot(f"other{i}".encode())) is not source)
    with redis.Redis(port=source.port) as r:
        r.mset({moved: "m", stays: "s"})
    command(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    command(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    try:
        command(source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", moved)
        for make in (connect, connect_async):
            rc = make(url)
            pipe: Any = rc.pipeline()
            pipe.get(moved)
            pipe.get(stays)
            pipe.set(new, "n")
            pipe.set(other, "o")
            pipe.get(new)
            if make is connect:
                res, one = pipe.execute(), rc.get(moved)
                rc.close()
            else:
                async def go(rc: Any = rc, pipe: Any = pipe) -> tuple[list[Any], Any]:
                    try:
                        return await pipe.execute(), await rc.get(moved)
                    finally:
                        await rc.aclose()
                res, one = asyncio.run(go())
            assert res == [b"m", b"s", True, True, b"n"], make
            assert one == b"m"
        with proxies_for(n.port for n in cluster.nodes) as proxies:
            seen: list[tuple[str, int]] = []

            def remap(a: tuple[str, int]) -> tuple[str, int]:
                seen.append(a)
                return ("127.0.0.1", proxies[a[1]].port)

            with connect(f"redis+cluster://127.0.0.1:{proxies[source.port].port}",
                         address_remap=remap) as rc:
                rc.ready()
                seen.clear()
                assert (rc.get(moved), rc.pipeline().get(moved).get(stays).execute()) == (
                    b"m", [b"m", b"s"])
                assert seen == [("127.0.0.1", target.port)] * 2  # the ASK's target, remapped
        with redis.Redis(port=target.port) as r:
            pipe = r.pipeline(transaction=False)
            pipe.execute_command("ASKING")
            pipe.get(new)
            assert pipe.execute() == [True, b"n"]  # written where the slot is going
    finally:
        with redis.Redis(port=target.port) as r:
            for k in (moved, new):
                pipe = r.pipeline(transaction=False)
                pipe.execute_command("ASKING")
                pipe.delete(k)
                pipe.execute()
        for node in (source, target):
            command(node.port, "CLUSTER", "SETSLOT", slot, "STABLE")
        with redis.Redis(port=source.port) as r:
            r.delete(stays)


def test_moved_refreshes_the_slot_map_instead_of_being_followed_like_ask(url: str) -> None:
    """redis-py's MovedError subclasses AskError: a MOVED reply must refresh the slot map (the
    slot has a new owner for good), not be followed with ASKING call after call."""
    with connect(url) as rc:
        rc.ready()
        true_map = rc.slots
        one = true_map.masters[0]
        for call in ("pipeline", "command"):
            stale = SlotMap(owner=[one] * len(true_map.owner), masters=[one],
                            replicas={one: []})
            rc.slots = stale
            time.sleep(0.15)  # past REFRESH_MIN_INTERVAL_S since the last refresh
            names = [f"moved{i}" for i in range(30)]
            if call == "pipeline":
                pipe: Any = rc.pipeline()
                for n in names:
                    pipe.set(n, n)
                assert pipe.execute() == [True] * 30
            else:
                other = next(n for n in names if true_map.node_for(("GET", n)) != one)
                assert rc.set(other, "x") is True
            assert rc.slots is not stale and len(rc.slots.masters) == 3, call


@pytest.mark.parametrize("endpoint_type", ["unknown-endpoint", "hostname"])
def test_the_router_reaches_masters_that_advertise_no_usable_host(url: str, cluster: RedisCluster,
                                                                   endpoint_type: str) -> None:
    """unknown-endpoint: CLUSTER SLOTS names each node NULL (reach it where you asked);
    hostname with none announced: "?" (reach it at the IP in its metadata)."""
    for node in cluster.nodes:
        command(node.port, "CONFIG", "SET", "cluster-preferred-endpoint-type", endpoint_type)
    try:
        with connect(url) as rc:
            rc.ready()
            assert sorted(rc.slots.masters) == sorted(("127.0.0.1", n.port)
                                                      for n in cluster.nodes)
            pipe: Any = rc.pipeline()
            for i in range(30):
                pipe.set(f"k{i}", i)
            assert pipe.execute() == [True] * 30
    finally:
        for node in cluster.nodes:
            command(node.port, "CONFIG", "SET", "cluster-preferred-endpoint-type", "ip")


def test_address_remap_connects_to_every_master_where_the_mapping_says(
        url: str, cluster: RedisCluster) -> None:
    """The nodes advertise their own ports; the client reaches each only through a proxy of
    its own (as behind NAT), by the URL's pairs or a function given to connect_async."""
    with proxies_for(n.port for n in cluster.nodes) as proxies:
        outside = {("127.0.0.1", port): ("127.0.0.1", p.port) for port, p in proxies.items()}
        pairs = ",".join(f"127.0.0.1:{a[1]}=127.0.0.1:{b[1]}" for a, b in outside.items())
        seed = f"redis+cluster://127.0.0.1:{proxies[cluster.nodes[0].port].port}"
        names = [f"k{i}" for i in range(30)]

        with connect(f"{seed}?address_remap={pairs}") as rc:
            pipe: Any = rc.pipeline()
            for n in names:
                pipe.set(n, n)
            assert pipe.execute() == [True] * 30
            assert sorted(rc.slots.masters) == sorted(outside.values())
        assert all(p.accepted >= 1 for p in proxies.values())

        async def go() -> list[Any]:
            rc = connect_async(seed, address_remap=lambda a: outside.get(a, a))
            try:
                pipe: Any = rc.pipeline()
                for n in names:
                    pipe.get(n)
                return list(await pipe.execute())
            finally:
                await rc.aclose()

        accepted = {port: p.accepted for port, p in proxies.items()}
        assert asyncio.run(go()) == [n.encode() for n in names]
        assert all(p.accepted > accepted[port] for port, p in proxies.items())
