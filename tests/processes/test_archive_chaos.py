"""The archiver as real processes under faults: SIGKILL mid-batch, and Postgres going away.

`python -m rsched.cli archiver` runs against the session's redis-server and a fresh archive
(SQLite file or Postgres schema).  The Postgres outage goes through a TCP proxy this test owns
and cuts, never the machine's shared server.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from support.archive import PARTITIONS, archive_url, produce, redis_ids, store, stored  # noqa: F401
from support.redis_server import free_port

from rsched import Client
from rsched.archive import Store, archive_lag, open_store
from rsched.rdb import keys

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.chaos


def spawn(redis_url: str, url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, RSCHED_ARCHIVE_BACKOFF_BASE_MS="50", RSCHED_ARCHIVE_BACKOFF_CAP_MS="400")
    cmd = [sys.executable, "-m", "rsched.cli", "--redis-url", redis_url, "archiver",
           "--archive-url", url, "--poll-ms", "20", *args]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(what: str, cond: Callable[..., bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def count(archive: Store) -> int:
    return int(archive.fetchall("SELECT count(*) FROM events")[0][0])


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the archiver did not stop on SIGTERM") from None


@pytest.mark.slow
def test_sigkill_at_random_points_of_batches_loses_and_duplicates_nothing(
    redis_url: str, r: redis.Redis, store: Store, archive_url: str, tmp_path: Path,  # noqa: F811
) -> None:
    r.hset(keys.config(), "partitions", PARTITIONS)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    expected = produce(r, 3000)
    log = tmp_path / "archiver.log"
    done = threading.Event()
    more: list[tuple[int, int, int]] = []

    def engine() -> None:  # keeps appending while archivers die
        with redis.Redis.from_url(redis_url) as client:
            while not done.is_set():
                more.extend(produce(client, 30))
                time.sleep(0.05)

    producer = threading.Thread(target=engine)
    producer.start()
    kills: list[tuple[int, int]] = []
    try:
        # At least 5 kills, and more (up to 20) until one lands inside a batch: a fast archiver
        # (SQLite) is often idle between the producer's small appends, and a kill between
        # batches proves nothing.
        for i in range(20):
            if i >= 5 and any(pending for pending, _ in kills):
                break
            # Even rounds restart under the same id (it resumes its own pending batch); odd ones
            # use a fresh id, leaving the dead one's batch to be claimed after claim-idle-ms.
            ident = ["--id", "steady"] if i % 2 == 0 else []
            more.extend(produce(r, 1500))  # a backlog, so the kill finds the archiver busy
            before = count(store)
            proc = spawn(redis_url, archive_url, log, "--batch", "100", "--claim-idle-ms", "500",
                         *ident)
            wait_for("the archiver to commit something",
                     lambda before=before: count(store) > before)
            time.sleep(rng.uniform(0.0, 0.15))
            proc.kill()  # SIGKILL: wherever it is in a batch
            proc.wait()
            pending = sum(r.xpending(keys.events(p), keys.EVENTS_GROUP)["pending"]
                          for p in range(PARTITIONS))
            committed_unacked = len(set(stored(store)) & set(redis_ids(r)))
            kills.append((pending, committed_unacked))
    finally:
        done.set()
        producer.join(30)
    final = spawn(redis_url, archive_url, log, "--batch", "100", "--claim-idle-ms", "500")
    try:
        wait_for("the backlog to drain", lambda: archive_lag(r, PARTITIONS).entries == 0, 90)
    finally:
        assert stop(final) == 0
    everything = sorted(expected + more)
    got = stored(store)
    assert len(got) == len(set(got)), f"duplicates (seed {seed})"
    assert got == everything, f"lost {len(set(everything) - set(got))} events (seed {seed})"
    assert redis_ids(r) == []  # acknowledged and trimmed
    # The kills landed inside batches: entries were left delivered but unacknowledged.
    assert any(pending for pending, _ in kills), f"kills {kills} (seed {seed})"
    print(f"seed {seed}: (pending, committed but unacknowledged) after each kill: {kills}")


class TcpProxy:
    """127.0.0.1:<port> -> target; cut() refuses and drops connections, restore() reopens."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.mark.postgres
@pytest.mark.parametrize("archive_url", ["postgres"], indirect=True)
def test_while_postgres_is_unreachable_events_wait_in_redis_and_then_catch_up(
    redis_url: str, r: redis.Redis, archive_url: str, tmp_path: Path,  # noqa: F811
) -> None:
    r.hset(keys.config(), "partitions", PARTITIONS)
    parts = urlsplit(archive_url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    via_proxy = parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()
    direct = open_store(archive_url)
    log = tmp_path / "archiver.log"
    proc = spawn(redis_url, via_proxy, log, "--backlog-warn", "500", "--batch", "200")
    client = Client(redis_url)
    try:
        expected = produce(r, 100)
        wait_for("the first events to be archived", lambda: count(direct) == len(expected))

        proxy.cut()  # Postgres is gone for the archiver (and only for it)
        expected += produce(r, 300)
        job = client.schedule("email", {"to": "a@x"}, run_at=int(time.time() * 1000) + 3_600_000)
        expected_in_redis = 900 + 1  # the engine keeps running: its 'scheduled' event waits too
        wait_for("the archiver to notice", lambda: log.read_text().count(
            "archive store unavailable") >= 3, 30)
        lag = archive_lag(r, PARTITIONS)
        assert lag.entries == expected_in_redis and lag.seconds > 0
        assert len(redis_ids(r)) == expected_in_redis
        assert len(stored(direct)) == 300  # nothing new landed, nothing was acknowledged
        text = log.read_text()
        assert "events wait in Redis" in text and "archive backlog: " in text
        assert proc.poll() is None  # still running, retrying with capped backoff

        proxy.restore()
        wait_for("the archive to catch up", lambda: archive_lag(r, PARTITIONS).entries == 0, 60)
        got = stored(direct)
        assert set(expected) <= set(got) and len(got) == len(expected) + 1
        [(event,)] = direct.fetchall("SELECT event FROM events WHERE job_id = ?", [job.id])
        assert event == "scheduled"
        assert redis_ids(r) == []
    finally:
        code = stop(proc)
        proxy.cut()
        client.close()
        direct.close()
    assert code == 0
