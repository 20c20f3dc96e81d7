"""The stream-entry field names Python reads (rsched.core.wire), held against the scripts that
write them; the packed spec's field order (models.SPEC_ORDER), held against its readers."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import msgpack

from rsched.core import defaults, wire
from rsched.core.models import (
    _LEFT_OUT,
    SPEC_DEFAULTS,
    SPEC_ORDER,
    SPEC_STORED,
    SPEC_WITH_LIFE,
    pack_default_spec,
    pack_spec,
    unpack_payload,
    unpack_spec,
)
from rsched.core.spec import JobSpec, prepare

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "lua"
SCRIPTS = sorted(LUA.glob("*.lua")) + sorted((LUA / "include").glob("*.lua"))


def _split(text: str) -> list[str]:
    """A Lua argument list split at its top-level commas (not inside strings or brackets)."""
    args, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return [*args, cur.strip()]


def _names(text: str) -> list[bytes]:
    """Field names of a flat field/value argument list: the arguments at even offsets."""
    names = _split(text)[::2]  # a name given as a variable (complete.lua's outcome_event's
    # err or res field) is checked where it is passed
    return [n.strip("'").encode() for n in names if re.fullmatch(r"'\w+'", n)]


def test_the_queue_entry_fields_are_those_claims_header_lists() -> None:
    header = (LUA / "claim.lua").read_text().split("]]", 1)[0]
    listed = re.search(r"Queue stream entries: (.*?);", header, re.S)
    assert listed, "claim.lua's header no longer lists the queue stream entry fields"
    names = [part.split()[0].encode() for part in listed.group(1).split(",")]
    assert names == list(wire.ENTRY_FIELDS)


def test_claim_writes_queue_entries_with_exactly_those_fields() -> None:
    source = (LUA / "claim.lua").read_text().split("]]", 1)[1]
    calls = re.findall(r"redis\.call\('XADD', stream_key, '\*', (.*?)\)\n", source, re.S)
    assert calls, "claim.lua writes no queue entry"
    for call in calls:
        names = _names(call)
        assert set(names) <= set(wire.ENTRY_FIELDS)
        assert names[:2] == [wire.ENTRY_RUN, wire.ENTRY_TYPE] and wire.ENTRY_SPEC in names


def test_every_event_field_a_script_writes_is_named_in_wire_and_every_name_is_written() -> None:
    written: set[bytes] = set()
    for path in SCRIPTS:
        source = path.read_text()
        for args in re.findall(r"emit\(events_key, maxlen, (.*?)\)\n", source, re.S):
            written.update(_names(args))
        # outcome_event(outcome, run_id, attempt, duration, type, queue, field name, text, ...)
        written.update(m.encode() for m in re.findall(r"outcome_event\([^)]*?, '(\w+)',", source))
        for common, columns in re.findall(
                r"batch_new\(events_key, maxlen,\s*\{(.*?)\},\s*\{(.*?)\}(?:,[^,)]*)?\)", source,
                re.S):
            written.update(_names(common))
            written.update(c.strip().strip("'").encode() for c in columns.split(","))
    assert written, "found no event written"
    assert written <= {*wire.EV_FIELDS, wire.EV_COUNT, wire.EV_BY, wire.EV_PROGRESS}
    assert set(wire.EV_FIELDS) - written == set(), "a name in wire that no script writes"


def test_a_claim_item_has_the_per_item_values_claims_header_lists_in_order() -> None:
    header = (LUA / "claim.lua").read_text().split("]]", 1)[0]
    listed = re.search(r"then per item (\d+) values: (.*?)\n", header)
    assert listed, "claim.lua's header no longer lists the per-item values"
    names = [n.strip().replace(" ", "_") for n in listed.group(2).split(",")]
    assert int(listed.group(1)) == len(names)
    assert tuple(names) == wire.ClaimItem._fields
    kinds = re.findall(r"^  kind '(\w)' \(", header, re.M)
    assert kinds == [wire.CLAIM_JOB, wire.CLAIM_RETRY]
    # The script unpacks an item by offset from `a`: the same names, in the same order.
    source = (LUA / "claim.lua").read_text()
    unpacked = re.findall(r"local ([\w, ]+) = (ARGV\[a(?: \+ \d)?\].*)\n", source)
    names_at = {}
    for names_, values in unpacked:
        for name, value in zip(names_.split(", "), values.split(", "), strict=True):
            offset = re.search(r"ARGV\[a(?: \+ (\d))?\]", value)
            assert offset, value
            names_at[int(offset.group(1) or 0)] = name
    assert [names_at[k] for k in sorted(names_at)] == list(wire.ClaimItem._fields)
    assert f"a = a + {len(wire.ClaimItem._fields)}\n" in source


def test_a_packed_spec_unpacks_to_its_values_under_the_names_of_spec_order() -> None:
    assert tuple(inspect.signature(pack_spec).parameters) == SPEC_ORDER
    values = (30_000, 1_000, 60_000, -3, "Europe/Paris", "skip", 500, "key-1", 1_700_000_000_000,
              b"\x81\xa1k\x01", 90_000, "bufferOne", "L1,2,3,0,4")
    assert unpack_spec(pack_spec(*values)) == dict(zip(SPEC_ORDER, values, strict=True))


def test_a_spec_stores_default_settings_as_nil_and_reads_them_back_exactly() -> None:
    """Defaults cost one byte each, so a small payload's job hash stays a listpack (64 B)."""
    base, cap, timeout = defaults.BACKOFF_BASE_MS, defaults.BACKOFF_CAP_MS, defaults.TIMEOUT_MS
    values = (timeout, base, cap, 0, defaults.TZ, "run_once", 0, "", 1_700_000_000_000,
              b"\x82\xa2to\xb6user-12345@example.com\xa1n\xcd09",
              defaults.CATCH_UP_WINDOW_MS, "", None)
    assert set(SPEC_DEFAULTS.values()) <= set(values)
    blob = pack_spec(*values)
    assert unpack_spec(blob) == dict(zip(SPEC_ORDER, values, strict=True))
    assert len(blob) <= 64 - 8, len(blob)  # Redis's hash-max-listpack-value, with room to spare
    # Only the payload and run_at_ms are stored: the defaults after them are left out.
    assert msgpack.unpackb(blob) == [values[9], values[8]] and blob[0] == 0x92
    assert blob[0] != SPEC_WITH_LIFE and pack_spec(*values[:-1], "L1,2,3,0,4")[0] == SPEC_WITH_LIFE
    life_lua = (ROOT / "lua" / "include" / "life.lua").read_text()
    assert f"local SPEC_WITH_LIFE = {SPEC_WITH_LIFE:#x}\n" in life_lua
    assert "string.byte(spec, 1) ~= SPEC_WITH_LIFE" in life_lua
    near = (timeout + 1, base - 1, 0, 0, "Etc/UTC", "skip", 0, "",
            0, b"", 0, "", None)  # values next to the defaults are kept as they are
    assert unpack_spec(pack_spec(*near)) == dict(zip(SPEC_ORDER, near, strict=True))


