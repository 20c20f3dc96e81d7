"""Machine loss, simulated honestly: Redis restarts from its AOF as it was at an earlier moment.

With ``appendfsync everysec`` Redis write()s every acknowledged command to the AOF before it
replies, and fsyncs about once a second.  Killing redis-server alone loses nothing (the kernel
still holds the written tail); a machine that dies loses what was not fsynced yet.  So at the
moment standing in for the last fsync, `mark` hard-links the AOF files (Redis 7: appendonlydir
with a manifest; the incremental file is only ever appended to, and a link keeps it even if a
rewrite deletes it) and records their sizes; after the kill, `restore` puts back exactly those
bytes.  Everything written after the mark is gone, as on the dead machine.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

AOF_DIR = "appendonlydir"
MANIFEST = "appendonly.aof.manifest"


@dataclass(frozen=True, slots=True)
class Mark:
    at_ms: int  # the simulated last fsync: acknowledged before this, a write must survive
    dir: Path  # hard links of the files the manifest named
    manifest: bytes
    sizes: dict[str, int]


def _named(manifest: bytes) -> list[str]:
    """File names in a Redis 7 AOF manifest (`file <name> seq <n> type <b|h|i>` lines)."""
    names = []
    for line in manifest.decode().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "file":
            names.append(parts[1])
    return names


def mark(redis_dir: Path, n: int) -> Mark | None:
    """None when a rewrite swapped the files between reading the manifest and linking them."""
    aof = redis_dir / AOF_DIR
    snap = redis_dir / f"fsynced-{n}"
    shutil.rmtree(snap, ignore_errors=True)
    snap.mkdir()
    at_ms = int(time.time() * 1000)
    manifest = (aof / MANIFEST).read_bytes()
    sizes = {}
    try:
        for name in _named(manifest):
            os.link(aof / name, snap / name)
            sizes[name] = (snap / name).stat().st_size
    except FileNotFoundError:
        shutil.rmtree(snap, ignore_errors=True)
        return None
    return Mark(at_ms, snap, manifest, sizes)


def restore(redis_dir: Path, m: Mark) -> None:
    """Replace the AOF of a killed redis-server by the marked bytes."""
    aof = redis_dir / AOF_DIR
    shutil.rmtree(aof)
    aof.mkdir()
    for name, size in m.sizes.items():
        with open(m.dir / name, "r+b") as f:
            f.truncate(size)
        os.replace(m.dir / name, aof / name)
    (aof / MANIFEST).write_bytes(m.manifest)
    shutil.rmtree(m.dir, ignore_errors=True)
