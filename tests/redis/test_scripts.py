"""The Lua scripts: key discipline (cluster-safe), headers, and surviving a Redis restart.

Key discipline is checked three ways: statically on the source; at run time by watching every
command each shipped script runs (MONITOR) and asking Redis which of its arguments are keys
(COMMAND GETKEYS), each of which must be among the script's KEYS; and on a real 3-master Redis
Cluster, which rejects any access to a key of another slot.  The last two run one scenario that
calls every script through the real client, lease keeper, claimer and workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterable
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio.cluster as aiocluster
from redis.exceptions import ResponseError
from support.helpers import (
    PARTITIONS,
    ManualClock,
    Monitor,
    MonitoredCommand,
    Rig,
    all_jobs,
    aredis,
    keys_in_partition,
    redis_now_ms,
    settings,
)
from support.redis_server import RedisCluster, RedisServer

from rsched import App, Client, JobContext, JobSpec, JobStatus, RunState
from rsched.client import JobPatch
from rsched.core import codes, layout
from rsched.core.layout import OWN, J
from rsched.core.settings import Settings
from rsched.engine.dispatcher import LeaseKeeper
from rsched.engine.dispatcher.claimer import Claimer
from rsched.engine.worker.worker import Worker
from rsched.rdb import keys, scripts
from rsched.service.dead_letters import op_delete

LUA = Path(__file__).resolve().parents[2] / "lua"
SOURCES = sorted(LUA.glob("*.lua")) + sorted((LUA / "include").glob("*.lua"))
SCRIPT_FILES = sorted(LUA.glob("*.lua"))


# --- static checks -----------------------------------------------------------------------------

CALL = re.compile(r"redis\.call\(\s*'(\w+)'\s*,\s*([^,)]+)(?:,\s*([^,)]+))?")
KEY_ARG = re.compile(r"^(KEYS\[[^\]]+\]|\w*key|unpack\(KEYS)$")  # unpack(KEYS, i, j): a slice
SUBCOMMANDS = {"XINFO"}  # the key follows the subcommand
KEYLESS = {"TIME"}
STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
KEY_FRAGMENT = re.compile(r"rsched|\{p|\b(?:job|run|hist|q|lease|due|retry|dead|stats|events):")
KEY_ASSIGN = re.compile(r"^\s*(?:local\s+)?((?:\w+_key\s*,\s*)*\w+_key)\s*=\s*(.+)$", re.M)
STRING_FN_ON_KEY = re.compile(r"string\.\w+\(\s*\w+_key\b")
# The queue's name, read off a queue stream's key (claim.lua: where a queue's runs go;
# complete.lua: the queue of the runs that came from it).
DOCUMENTED_PARSE = ({"claim.lua", "complete.lua"}, "string.match(stream_key, ':q:(.*)$')")


def code_of(path: Path) -> str:
    """The source without comments (a header may name key patterns; code must not)."""
    text = re.sub(r"--\[\[.*?\]\]", "", path.read_text(), flags=re.S)
    return re.sub(r"--[^\n]*", "", text)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_a_script_uses_only_keys_it_was_given_never_names_it_built(path: Path) -> None:
    code = code_of(path)
    for m in CALL.finditer(code):
        command, first, second = m.group(1), m.group(2).strip(), (m.group(3) or "").strip()
        if command in KEYLESS:
            continue
        key = second if command in SUBCOMMANDS else first
        assert KEY_ARG.match(key), f"{path.name}: {command} on {key!r}, not a KEYS entry"
    for m in KEY_ASSIGN.finditer(code):
        for rhs in m.group(2).split(","):
            assert re.fullmatch(r"\s*KEYS\[[^\]]+\]\s*", rhs), (
                f"{path.name}: {m.group(1)} assigned from {m.group(2)!r}, not from KEYS"
            )
    for literal in STRING.findall(code):
        if path.name in DOCUMENTED_PARSE[0] and literal == "':q:(.*)$'":
            continue
        assert not KEY_FRAGMENT.search(literal), f"{path.name}: key-like literal {literal}"
    for m in STRING_FN_ON_KEY.finditer(code):
        assert path.name in DOCUMENTED_PARSE[0], f"{path.name}: parses a key: {m[0]}"
        assert code.startswith(DOCUMENTED_PARSE[1], m.start()), f"{path.name}: parses {m[0]}"


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=lambda p: p.name)
def test_every_script_header_documents_its_keys_arguments_and_returns(path: Path) -> None:
    header = path.read_text().split("]]", 1)[0]
    assert header.startswith("--[[ " + path.stem + ":")
    for word in ("KEYS[", "ARGV[1]", "Returns"):
        assert word in header, f"{path.name}: header does not document {word}"
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", code_of(path))}
    documented = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", header)}
    assert used <= documented, f"{path.name}: KEYS{sorted(used - documented)} undocumented"


@pytest.mark.parametrize("name", scripts.NAMES)
def test_a_loaded_script_names_job_hash_fields_only_as_literals(name: str) -> None:
    """J.<name> and OWN.<name> are written as their stored names at load (core.layout.literals):
    no J or OWN table is built, so nothing may be left to index it another way."""
    source = scripts.load(name).source
    code = re.sub(r"--[^\n]*", "", re.sub(r"--\[\[.*?\]\]", "", source, flags=re.S))
    assert not re.search(r"(?<![\w.])(?:J|OWN)\b", code), f"{name}: J or OWN used as a table"


def test_a_name_missing_from_the_layout_is_an_error_at_load() -> None:
    written = layout.literals("local a = J.own_run .. OWN.state")
    assert written == f"local a = '{J.own_run}' .. '{OWN.state}'"
    with pytest.raises(ValueError, match="J.no_such"):
        layout.literals("return J.no_such")


SCRIPT_CODES: dict[str, type[IntEnum]] = {
    "schedule": codes.ScheduleCode, "claim": codes.ClaimCode, "lease": codes.LeaseCode,
    "start": codes.StartFence, "heartbeat": codes.HeartbeatCode, "complete": codes.CompleteCode,
    "pause": codes.ControlCode, "resume": codes.ControlCode, "cancel": codes.ControlCode,
    "trigger": codes.ControlCode, "replay": codes.ControlCode, "update": codes.ControlCode,
    "delete_dead": codes.DeleteDeadCode, "expire": codes.ExpireCode,
    "backfill": codes.BackfillCode,
}


@pytest.mark.parametrize("name", sorted(SCRIPT_CODES))
def test_every_return_code_a_header_documents_is_mirrored_by_its_intenum(name: str) -> None:
    """Each code in the header's Returns section is a member of the script's IntEnum, and each
    negative member (a refusal a caller must handle) is documented by every script it covers."""
    header = (LUA / f"{name}.lua").read_text().split("]]", 1)[0]
    returns = header.split("Returns", 1)[1]
    documented = {int(n) for n in re.findall(r"(?<![\w.\[])-?\d+(?![\w.\]])", returns)}
    members = {int(m) for m in SCRIPT_CODES[name]}
    assert {n for n in documented if n < 0} <= members, name
    negatives = {m for m in members if m < 0}
    if name != "update":
        negatives.discard(int(codes.ControlCode.CHANGED))
    if name in ("trigger", "replay", "backfill"):
        negatives.discard(int(codes.ControlCode.VERSION))
    assert negatives <= documented, name


def test_every_script_file_is_known_to_the_loader() -> None:
    assert {p.stem for p in SCRIPT_FILES} == set(scripts.NAMES)


# --- run time: one scenario calling every script -------------------------------------------------

# Two partitions whose slots (p0: 14, p3: 12302, see keys.tag) fall to different masters of a
# 3-master cluster: Redis 7.0 rejects a script's access to a key on another node, not yet to another
# slot of the same node, so only a cross-node layout makes the cluster test able to fail.
PA, PB = 0, 3


def scenario_app() -> tuple[App, asyncio.Event]:
    app, gate = App("scenario"), asyncio.Event()

    @app.job("ok")
    async def ok(ctx: JobContext) -> str:
        return "ok"

    @app.job("bad")
    async def bad(ctx: JobContext) -> None:
        raise RuntimeError(f"bad attempt {ctx.attempt}")

    @app.job("tick")
    def tick(ctx: JobContext) -> int:
        return ctx.scheduled_ms

    @app.job("long")
    async def long(ctx: JobContext) -> str:
        await gate.wait()
        return ctx.worker_id

    return app, gate


async def scenario_worker(
    app: App, s: Settings, ar: Any, worker_id: str, parts: tuple[int, ...], **kw: Any
) -> Worker:
    """A worker on some partitions, through the given (maybe cluster) client: one XREADGROUP
    may not span slots on a cluster, so each fetching worker reads a single partition."""
    w = Worker(app, s, worker_id=worker_id, **kw)
    await w.link.r.aclose()  # every part talks through the link: replace its client there
    w.link.r = ar
    w.link.streams = {keys.stream(p, "default"): (p, "default") for p in parts}
    for stream in w.link.streams:
        try:
            await ar.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
        except ResponseError as e:
            assert "BUSYGROUP" in str(e)
    return w


async def until_done(w: Worker, n: int) -> None:
    for _ in range(500):
        if len(w.reporter.done) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{w.id}: {len(w.reporter.done)} of {n} runs finished")


async def exercise_every_script(client: Client, ar: Any, clock: ManualClock) -> None:
    """Schedule, lease, claim, start, heartbeat, complete (success, retry, dead letter, fenced),
    reclaim, a run set aside by a worker without its handler and taken by one with it (park),
    replay, delete_dead, trigger, update, pause, resume, cancel and release, on two
    partitions."""
    app, gate = scenario_app()
    s = client.settings
    ka, kb = keys_in_partition(PA, 3, "a"), keys_in_partition(PB, 2, "b")
    now = client.now_ms()
    jobs = all_jobs(client.schedule_many([
        JobSpec("ok", run_at=now - 1, idempotency_key=ka[0], start_deadline_ms=600_000),
        JobSpec("bad", run_at=now - 1, idempotency_key=ka[1], max_attempts=2, backoff_base_ms=0),
        # Due by the claim's clock only (ok and bad, due now, go straight to their queue)
        JobSpec("long", run_at=now + 60_000, idempotency_key=kb[0], max_attempts=3),
        JobSpec("tick", cron="* * * * *", idempotency_key=kb[1]),
    ]))
    ok, bad, long, tick = jobs
    assert tick.next_ms is not None and long.next_ms is not None
    clock.ms = long.next_ms  # tick's next occurrence is due, only that one
    leases = LeaseKeeper(ar, "d1", PARTITIONS, 10_000, clock)
    claimer = Claimer(ar, "d1", clock=clock)
    wa = await scenario_worker(app, s, ar, "wa", (PA,))
    wb = await scenario_worker(app, s, ar, "wb", (PB,))
    w2 = await scenario_worker(app, s, ar, "w2", (PA, PB), visibility_ms=0, heartbeat_ms=0)
    wx = await scenario_worker(App("bare"), s, ar, "wx", (PA,))  # no handlers at all
    try:
        owned = await leases.run_once()
        assert len(owned) == PARTITIONS
        assert (await claimer.run_once(owned)).dispatched == 2  # long, tick
        assert await wa.fetch_once(block_ms=1) == 2  # ok, bad
        assert await wb.fetch_once(block_ms=1) == 2  # long, tick
        await until_done(wa, 2)
        await until_done(wb, 1)
        assert await wa.flush_once() + await wb.flush_once() == 3
        assert await wb.heartbeat_once() == 0

        (aside,) = all_jobs(client.schedule_many([
            JobSpec("ok", run_at=client.now_ms() - 1, idempotency_key=ka[2])]))
        assert await wx.fetch_once(block_ms=1) == 0  # read, and set aside: not for wx
        await wx.handback.settle()
        assert await wa.adopt_once() == 1
        await until_done(wa, 1)
        assert await wa.flush_once() == 1

        assert (await claimer.run_once(owned)).dispatched == 1  # bad's retry
        assert await wa.fetch_once(block_ms=1) == 1
        await until_done(wa, 1)
        await wa.flush_once()  # bad dead-lettered
        assert await w2.reclaim_once() == 1  # long, idle longer than w2's 0 ms visibility
        gate.set()
        await until_done(wb, 1)
        await until_done(w2, 1)
        await wb.flush_once()  # fenced: w2 owns the run now
        await w2.flush_once()

        bad_run = f"{bad.id}@{bad.next_ms}"
        assert client.get_run(bad_run).state is RunState.DEAD
        client.replay(bad_run)
        assert client.run(op_delete(client, [bad_run], "test")) == [False]  # replayed: kept
        client.trigger(tick.id)
        created = client.get(tick.id).created_ms
        assert len(client.backfill(tick.id, created - 180_000, created).queued) >= 2
        client.update(tick.id, JobPatch(priority=5))
        client.pause(tick.id)
        client.resume(tick.id)
        client.cancel(tick.id)
        clock.ms = max(clock(), client.now_ms() + 1)
        claimed = await claimer.run_once(await leases.run_once())
        assert claimed.dispatched == 1  # the replay; the trigger's and backfill's runs are
        # abandoned (cancelled)
        await leases.release_all()
    finally:
        for w in (wa, wb, w2, wx):  # each closes the shared client too: the scenario is over
            await w.close(wait_s=1)

    assert client.get_run(f"{ok.id}@{ok.next_ms}").result == "ok"
    aside_run = client.get_run(f"{aside.id}@{aside.next_ms}")
    assert (aside_run.result, aside_run.attempt, aside_run.worker) == ("ok", 1, "wa")
    long_run = client.get_run(f"{long.id}@{long.next_ms}")
    assert (long_run.state, long_run.result, long_run.fence) == (RunState.SUCCEEDED, "w2", 2)
    assert client.get_run(bad_run).state is RunState.DISPATCHED
    assert client.get(tick.id).status is JobStatus.CANCELLED
    assert int(client.r.hget(keys.stats(PB), "fenced") or 0) == 1


SCRIPT_OF_SHA = {scripts.load(name).sha.encode(): name for name in scripts.NAMES}


def scripts_run(commands: Iterable[MonitoredCommand]) -> set[str]:
    """The rsched scripts the commands called (to prove a scenario ran them all)."""
    return {SCRIPT_OF_SHA[c.args[1]] for c in commands
            if c.args[0] == b"EVALSHA" and c.args[1] in SCRIPT_OF_SHA}


def undeclared_keys(
    r: redis.Redis, commands: Iterable[MonitoredCommand]
) -> list[tuple[str, list[bytes], bytes]]:
    """(script, command, key) for each key a script's command touched without the script having
    it among its KEYS; Redis says which arguments are keys (COMMAND GETKEYS).  A command of no
    keys other than TIME counts too, with key b"?": nothing should go unchecked."""
    out: list[tuple[str, list[bytes], bytes]] = []
    script, declared = "", set[bytes]()
    for c in commands:
        if c.client != "lua":  # a script's own commands follow the call that ran it
            if c.args[0] in (b"EVAL", b"EVALSHA"):
                script = SCRIPT_OF_SHA.get(c.args[1], "(eval)")
                declared = set(c.args[3 : 3 + int(c.args[2])])
            continue
        try:
            touched = [k.encode() if isinstance(k, str) else k  # redis-py decodes these
                       for k in r.command_getkeys(*c.args)]
        except ResponseError:
            if c.args[0] != b"TIME":
                out.append((script, c.args, b"?"))
            continue
        out.extend((script, c.args, k) for k in touched if k not in declared)
    return out


def test_schedule_refuses_a_job_layout_other_than_next_ms_and_spec(r: redis.Redis) -> None:
    """Its direct dispatch reads a job's spec as its second own field: another count of own
    fields is refused, not stored askew."""
    ks = [keys.due(0), keys.events(0), keys.queues(0), keys.stats(0)]
    args = [0, 1000, keys.GROUP, 0, 0, 0, 2, 0]
    assert scripts.call(r, "schedule", ks, args)[0] == 0  # no jobs: nothing to do
    args[6] = 3
    with pytest.raises(ResponseError, match="2 own fields"):
        scripts.call(r, "schedule", ks, args)


def test_the_key_check_finds_a_script_that_touches_an_undeclared_key(r: redis.Redis) -> None:
    sneaky = "redis.call('HSET', KEYS[1], 'a', 1) return redis.call('GET', 'rsched:{p0}:other')"
    honest = "redis.call('HSET', KEYS[1], 'a', 1); return redis.pcall('HGET', KEYS[1], 'a')"
    with Monitor(r) as mon:
        r.eval(sneaky, 1, "rsched:{p0}:job:x")
        assert r.eval(honest, 1, "rsched:{p0}:job:x") == b"1"
        commands = mon.commands()
    assert undeclared_keys(r, commands) == [
        ("(eval)", [b"GET", b"rsched:{p0}:other"], b"rsched:{p0}:other")]


def test_every_script_touches_only_its_declared_keys_through_a_whole_scenario(
    redis_url: str, r: redis.Redis
) -> None:
    """Watched with MONITOR: the shipped scripts as they are, redis.pcall included."""
    client = Client(settings=settings(redis_url))

    async def run() -> None:
        async with aredis(redis_url) as ar:
            await exercise_every_script(client, ar, ManualClock(redis_now_ms(r)))

    with Monitor(r) as mon:
        try:
            asyncio.run(run())
        finally:
            client.close()
        commands = mon.commands()
    assert scripts_run(commands) == set(scripts.NAMES)
    assert undeclared_keys(r, commands) == []


class OneByOne:
    """A pipeline for a redis-py cluster client that sends each queued command on its own, routed
    by the client (a script call by its first key).  redis-py's ClusterPipeline refuses EVALSHA,
    TIME and PUBLISH, which rsched's pipelines use: rsched has no cluster code path yet, and this
    test is about what the scripts touch, so it trades the round trips away."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queued: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., OneByOne]:
        def queue(*args: Any, **kwargs: Any) -> OneByOne:
            self._queued.append((name, args, kwargs))
            return self

        return queue

    def _take(self) -> list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
        queued, self._queued = self._queued, []
        return [(getattr(self._client, name), args, kwargs) for name, args, kwargs in queued]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        out: list[Any] = []
        for fn, args, kwargs in self._take():
            try:
                out.append(fn(*args, **kwargs))
            except ResponseError as e:
                if raise_on_error:
                    raise
                out.append(e)
        return out