def test_a_spec_of_defaults_packs_by_the_shortcut_to_the_bytes_of_the_whole_rule() -> None:
    """pack_spec's shortcut for a job with every setting at its default (most of a batch) must
    give the bytes the general rule gives: SPEC_STORED's array, defaults nil, the trailing
    left-out values cut; near misses (each setting off by one, of another type) take the rule."""
    base: dict[str, Any] = dict(zip(SPEC_ORDER, (
        defaults.TIMEOUT_MS, defaults.BACKOFF_BASE_MS, defaults.BACKOFF_CAP_MS, 0, defaults.TZ,
        "run_once", 0, "", None, b"\xc0", defaults.CATCH_UP_WINDOW_MS, "", None), strict=True))
    changes: list[dict[str, Any]] = [
        {}, {"run_at_ms": 0}, {"run_at_ms": 1_700_000_000_000},
        {"payload": b"\x81\xa1k\x01", "run_at_ms": 0},
        {"timeout_ms": defaults.TIMEOUT_MS + 1}, {"backoff_base_ms": defaults.BACKOFF_BASE_MS - 1},
        {"backoff_cap_ms": 1}, {"priority": 1}, {"priority": -1}, {"priority": 0.0},
        {"tz": "Etc/UTC"}, {"misfire": "skip"}, {"jitter_ms": 1}, {"jitter_ms": False},
        {"idem_key": "k"}, {"catch_up_ms": 0}, {"overlap": "skip"}, {"life": "L1,2,3,0,4"},
        {"life": "L1,2,3,0,4", "run_at_ms": 0}]
    for change in changes:
        values = {**base, **change}
        stored = [values[name] for name in SPEC_STORED]
        for name in SPEC_DEFAULTS:
            k = SPEC_STORED.index(name)
            if stored[k] == SPEC_DEFAULTS[name]:
                stored[k] = None
        n = len(stored)
        while n > 1 and stored[n - 1] == _LEFT_OUT[n - 1] and type(stored[n - 1]) is type(
                _LEFT_OUT[n - 1]):
            n -= 1
        assert pack_spec(**values) == msgpack.packb(stored[:n], use_bin_type=True), change
    for run_at_ms in (None, 0, 1_700_000_000_000):  # prepare's own shortcut
        assert pack_default_spec(b"\x81\xa1k\x01", run_at_ms) == pack_spec(**{
            **base, "payload": b"\x81\xa1k\x01", "run_at_ms": run_at_ms})


