"""Following runs over HTTP: GET /runs/{runId} (``?wait=S``: answer when the run has ended, or
after S), and the Server-Sent Events streams of one job's events and of many jobs' (filtered by
queue and type).  All of them ride the process's EventHub: while they wait, no Redis read per
request or stream, but one read of the runs that each read of a partition's events saw end."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from rsched.aclient import AsyncClient
from rsched.api.event_hub import Deliver, EventHub
from rsched.api.problems import JSON
from rsched.archive.events import EventRow
from rsched.core.errors import NotFound, ValidationError
from rsched.core.models import Run, job_of_run, partition_of
from rsched.core.spec import QUEUE_PATTERN, TYPE_PATTERN
from rsched.core.wire import parse_sid
from rsched.service.inputs import known_job_id
from rsched.service.jobs import op_read_run
from rsched.service.run_events import (
    ENDING,
    Cursor,
    check_event_id,
    check_wait,
    ended,
    op_is_pending,
    op_next_events,
    op_start,
    with_start,
)
from rsched.service.shapes import event_json, run_json

KEEP_ALIVE_S = 15.0  # an SSE comment this often keeps proxies from closing a quiet stream
_QUEUE_SIZE = 10_000  # events buffered for a slow SSE client before it is disconnected


def _client(request: Request) -> AsyncClient:
    return request.app.state.client  # type: ignore[no-any-return]


def _hub(request: Request) -> EventHub:
    return request.app.state.events  # type: ignore[no-any-return]


def _run_id(raw: str) -> str:
    try:
        partition_of(job_of_run(raw))
    except ValidationError:
        raise NotFound("run", raw) from None
    if "@" not in raw:
        raise NotFound("run", raw)
    return raw


async def get_run(request: Request) -> Response:
    """The run; with ``?wait=S`` (up to 60), once it has ended or after S as it is then."""
    run_id = _run_id(request.path_params["runId"])
    wait_s = check_wait(request.query_params.get("wait"))
    c = _client(request)
    if wait_s <= 0:
        return JSON(run_json(await c.get_run(run_id)))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    async with _hub(request).run_end(run_id) as next_end:
        end = next_end()  # before the read: no ending can fall in between
        run = await _run_or_pending(c, run_id)
        while run is None or not ended(run):
            try:
                got = await asyncio.wait_for(asyncio.shield(end), deadline - loop.time())
            except TimeoutError:
                run = await c.run(op_read_run(run_id))  # as it is now
                break
            run = got if got is not None else run
            end = next_end()
    if run is None:
        raise NotFound("run", f"{run_id} (not dispatched yet)")
    return JSON(run_json(run))


async def _run_or_pending(c: AsyncClient, run_id: str) -> Run | None:
    """The run; None when it is its job's next occurrence, not dispatched yet (a wait waits for
    its dispatch too); NotFound otherwise."""
    run = await c.run(op_read_run(run_id))
    if run is None and not await c.run(op_is_pending(run_id)):
        raise NotFound("run", run_id)
    return run


def _position_id(start_ms: int, sent: dict[int, tuple[int, int]]) -> str:
    """An SSE event id: the stream's start (ms) and where it is in each partition it has sent
    events of, ``start;p.ms-seq;...``: resuming from it misses and repeats nothing (a partition
    not named resumes from the start)."""
    return ";".join([str(start_ms), *(f"{p}.{ms}-{seq}" for p, (ms, seq) in sorted(sent.items()))])


def _positions(raw: str | None, partitions: list[int]
               ) -> tuple[int | None, dict[int, tuple[int, int]]]:
    """A Last-Event-ID as _position_id writes it, for these partitions only ((None, {}): none
    given)."""
    if not raw:
        return None, {}
    head, *parts = raw.split(";")
    out: dict[int, tuple[int, int]] = {}
    ok = head.isdigit() and len(head) < 19
    for part in parts:
        p, dot, sid = part.partition(".")
        at = check_event_id(sid) if ok and dot and p.isdigit() else None
        if at is None or int(p) not in partitions:
            ok = False
            break
        out[int(p)] = at
    if not ok:
        raise ValidationError("Last-Event-ID", "not an event id this stream sent")
    return int(head), out


def _sse(sse_id: str, row: EventRow) -> bytes:
    """The event as SSE frames; an outcome carrying its run's start comes after a 'started'
    frame without an id, so resuming from the outcome never repeats it."""
    out = []
    for ev in with_start(row):
        data = json.dumps(event_json(sse_id if ev is row else None, ev), separators=(",", ":"),
                          ensure_ascii=False)
        head = f"id: {sse_id}\n" if ev is row else ""
        out.append(f"{head}event: {ev.event}\ndata: {data}\n\n")
    return "".join(out).encode()


@asynccontextmanager
async def _subscribed(hub: EventHub, partitions: list[int],
                      deliver: Deliver) -> AsyncIterator[dict[int, str]]:
    """Subscriptions to several partitions at once; yields where each one's reader was."""
    async with AsyncExitStack() as stack:
        yield {p: await stack.enter_async_context(hub.subscription(p, deliver))
               for p in partitions}


