"""Real `python -m rsched.cli ...` processes (api, dispatcher, worker, dev) with their output in
a log file, and the wait that shows those logs when a condition is not met in time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest


class Proc:
    def __init__(self, name: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.log = cwd / f"{name}.log"
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "rsched.cli", *args], env=env, cwd=cwd,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def tail(self) -> str:
        return f"--- {self.name} ---\n" + "\n".join(self.log.read_text().splitlines()[-30:])


def wait_for(what: str, check: Callable[[], Any], procs: list[Proc], timeout_s: float = 30) -> Any:
    """Poll ``check`` until it returns something truthy; fail with the processes' logs."""
    deadline = time.monotonic() + timeout_s
    while True:
        for p in procs:
            if p.popen.poll() is not None:
                pytest.fail(f"{p.name} exited with {p.popen.returncode}\n{p.tail()}")
        try:
            value = check()
        except httpx.TransportError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s\n" + "\n".join(p.tail() for p in procs))
        time.sleep(0.1)
