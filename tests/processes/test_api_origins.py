"""Cross-site requests and DNS rebinding against a real `rsched api`: it answers only trusted
Host names, takes request bodies only as JSON (415), refuses writes a page of another origin
sends, and will not serve --no-auth to the network unless told so twice (rsched.api.browser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.api_process import Api, running_api
from support.processes import Proc, wait_for
from support.redis_server import RedisServer, free_port

from rsched.api.app import API_ROUTES

pytestmark = pytest.mark.slow

# Some job id: a route that takes a body answers 404 for it once the body is accepted.
JOB = "p0-0000000000000000000000"
BODY_ROUTES = sorted({(m, p.replace("{id}", JOB).replace("{runId}", "r0-x").replace(
    "{keyId}", "k")) for m, p, _, _ in API_ROUTES if m in ("POST", "PATCH")})


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    redis_server.resume()
    with running_api(redis_server.url, tmp_path_factory.mktemp("origins")) as a:
        yield a


def is_problem(res: httpx.Response, status: int) -> bool:
    return res.status_code == status and \
        res.headers["content-type"] == "application/problem+json" and res.json()["status"] == status


@pytest.mark.parametrize("path", ["/healthz", "/jobs", "/ui/", "/docs", "/metrics",
                                  "/openapi.json"])
def test_a_host_name_that_is_not_loopback_is_refused_421_when_bound_to_loopback(
    api: Api, path: str
) -> None:
    # A page whose name its attacker made resolve to 127.0.0.1 sends its own name as Host.
    with api.http(api.admin, Host=f"rebind.example:{api.port}") as http:
        res = http.get(path)
    assert is_problem(res, 421), res.text
    assert "rebind.example" in res.json()["detail"] and "--allowed-host" in res.json()["detail"]


@pytest.mark.parametrize("host", ["127.0.0.1:{port}@rebind.example", "localhost:x",
                                  "[::1]rebind.example", "", "localhost.rebind.example"])
def test_a_host_header_that_only_starts_like_a_loopback_name_is_refused(api: Api,
                                                                        host: str) -> None:
    # Starlette builds a redirect's absolute URL from Host: it must never get this far.
    with api.http(api.read, Host=host.format(port=api.port)) as http:
        assert is_problem(http.get("/jobs/"), 421)


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST",
                                  "[::1]:{port}", "localhost.:{port}"])
def test_the_loopback_names_are_answered(api: Api, host: str) -> None:
    with api.http(api.read, Host=host.format(port=api.port)) as http:
        assert http.get("/jobs").status_code == 200


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
@pytest.mark.parametrize("content_type", [
    "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", None,
])
def test_every_body_route_refuses_a_body_that_is_not_json_415(
    api: Api, method: str, path: str, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    with api.http(api.admin) as http:
        res = http.request(method, path, content=b'{"type": "x"}', headers=headers)
        assert is_problem(res, 415), (res.status_code, res.text)
        assert res.json()["errors"][0]["field"] == "Content-Type"
        assert http.get("/jobs", params={"type": "x"}).json()["jobs"] == []


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON", "application/merge-patch+json"])
def test_json_in_its_spellings_is_taken(api: Api, content_type: str) -> None:
    with api.http(api.admin) as http:
        res = http.post("/jobs", content=json.dumps({"type": "json-ok"}),
                        headers={"Content-Type": content_type})
        assert res.status_code == 201, res.text


def test_a_post_without_a_body_needs_no_content_type(api: Api) -> None:
    with api.http(api.admin) as http:
        job = http.post("/jobs", json={"type": "bodyless", "cron": "0 0 1 1 *"}).json()
        res = http.post(f"/jobs/{job['id']}/pause")
        assert res.status_code == 200, res.text


def test_a_write_from_a_page_of_another_origin_is_refused_and_changes_nothing(api: Api) -> None:
    with api.http(api.admin) as http:
        job = http.post("/jobs", json={"type": "origin", "cron": "0 0 1 1 *"}).json()
        for origin in ("http://evil.example", "null", f"http://localhost:{api.port + 1}",
                       f"http://127.0.0.1.evil.example:{api.port}",
                       "http://127.0.0.1:port", "http://[::1", "javascript:x", ""):
            res = http.post(f"/jobs/{job['id']}/pause", headers={"Origin": origin})
            assert is_problem(res, 403), (origin, res.text)
        assert http.get(f"/jobs/{job['id']}").json()["status"] == "scheduled"
        # Reads are not writes: a GET with an Origin goes through (CORS keeps its answer from
        # another page), and so does a write from this server's own pages.
        assert http.get("/jobs", headers={"Origin": "http://evil.example"}).status_code == 200
        res = http.post(f"/jobs/{job['id']}/pause",
                        headers={"Origin": f"http://127.0.0.1:{api.port}"})
        assert res.status_code == 200, res.text


def test_allowed_hosts_replace_the_loopback_names(redis_server: RedisServer,
                                                  tmp_path: Path) -> None:
    redis_server.resume()
    (tmp_path / "b").mkdir()
    with running_api(redis_server.url, tmp_path, "--allowed-host", "127.0.0.1",
                     env={"RSCHED_ALLOWED_HOSTS": "ignored.example"}) as a, \
            running_api(redis_server.url, tmp_path / "b",
                        env={"RSCHED_ALLOWED_HOSTS": "sched.example.com,*.corp.example"}) as b:
        with a.http(a.read, Host="localhost") as http:
            assert is_problem(http.get("/jobs"), 421)  # the flag wins over the variable
        for host, status in (("sched.example.com", 200), ("x.corp.example:443", 200),
                             ("corp.example", 421), ("localhost", 421),
                             ("evil.sched.example.com", 421)):
            with b.http(b.read, Host=host) as http:
                assert http.get("/jobs").status_code == status, host


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rsched.cli", *args], env=env, text=True,
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def test_no_auth_on_a_network_address_is_refused_with_one_line_naming_the_flags(
    redis_server: RedisServer,
) -> None:
    env = dict(os.environ, RSCHED_REDIS_URL=redis_server.url)
    for host in ("0.0.0.0", "::", "192.0.2.1", "sched.example.com"):
        res = run_cli("api", "--no-auth", "--host", host, "--port", str(free_port()), env=env)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert "--no-auth" in lines[0] and "--no-auth-on-network" in lines[0]
        assert "Traceback" not in res.stderr


def test_no_auth_on_the_network_when_said_twice_takes_only_json_and_redirects_relatively(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    redis_server.resume()
    port = free_port()
    env = dict(os.environ, RSCHED_REDIS_URL=redis_server.url, PYTHONUNBUFFERED="1")
    proc = Proc("api", ["api", "--no-auth", "--no-auth-on-network", "--host", "0.0.0.0",
                        "--port", str(port)], env, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for("api ready", lambda: httpx.get(f"{base}/readyz").status_code == 200, [proc])
        with httpx.Client(base_url=base, headers={"Host": "evil.example"}) as http:
            # Bound to every interface with no list: any name is answered...
            assert http.get("/healthz").status_code == 200
            # ...and the redirect to the dashboard does not repeat it.
            res = http.get("/ui", follow_redirects=False)
            assert res.status_code == 308 and res.headers["location"] == "ui/"
            res = http.get("/ui?x=1", follow_redirects=False)
            assert res.headers["location"] == "ui/?x=1"
            # What a page's no-cors fetch sends: text/plain, no key.  No job.
            res = http.post("/jobs", content=b'{"type":"csrf"}',
                            headers={"Content-Type": "text/plain;charset=UTF-8"})
            assert is_problem(res, 415)
            assert http.get("/jobs", params={"type": "csrf"}).json()["jobs"] == []
    finally:
        proc.stop()
