"""The Lua scripts: key discipline (cluster-safe), headers, and surviving a Redis restart.

Key discipline is checked three ways: statically on the source; at run time by watching every
command each shipped script runs (MONITOR) and asking Redis which of its arguments are keys
(COMMAND GETKEYS), each of which must be among the script's KEYS; and on a real 3-master Redis
Cluster, which rejects any access to a key of another slot
(tests/processes/test_scripts_cluster.py).  The last two run one scenario that calls every
script through the real client, lease keeper, claimer and workers (support.scripts).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError
from support.helpers import (
    ManualClock,
    Monitor,
    MonitoredCommand,
    Rig,
    aredis,
    keys_in_partition,
    redis_now_ms,
    settings,
)
from support.redis_server import RedisServer
from support.scripts import (
    SCRIPT_OF_SHA,
    exercise_every_script,
    scripts_run,
)

from rsched import App, Client, JobContext, JobStatus
from rsched.core import codes, layout
from rsched.core.layout import OWN, J
from rsched.rdb import keys, scripts

LUA = Path(__file__).resolve().parents[2] / "lua"
SOURCES = sorted(LUA.glob("*.lua")) + sorted((LUA / "include").glob("*.lua"))
SCRIPT_FILES = sorted(LUA.glob("*.lua"))


# --- static checks -----------------------------------------------------------------------------

CALL = re.compile(r"redis\.call\(\s*'(\w+)'\s*,\s*([^,)]+)(?:,\s*([^,)]+))?")
KEY_ARG = re.compile(r"^(KEYS\[[^\]]+\]|\w*key|unpack\(KEYS)$")  # unpack(KEYS, i, j): a slice
SUBCOMMANDS = {"XINFO"}  # the key follows the subcommand
KEYLESS = {"TIME", "PUBLISH"}  # PUBLISH names a channel (include limits wakes dispatchers)
STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
KEY_FRAGMENT = re.compile(r"rsched|\{p|\b(?:job|run|hist|q|lease|due|retry|dead|stats|events):")
KEY_ASSIGN = re.compile(r"^\s*(?:local\s+)?((?:\w+_key\s*,\s*)*\w+_key)\s*=\s*(.+)$", re.M)
STRING_FN_ON_KEY = re.compile(r"string\.\w+\(\s*\w+_key\b")
# The queue's name, read off a queue stream's key (claim.lua: where a queue's runs go;
# complete.lua: the queue of the runs that came from it).
DOCUMENTED_PARSE = ({"claim.lua", "complete.lua"}, "string.match(stream_key, ':q:(.*)$')")
# lua/include/limits.lua (and lua/limit_keys.lua, which reads them) builds the keys of a limit
# key's state from the partition's prefix (its header says why): locals assigned from
# lim_key(...) only, and the partition number read off the prefix for the wake channel.
BUILT_KEYS = (("limits.lua", "limit_keys.lua"), re.compile(r"\s*lim_key\(prefix, \w+, '\w+'\)\s*"),
              "'^(.*):{p(%d+)'")


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
        if path.name in BUILT_KEYS[0] and BUILT_KEYS[1].fullmatch(m.group(2)):
            continue
        for rhs in m.group(2).split(","):
            assert re.fullmatch(r"\s*KEYS\[[^\]]+\]\s*", rhs), (
                f"{path.name}: {m.group(1)} assigned from {m.group(2)!r}, not from KEYS"
            )
    for literal in STRING.findall(code):
        if path.name in DOCUMENTED_PARSE[0] and literal == "':q:(.*)$'":
            continue
        if path.name in BUILT_KEYS[0] and literal == BUILT_KEYS[2]:
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
    "backfill": codes.BackfillCode, "operation_step": codes.OperationStep,
    "operation_cancel": codes.OperationCancel,
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
    if name != "replay":
        negatives.discard(int(codes.ControlCode.OVERLAP))
    if name in ("trigger", "replay", "backfill"):
        negatives.discard(int(codes.ControlCode.VERSION))
    assert negatives <= documented, name


def test_every_script_file_is_known_to_the_loader() -> None:
    assert {p.stem for p in SCRIPT_FILES} == set(scripts.NAMES)


# --- run time: one scenario calling every script -------------------------------------------------















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
        if c.args[0] == b"PUBLISH" and c.args[1] == keys.wake_channel().encode():
            continue  # include limits wakes the dispatchers: a channel, no key
        try:
            touched = [k.encode() if isinstance(k, str) else k  # redis-py decodes these
                       for k in r.command_getkeys(*c.args)]
        except ResponseError:
            if c.args[0] != b"TIME":
                out.append((script, c.args, b"?"))
            continue
        out.extend((script, c.args, k) for k in touched
                   if k not in declared and not built_by_limits(k, declared))
    return out


# The keys include limits builds (see its header): a partition's limits, waiting keys and retry
# set, and a limit key's run, wait and log sets, all under a declared key's hash tag.
LIMIT_BUILT = re.compile(
    rb"^(rsched:\{[^}]+\}):(?:limits|limwait|limstats|limrun|retry|lim:.+:(?:run|wait|log))$", re.S)


def built_by_limits(key: bytes, declared: set[bytes]) -> bool:
    m = LIMIT_BUILT.match(key)
    return m is not None and any(d.startswith(m.group(1) + b":") for d in declared)


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


def test_a_claim_that_lets_go_of_an_ended_active_run_reads_it_by_a_declared_key(
    redis_url: str, r: redis.Redis
) -> None:
    """lua/claim.lua reads the state of an overlap job's active run by the key the dispatcher
    passed (include overlap's record heals): watched with MONITOR."""
    client = Client(settings=settings(redis_url))
    job = client.schedule("ok", cron="* * * * *", overlap="skip")
    client.close()
    assert job.next_ms is not None
    clock = ManualClock(job.next_ms)
    gone = f"{job.id}@{job.next_ms - 60_000}"
    r.hset(keys.job(job.partition, job.id), "active", gone)  # its run hash never existed

    async def run() -> None:
        async with Rig(redis_url, App("none"), clock=clock) as rig:
            with Monitor(r) as mon:
                assert (await rig.claim()).dispatched == 1
                commands = mon.commands()
        assert any(c.client == "lua" and c.args[:2] == [b"HGET", keys.run(
            job.partition, gone).encode()] for c in commands)
        assert undeclared_keys(r, commands) == []

    asyncio.run(run())


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