def test_a_prepared_jobs_spec_blob_holds_its_settings_where_every_reader_looks() -> None:
    spec = JobSpec("email.send", {"to": "a@b.c"}, run_at=1_700_000_000_000, tz="Europe/Paris",
                   priority=-3, timeout_ms=9_000, backoff_base_ms=2_000, backoff_cap_ms=70_000,
                   jitter_ms=400, idempotency_key="k-7", misfire="skip",
                   catch_up_window_ms=5_000)
    prep = prepare(spec, "3-01JABC", 1_699_999_000_000, 1 << 20)
    sp, job = unpack_spec(prep.blob), prep.job
    assert sp["overlap"] == ""  # allow, stored as '' (a one-off job has no other)
    skipped = ("misfire", "payload", "overlap", "life")
    assert {name: sp[name] for name in SPEC_ORDER if name not in skipped} == {
        "timeout_ms": job.timeout_ms, "backoff_base_ms": job.backoff_base_ms,
        "backoff_cap_ms": job.backoff_cap_ms, "priority": job.priority, "tz": job.tz,
        "jitter_ms": job.jitter_ms, "idem_key": job.idempotency_key,
        "run_at_ms": None,  # a runAt is the job's first occurrence: its next_ms (models._LEFT_OUT)
        "catch_up_ms": job.catch_up_window_ms}
    assert job.run_at_ms == prep.next_ms == 1_700_000_000_000
    assert sp["misfire"] == job.misfire.value and unpack_payload(sp["payload"]) == job.payload
    # Every reader of an unpacked spec (the worker's runner, the claimer, Job.from_hash) asks
    # for names SPEC_ORDER has.
    read: set[str] = set()
    for path in (ROOT / "rsched").rglob("*.py"):
        read.update(re.findall(r"\bsp\.get\(\"(\w+)\"", path.read_text()))
    runner = (ROOT / "rsched" / "engine" / "worker" / "runner.py").read_text()
    assert {"timeout_ms", "payload"} <= set(re.findall(r"\bsp\.get\(\"(\w+)\"", runner))
    assert read and read <= set(SPEC_ORDER)
