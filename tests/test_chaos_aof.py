"""The checker's machine loss (chaos/aof.py) against a real redis-server 7: a mark that falls
inside a write() must not bring half of a script back one restart later."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis
from redis_server import RedisServer

from chaos import aof

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
