"""`rsched worker --processes N`: N worker processes under one supervisor process.

One Python process runs handlers on one core (the GIL); N processes use N.  The supervisor only
starts, watches and stops: each child is a plain ``rsched worker`` (own Redis connections, own
worker id, own metrics port), restarted when it dies, after a backoff that doubles on every
quick death so a crash loop cannot spin.  SIGTERM or SIGINT to the supervisor is passed on to
every child, which drains as a single worker does; the supervisor exits 0 when all did.

Each child shows it is alive by touching a file of its own (ALIVE_EVERY_S; its event loop does,
so a child frozen or stuck in a blocking call stops): one silent for HUNG_AFTER_S is killed and
restarted.  It writes ``ready`` there once its worker started; a supervisor whose child died
START_TRIES times in a row before that gives up (exit 1) rather than restart it forever.  The
child asks the kernel itself for SIGTERM when the supervisor dies (`watch_parent`): a
``preexec_fn`` is unsafe in a process that has threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from rsched.core import defaults

log = logging.getLogger("rsched.supervisor")

POLL_S = 0.2  # how often the supervisor looks at its children
KILL_MARGIN_S = 15.0  # past the grace period, a child that has not exited gets SIGKILL
ENV_PARENT = "RSCHED_SUPERVISOR_PID"  # set for a child: the supervisor's pid
ENV_ALIVE = "RSCHED_ALIVE_FILE"  # set for a child: the file it touches while alive
READY = b"ready"  # what a child writes to its file once its worker started, and its worker id


def watch_parent() -> None:
    """In a supervised child, first thing: SIGTERM when the supervisor dies (a clean drain),
    and exit at once if it died already (the kernel only signals a death to come)."""
    parent = os.environ.get(ENV_PARENT)
    if not parent:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        log.error("supervisor (pid %s) is gone: not starting", parent)
        raise SystemExit(1)


@dataclass
class Backoff:
    """Restart delays of one slot: RESTART_MIN_S doubling to RESTART_MAX_S while the process
    keeps dying within RESTART_STABLE_S of its start, and from the minimum again after that."""

    min_s: float = defaults.RESTART_MIN_S
    max_s: float = defaults.RESTART_MAX_S
    stable_s: float = defaults.RESTART_STABLE_S
    next_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.next_s = self.min_s

    def after_death(self, lived_s: float) -> float:
        """The delay before the next start of a process that lived ``lived_s``."""
        if lived_s >= self.stable_s:
            self.next_s = self.min_s
        delay = self.next_s
        self.next_s = min(self.next_s * 2, self.max_s)
        return delay


@dataclass
class Slot:
    """One child's place: its command line, its process while it runs, when it may start."""

    index: int
    argv: list[str]
    alive_file: Path
    backoff: Backoff = field(default_factory=Backoff)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    start_at: float = 0.0  # monotonic time of the next start, while no process runs
    failed_starts: int = 0  # deaths in a row before the worker started

    def start(self) -> None:
        # In the supervisor's process group, as dramatiq's and celery's children are: a kill of
        # the group reaches them, and session CPU accounting counts them.  Ctrl-C's SIGINT then
        # reaches them too, which drains them just as the supervisor's SIGTERM does.
        self.alive_file.unlink(missing_ok=True)
        env = dict(os.environ, **{ENV_PARENT: str(os.getpid()), ENV_ALIVE: str(self.alive_file)})
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, env=env)
        self.started_at = time.monotonic()
        log.info("worker process %d started: pid %d", self.index, self.proc.pid)

    def silent_s(self, now: float) -> float:
        """Seconds since the running child last showed it is alive (or since its start)."""
        try:
            touched_ago = time.time() - self.alive_file.stat().st_mtime
        except FileNotFoundError:
            return now - self.started_at
        return min(touched_ago, now - self.started_at)

    def hung(self, now: float, after_s: float) -> float | None:
        """Its silence when that is past ``after_s`` (START_SILENCE_S at least before its first
        sign of life: a start on a busy machine is slow, not hung), else None."""
        silent = self.silent_s(now)
        if not self.alive_file.exists():
            after_s = max(after_s, defaults.START_SILENCE_S)
        return silent if silent > after_s else None

    def ready(self) -> bool:
        return self.worker_id() is not None

    def worker_id(self) -> str | None:
        """The worker id the child wrote once its worker started (None: not started)."""
        try:
            said = self.alive_file.read_bytes()
        except FileNotFoundError:
            return None
        word, _, wid = said.partition(b" ")
        return wid.decode() if word == READY else None


