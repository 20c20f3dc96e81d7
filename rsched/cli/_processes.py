"""The child processes of `rsched dev` (rsched.cli.dev): start, watch, echo and stop them."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rsched.cli._private import open_private
from rsched.core.errors import RschedError

STOP_TIMEOUT_S = 15.0
ECHO_LEVELS = (" WARNING ", " ERROR ", " CRITICAL ")


class DevError(RschedError):
    """rsched dev cannot start: the message says what to do."""


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it (a clean stop, AOF flushed) if rsched dev dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the kernel picks, free when asked."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout_s: float, what: str,
               alive: Callable[[], bool] = lambda: True) -> None:
    """Poll ``check``; a DevError naming ``what`` once ``alive`` fails or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if not alive():
            raise DevError(f"{what}: the process exited")
        if time.monotonic() > deadline:
            raise DevError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(0.1)


def redis_ping(port: int, password: str | None = None) -> bool:
    """Whether the Redis on ``port`` answers PING (after AUTH with ``password``)."""
    expect = (b"+OK\r\n" if password else b"") + b"+PONG"  # not -LOADING the AOF
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall((f"AUTH {password}\r\n" if password else "").encode() + b"PING\r\n")
            got = b""
            while len(got) < len(expect) and (chunk := s.recv(64)):
                got += chunk
            return got.startswith(expect)
    except OSError:
        return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as res:  # noqa: S310 - our own local URL
            return bool(res.status == 200)
    except OSError:
        return False


@dataclass
class Child:
    """One child process of rsched dev, its output appended to ``log_path``."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    umask: int = -1
    """The child's umask; -1 keeps ours (a worker's handlers create files as they would)."""
    proc: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path) -> None:
        with os.fdopen(open_private(self.log_path), "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                start_new_session=True,  # Ctrl-C reaches rsched dev only; it stops us in order
                preexec_fn=_die_with_parent, umask=self.umask,
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
    prefixed with the child's name; the full logs stay in .rsched/logs/.  Lines about the jobs
    in ``quiet`` (sample jobs that fail on purpose) are only counted, so they cannot scroll the
    banner away: 86 lines in 9 minutes did."""

    def __init__(self, children: list[Child], out: IO[str], verbose: bool,
                 quiet: Iterable[str] = ()) -> None:
        super().__init__(name="rsched-dev-logs", daemon=True)
        self.children, self.out, self.verbose = children, out, verbose
        self.quiet = tuple(quiet)
        self.held = 0  # quiet lines left out
        self.stop = threading.Event()

    def run(self) -> None:
        files = {c.name: open(c.log_path, errors="replace") for c in self.children}  # noqa: SIM115
        for f in files.values():
            f.seek(0, os.SEEK_END)
        try:
            while not self.stop.wait(0.2):
                for name, f in files.items():
                    for line in iter(f.readline, ""):
                        if not self.verbose and any(lv in line for lv in ECHO_LEVELS) \
                                and any(j in line for j in self.quiet):
                            self.held += 1
                        elif self.verbose or any(lv in line for lv in ECHO_LEVELS):
                            self.out.write(f"[{name}] {line}")
                self.out.flush()
        finally:
            for f in files.values():
                f.close()


@contextlib.contextmanager
def exclusive(data_dir: Path) -> Iterator[None]:
    """One rsched dev per data directory: two Redis servers must not share an AOF."""
    with os.fdopen(open_private(data_dir / "dev.lock", os.O_WRONLY), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DevError(f"another rsched dev is running with {data_dir}; stop it first, "
                           "or use --data-dir") from None
        yield
