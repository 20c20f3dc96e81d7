"""A running `rsched dev`: its banner read into a Dev, Ctrl-C, and the processes it left."""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import httpx

from support.processes import Proc, wait_for


def running(proc: Proc, timeout_s: float = 90) -> Dev:
    """Wait for rsched dev's banner and read the address, key and Redis URL off it."""
    banner = wait_for("the rsched dev banner", lambda: re.search(
        r"rsched dev is running\n(.*?)Press Ctrl-C", proc.log.read_text(), re.S), [proc],
        timeout_s).group(1)
    url = re.search(r"API\s+(http://\S+)", banner)
    key = re.search(r"admin key\s+(rsk_\S+)", banner)
    redis_url = re.search(r"redis\s+(redis://\S+)", banner)
    assert url and key and redis_url, banner
    return Dev(proc, url.group(1), key.group(1), redis_url.group(1), banner)


def interrupt(proc: Proc, timeout_s: float = 60) -> int:
    """Ctrl-C, as a terminal sends it, and wait for rsched dev to exit."""
    proc.popen.send_signal(signal.SIGINT)
    return proc.popen.wait(timeout_s)


def processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmd and int(pid) != os.getpid():
                found.append(int(pid))
    return found


@dataclass
class Dev:
    proc: Proc
    base: str
    key: str
    redis_url: str
    banner: str

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=10,
                            headers={"Authorization": f"Bearer {self.key}"})
