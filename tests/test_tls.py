"""rsched over TLS (rediss://): a redis-server with a TLS-only port and a self-signed
certificate made here with the openssl CLI; a job scheduled and run by a real dispatcher and
worker through that port.  (The TLS cluster and Sentinel schemes share this code path per
node, rdb.connect.Target.node_url, but are not started here.)"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
from helpers import run_engine
from redis_server import RedisServer, free_port

from rsched import App, Client, JobContext
from rsched.core.settings import Settings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="the openssl CLI makes the test certificate")


def self_signed(dir: Path) -> tuple[Path, Path]:
    cert, key = dir / "cert.pem", dir / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60)
    return cert, key


def test_a_job_is_scheduled_and_run_over_rediss(redis_available: None, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls_port = free_port()
    server = RedisServer(extra_args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"])
    server.start()
    try:
        url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}"
        with redis.Redis(port=tls_port, socket_timeout=2) as plain, \
                pytest.raises(redis.exceptions.ConnectionError):
            plain.ping()  # the port speaks TLS only: rsched below really used it
        ran: list[str] = []
        app = App("tls")

        @app.job("t")
        def t(ctx: JobContext) -> None:
            ran.append(ctx.run_id)

        with Client(settings=Settings(redis_url=url)) as c:
            job = c.schedule("t", {"n": 1})
            asyncio.run(run_engine(url, app, lambda: len(ran) == 1, timeout_s=30))
            assert c.get(job.id).status.value == "completed"
        assert ran == [f"{job.id}@{job.next_ms}"]
    finally:
        server.close()
