"""The dashboard and /docs under their Content-Security-Policy in real headless Chromium, against
a real `rsched api`: every page works with no console error and no policy violation, the
security headers are there, and no page of another origin can frame them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.api_process import Api, running_api
from support.browser import ARTIFACTS, UI_TIMEOUT_MS
from support.redis_server import RedisServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Collects what the policy refused, in every frame, from the first script on.
WATCH_CSP = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}`));
"""
HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    redis_server.resume()
    with running_api(redis_server.url, tmp_path_factory.mktemp("csp")) as a:
        with a.http(a.admin) as http:
            http.post("/jobs", json={"type": "csp", "cron": "*/5 * * * *",
                                     "payload": {"n": 1}}).raise_for_status()
        yield a


class Watched:
    """A page whose console errors, page errors and CSP violations are collected."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1300, "height": 900})
        self.context.add_init_script(WATCH_CSP)
        self.page = self.context.new_page()
        self.page.set_default_timeout(UI_TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def problems(self) -> list[str]:
        return self.errors + list(self.page.evaluate("window.__violations"))


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    w = Watched(browser)
    try:
        yield w
    finally:
        w.context.close()


def check_headers(headers: dict[str, str]) -> None:
    csp = headers.get("content-security-policy", "")
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    assert directives.get("default-src") == ["'self'"], csp
    assert directives.get("frame-ancestors") == ["'none'"], csp
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    assert "script-src" not in directives and "style-src" not in directives  # 'self' only
    for name, value in HEADERS.items():
        assert headers.get(name) == value, (name, headers)


def test_every_dashboard_page_works_under_its_policy_with_no_console_error(
    api: Api, watched: Watched
) -> None:
    page = watched.page
    res = page.goto(f"{api.base}/ui/#key={api.admin}")
    check_headers(res.all_headers())
    page.wait_for_selector("#who >> text=http-admin")
    page.wait_for_selector("[data-test=workers]")
    page.goto(f"{api.base}/ui/#/jobs")
    page.wait_for_selector("tr[data-job]")
    page.click("tr[data-job] a")
    page.wait_for_selector("h1 [data-status=scheduled]")
    page.wait_for_selector("ol.preview li")
    page.goto(f"{api.base}/ui/#/dead-letters")
    page.wait_for_selector("text=Dead letters")
    page.goto(f"{api.base}/ui/#/limits")
    page.fill("input[name=name]", "csp-*")
    page.fill("input[name=concurrency]", "2")
    page.click("[data-test=limit-form] button[type=submit]")
    page.wait_for_selector("tr[data-limit='csp-*']")
    page.goto(f"{api.base}/ui/#/")
    page.wait_for_selector("[data-test=workers]")
    page.wait_for_timeout(1500)  # charts and the overview's refresh run once more
    # Styles the scripts set (a chart key's colour) apply: through the CSSOM, not as markup.
    colour = page.eval_on_selector(".chart .key i", "e => getComputedStyle(e).backgroundColor")
    assert colour not in ("", "rgba(0, 0, 0, 0)", "transparent"), colour
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-under-csp.png"), full_page=True)
    assert watched.problems() == []


def test_the_dashboards_files_and_the_api_answers_it_reads_carry_their_headers(
    api: Api, watched: Watched
) -> None:
    seen: dict[str, dict[str, str]] = {}
    watched.page.on("response", lambda r: seen.setdefault(r.url, r.all_headers()))
    watched.page.goto(f"{api.base}/ui/#key={api.read}")
    watched.page.wait_for_selector("#who >> text=http-reader")
    wanted = {"/ui/", "/ui/app.js", "/ui/style.css", "/ui/session", "/status", "/metrics"}

    def by_path() -> dict[str, dict[str, str]]:
        return {u.removeprefix(api.base).partition("?")[0]: h for u, h in list(seen.items())}

    for _ in range(200):  # the overview's first reads may still be on their way
        if wanted <= set(by_path()):
            break
        watched.page.wait_for_timeout(100)
    assert wanted <= set(by_path()), by_path()
    for path, headers in by_path().items():
        if path.startswith("/ui"):
            check_headers(headers)
        else:  # the API's JSON: kept from caches and from sniffing
            assert headers["cache-control"] == "no-store", path
            assert headers["x-content-type-options"] == "nosniff", path
    assert watched.problems() == []


def test_the_sign_in_field_is_a_password_field(api: Api, watched: Watched) -> None:
    watched.page.goto(f"{api.base}/ui/")
    assert watched.page.get_attribute("input[name=key]", "type") == "password"


def test_docs_renders_and_sends_under_the_policy(api: Api, watched: Watched) -> None:
    page = watched.page
    res = page.goto(f"{api.base}/docs")
    check_headers(res.all_headers())
    assert "<script>" not in res.text() and "<style>" not in res.text() and "style=" not in \
        res.text()
    assert page.get_attribute("#key", "type") == "password"
    page.wait_for_selector("details >> text=/healthz")
    page.fill("#key", api.read)
    page.dispatch_event("#key", "change")
    op = page.locator("details", has=page.locator(".path", has_text="/status")).first
    op.locator("summary").click()
    op.locator("button", has_text="Send").click()
    page.wait_for_selector("pre >> text=200 OK")
    assert watched.problems() == []


@pytest.mark.parametrize("path", ["/ui/", "/docs"])
def test_a_page_of_another_origin_cannot_frame_them(api: Api, watched: Watched, path: str
                                                    ) -> None:
    page = watched.page
    # about:blank holds the frame: an origin that is not the API's.
    page.set_content(f'<iframe id="f" src="{api.base}{path}" width="800" height="600"></iframe>')
    page.wait_for_timeout(1500)
    frame = page.frame_locator("#f")
    assert frame.locator("#who, #ops").count() == 0
    blocked = [f for f in page.frames if f != page.main_frame]
    assert blocked and all(not f.url.startswith(api.base) or f.is_detached()
                           or f.evaluate("document.body === null || document.body.innerHTML === ''")
                           for f in blocked), [f.url for f in blocked]


ATTACK = """<!doctype html><title>a page elsewhere</title><script>
window.sent = (async () => {
  const opts = {method: "POST", mode: "no-cors"};
  // What no page may do without asking: a text/plain body, a form body, no body at all.
  await fetch(API + "/jobs", {...opts, body: '{"type": "csrf"}'});
  await fetch(API + "/jobs", {...opts, body: new URLSearchParams({type: "csrf"})});
  await fetch(API + "/jobs/" + JOB + "/pause", opts);
  return true;
})();
</script>"""


@contextmanager
def elsewhere(html: str) -> Iterator[str]:
    """A page served from another origin (another port) on this machine."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_page_of_another_origin_cannot_write_to_an_api_without_keys(
    redis_server: RedisServer, tmp_path: Path, watched: Watched
) -> None:
    """The attack of a page on another origin against `rsched api --no-auth` on loopback: each
    request reaches the API (its answer is seen here) and is refused; nothing changes."""
    redis_server.resume()
    with running_api(redis_server.url, tmp_path, "--no-auth") as api, api.http() as http:
        job = http.post("/jobs", json={"type": "target", "cron": "0 0 1 1 *"}).json()
        page = watched.page
        answers: dict[str, int] = {}
        page.on("response", lambda r: answers.setdefault(
            f"{r.request.method} {r.url.removeprefix(api.base)} "
            f"{r.request.headers.get('content-type', '-')}", r.status))
        html = ATTACK.replace("API +", f'"{api.base}" +').replace("JOB", f'"{job["id"]}"')
        with elsewhere(html) as origin:
            page.goto(origin)
            assert page.evaluate("window.sent") is True
        # Chromium sends Origin with each: refused on it, before the body's type (a client
        # that sends no Origin gets the 415, test_api_origins.py).
        writes = {k: v for k, v in answers.items() if k.startswith("POST")}
        assert writes == {
            "POST /jobs text/plain;charset=UTF-8": 403,
            "POST /jobs application/x-www-form-urlencoded;charset=UTF-8": 403,
            f"POST /jobs/{job['id']}/pause -": 403,
        }, answers
        assert http.get("/jobs", params={"type": "csrf"}).json()["jobs"] == []
        assert http.get(f"/jobs/{job['id']}").json()["status"] == "scheduled"
