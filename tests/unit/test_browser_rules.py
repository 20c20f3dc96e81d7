"""The rules of rsched.api.browser on their own: which bodies are JSON, which Host names and
origins are this server's, which bind addresses are loopback."""

from __future__ import annotations

import pytest

from rsched.api.browser import (
    HostPolicy,
    default_hosts,
    is_json,
    is_loopback,
    parse_hosts,
    same_origin,
)


@pytest.mark.parametrize(("content_type", "json"), [
    ("application/json", True), ("application/json; charset=utf-8", True),
    ("APPLICATION/JSON", True), ("application/merge-patch+json", True),
    ("application/problem+json;charset=UTF-8", True), (" application/json ", True),
    ("text/plain", False), ("text/json", False), ("application/jsonp", False),
    ("application/x-www-form-urlencoded", False), ("multipart/form-data; boundary=x", False),
    ("application/json5", False), ("", False), ("json", False),
])
def test_which_content_types_are_json(content_type: str, json: bool) -> None:
    assert is_json(content_type) is json


@pytest.mark.parametrize(("origin", "host", "same"), [
    ("http://127.0.0.1:8600", "127.0.0.1:8600", True),
    ("http://LOCALHOST:8600", "localhost:8600", True),
    ("http://[::1]:8600", "[::1]:8600", True),
    ("https://sched.example.com", "sched.example.com", True),
    ("https://sched.example.com", "sched.example.com:443", True),
    ("http://sched.example.com", "sched.example.com:80", True),
    ("http://localhost:3000", "localhost:8600", False),
    ("http://evil.example:8600", "127.0.0.1:8600", False),
    ("https://sched.example.com", "sched.example.com:8600", False),
    ("null", "127.0.0.1:8600", False),
    ("file://", "127.0.0.1:8600", False),
    ("http://127.0.0.1:8600", None, False),
    ("http://[::1", "[::1]:8600", False),
    ("http://127.0.0.1:x", "127.0.0.1:8600", False),
])
def test_which_origins_are_this_server(origin: str, host: str | None, same: bool) -> None:
    assert same_origin(origin, host) is same


@pytest.mark.parametrize(("bind", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("localhost", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("::", False), ("", False), ("192.0.2.1", False),
    ("sched.example.com", False),
])
def test_which_bind_addresses_are_loopback(bind: str, loopback: bool) -> None:
    assert is_loopback(bind) is loopback
    assert (default_hosts(bind) is not None) is loopback


def test_the_hosts_answered() -> None:
    loopback = HostPolicy(default_hosts("127.0.0.2"))
    for host in ("127.0.0.2:8600", "localhost", "[::1]:1", "127.0.0.1:8600", None):
        assert loopback.host_allowed(host), host
    for host in ("rebind.example:8600", "127.0.0.1:8600@x.example", "", "127.0.0.1.nip.io"):
        assert not loopback.host_allowed(host), host
    listed = HostPolicy(parse_hosts(["sched.example.com, *.corp.example", " LB.Example. "]))
    for host in ("sched.example.com", "a.corp.example:443", "b.a.corp.example", "lb.example"):
        assert listed.host_allowed(host), host
    for host in ("corp.example", "xcorp.example", "localhost", "sched.example.com.evil"):
        assert not listed.host_allowed(host), host
    assert HostPolicy(None).host_allowed("anything") and HostPolicy(["*"]).host_allowed("x")
