"""The runner's slots without Redis: at most ``concurrency`` handlers at once, the others waiting
their turn in order, a waiter cancelled meanwhile taking no slot; and the intake's job-key fast
path against rsched.rdb.keys."""

from __future__ import annotations

import asyncio

import pytest
from support.helpers import settings

from rsched import App, JobContext
from rsched.engine.worker import Worker
from rsched.engine.worker.inflight import Inflight, inflight, job_prefix
from rsched.rdb import keys

UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing here talks to Redis


def gated_app(started: list[str], gates: dict[str, asyncio.Event]) -> App:
    app = App("runner")

    @app.job("gated")
    async def gated(ctx: JobContext) -> None:
        started.append(ctx.run_id)
        await gates[ctx.run_id].wait()

    return app


def entry(p: int, i: int) -> tuple[Inflight, dict[bytes, bytes]]:
    f = {b"r": f"j{i}@1000".encode(), b"t": b"gated", b"a": b"1", b"o": b"1"}
    return inflight(p, keys.stream(p, "default"), "default", f"1-{i}", f"j{i}@1000", f, 1,
                    0.0), f


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class Gated:
    """A worker at ``concurrency`` given ``n`` runs whose handlers wait for their gate."""

    def __init__(self, concurrency: int, n: int) -> None:
        self.started: list[str] = []
        self.gates = {f"j{i}@1000": asyncio.Event() for i in range(n)}
        self.w = Worker(gated_app(self.started, self.gates), settings(UNREACHABLE),
                        concurrency=concurrency)
        self.n = n

    async def __aenter__(self) -> Gated:
        self.fls = [entry(3, i) for i in range(self.n)]
        for fl, f in self.fls:
            self.w.runner.run(fl, f)
        await turns()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.w.close(wait_s=1)

    def cancel(self, i: int) -> None:
        task = self.fls[i][0].task
        assert task is not None
        task.cancel()

    async def open(self, *runs: int) -> None:
        for i in runs:
            self.gates[f"j{i}@1000"].set()
        await turns()


def test_at_most_concurrency_handlers_run_and_the_rest_start_in_order_as_slots_free() -> None:
    async def scenario() -> None:
        async with Gated(concurrency=2, n=5) as g:
            assert g.started == ["j0@1000", "j1@1000"]
            g.cancel(3)  # a waiter gives up its turn
            await g.open(1)
            assert g.started == ["j0@1000", "j1@1000", "j2@1000"]
            await g.open(0)
            assert g.started == ["j0@1000", "j1@1000", "j2@1000", "j4@1000"]  # j3 never ran
            await g.open(2, 4)
            assert not g.w.runner.tasks and g.w.runner._running == 0
            assert sorted(o.fl.run_id for o in g.w.done) == ["j0@1000", "j1@1000", "j2@1000",
                                                             "j4@1000"]

    asyncio.run(scenario())


def test_a_waiter_cancelled_just_after_it_was_handed_a_slot_passes_the_slot_on() -> None:
    async def scenario() -> None:
        async with Gated(concurrency=1, n=3) as g:
            assert g.started == ["j0@1000"]
            g.w.runner._leave()  # as j0's end does: its slot goes to j1, which has not woken yet
            g.cancel(1)
            await turns()
            assert g.started == ["j0@1000", "j2@1000"]  # j1's slot went on, not lost

    asyncio.run(scenario())


@pytest.mark.parametrize("p", [0, 7, 15, 63])
def test_the_job_key_of_a_taken_run_is_the_one_rsched_rdb_keys_builds(p: int) -> None:
    fl, _ = entry(p, 1)
    assert fl.job_key == keys.job(p, "j1") == job_prefix(p) + "j1"
    assert fl.run_key == fl.job_key  # a one-off job's own run lives in its job hash


@pytest.mark.parametrize("payload", [None, 0, "", {"a": [1, None]}, [None]])
def test_a_spec_read_once_gives_each_run_the_payload_unpacking_would(payload: object) -> None:
    """Runner's Spec keeps a packed None as None (no unpack per run for a job without payload)
    and any other payload packed, so each run unpacks a fresh copy of it."""
    import msgpack

    from rsched.core.models import PACKED_NONE, pack_default_spec, unpack_payload
    from rsched.engine.worker.runner import Spec

    packed = msgpack.packb(payload)
    spec = Spec.of(pack_default_spec(packed, None))
    assert (spec.payload is None) == (packed == PACKED_NONE)
    got = unpack_payload(spec.payload) if spec.payload else None
    assert got == payload
    if isinstance(payload, dict | list):  # a handler changing its copy changes no other run's
        assert got is not unpack_payload(spec.payload)
