"""The archive's reads of the events streams as rdb parses them (rdb.event_streams): the
archivers' group in XINFO GROUPS and the id below which a stream is archived.  No Redis."""

from __future__ import annotations

from typing import Any

import pytest

from rsched.rdb import keys
from rsched.rdb.event_streams import events_group, trim_point
from rsched.rdb.redis_api import ResponseError


def _groups(last: bytes, name: str = keys.EVENTS_GROUP) -> list[dict[bytes, Any]]:
    return [{b"name": b"other", b"last-delivered-id": b"9-9"},
            {b"name": name.encode(), b"last-delivered-id": last, b"lag": 3}]


def test_the_archivers_group_is_found_among_others_with_its_keys_as_text() -> None:
    assert events_group(_groups(b"5-0")) == {"name": keys.EVENTS_GROUP.encode(),
                                              "last-delivered-id": b"5-0", "lag": 3}
    assert events_group(_groups(b"5-0", name="someone")) is None
    assert events_group(ResponseError("ERR no such key")) is None


@pytest.mark.parametrize(("groups", "pending", "point"), [
    (_groups(b"7-2"), {"pending": 2, "min": b"4-1"}, "4-1"),  # below the oldest pending
    (_groups(b"7-2"), {"pending": 0, "min": None}, "7-3"),  # all delivered ones acknowledged
    (_groups(b"0-0"), {"pending": 0, "min": None}, None),  # nothing delivered yet
    (ResponseError("ERR no such key"), {"pending": 0, "min": None}, None),
    (_groups(b"7-2"), ResponseError("NOGROUP"), None),
])
def test_a_stream_is_trimmed_below_its_oldest_entry_not_archived(
        groups: Any, pending: Any, point: str | None) -> None:
    assert trim_point(groups, pending) == point
