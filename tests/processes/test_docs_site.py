"""The documentation site as a reader gets it: `mkdocs serve` (what docs/ and the README tell a
contributor to run) serves the built pages, and headless Chromium shows three of them, with
screenshots kept in tests/artifacts/docs-*.png."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.browser import ARTIFACTS, UI_TIMEOUT_MS
from support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mkdocs serve` on a free port, once it answers; stopped after."""
    port = free_port()
    log = tmp_path_factory.mktemp("mkdocs") / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "mkdocs"), "serve", "--strict", "--no-livereload",
             "-a", f"127.0.0.1:{port}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(base + "/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.parametrize(("path", "title", "shows"), [
    ("/", "rsched", "Guarantees"),
    ("/guarantees/", "Guarantees", "tests/processes/test_failover.py"),
    ("/reference/http-api/", "HTTP API", "POST /jobs/{id}/backfill"),
])
def test_mkdocs_serve_shows_the_page_in_chromium(site: str, browser: Any, path: str, title: str,
                                                 shows: str) -> None:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    try:
        response = page.goto(site + path, timeout=UI_TIMEOUT_MS)
        assert response is not None and response.status == 200
        heading = page.locator("article h1").first.inner_text(timeout=UI_TIMEOUT_MS)
        assert heading.removesuffix("¶").strip() == title  # ¶: the heading's permalink
        assert shows in page.locator("article").inner_text()
        # The navigation lists every section of the site.
        nav = page.locator("nav.md-nav--primary").first.inner_text()
        for section in ("Getting started", "Concepts", "Operating it", "Reference", "Internals"):
            assert section in nav
        ARTIFACTS.mkdir(exist_ok=True)
        name = path.strip("/").replace("/", "-") or "home"
        page.screenshot(path=str(ARTIFACTS / f"docs-{name}.png"))
    finally:
        page.close()


@pytest.mark.parametrize(("change", "says"), [
    ("orphan", "not included in the \"nav\""),
    ("broken link", "not found among documentation files"),
    ("broken anchor", "does not contain an anchor"),
])
def test_the_strict_build_fails_on_a_page_left_out_of_the_nav_a_broken_link_or_anchor(
        tmp_path: Path, change: str, says: str) -> None:
    """`make docs` builds with --strict, and this configuration makes each of these a warning,
    so each fails the build (a copy of the site's sources, one fault added)."""
    for name in ("docs", "lua", "deploy"):  # the pages include snippets of lua/ and deploy/
        shutil.copytree(ROOT / name, tmp_path / name)
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    index = tmp_path / "docs" / "index.md"
    if change == "orphan":
        (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    elif change == "broken link":
        index.write_text(index.read_text() + "\n[gone](gone.md)\n")
    else:
        index.write_text(index.read_text() + "\n[gone](concepts.md#no-such-heading)\n")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-d",
         str(tmp_path / "site")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        check=False, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert says in out
    assert "Aborted with 1 warnings in strict mode" in out
