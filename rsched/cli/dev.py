"""`rsched dev`: the whole system on one machine, for trying rsched out (`make demo`).

It starts a private redis-server (AOF, appendfsync everysec, noeviction; data in ``.rsched/``,
so a restart keeps every job), then the API with the dashboard, a dispatcher, a worker with the
handlers in ``examples/`` and an archiver into SQLite, each as a child process running the
same ``rsched`` command a deployment would.  It schedules the sample jobs (idempotency keys: a
restart finds them again), prints the dashboard's address and an admin key, and on Ctrl-C stops
the children in order (API, dispatcher, worker, archiver, Redis last) and waits for each.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from redis import Redis

from rsched.client import Client
from rsched.core.errors import RschedError
from rsched.service import apikeys as auth

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
ECHO_LEVELS = (" WARNING ", " ERROR ", " CRITICAL ")


class DevError(RschedError):
    """rsched dev cannot start: the message says what to do."""


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it (a clean stop, AOF flushed) if rsched dev dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout_s: float, what: str,
               alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if not alive():
            raise DevError(f"{what}: the process exited")
        if time.monotonic() > deadline:
            raise DevError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(0.1)


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")  # not while -LOADING the AOF
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as res:  # noqa: S310 - our own local URL
            return bool(res.status == 200)
    except OSError:
        return False


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                start_new_session=True,  # Ctrl-C reaches rsched dev only; it stops us in order
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LogEcho(threading.Thread):
    """Copies the children's warnings and errors (everything with ``verbose``) to the console,
    prefixed with the child's name; the full logs stay in .rsched/logs/."""

    def __init__(self, children: list[Child], out: IO[str], verbose: bool) -> None:
        super().__init__(name="rsched-dev-logs", daemon=True)
        self.children, self.out, self.verbose = children, out, verbose
        self.stop = threading.Event()

    def run(self) -> None:
        files = {c.name: open(c.log_path, errors="replace") for c in self.children}  # noqa: SIM115
        for f in files.values():
            f.seek(0, os.SEEK_END)
        try:
            while not self.stop.wait(0.2):
                for name, f in files.items():
                    for line in iter(f.readline, ""):
                        if self.verbose or any(lv in line for lv in ECHO_LEVELS):
                            self.out.write(f"[{name}] {line}")
                self.out.flush()
        finally:
            for f in files.values():
                f.close()


@contextlib.contextmanager
def exclusive(data_dir: Path) -> Iterator[None]:
    """One rsched dev per data directory: two Redis servers must not share an AOF."""
    with open(data_dir / "dev.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DevError(f"another rsched dev is running with {data_dir}; stop it first, "
                           "or use --data-dir") from None
        yield


def redis_config(data_dir: Path, port: int) -> str:
    return "\n".join([
        f"port {port}", "bind 127.0.0.1", f"dir {data_dir}", "daemonize no",
        f"logfile {data_dir / 'logs' / 'redis.log'}",
        "appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction",
        'save ""',  # the AOF is the durable copy; no RDB snapshots on top
    ]) + "\n"


def examples_root() -> Path:
    """The folder holding ``examples/``: the source checkout rsched runs from, else the cwd."""
    here = Path(__file__).resolve().parents[2]
    for root in (here, Path.cwd()):
        if (root / "examples" / "handlers.py").is_file():
            return root
    raise DevError("examples/ not found: run rsched dev from the rsched source tree")


def admin_key(redis_url: str, key_file: Path) -> str:
    """The admin key kept in ``key_file`` if Redis still knows it, else a new one."""
    client = Client(redis=Redis.from_url(redis_url))
    try:
        if key_file.is_file():
            secret = key_file.read_text().strip()
            key = client.run(auth.op_lookup(secret))
            if key is not None and key.scope == "admin":
                return secret
        _, secret = client.run(auth.op_create_key("rsched-dev", "admin"))
    finally:
        client.close()
    key_file.write_text(secret + "\n")
    key_file.chmod(0o600)
    return secret


