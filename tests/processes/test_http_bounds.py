"""What one client may hold of a real `rsched api` before any key is checked: the size and count
of a request's headers, how long it may take to send them and its body, how long an idle
connection stays open, and how many connections are open at once (rsched.api.server)."""

from __future__ import annotations

import json
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.api_process import Api, read_until_closed, running_api, send_all, wait_closed
from support.redis_server import RedisServer

from rsched.core import defaults

pytestmark = pytest.mark.slow

HEAD_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 2
MAX_CONNECTIONS = 6
# How late past its timeout a connection may close on a busy machine; without the bound it
# stays open for good.
SLACK_S = 12.0


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    redis_server.resume()
    with running_api(redis_server.url, tmp_path_factory.mktemp("bounds"),
                     "--head-timeout", str(HEAD_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S),
                     "--keep-alive", str(KEEP_ALIVE_S),
                     "--max-connections", str(MAX_CONNECTIONS)) as a:
        yield a


@pytest.fixture(autouse=True)
def closing(api: Api) -> Iterator[None]:
    yield
    api.close_sockets()


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def head(path: str, port: int, *extra: bytes) -> bytes:
    return b"\r\n".join([f"GET {path} HTTP/1.1".encode(), f"Host: 127.0.0.1:{port}".encode(),
                         *extra, b"", b""])


def test_a_request_within_the_bounds_is_answered(api: Api) -> None:
    s = api.connect()
    filler = [f"X-Filler-{i}: {'v' * 100}".encode() for i in range(defaults.MAX_HEADERS - 2)]
    s.sendall(head("/healthz", api.port, b"Connection: close", *filler))
    assert status_of(read_until_closed(s)) == 200


def test_a_50_mb_header_is_refused_431_while_it_arrives(api: Api) -> None:
    s = api.connect()
    start = time.monotonic()
    send_all(s, head("/healthz", api.port, b"X-Big: " + b"a" * (50 << 20)))
    got = read_until_closed(s)
    assert status_of(got) == 431, got[:300]
    assert b"request line and headers over" in got
    assert b"\r\nx-content-type-options: nosniff\r\n" in got
    # Refused at the limit, not after taking all 50 MB in: the send failed early.
    assert time.monotonic() - start < 30


def test_a_request_the_parser_cannot_read_is_answered_400_as_a_problem(api: Api) -> None:
    s = api.connect()
    s.sendall(b"PATCH /jobs/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n"
              b"Content-Length: 2\r\n\r\n{}")
    got = read_until_closed(s)
    assert status_of(got) == 400, got[:300]
    assert b"\r\ncontent-type: application/problem+json\r\n" in got
    assert got.endswith(b'"detail":"not a valid HTTP/1.1 request"}')


def test_ten_thousand_headers_are_refused_431(api: Api) -> None:
    s = api.connect()
    many = [f"X-{i}: 1".encode() for i in range(10_000)]
    send_all(s, head("/healthz", api.port, *many))
    got = read_until_closed(s)
    assert status_of(got) == 431
    assert f"more than {defaults.MAX_HEADERS} header lines".encode() in got


def test_a_header_count_over_the_limit_by_one_is_refused(api: Api) -> None:
    s = api.connect()
    many = [f"X-{i}: 1".encode() for i in range(defaults.MAX_HEADERS)]  # + Host
    s.sendall(head("/healthz", api.port, *many))
    assert status_of(read_until_closed(s)) == 431


def test_a_head_sent_a_line_every_half_second_is_cut_off_with_408(api: Api) -> None:
    s = api.connect()
    s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{api.port}\r\n".encode())
    start = time.monotonic()
    while time.monotonic() - start < HEAD_TIMEOUT_S + SLACK_S:
        readable, _, _ = select.select([s], [], [], 0.5)  # the answer, or the close, came
        if readable or not send_all(s, b"X-Slow: 1\r\n"):
            break
    got, _ = wait_closed(s, 5)
    took = time.monotonic() - start
    assert status_of(got) == 408, got
    assert HEAD_TIMEOUT_S - 0.5 < took < HEAD_TIMEOUT_S + SLACK_S


def test_a_connection_that_sends_nothing_is_closed(api: Api) -> None:
    s = api.connect()
    got, took = wait_closed(s, HEAD_TIMEOUT_S + SLACK_S)
    assert got == b""  # nothing was asked: nothing to answer
    assert HEAD_TIMEOUT_S - 0.5 < took


def test_an_idle_kept_alive_connection_is_closed(api: Api) -> None:
    s = api.connect()
    s.sendall(head("/healthz", api.port))
    got, took = wait_closed(s, KEEP_ALIVE_S + SLACK_S)
    assert status_of(got) == 200
    assert got.endswith(b'{"status":"ok"}')  # and nothing after the answer
    assert KEEP_ALIVE_S - 0.5 < took


def test_a_body_that_stops_coming_is_cut_off_with_408_and_nothing_is_stored(api: Api) -> None:
    s = api.connect()
    body = json.dumps({"type": "slow-body", "payload": {"n": 1}}).encode()
    s.sendall(b"\r\n".join([
        b"POST /jobs HTTP/1.1", f"Host: 127.0.0.1:{api.port}".encode(),
        f"Authorization: Bearer {api.admin}".encode(), b"Content-Type: application/json",
        f"Content-Length: {len(body)}".encode(), b"", body[:5]]))
    got, took = wait_closed(s, BODY_TIMEOUT_S + SLACK_S)
    assert status_of(got) == 408, got
    assert b"request body not complete" in got
    assert BODY_TIMEOUT_S - 0.5 < took
    with api.http(api.read) as http:
        assert http.get("/jobs", params={"type": "slow-body"}).json()["jobs"] == []


def test_connections_past_the_limit_are_answered_503_and_closed_at_once(api: Api) -> None:
    for _ in range(MAX_CONNECTIONS):
        api.connect()
    try:
        # Each held connection is open (it would time out, not be refused)...
        extra = api.connect()
        got, took = wait_closed(extra, 5)
        assert status_of(got) == 503, got
        assert took < 5
    finally:
        api.close_sockets()
    # ...and once they are gone, a new one is served.
    deadline = time.monotonic() + 10
    while True:
        s = api.connect()
        s.sendall(head("/healthz", api.port, b"Connection: close"))
        got = read_until_closed(s)
        if status_of(got) == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status_of(got) == 200


def test_the_bounds_are_settable_and_checked_at_start(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rsched.cli.main import cli

    res = CliRunner().invoke(cli, ["api", "--max-headers", "0"])
    assert res.exit_code == 2 and "--max-headers" in res.output
