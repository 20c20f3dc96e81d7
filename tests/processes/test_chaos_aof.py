"""The checker's machine loss: chaos/aof.py against a real redis-server 7 (a mark that falls
inside a write() must not bring half of a script back one restart later), and which lost
acknowledgements the analyzer puts inside its window."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis
from support.redis_server import RedisServer

from chaos import aof
from chaos.analyzer import in_window

pytestmark = [pytest.mark.chaos]

# Two writes, so Redis 7 puts the script's effects into the AOF as MULTI, HSET, HSET, EXEC.
TWO_WRITES = "redis.call('HSET', KEYS[1], 'v', ARGV[1]); redis.call('HSET', KEYS[2], 'v', ARGV[1])"
MULTI = b"*1\r\n$5\r\nMULTI\r\n"
EXEC = b"*1\r\n$4\r\nEXEC\r\n"


def _script(r: redis.Redis, *keys: str) -> None:
    r.eval(TWO_WRITES, len(keys), *keys, "x")


def _present(r: redis.Redis, *keys: str) -> list[str]:
    return [k for k in keys if r.exists(k)]


def test_a_mark_inside_a_scripts_block_drops_the_whole_script_for_good(
    redis_available: None,
) -> None:
    with RedisServer(aof=True) as server:
        r = server.client()
        _script(r, "before:a", "before:b")
        m = aof.mark(server.dir, 1)
        assert m is not None
        _script(r, "torn:a", "torn:b")  # acknowledged after the mark: lost with the machine
        time.sleep(0.05)
        server.kill()
        (incr,) = [n for n in m.sizes if ".incr." in n]
        data = (m.dir / incr).read_bytes()
        block = data.rindex(MULTI)
        assert data.endswith(EXEC) and block >= m.sizes[incr]
        # The mark saw the size halfway through the block's second HSET, inside an argument.
        second = data.index(b"torn:b", block) + 3
        torn = dataclasses.replace(m, sizes={**m.sizes, incr: second})

        assert aof.restore(server.dir, torn) == {incr: second - block}
        server.start()
        r = server.client()
        assert _present(r, "before:a", "before:b", "torn:a", "torn:b") == ["before:a",
                                                                           "before:b"]
        _script(r, "after:a", "after:b")  # the first script after the restart
        time.sleep(0.05)
        server.kill()  # kill -9 alone loses nothing: the kernel holds what Redis wrote
        server.start()
        r = server.client()
        # Left torn inside the block, Redis 7.0 cuts the file after torn:a's HSET, inside the
        # MULTI, and the next load applies that half of the script with the next one.
        assert _present(r, "before:a", "before:b", "torn:a", "torn:b", "after:a",
                        "after:b") == ["before:a", "before:b", "after:a", "after:b"]


def _commands(*names: bytes) -> bytes:
    """RESP commands, each with one argument except MULTI and EXEC."""
    return b"".join(b"*1\r\n$%d\r\n%s\r\n" % (len(n), n) if n in (b"MULTI", b"EXEC")
                    else b"*2\r\n$%d\r\n%s\r\n$1\r\nk\r\n" % (len(n), n) for n in names)


def test_the_whole_prefix_ends_after_a_whole_command_outside_every_block() -> None:
    data = b"#TS:1764590000\r\n" + _commands(b"SET", b"MULTI", b"HSET", b"DEL", b"EXEC",
                                             b"INCR", b"MULTI", b"HSET", b"EXEC")
    bounds = [0]
    pos = 0
    for chunk in (b"#TS:1764590000\r\n", _commands(b"SET"),
                  _commands(b"MULTI", b"HSET", b"DEL", b"EXEC"), _commands(b"INCR"),
                  _commands(b"MULTI", b"HSET", b"EXEC")):
        pos += len(chunk)
        bounds.append(pos)
    assert bounds[-1] == len(data)
    for cut in range(len(data) + 1):
        assert aof.whole_prefix(data[:cut]) == max(b for b in bounds if b <= cut), cut


# The machine loss of a seed-1 run that reported 15 jobs lost: one batch acknowledged 1 ms
# after t0, which is read before the kill; the dying server answered it.
LOSS = {"op": "redis_lose", "target": "redis", "fsynced_ms": 1796131655305,
        "t0": 1796131656221, "respawn_ms": 1796131656852, "t1": 1796131657219}


@pytest.mark.parametrize(("ack_ms", "inside"), [
    (1796131655304, False),  # acknowledged before the simulated last fsync: must survive
    (1796131655305, True),
    (1796131656221, True),
    (1796131656222, True),  # after t0, before the server died: from the dying server
    (1796131656852, True),
    (1796131656853, False),  # after the restart began: only the new server can have sent it
    (1796131657300, False),
])
def test_the_window_runs_from_the_last_fsync_until_redis_is_started_again(
    ack_ms: int, inside: bool
) -> None:
    assert in_window(LOSS, ack_ms) is inside


# The plain kill of a seed-2 run that reported 15 jobs lost: one batch acknowledged 6 ms before
# the kill and never written to the AOF (docs/internals/fault-checker.md, "The AOF window").
KILL = {"op": "redis_kill", "target": "redis", "t0": 1796132546022,
        "respawn_ms": 1796132546761, "t1": 1796132546924}


@pytest.mark.parametrize(("ack_ms", "inside"), [
    (1796132543021, False),  # 3 s and more before the kill: written, and kill -9 keeps it
    (1796132543022, True),
    (1796132546016, True),
    (1796132546761, True),
    (1796132546762, False),
])
def test_a_plain_kill_may_undo_what_redis_acknowledged_in_the_3_s_before_it(
    ack_ms: int, inside: bool
) -> None:
    assert in_window(KILL, ack_ms) is inside
    assert in_window({**KILL, "op": "drop"}, ack_ms) is False
