"""rsched over TLS (rediss://): a redis-server with a TLS-only port and a self-signed
certificate made here with the openssl CLI; a job scheduled and run by a real dispatcher and
worker through that port; the same on a 3-master cluster whose bus and client ports are TLS
(rediss+cluster://) and through 3 Sentinels and a primary + replica on TLS ports
(rediss+sentinel://)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
from support.helpers import run_engine
from support.redis_probe import NotYet, command, replicating_from, wait_for
from support.redis_sentinel import SentinelServer
from support.redis_server import RedisCluster, RedisServer, free_port

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


def test_a_job_is_scheduled_and_run_over_a_tls_cluster(redis_available: None,
                                                       tmp_path: Path) -> None:
    """rediss+cluster://: the cluster bus and clients on TLS ports; CLUSTER SLOTS names the TLS
    ports to a TLS client, and each node client is made with the rediss scheme."""
    cert, key = self_signed(tmp_path)
    cluster = RedisCluster()  # no replicas: wait_replicas=0 below
    tls: dict[RedisServer, int] = {}
    for node in cluster.nodes:
        tls[node] = free_port()
        node.extra_args += [
            "--tls-port", str(tls[node]), "--tls-cert-file", str(cert),
            "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
            "--tls-auth-clients", "no", "--tls-cluster", "yes"]
    cluster.start()
    try:
        url = ("rediss+cluster://" + ",".join(f"127.0.0.1:{p}" for p in tls.values())
               + f"?ssl_ca_certs={cert}")
        ran: list[str] = []
        app = App("tls")

        @app.job("t")
        def t(ctx: JobContext) -> None:
            ran.append(ctx.run_id)

        with Client(settings=Settings(redis_url=url, wait_replicas=0)) as c:
            rc: Any = c.r  # a ClusterRedis
            rc.ready()
            assert {port for _, port in rc.slots.masters} <= set(tls.values())  # all TLS
            jobs = [c.schedule("t", {"n": i}) for i in range(20)]
            asyncio.run(run_engine(url, app, lambda: len(ran) == 20, timeout_s=30,
                                   settings_kw={"wait_replicas": 0}))
        assert sorted(ran) == sorted(f"{j.id}@{j.next_ms}" for j in jobs)
        assert len({j.partition for j in jobs}) > 3  # several partitions, so several masters
    finally:
        cluster.stop()


def tls_args(cert: Path, key: Path, port: int) -> list[str]:
    return ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
            "--tls-replication", "yes"]


def test_a_job_is_scheduled_and_run_over_tls_sentinels(redis_available: None,
                                                       tmp_path: Path) -> None:
    """rediss+sentinel://: Sentinels and data nodes on TLS ports (replication and Sentinel's
    own links over TLS too); the client verifies both with the URL's CA file (the Sentinels'
    connections once got ssl=True without it, and failed verification)."""
    cert, key = self_signed(tmp_path)
    primary_tls, replica_tls = free_port(), free_port()
    primary = RedisServer(extra_args=tls_args(cert, key, primary_tls)).start()
    replica = RedisServer(extra_args=tls_args(cert, key, replica_tls)).start()
    sentinels: list[SentinelServer] = []
    try:
        command(replica.port, "REPLICAOF", "127.0.0.1", primary_tls)
        wait_for(lambda: _linked(replica), 20, "the replica to sync over TLS")
        # Sentinels monitor the primary's TLS port: that is the address they hand out.
        monitored = RedisServer(port=primary_tls)  # an address only, never started
        ports = []
        for _ in range(3):
            s = SentinelServer(monitored, service="rsched", down_after_ms=1000,
                               failover_timeout_ms=2000)
            ports.append(free_port())
            s.extra_args += tls_args(cert, key, ports[-1])
            sentinels.append(s)
            s.start()
        url = ("rediss+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in ports)
               + f"/rsched?ssl_ca_certs={cert}")
        monitored.close()
        ran: list[str] = []
        app = App("tls")

        @app.job("t")
        def t(ctx: JobContext) -> None:
            ran.append(ctx.run_id)

        with Client(settings=Settings(redis_url=url)) as c:  # WAIT for the replica: the default
            job = c.schedule("t", {"n": 1})
            asyncio.run(run_engine(url, app, lambda: len(ran) == 1, timeout_s=30))
            assert c.get(job.id).status.value == "completed"
        assert ran == [f"{job.id}@{job.next_ms}"]
    finally:
        for server in (*sentinels, replica, primary):
            server.close()


def _linked(replica: RedisServer) -> int:
    if (port := replicating_from(replica.port)) is None:
        raise NotYet(f"replica {replica.port}: link not up")
    return port
