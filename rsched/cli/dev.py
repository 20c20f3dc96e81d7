"""`rsched dev`: the whole system on one machine, for developing with rsched (`make demo`).

It starts a private redis-server (AOF, appendfsync everysec, noeviction, a generated password;
data in ``.rsched/``, so a restart keeps every job), then the API with the dashboard, a
dispatcher, a worker with the handlers of ``--app`` (the bundled ``examples/`` without it, in
the source tree) and an archiver into SQLite, each as a child process running the same
``rsched`` command a deployment would.  With the examples it schedules their sample jobs
(idempotency keys: a restart finds them again).  It prints the dashboard's address and an admin
key, and on Ctrl-C stops the children in order (API, dispatcher, worker, archiver, Redis last)
and waits for each.  Whoever reads its files can read every payload and whoever writes its
Redis is admin: the data directory is 0700 and every file in it 0600.
The children themselves are in rsched.cli._processes, the key and sample jobs in _samples.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rsched.cli._apps import load_apps
from rsched.cli._private import PRIVATE, open_private, private_dir, write_private
from rsched.cli._processes import (
    Child,
    DevError,
    LogEcho,
    exclusive,
    free_port,
    http_ok,
    port_free,
    redis_ping,
    wait_until,
)
from rsched.cli._samples import admin_key, examples_root, schedule_samples
from rsched.core import defaults
from rsched.rdb.connect import _safe as masked

READY_TIMEOUT_S = 60.0
EXAMPLES_APP = "examples.handlers:app"


def redis_config(data_dir: Path, port: int, password: str) -> str:
    return "\n".join([
        f"port {port}", "bind 127.0.0.1", f"dir {data_dir}", "daemonize no",
        f"requirepass {password}",  # any local account could otherwise connect: admin access
        f"logfile {data_dir / 'logs' / 'redis.log'}",
        "appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction",
        f"hash-max-listpack-value {defaults.HASH_LISTPACK_VALUE}",  # compact job hashes
        'save ""',  # the AOF is the durable copy; no RDB snapshots on top
    ]) + "\n"


def _shown(path: Path) -> str:
    """A path as the user would type it: relative below the working directory."""
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


@dataclass
class DevOptions:
    apps: tuple[str, ...] = ()
    examples: bool = False  # also with --app; the default without one
    queues: tuple[str, ...] = (defaults.QUEUE,)
    host: str = defaults.API_HOST
    port: int = defaults.API_PORT
    redis_url: str | None = None
    data_dir: Path = Path(defaults.DEV_DATA_DIR)
    fresh: bool = False
    verbose: bool = False
    metrics_ports: bool = True


class Dev:
    def __init__(self, opts: DevOptions, out: IO[str] = sys.stdout) -> None:
        self.opts = opts
        self.out = out
        self.data_dir = opts.data_dir.resolve()
        self.logs = self.data_dir / "logs"
        self.url_file = self.data_dir / defaults.DEV_URL_FILE
        self.archive_file = self.data_dir / defaults.DEV_ARCHIVE_FILE
        self.examples = opts.examples or not opts.apps
        self.apps = [*opts.apps, *([EXAMPLES_APP] if self.examples else [])]
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
        write_private(port_file, f"{port}\n")
        password = self.redis_password()
        conf = self.data_dir / "redis.conf"
        write_private(conf, redis_config(self.data_dir, port, password))
        # umask: the AOF (every payload) and the log are created 0600 in a 0700 directory
        self.redis = Child("redis", [exe, str(conf)], self.logs / "redis.log", umask=PRIVATE)
        self.redis.start(self.data_dir)
        wait_until(lambda: redis_ping(port, password), READY_TIMEOUT_S,
                   f"redis-server (log {self.redis.log_path})", self.redis.alive)
        return f"redis://:{password}@127.0.0.1:{port}/0"

    def redis_password(self) -> str:
        """The dev Redis's password: kept across restarts (a URL given out stays valid),
        generated at the first start; URL-safe characters, so the URL needs no escaping."""
        path = self.data_dir / "redis.password"
        password = path.read_text().strip() if path.is_file() else ""
        if not password:
            password = secrets.token_urlsafe(24)
            write_private(path, password + "\n")
        return password

    def plan(self, redis_url: str, archive_url: str | None) -> list[Child]:
        """The rsched processes, each the command a deployment would run."""
        base = [sys.executable, "-m", "rsched.cli"]
        ports = iter(range(self.opts.port + 1, self.opts.port + 4))

        def metrics() -> list[str]:
            port = next(ports)
            if not self.opts.metrics_ports or not port_free(port, self.opts.host):
                return []
            return ["--metrics-port", f"{self.opts.host}:{port}"]

        # The URL (its password) goes by environment: the command lines are anyone's to read.
        env = {"RSCHED_REDIS_URL": redis_url}
        if self.examples:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(examples_root()), os.environ.get("PYTHONPATH", "")) if p)
        if archive_url:
            env["RSCHED_ARCHIVE_URL"] = archive_url
        apps = [a for spec in self.apps for a in ("--app", spec)]
        plan = [
            Child("api", [*base, "api", "--host", self.opts.host, "--port", str(self.opts.port),
                          "--dev-echo"],
                  self.logs / "api.log", env),
            Child("dispatcher", [*base, *metrics(), "dispatcher"], self.logs / "dispatcher.log",
                  env),
            # --http: HTTP target jobs run too; the SSRF guard lets them reach this API's host
            # on its port only, unless RSCHED_HTTP_ALLOW says otherwise.
            Child("worker", [*base, *metrics(), "worker", *apps, "--http", "--queues",
                             ",".join(self.opts.queues), "--concurrency", "8",
                             "--heartbeat-ms", "1000", "--grace", "10"],
                  self.logs / "worker.log",
                  {**env, "RSCHED_HTTP_ALLOW": os.environ.get(
                      "RSCHED_HTTP_ALLOW", f"{self.opts.host}:{self.opts.port}")}),
        ]
        if archive_url:  # history.db and its WAL files 0600
            plan.append(Child("archiver", [*base, *metrics(), "archiver"],
                              self.logs / "archiver.log", env, umask=PRIVATE))
        return plan

    def check_apps(self) -> None:
        """Import every app here first: a bad --app is one line before anything starts."""
        if self.examples:
            sys.path.insert(0, str(examples_root()))
        sys.path.insert(0, ".")  # as the worker does
        load_apps(self.apps)

    def run(self) -> int:
        self.check_apps()
        if not port_free(self.opts.port, self.opts.host):
            raise DevError(f"port {self.opts.port} is in use: pass --port")
        if self.opts.fresh and self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        private_dir(self.data_dir, _shown(self.data_dir))
        self.logs.mkdir(mode=0o700, exist_ok=True)
        with exclusive(self.data_dir):
            echo: LogEcho | None = None
            try:
                redis_url = self.start_redis()
                write_private(self.url_file, redis_url + "\n")  # for the CLI run beside it
                archive = None
                if importlib.util.find_spec("rsched.archive.archiver") is not None:
                    db = self.data_dir / "history.db"
                    os.close(open_private(db, os.O_RDONLY))  # 0600 before any process opens it
                    archive = f"sqlite:///{db}"
                    write_private(self.archive_file, archive + "\n")  # for the CLI too
                key = admin_key(redis_url, self.data_dir / "admin.key")
                created = existing = 0
                problems: list[str] = []
                quiet: set[str] = set()
                if self.examples:
                    created, existing, problems, quiet = schedule_samples(
                        redis_url, f"http://{self.opts.host}:{self.opts.port}")
                self.children = self.plan(redis_url, archive)
                for child in self.children:
                    child.start(Path.cwd())
                echo = LogEcho(self.children, self.out, self.opts.verbose, quiet)
                echo.start()  # after every fork: preexec_fn and threads do not mix
                api = self.children[0]
                base = f"http://{self.opts.host}:{self.opts.port}"
                wait_until(lambda: http_ok(base + "/healthz"), READY_TIMEOUT_S,
                           f"rsched api (log {api.log_path})", api.alive)
                self.banner(base, key, redis_url, archive, created, existing, problems,
                            bool(quiet))
                return self.supervise()
            finally:
                self.shutdown()
                if echo is not None:
                    echo.stop.set()
                    echo.join(2)
                    if echo.held:
                        self.say(f"({echo.held} warnings and errors of the sample jobs that "
                                 f"fail on purpose are in {_shown(self.logs)}/worker.log)")

    def banner(self, base: str, key: str, redis_url: str, archive: str | None, created: int,
               existing: int, problems: list[str], quiet: bool = False) -> None:
        rel = _shown(self.data_dir)
        self.say("")
        self.say("rsched dev is running")
        self.say(f"  dashboard   {base}/ui/#key={key}")
        self.say(f"  API         {base}   (docs: {base}/docs, metrics: {base}/metrics)")
        self.say(f"  admin key   {key}   (saved in {_shown(self.data_dir / 'admin.key')})")
        self.say(f"  worker      {', '.join(self.apps)}   (queues {','.join(self.opts.queues)})")
        where = (f"data in {rel}/, AOF everysec, password in {_shown(self.url_file)}"
                 if self.redis else "external")
        self.say(f"  redis       {masked(redis_url)}   ({where})")
        self.say(f"  history     {archive or 'not archived (rsched.archive missing)'}")
        ports = [f"{c.name} {c.argv[c.argv.index('--metrics-port') + 1]}"
                 for c in self.children if "--metrics-port" in c.argv]
        if ports:
            self.say(f"  metrics     {', '.join(ports)}")
        self.say(f"  logs        {_shown(self.logs)}/ (warnings and errors shown here)")
        if self.examples:
            self.say(f"  sample jobs {created} scheduled, {existing} already there"
                     + ("; the failures of those that fail on purpose go to the worker log "
                        "only" if quiet else ""))
        for p in problems:
            self.say(f"  ! {p}")
        if self.data_dir == (Path.cwd() / defaults.DEV_DATA_DIR).resolve():
            # run here, the CLI reads the URL from the data directory (rsched.cli.context)
            self.say(f"  try         rsched jobs list   (in this directory: the CLI reads "
                     f"{_shown(self.url_file)})")
        else:
            self.say(f"  try         RSCHED_REDIS_URL=$(cat {_shown(self.url_file)}) "
                     "rsched jobs list")
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
        self.url_file.unlink(missing_ok=True)
        self.archive_file.unlink(missing_ok=True)
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
