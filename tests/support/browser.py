"""Headless Chromium for the browser tests: where it is, how it is started, how long a page may
take, and where screenshots of failures go."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ARTIFACTS = TESTS / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
UI_TIMEOUT_MS = 20_000
