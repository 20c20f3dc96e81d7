"""Limit definitions (docs/limits.md): set, read, list and delete, as operations every face runs.

A definition is written to the global index (what listings read) and then to every partition,
where lua/limit.lua applies it at once: a raised limit or a deletion admits waiting runs in the
same call, so a change holds for runs not yet started as soon as the write returns."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rsched.core import defaults
from rsched.core.cursor import check_limit, decode_cursor, encode_cursor
from rsched.core.errors import NotFound, ValidationError
from rsched.core.ids import partition_for_key
from rsched.core.limits import Limit, check_name, limit_of
from rsched.core.spec import QUEUE_PATTERN
from rsched.rdb.limit_scripts import (
    BusyKey,
    op_busy_keys,
    op_key_state,
    op_limit,
    op_limits,
    op_write_limit,
)
from rsched.rdb.ops import Op
from rsched.rdb.queue_limits import op_queue_counts, op_queue_limit, op_write_queue_limit
from rsched.service.context import Service

_QUEUE = re.compile(QUEUE_PATTERN)


@dataclass(frozen=True, slots=True)
class LimitView:
    """A definition and, for a key's own one (no family), its key's counts now; its busiest
    keys (a family's, or the key itself while busy)."""

    limit: Limit
    in_flight: int | None = None
    waiting: int | None = None
    busiest: tuple[BusyKey, ...] = ()


@dataclass(frozen=True, slots=True)
class LimitPage:
    items: list[Limit]
    next_cursor: str | None


def limit_from_args(name: str, concurrency: int | None = None,
                    rate: tuple[int, float] | None = None) -> Limit:
    """A definition from Python arguments (``rate``: (limit, period seconds)), checked as the
    API's body is: errors name the API's fields."""
    return limit_of(name, _body(concurrency, rate))


def queue_limit_from_args(queue: str, concurrency: int | None = None,
                          rate: tuple[int, float] | None = None) -> Limit:
    """A queue's limit from Python arguments, checked as the API's body is."""
    return queue_limit_of(queue, _body(concurrency, rate))


def _body(concurrency: int | None, rate: tuple[int, float] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"concurrency": concurrency, "rate": None}
    if rate is not None:
        limit, seconds = rate
        body["rate"] = {"limit": limit, "periodSeconds": seconds}
    return body


def check_queue(queue: Any) -> str:
    """A queue's name, as jobs name it (core.spec.QUEUE_PATTERN)."""
    if not isinstance(queue, str) or not _QUEUE.fullmatch(queue):
        raise ValidationError("queue", "must be 1-64 characters of letters, digits, _ . -")
    return queue


def queue_limit_of(queue: Any, body: Any) -> Limit:
    """A queue's limit from a PUT's JSON body (the body of PUT /limits/{name}), the queue's
    name as its name."""
    limit = limit_of("queue", body)
    return Limit(check_queue(queue), limit.concurrency, limit.rate_limit, limit.period_ms)


def op_set_queue_limit(svc: Service, limit: Limit) -> Op[Limit]:
    """Store (or replace) a queue's limit; waiting runs a raise lets start start now."""
    yield from op_write_queue_limit(limit.name, limit.packed())
    return limit


def _op_existing_queue_limit(queue: str) -> Op[Limit]:
    limit = yield from op_queue_limit(check_queue(queue))
    if limit is None:
        raise NotFound("queue limit", queue)
    return limit


def op_get_queue_limit(svc: Service, queue: str) -> Op[LimitView]:
    """A queue's limit with its permits held now and its runs waiting.  NotFound if none."""
    limit = yield from _op_existing_queue_limit(queue)
    now = yield from svc.op_now()
    held, waiting = yield from op_queue_counts(queue, now)
    return LimitView(limit, held, waiting)


def op_delete_queue_limit(svc: Service, queue: str) -> Op[None]:
    """Delete a queue's limit: its waiting runs start (up to 1,000 at once, the others at their
    recheck).  NotFound if there was none."""
    yield from _op_existing_queue_limit(queue)
    yield from op_write_queue_limit(queue, "")


def op_set_limit(svc: Service, limit: Limit) -> Op[Limit]:
    """Store (or replace) a definition in the index and every partition."""
    P = yield from svc.op_store_partitions()
    yield from op_write_limit(limit.name, limit.packed(), P)
    return limit


def op_get_limit(svc: Service, name: str) -> Op[LimitView]:
    """A definition; a key's own (no family) with its counts.  NotFound if none."""
    limit = yield from op_limit(check_name(name))
    if limit is None:
        raise NotFound("limit", name)
    P = yield from svc.op_store_partitions()
    if limit.family:
        busy = yield from op_busy_keys(range(P))
        return LimitView(limit, busiest=tuple(busiest(busy).get(name, ())))
    p = partition_for_key(name, P)
    now = yield from svc.op_now()
    state = yield from op_key_state(p, name, now - (limit.period_ms or 0))
    busy = yield from op_busy_keys([p])
    return LimitView(limit, state.in_flight, state.waiting, tuple(busiest(busy).get(name, ())))


def busiest(keys: Iterable[BusyKey],
            n: int = defaults.BUSIEST_KEYS) -> dict[str, list[BusyKey]]:
    """Per definition name, its ``n`` busiest keys: most runs in flight and waiting, then most
    starts in the rate window (then by key, so the order is stable)."""
    by_name: dict[str, list[BusyKey]] = {}
    for k in keys:
        by_name.setdefault(k.name, []).append(k)
    return {name: heapq.nsmallest(n, ks, key=lambda k: (-(k.in_flight + k.waiting),
                                                        -k.recent_starts, k.key))
            for name, ks in by_name.items()}


def op_busiest_keys(svc: Service, n: int) -> Op[dict[str, list[BusyKey]]]:
    """Every definition's ``n`` busiest keys (0 to 100), read in one walk of every partition's
    busy keys; keys with no definition under ''."""
    if not 0 <= n <= defaults.BUSIEST_KEYS_MAX:
        raise ValidationError("busiest", f"expected 0 to {defaults.BUSIEST_KEYS_MAX}, got {n}")
    if n == 0:
        return {}
    P = yield from svc.op_store_partitions()
    busy = yield from op_busy_keys(range(P))
    return busiest(busy, n)


def op_delete_limit(svc: Service, name: str) -> Op[None]:
    """Delete a definition everywhere: its keys' waiting runs are admitted at once (a key
    with no definition runs unlimited).  NotFound if there was none."""
    limit = yield from op_limit(check_name(name))
    if limit is None:
        raise NotFound("limit", name)
    P = yield from svc.op_store_partitions()
    yield from op_write_limit(name, "", P)


def op_all_limits() -> Op[list[Limit]]:
    """Every definition, by name."""
    return (yield from op_limits())


def op_list_limits(limit: int = defaults.PAGE_LIMIT, cursor: str | None = None) -> Op[LimitPage]:
    """One page of definitions by name; the cursor is the last name of the previous page."""
    check_limit(limit)
    after = decode_cursor(cursor, lambda v: isinstance(v, str)) or ""
    every = yield from op_limits()
    rest = [lim for lim in every if lim.name > after]
    page = rest[:limit]
    more = len(rest) > limit
    return LimitPage(page, encode_cursor(page[-1].name) if more else None)


__all__ = ["LimitPage", "LimitView", "busiest", "check_queue", "limit_from_args", "op_all_limits",
           "op_busiest_keys", "op_delete_limit", "op_delete_queue_limit", "op_get_limit",
           "op_get_queue_limit", "op_set_queue_limit", "queue_limit_from_args", "queue_limit_of",
           "op_list_limits", "op_set_limit"]