class Supervisor:
    """Keeps one child per slot running until told to stop, then stops them all."""

    def __init__(self, argvs: Sequence[list[str]], grace_s: float,
                 backoff: Callable[[], Backoff] = Backoff,
                 hung_after_s: float = defaults.HUNG_AFTER_S,
                 start_tries: int = defaults.START_TRIES,
                 release: Callable[[str], None] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rsched-supervisor-"))
        self.slots = [Slot(i, argv, self.dir / f"worker-{i}.alive", backoff())
                      for i, argv in enumerate(argvs)]
        self.grace_s = grace_s
        self.hung_after_s = hung_after_s
        self.start_tries = start_tries
        self.release = release  # hands a dead child's runs over to the live workers at once
        self.stop = threading.Event()
        self.failed = False  # a child never started, START_TRIES times in a row

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("supervisor: %s, stopping %d worker processes", signal.Signals(signum).name,
                 len(self.slots))
        self.stop.set()

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT; returns the exit code (0: every child drained)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            for slot in self.slots:
                slot.start()
            while not self.stop.wait(POLL_S):
                self.watch_once(time.monotonic())
            code = self.shutdown()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return 1 if self.failed else code

    def watch_once(self, now: float) -> int:
        """Kill children that went silent, schedule the restart of children that died (or give
        up on one that never starts), start those whose time came; returns how many were
        started."""
        started = 0
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None \
                    and (silent := slot.hung(now, self.hung_after_s)) is not None:
                log.error("worker process %d (pid %d) gave no sign of life for %.0f s: killing "
                          "it", slot.index, slot.proc.pid, silent)
                slot.proc.kill()
                slot.proc.wait()
            if slot.proc is not None and (code := slot.proc.poll()) is not None:
                self._release(slot)
                slot.failed_starts = 0 if slot.ready() else slot.failed_starts + 1
                if slot.failed_starts >= self.start_tries:
                    log.error("worker process %d exited with %s before it started, %d times in "
                              "a row: giving up (see its lines above)", slot.index, code,
                              slot.failed_starts)
                    slot.proc, self.failed = None, True
                    self.stop.set()
                    continue
                delay = slot.backoff.after_death(now - slot.started_at)
                log.warning("worker process %d (pid %d) exited with %s; restarting in %.1f s",
                            slot.index, slot.proc.pid, code, delay)
                slot.proc, slot.start_at = None, now + delay
            if slot.proc is None and now >= slot.start_at and not self.stop.is_set():
                slot.start()
                started += 1
        return started

    def _release(self, slot: Slot) -> None:
        """A child died (or was killed hung): its runs go to the live workers now, not once
        its heartbeats are missed."""
        wid = slot.worker_id()
        if wid is None or self.release is None or slot.proc is None or slot.proc.returncode == 0:
            return
        try:
            self.release(wid)
        except Exception as e:  # noqa: BLE001 - their heartbeats tell the workers anyway
            log.warning("could not hand over the runs of worker %s: %s", wid, e)
        else:
            log.info("worker process %d (%s) died: its runs handed over to live workers",
                     slot.index, wid)

    def shutdown(self) -> int:
        """SIGTERM every child, wait for their drain (SIGKILL past grace + margin)."""
        procs = [s.proc for s in self.slots if s.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s + KILL_MARGIN_S
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                log.error("worker process pid %d did not stop: killed", p.pid)
                p.kill()
                codes.append(p.wait())
        log.info("supervisor: worker processes stopped with %s", codes)
        return 0 if all(c == 0 for c in codes) else 1
