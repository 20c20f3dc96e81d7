"""`rsched worker --processes N`: N worker processes under one supervisor process.

One Python process runs handlers on one core (the GIL); N processes use N.  The supervisor only
starts, watches and stops: each child is a plain ``rsched worker`` (own Redis connections, own
worker id, own metrics port), restarted when it dies, after a backoff that doubles on every
quick death so a crash loop cannot spin.  SIGTERM or SIGINT to the supervisor is passed on to
every child, which drains as a single worker does; the supervisor exits 0 when all did.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from rsched.cli._processes import _die_with_parent
from rsched.core import defaults

log = logging.getLogger("rsched.supervisor")

POLL_S = 0.2  # how often the supervisor looks at its children
KILL_MARGIN_S = 15.0  # past the grace period, a child that has not exited gets SIGKILL


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
    backoff: Backoff = field(default_factory=Backoff)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    start_at: float = 0.0  # monotonic time of the next start, while no process runs

    def start(self) -> None:
        # In the supervisor's process group, as dramatiq's and celery's children are: a kill of
        # the group reaches them, and session CPU accounting counts them.  Ctrl-C's SIGINT then
        # reaches them too, which drains them just as the supervisor's SIGTERM does.
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        self.started_at = time.monotonic()
        log.info("worker process %d started: pid %d", self.index, self.proc.pid)


class Supervisor:
    """Keeps one child per slot running until told to stop, then stops them all."""

    def __init__(self, argvs: Sequence[list[str]], grace_s: float,
                 backoff: Callable[[], Backoff] = Backoff) -> None:
        self.slots = [Slot(i, argv, backoff()) for i, argv in enumerate(argvs)]
        self.grace_s = grace_s
        self.stop = threading.Event()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("supervisor: %s, stopping %d worker processes", signal.Signals(signum).name,
                 len(self.slots))
        self.stop.set()

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT; returns the exit code (0: every child drained)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for slot in self.slots:
            slot.start()
        while not self.stop.wait(POLL_S):
            self.watch_once(time.monotonic())
        return self.shutdown()

    def watch_once(self, now: float) -> int:
        """Schedule the restart of children that died, start those whose time came; returns
        how many were started."""
        started = 0
        for slot in self.slots:
            if slot.proc is not None and (code := slot.proc.poll()) is not None:
                delay = slot.backoff.after_death(now - slot.started_at)
                log.warning("worker process %d (pid %d) exited with %s; restarting in %.1f s",
                            slot.index, slot.proc.pid, code, delay)
                slot.proc, slot.start_at = None, now + delay
            if slot.proc is None and now >= slot.start_at and not self.stop.is_set():
                slot.start()
                started += 1
        return started

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
