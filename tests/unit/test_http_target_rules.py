"""HTTP targets' pure rules: what a target may hold (each refusal naming its field), the
signature a receiver checks, the outcome of a status, Retry-After, the SSRF guard's rules, and
the resolver that applies them to a real lookup."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
from email.utils import formatdate
from typing import Any

import pytest

from rsched.core.errors import ValidationError
from rsched.core.handlers import AttemptFailed, JobContext
from rsched.core.http_guard import Guard
from rsched.core.http_target import (
    body_excerpt,
    check_target,
    outcome_of,
    parse_secrets,
    retry_after_s,
    signature,
    wrap,
)
from rsched.core.spec import JobSpec, prepare
from rsched.engine.worker.http_target import GuardedResolver, HttpSettings, HttpTargets, Refused
from rsched.engine.worker.runner import FINAL, failed_delay_ms
from rsched.service.inputs import spec_from_json


def test_a_target_gets_its_defaults() -> None:
    assert check_target({"url": "https://example.com/hook"}) == {
        "url": "https://example.com/hook", "method": "POST", "headers": {},
        "timeoutSeconds": 30}
    assert check_target({"url": "http://a.example/x", "method": "put", "body": [1],
                         "headers": {"X-A": "b"}, "timeoutSeconds": 900})["method"] == "PUT"


@pytest.mark.parametrize(("target", "field"), [
    ({}, "target.url"),
    ({"url": "https://example.com/" + "a" * 2048}, "target.url"),
    ({"url": "ftp://example.com/x"}, "target.url"),
    ({"url": "https://user:pw@example.com/x"}, "target.url"),
    ({"url": "https:///nohost"}, "target.url"),
    ({"url": "https://example.com/a b"}, "target.url"),
    ({"url": "https://example.com", "method": "TRACE"}, "target.method"),
    ({"url": "https://example.com", "headers": {"Bad Name": "x"}}, "target.headers.Bad Name"),
    ({"url": "https://example.com", "headers": {"X-A": "a\r\nInjected: 1"}},
     "target.headers.X-A"),
    ({"url": "https://example.com", "headers": {"Host": "evil"}}, "target.headers.Host"),
    ({"url": "https://example.com", "headers": {"content-length": "1"}},
     "target.headers.content-length"),
    ({"url": "https://example.com", "headers": {"Rsched-Run-Id": "x"}},
     "target.headers.Rsched-Run-Id"),
    ({"url": "https://example.com", "headers": {f"X-{i}": "v" for i in range(51)}},
     "target.headers"),
    ({"url": "https://example.com", "headers": {"X-Big": "v" * 16384}}, "target.headers"),
    ({"url": "https://example.com", "timeoutSeconds": 0}, "target.timeoutSeconds"),
    ({"url": "https://example.com", "timeoutSeconds": 900.5}, "target.timeoutSeconds"),
    ({"url": "https://example.com", "retries": 3}, "target.retries"),
])
def test_a_bad_target_is_refused_naming_its_field(target: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        check_target(target)
    assert e.value.field == field


def test_the_api_body_takes_a_target_as_an_http_job_and_refuses_a_mismatch() -> None:
    spec = spec_from_json({"target": {"url": "https://example.com/h"}, "payload": {"a": 1}})
    prep = prepare(spec, "0-abc", 1_700_000_000_000, 65536)
    assert prep.job.type == "http" and prep.job.payload == {"a": 1}
    assert prep.job.target is not None and prep.job.target["method"] == "POST"
    for bad, field in (({"type": "mail", "target": {"url": "https://e.example"}}, "type"),
                       ({"type": "http"}, "target")):
        with pytest.raises(ValidationError) as e:
            prepare(spec_from_json(bad), "0-abc", 1_700_000_000_000, 65536)
        assert e.value.field == field
    with pytest.raises(ValidationError) as e:  # the http type never takes the fast path
        prepare(JobSpec("http"), "0-abc", 1_700_000_000_000, 65536)
    assert e.value.field == "target"


def test_the_signature_has_one_v1_per_secret_that_a_receiver_can_check() -> None:
    body = b'{"order":7}'
    header = signature(("new", "old"), 1_700_000_000, body)
    assert header is not None
    t, *sigs = header.split(",")
    assert t == "t=1700000000" and len(sigs) == 2
    for secret, sig in zip(("new", "old"), sigs, strict=True):
        want = hmac.new(secret.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
        assert sig == "v1=" + want
    assert signature((), 1, body) is None
    assert parse_secrets(" a, ,b ") == ("a", "b") and parse_secrets(None) == ()


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "ok"), (204, "ok"), (408, "retry"), (429, "retry"), (500, "retry"), (503, "retry"),
    (400, "final"), (404, "final"), (410, "final"), (304, "final"),
])
def test_a_status_is_a_success_a_retry_or_final(status: int, outcome: str) -> None:
    assert outcome_of(status) == outcome


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    assert retry_after_s("2", now) == 2.0
    assert retry_after_s(formatdate(now + 30, usegmt=True), now) == pytest.approx(30, abs=1)
    assert retry_after_s(formatdate(now - 30, usegmt=True), now) == 0.0
    assert retry_after_s("soon", now) is None and retry_after_s(None, now) is None


def test_retry_after_raises_the_backoff_up_to_its_cap_and_final_dead_letters() -> None:
    assert failed_delay_ms(AttemptFailed("503", retry_after=2), 1000, 3_600_000) == 2000
    assert failed_delay_ms(AttemptFailed("503", retry_after=2), 4000, 3_600_000) == 4000
    assert failed_delay_ms(AttemptFailed("503", retry_after=7200), 1000, 60_000) == 60_000
    assert failed_delay_ms(AttemptFailed("404", final=True), 1000, 60_000) == FINAL


def test_a_body_excerpt_stays_small_as_json() -> None:
    assert body_excerpt(b"hello") == "hello"
    assert len(body_excerpt(b"\x01" * 100_000)) * 6 <= 8192
    assert body_excerpt(b"\xff") == "\ufffd"


@pytest.mark.parametrize(("address", "refused"), [
    ("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("172.16.0.1", "private"),
    ("192.168.1.1", "private"), ("100.64.0.1", "private"), ("169.254.169.254", "link-local"),
    ("224.0.0.1", "multicast"), ("255.255.255.255", "broadcast"), ("0.0.0.0", "unspecified"),
    ("::1", "loopback"), ("fe80::1", "link-local"), ("fd00::1", "unique-local"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "link-local"),
    ("93.184.216.34", None), ("2606:2800:220:1::1", None),
])
def test_the_guard_refuses_internal_addresses_by_default(address: str,
                                                         refused: str | None) -> None:
    why = Guard().refusal("h.example", ipaddress.ip_address(address), 443)
    assert (why is None) if refused is None else (refused in (why or "") and address in (why or ""))


def test_allow_entries_open_cidrs_hosts_and_ports_and_deny_wins() -> None:
    guard = Guard.of("127.0.0.1:8080,10.1.0.0/16,hooks.internal", "93.184.216.0/24")
    ip = ipaddress.ip_address
    assert guard.refusal("x", ip("127.0.0.1"), 8080) is None
    assert guard.refusal("x", ip("127.0.0.1"), 8081) is not None  # another port
    assert guard.refusal("x", ip("10.1.200.3"), 80) is None
    assert guard.refusal("x", ip("10.2.0.1"), 80) is not None
    assert guard.refusal("hooks.internal", ip("10.9.9.9"), 443) is None
    why = guard.refusal("example.com", ip("93.184.216.34"), 443)
    assert why is not None and "RSCHED_HTTP_DENY" in why
    with pytest.raises(ValidationError) as e:
        Guard.of("not a host!", None)
    assert e.value.field == "RSCHED_HTTP_ALLOW"


def test_a_name_that_resolves_to_loopback_is_refused_without_an_allow_entry() -> None:
    """A real lookup of localhost (the hosts file): refused, naming the address and rule;
    with localhost allowed, the checked addresses are what aiohttp connects to."""
    async def resolve(guard: Guard) -> list[str]:
        resolver = GuardedResolver(guard)
        try:
            return [r["host"] for r in await resolver.resolve("localhost", 8080)]
        finally:
            await resolver.close()

    with pytest.raises(Refused, match=r"address 127\.0\.0\.1 of localhost:8080 is refused: "
                                      r"loopback"):
        asyncio.run(resolve(Guard()))
    assert asyncio.run(resolve(Guard.of("localhost", None))) == ["127.0.0.1"]


def test_the_handler_fails_finally_for_a_name_that_resolves_to_loopback() -> None:
    """Through the handler and aiohttp's connector: the guard's refusal is the error, before
    any connection is made."""
    async def send() -> AttemptFailed:
        handler = HttpTargets(HttpSettings(), 4)
        target = check_target({"url": "http://localhost:9/hook"})
        ctx = JobContext("0-x", "0-x@1", "http", 1, 1, wrap(target, None), "w")
        try:
            await handler(ctx)
        except AttemptFailed as e:
            return e
        finally:
            await handler.close()
        raise AssertionError("sent")

    e = asyncio.run(send())
    assert e.final and str(e).startswith("refused by the SSRF guard: address 127.0.0.1 of "
                                         "localhost:9 is refused: loopback")
