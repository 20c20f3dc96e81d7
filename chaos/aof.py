"""Machine loss, simulated honestly: Redis restarts from its AOF as it was at an earlier moment.

With ``appendfsync everysec`` Redis write()s every acknowledged command to the AOF before it
replies, and fsyncs about once a second.  Killing redis-server alone loses nothing (the kernel
still holds the written tail); a machine that dies loses what was not fsynced yet.  So at the
moment standing in for the last fsync, `mark` hard-links the AOF files (Redis 7: appendonlydir
with a manifest; the incremental file is only ever appended to, and a link keeps it even if a
rewrite deletes it) and records their sizes; after the kill, `restore` puts back those bytes.
Everything written after the mark is gone, as on the dead machine.

A size read while Redis is inside a write() can end in the middle of a command, even of a
MULTI/EXEC block (Redis 7 wraps every script's effects in one).  Redis 7.0.15 loads such a tail
with aof-load-truncated by cutting the file after the last whole *command*, inside the block,
and appends its new writes after the open MULTI: the next load of that file queues them behind
the dead half-transaction and EXEC applies both, so half of a script that never replied comes
back one restart later (tests/processes/test_chaos_aof.py fails so without the cut).  That is
Redis's defect, not one rsched could guard against, so `restore` cuts the tail back to the last
whole command outside any block (a block goes out in one write(), so a complete write() can end
there), as Redis itself cuts an incomplete block that ends cleanly ("Revert incomplete MULTI/EXEC
transaction").
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


def _named(manifest: bytes, types: str = "bhi") -> list[str]:
    """File names in a Redis 7 AOF manifest (`file <name> seq <n> type <b|h|i>` lines) whose
    type is one of ``types``."""
    names = []
    for line in manifest.decode().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0] == "file" and parts[5] in types:
            names.append(parts[1])
    return names


_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
_ANCHOR_BACK = 1 << 20  # look for the last EXEC this far back before parsing from the start


def _whole_prefix(data: bytes, start: int = 0) -> int | None:
    """The length of the longest prefix of ``data`` that ends after a whole command outside any
    MULTI/EXEC block, parsing from ``start`` (such a boundary); None when ``data[start:]`` is
    not a sequence of RESP commands (then ``start`` was not a boundary)."""
    pos = good = start
    n = len(data)
    in_multi = False
    while pos < n:
        if data[pos] == 0x23:  # '#': an annotation line (aof-timestamp-enabled)
            end = data.find(b"\r\n", pos)
            if end < 0:
                return good
            pos = end + 2
            good = pos if not in_multi else good
            continue
        end = data.find(b"\r\n", pos)
        if end < 0:
            return good  # torn inside the argument count
        if data[pos] != 0x2A or not data[pos + 1 : end].isdigit():
            return None
        argc, pos = int(data[pos + 1 : end]), end + 2
        name = b""
        for i in range(argc):
            end = data.find(b"\r\n", pos)
            if end < 0:
                return good
            if data[pos] != 0x24 or not data[pos + 1 : end].isdigit():
                return None
            size, arg = int(data[pos + 1 : end]), end + 2
            pos = arg + size + 2
            if pos > n:
                return good  # torn inside an argument
            if data[pos - 2 : pos] != b"\r\n":
                return None
            if i == 0:
                name = data[arg : arg + size].upper()
        if name == b"MULTI":
            in_multi = True
        elif name == b"EXEC":
            in_multi = False
        if not in_multi:
            good = pos
    return good


def whole_prefix(data: bytes) -> int:
    """`_whole_prefix` of a whole file, parsing only its tail when the last EXEC is near the
    end (a block's end is a boundary; an EXEC's bytes inside a payload almost surely fail to
    parse as what follows, and the whole file is parsed then)."""
    anchor = data.rfind(_EXEC, max(0, len(data) - _ANCHOR_BACK))
    if anchor > 0:
        good = _whole_prefix(data, anchor + len(_EXEC))
        if good is not None:
            return good
    good = _whole_prefix(data)
    if good is None:
        raise ValueError("not an AOF of RESP commands")
    return good


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


def restore(redis_dir: Path, m: Mark) -> dict[str, int]:
    """Replace the AOF of a killed redis-server by the marked bytes, each incremental file cut
    back to its last whole command outside a MULTI/EXEC block; returns the bytes so cut off
    per file (a torn tail)."""
    aof = redis_dir / AOF_DIR
    shutil.rmtree(aof)
    aof.mkdir()
    incr = set(_named(m.manifest, "i"))
    torn = {}
    for name, size in m.sizes.items():
        with open(m.dir / name, "r+b") as f:
            if name in incr:
                f.seek(0)
                whole = whole_prefix(f.read(size))
                if whole < size:
                    torn[name] = size - whole
                    size = whole
            f.truncate(size)
        os.replace(m.dir / name, aof / name)
    (aof / MANIFEST).write_bytes(m.manifest)
    shutil.rmtree(m.dir, ignore_errors=True)
    return torn