def schedule_samples(redis_url: str) -> tuple[int, int, list[str]]:
    """Schedule examples/sample_jobs.py: (created, already there, problems)."""
    root = str(examples_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    jobs = importlib.import_module("examples.sample_jobs").SAMPLE_JOBS
    client = Client(redis_url)
    try:
        results = client.run(client.op_schedule_created(jobs))
    finally:
        client.close()
    created = sum(1 for r in results if isinstance(r, tuple) and r[1])
    existing = sum(1 for r in results if isinstance(r, tuple) and not r[1])
    problems = [f"{spec.idempotency_key}: {r}" for spec, r in zip(jobs, results, strict=True)
                if isinstance(r, Exception)]
    return created, existing, problems


def _shown(path: Path) -> str:
    """A path as the user would type it: relative below the working directory."""
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


@dataclass
class DevOptions:
    host: str = "127.0.0.1"
    port: int = 8600
    redis_url: str | None = None
    data_dir: Path = Path(".rsched")
    fresh: bool = False
    verbose: bool = False
    metrics_ports: bool = True


class Dev:
    def __init__(self, opts: DevOptions, out: IO[str] = sys.stdout) -> None:
        self.opts = opts
        self.out = out
        self.data_dir = opts.data_dir.resolve()
        self.logs = self.data_dir / "logs"
        self.redis: Child | None = None
        self.children: list[Child] = []
        self.stop_requested = threading.Event()

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # --- start -------------------------------------------------------------------------------

    def start_redis(self) -> str:
        if self.opts.redis_url:
            return self.opts.redis_url
        exe = shutil.which("redis-server")
        if exe is None:
            raise DevError("redis-server not found: install it (Debian: apt-get install "
                           "redis-server) or pass --redis-url")
        port_file = self.data_dir / "redis.port"
        port = int(port_file.read_text()) if port_file.is_file() else 0
        if not port or not port_free(port):
            port = free_port()
        port_file.write_text(f"{port}\n")
        conf = self.data_dir / "redis.conf"
        conf.write_text(redis_config(self.data_dir, port))
        self.redis = Child("redis", [exe, str(conf)], self.logs / "redis.log")
        self.redis.start(self.data_dir)
        wait_until(lambda: _redis_ping(port), READY_TIMEOUT_S,
                   f"redis-server (log {self.redis.log_path})", self.redis.alive)
        return f"redis://127.0.0.1:{port}/0"

    def plan(self, redis_url: str, archive_url: str | None) -> list[Child]:
        """The rsched processes, each the command a deployment would run."""
        base = [sys.executable, "-m", "rsched.cli", "--redis-url", redis_url]
        ports = iter(range(self.opts.port + 1, self.opts.port + 4))

        def metrics() -> list[str]:
            port = next(ports)
            if not self.opts.metrics_ports or not port_free(port, self.opts.host):
                return []
            return ["--metrics-port", f"{self.opts.host}:{port}"]

        env = {"PYTHONPATH": os.pathsep.join(
            p for p in (str(examples_root()), os.environ.get("PYTHONPATH", "")) if p)}
        if archive_url:
            env["RSCHED_ARCHIVE_URL"] = archive_url
        plan = [
            Child("api", [*base, "api", "--host", self.opts.host, "--port", str(self.opts.port)],
                  self.logs / "api.log", env),
            Child("dispatcher", [*base, *metrics(), "dispatcher"], self.logs / "dispatcher.log",
                  env),
            Child("worker", [*base, *metrics(), "worker", "--app", "examples.handlers:app",
                             "--concurrency", "8", "--heartbeat-ms", "1000", "--grace", "10"],
                  self.logs / "worker.log", env),
        ]
        if archive_url:
            plan.append(Child("archiver", [*base, *metrics(), "archiver"],
                              self.logs / "archiver.log", env))
        return plan

    def run(self) -> int:
        if self.opts.fresh and self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.logs.mkdir(parents=True, exist_ok=True)
        if not port_free(self.opts.port, self.opts.host):
            raise DevError(f"port {self.opts.port} is in use: pass --port")
        with exclusive(self.data_dir):
            echo: LogEcho | None = None
            try:
                redis_url = self.start_redis()
                archive = None
                if importlib.util.find_spec("rsched.archive.archiver") is not None:
                    archive = f"sqlite:///{self.data_dir / 'history.db'}"
                key = admin_key(redis_url, self.data_dir / "admin.key")
                created, existing, problems = schedule_samples(redis_url)
                self.children = self.plan(redis_url, archive)
                for child in self.children:
                    child.start(Path.cwd())
                echo = LogEcho(self.children, self.out, self.opts.verbose)
                echo.start()  # after every fork: preexec_fn and threads do not mix
                api = self.children[0]
                base = f"http://{self.opts.host}:{self.opts.port}"
                wait_until(lambda: _http_ok(base + "/healthz"), READY_TIMEOUT_S,
                           f"rsched api (log {api.log_path})", api.alive)
                self.banner(base, key, redis_url, archive, created, existing, problems)
                return self.supervise()
            finally:
                self.shutdown()
                if echo is not None:
                    echo.stop.set()
                    echo.join(2)

    def banner(self, base: str, key: str, redis_url: str, archive: str | None, created: int,
               existing: int, problems: list[str]) -> None:
        rel = _shown(self.data_dir)
        self.say("")
        self.say("rsched dev is running")
        self.say(f"  dashboard   {base}/ui/#key={key}")
        self.say(f"  API         {base}   (docs: {base}/docs, metrics: {base}/metrics)")
        self.say(f"  admin key   {key}")
        where = f"data in {rel}/, AOF everysec" if self.redis else "external"
        self.say(f"  redis       {redis_url}   ({where})")
        self.say(f"  history     {archive or 'not archived (rsched.archive missing)'}")
        ports = [f"{c.name} {c.argv[c.argv.index('--metrics-port') + 1]}"
                 for c in self.children if "--metrics-port" in c.argv]
        if ports:
            self.say(f"  metrics     {', '.join(ports)}")
        self.say(f"  logs        {_shown(self.logs)}/ (warnings and errors shown here)")
        self.say(f"  sample jobs {created} scheduled, {existing} already there")
        for p in problems:
            self.say(f"  ! {p}")
        self.say(f"  try         RSCHED_REDIS_URL={redis_url} rsched jobs list")
        self.say("Press Ctrl-C to stop (jobs are kept; --fresh starts over).")
        self.say("")

    def supervise(self) -> int:
        while not self.stop_requested.wait(0.5):
            for child in ([self.redis] if self.redis else []) + self.children:
                if not child.alive():
                    code = child.proc.returncode if child.proc else None
                    self.say(f"{child.name} exited with code {code}; stopping. "
                             f"Last lines of {child.log_path}:\n{child.tail()}")
                    return 1
        return 0

    # --- stop --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """API first (no new requests), the dispatcher (no new runs), the worker (finishes its
        runs), the archiver (archives the last events), Redis last (flushes its AOF)."""
        if not self.children and self.redis is None:
            return
        self.say("stopping…")
        for child in self.children:  # started as api, dispatcher, worker, archiver
            child.stop()
        if self.redis is not None:
            self.redis.stop(30.0)
        self.children, self.redis = [], None
        self.say("stopped")


def run(opts: DevOptions) -> int:
    dev = Dev(opts)

    def on_signal(signum: int, frame: Any) -> None:
        if dev.stop_requested.is_set():
            return
        dev.stop_requested.set()
        raise KeyboardInterrupt  # interrupts start-up too; shutdown() runs in finally

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return dev.run()
    except KeyboardInterrupt:
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)


__all__ = ["DevError", "DevOptions", "run"]
