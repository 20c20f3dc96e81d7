"""The queue filter of ``GET /events`` (rsched.api.follow._QueueOf): an event without a queue
takes its job's from an earlier event, and what it remembers stays bounded."""

from __future__ import annotations

import pytest

from rsched.api import follow
from rsched.archive.events import EventRow


def row(event: str, job: str, queue: str | None) -> EventRow:
    return EventRow(1, 0, 0, event, job, f"{job}@1", 1, 1, None, None, "t", queue, None, None,
                    None, None, None, None)


def test_an_event_without_a_queue_takes_its_jobs_and_an_ending_forgets_it() -> None:
    q = follow._QueueOf()
    assert q.of(row("dispatched", "j1", "mail")) == "mail"
    assert q.of(row("started", "j1", None)) == "mail"
    assert q.of(row("succeeded", "j1", None)) == "mail"  # the ending itself is still matched
    assert q.of(row("started", "j1", None)) is None  # forgotten until its next dispatch
    assert q.known == {}


def test_the_oldest_job_is_forgotten_beyond_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "QUEUES_KNOWN", 3)
    q = follow._QueueOf()
    for i in range(5):
        q.of(row("dispatched", f"j{i}", "mail"))
    assert list(q.known) == ["j2", "j3", "j4"]
    assert q.of(row("dispatched", "j4", "other")) == "other"  # a known job is updated in place
    assert len(q.known) == 3