async def _stream(request: Request, partitions: list[int], wanted: Callable[[EventRow], bool],
                  start: int | None, sent: dict[int, tuple[int, int]]) -> AsyncIterator[bytes]:
    """The events of ``partitions`` that ``wanted`` takes, as SSE: after Last-Event-ID
    (caught up from the streams, then live), else from now; a comment every KEEP_ALIVE_S."""
    c, hub = _client(request), _hub(request)
    queue: asyncio.Queue[tuple[str, EventRow] | None] = asyncio.Queue(_QUEUE_SIZE)

    def deliver(event_id: str, row: EventRow) -> None:
        if wanted(row) and not queue.full():
            # Full: the client is far behind; it ends here and resumes from its last id.
            queue.put_nowait((event_id, row) if queue.qsize() < _QUEUE_SIZE - 1 else None)

    async with _subscribed(hub, partitions, deliver) as live_from:
        yield b": rsched events\n\n"
        if start is None:  # a new stream: from where the readers are
            start = min(parse_sid(at)[0] for at in live_from.values())
            resume: dict[int, tuple[int, int]] = {}
        else:  # resumed: every partition from its last event sent, or from the start
            resume = {p: sent.get(p, (start, -1)) for p in partitions}
        first = start

        def fresh(event_id: str, row: EventRow) -> str | None:
            """The SSE id to send the event with; None: sent already."""
            sid = parse_sid(event_id)
            if sid <= sent.get(row.part, (first, -1)):
                return None
            sent[row.part] = sid
            return _position_id(first, sent)

        for p, after in resume.items():  # catch up to where the hub's readers were
            cur = await c.run(op_start(p, after))
            async for event_id, row in _until(c, p, cur, live_from[p]):
                if wanted(row) and (sse_id := fresh(event_id, row)) is not None:
                    yield _sse(sse_id, row)
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), KEEP_ALIVE_S)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if item is None:
                return
            if (sse_id := fresh(*item)) is not None:
                yield _sse(sse_id, item[1])


async def _until(c: AsyncClient, p: int, cur: Cursor, stop: str
                 ) -> AsyncIterator[tuple[str, EventRow]]:
    """Partition ``p``'s events from ``cur`` up to the event ``stop`` (inclusive), then no
    more: the ones after it reach the stream live."""
    end = parse_sid(stop)
    while parse_sid(cur.last_event) < end or cur.resume_after is not None:
        events = await c.run(op_next_events(p, cur, 1))
        for event_id, row in events:
            if parse_sid(event_id) > end:
                return
            yield event_id, row
        if not events and cur.resume_after is None:
            return


def _event_stream(request: Request, body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def job_events(request: Request) -> Response:
    """GET /jobs/{id}/events: the job's events as Server-Sent Events."""
    job_id = known_job_id(request.path_params["id"])
    await _client(request).get(job_id)  # 404 for no such job
    p = partition_of(job_id)
    start, sent = _positions(request.headers.get("last-event-id"), [p])  # 422 before streaming
    return _event_stream(request, _stream(request, [p], lambda row: row.job_id == job_id,
                                          start, sent))


async def events(request: Request) -> Response:
    """GET /events?queue=&type=: every job's events (of that queue and job type) as SSE."""
    q = request.query_params
    queue, jtype = q.get("queue"), q.get("type")
    if queue is not None and not re.fullmatch(QUEUE_PATTERN, queue):
        raise ValidationError("queue", "not a queue name")
    if jtype is not None and not re.fullmatch(TYPE_PATTERN, jtype):
        raise ValidationError("type", "not a job type (letters, digits and _.:- up to 128)")
    c = _client(request)
    partitions = list(range(await c.run(c.op_partitions())))
    queues = _QueueOf()

    def wanted(row: EventRow) -> bool:
        if jtype is not None and row.job_type != jtype:
            return False
        return queue is None or queues.of(row) == queue

    start, sent = _positions(request.headers.get("last-event-id"), partitions)
    return _event_stream(request, _stream(request, partitions, wanted, start, sent))


QUEUES_KNOWN = 100_000  # jobs whose queue one /events stream remembers at most


class _QueueOf:
    """The queue of an event's job: the event's own 'q' when it carries one, else the queue
    last seen on an event of that job (dispatches carry it).  A job is forgotten when its run
    ends (its next dispatch names the queue again), and beyond ``QUEUES_KNOWN`` jobs in flight
    the oldest is, so a long-lived stream holds a bounded map."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}

    def of(self, row: EventRow) -> str | None:
        job = row.job_id
        if job is None:
            return row.queue
        if row.event in ENDING:
            known = self.known.pop(job, None)
            return row.queue if row.queue is not None else known
        if row.queue is not None:
            if job not in self.known and len(self.known) >= QUEUES_KNOWN:
                del self.known[next(iter(self.known))]
            self.known[job] = row.queue
            return row.queue
        return self.known.get(job)


__all__ = ["events", "get_run", "job_events"]
