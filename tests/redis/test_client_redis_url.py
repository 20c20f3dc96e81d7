"""Which Redis a Client without a URL uses: RSCHED_REDIS_URL, else the `rsched dev` running in
the working directory (its URL and archive files), else Settings' default; an explicit URL
always wins.  Against a real redis-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

from rsched import Client
from rsched.aclient import AsyncClient
from rsched.core import defaults
from rsched.core.settings import Settings


@pytest.fixture
def demo_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder an `rsched dev` runs in, with no URL variable set."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RSCHED_REDIS_URL", raising=False)
    monkeypatch.delenv("RSCHED_ARCHIVE_URL", raising=False)
    return tmp_path


def leave_dev_files(folder: Path, redis_url: str, archive_url: str) -> None:
    data = folder / defaults.DEV_DATA_DIR
    data.mkdir()
    (data / defaults.DEV_URL_FILE).write_text(redis_url + "\n")  # as rsched dev writes them
    (data / defaults.DEV_ARCHIVE_FILE).write_text(archive_url + "\n")


def test_client_in_the_demo_folder_uses_the_dev_redis_and_its_archive(
    demo_folder: Path, redis_url: str, r: redis.Redis
) -> None:
    archive = f"sqlite:///{demo_folder / 'history.db'}"
    leave_dev_files(demo_folder, redis_url, archive)
    with Client() as client:
        assert (client.settings.redis_url, client.archive_url) == (redis_url, archive)
        job = client.schedule("probe", run_at="2099-01-01T00:00:00Z")
    assert any(job.id.encode() in k for k in r.scan_iter(match="rsched:*:job:*"))

    async def read() -> tuple[str, str | None, str]:
        client = AsyncClient()
        try:
            return client.settings.redis_url, client.archive_url, (await client.get(job.id)).type
        finally:
            await client.close()

    assert asyncio.run(read()) == (redis_url, archive, "probe")


def test_an_explicit_url_or_rsched_redis_url_wins_over_the_dev_redis(
    demo_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leave_dev_files(demo_folder, "redis://:pw@127.0.0.1:1/0", "sqlite:///dev.db")
    given = "redis://127.0.0.1:2/0"
    with Client(given) as client:  # no connection is made until a command
        assert (client.settings.redis_url, client.archive_url) == (given, None)
    monkeypatch.setenv("RSCHED_REDIS_URL", given)
    with Client() as client:
        assert (client.settings.redis_url, client.archive_url) == (given, None)


def test_without_a_url_or_an_rsched_dev_the_client_uses_the_settings_default(
    demo_folder: Path,
) -> None:
    with Client() as client:
        assert client.settings.redis_url == Settings().redis_url
        assert client.archive_url is None