class AsyncOneByOne(OneByOne):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:  # type: ignore[override]
        out: list[Any] = []
        for fn, args, kwargs in self._take():
            try:
                out.append(await fn(*args, **kwargs))
            except ResponseError as e:
                if raise_on_error:
                    raise
                out.append(e)
        return out


class OneByOneClient:
    """A cluster client whose pipelines are OneByOne; everything else is the client's own."""

    def __init__(self, client: Any, pipeline: type[OneByOne]) -> None:
        self._client = client
        self._pipeline = pipeline

    def pipeline(self, transaction: bool = False) -> OneByOne:
        assert not transaction
        return self._pipeline(self._client)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_the_cluster_rejects_a_script_that_touches_a_key_of_another_slot(
    cluster: RedisCluster,
) -> None:
    rc = cluster.client()
    assert rc.get_node_from_key(keys.due(PA)) != rc.get_node_from_key(keys.due(PB))
    sneaky = f"return redis.call('HGET', '{keys.job(PB, 'x')}', 'a')"
    with pytest.raises(ResponseError, match="(?i)slot|non local key"):
        rc.eval(sneaky, 1, keys.job(PA, "x"))


def test_every_script_runs_on_a_redis_cluster_with_each_call_routed_by_its_first_key(
    cluster: RedisCluster,
) -> None:
    rc = cluster.client()
    rc.flushall()
    nodes = {rc.get_node_from_key(keys.due(p)).name for p in (PA, PB)}
    assert len(nodes) == 2, "the scenario's partitions should live on different masters"
    client = Client(settings=Settings(redis_url=cluster.url),
                    redis=OneByOneClient(rc, OneByOne))  # type: ignore[arg-type]

    async def run() -> None:
        ar = aiocluster.RedisCluster(startup_nodes=[
            aiocluster.ClusterNode(n.host, n.port) for n in cluster.startup_nodes])
        try:
            sec, usec = await ar.time()
            await exercise_every_script(client, OneByOneClient(ar, AsyncOneByOne),
                                        ManualClock(sec * 1000 + usec // 1000))
        finally:
            await ar.aclose()

    with contextlib.ExitStack() as stack:
        monitors = [stack.enter_context(Monitor(stack.enter_context(node.client())))
                    for node in cluster.nodes]
        asyncio.run(run())
        ran = set().union(*(scripts_run(m.commands()) for m in monitors))
    assert ran == set(scripts.NAMES)


# --- durability --------------------------------------------------------------------------------


def test_after_a_redis_restart_empties_the_script_cache_every_call_path_reloads_and_works(
    aof_redis: RedisServer,
) -> None:
    app = App()

    @app.job("ping")
    async def ping(ctx: JobContext) -> str:
        return "pong"

    client = Client(settings=settings(aof_redis.url))
    probe = aof_redis.client()
    try:
        # Two partitions: a read takes one entry per stream, and the cycle below reads once.
        k_before, k_after = keys_in_partition(1, 1)[0], keys_in_partition(2, 1)[0]
        before = client.schedule("ping", run_at=client.now_ms() + 1000, idempotency_key=k_before)

        async def before_restart() -> None:
            async with Rig(aof_redis.url, app, clock=ManualClock(redis_now_ms(probe))) as rig:
                await rig.lease()  # loads the lease script (and leaves the leases held)

        async def after_restart() -> None:
            clock = ManualClock(redis_now_ms(aof_redis.client()) + 2000)
            async with Rig(aof_redis.url, app, clock=clock) as rig:
                claimed, started, reported = await rig.cycle()  # asyncio pipeline paths
                assert (claimed.dispatched, started, reported) == (2, 2, 2)

        asyncio.run(before_restart())
        assert probe.script_exists(scripts.load("lease").sha) == [True]
        aof_redis.restart()
        assert aof_redis.client().script_exists(scripts.load("lease").sha) == [False]
        after = client.schedule("ping", run_at=client.now_ms() + 1000,  # sync pipeline path
                                idempotency_key=k_after)
        client.pause(after.id)  # sync single-call path
        client.resume(after.id)
        asyncio.run(after_restart())
        assert client.get(before.id).status is JobStatus.COMPLETED  # kept by the AOF
        assert [a.result for a in client.runs(before.id)] == ["pong"]
    finally:
        client.close()



def test_calls_with_more_commands_share_one_write_and_a_dropped_connection_sends_the_calls_again(
    redis_url: str,
) -> None:
    """scripts.acall_many_then: the commands' replies come raw; when the connection drops, the
    calls go again through the retrying pipeline and the commands not at all."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from rsched.rdb.connect import connect_async

    hb: scripts.Call = ("heartbeat", [keys.events(0), keys.stats(0)], ["w", 0, keys.GROUP, 0, 1000])

    async def scenario() -> tuple[Any, Any]:
        r = connect_async(redis_url)
        try:
            first = await scripts.acall_many_then(r, [hb], [("PING",)])
            conn = await r.connection_pool.get_connection()
            await r.connection_pool.release(conn)
            send = conn.send_packed_command

            async def dropped(*args: Any, **kwargs: Any) -> None:
                conn.send_packed_command = send
                raise RedisConnectionError("dropped")

            conn.send_packed_command = dropped
            return first, await scripts.acall_many_then(r, [hb], [("PING",)])
        finally:
            await r.aclose()

    first, again = asyncio.run(scenario())
    assert first == ([[]], [b"PONG"])
    assert again == ([[]], [])


def test_held_connections_skip_the_pool_until_one_breaks_or_the_client_changes(
    redis_url: str,
) -> None:
    """scripts.Held: a raw round trip's connection is kept for the next one (the pool is not
    asked again); a connection that failed is not kept (back to the pool, disconnected), and a
    client of another pool gets its own connections (the first one's go back)."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from rsched.rdb.connect import connect_async

    async def scenario() -> tuple[list[Any], int, int, int, bool]:
        r, other = connect_async(redis_url), connect_async(redis_url)
        held = scripts.Held(1)
        asked = [0]
        get = r.connection_pool.get_connection

        async def counted(*args: Any, **kwargs: Any) -> Any:
            asked[0] += 1
            return await get(*args, **kwargs)

        r.connection_pool.get_connection = counted
        try:
            replies = [await scripts.acommands_raw(r, [("PING",)], held) for _ in range(3)]
            reused = asked[0]
            conn = held.free[0]
            send = conn.send_packed_command

            async def dropped(*args: Any, **kwargs: Any) -> None:
                conn.send_packed_command = send
                raise RedisConnectionError("dropped")

            conn.send_packed_command = dropped
            with pytest.raises(RedisConnectionError):
                await scripts.acommands_raw(r, [("PING",)], held)
            after_error = len(held.free)
            replies.append(await scripts.acommands_raw(r, [("PING",)], held))
            replies.append(await scripts.acommands_raw(other, [("PING",)], held))
            mine = held.pool is other.connection_pool and len(held.free) == 1
            await held.release()
            return replies, reused, after_error, asked[0], mine
        finally:
            await r.aclose()
            await other.aclose()

    replies, reused, after_error, asked, mine = asyncio.run(scenario())
    assert replies == [[b"PONG"]] * 5
    assert reused == 1  # three round trips, one connection from the pool
    assert after_error == 0 and asked == 2  # the broken one was not kept: a new one was asked for
    assert mine
