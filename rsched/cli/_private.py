"""Files of `rsched dev` (rsched.cli.dev) that only their owner may read: its data directory
holds the AOF (every payload), the history, the admin key and its Redis's password."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from rsched.core.errors import RschedError

PRIVATE = 0o077  # the permission bits of group and others, which nothing in the data dir has


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only from its first byte (a new file of mode 0600
    renamed over the old one), never chmod-ed after: it may hold a key or a password."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """A descriptor of ``path``, created with mode 0600 when missing."""
    return os.open(path, flags | os.O_CREAT, 0o600)


def private_dir(path: Path, shown: str) -> None:
    """Create ``path`` with mode 0700, or tighten one an earlier rsched dev left open, with the
    files in it; a directory open to others that holds files of someone's own is refused
    (a RschedError naming --data-dir as ``shown``), never changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & PRIVATE:
        return
    if any(path.iterdir()) and not (path / "dev.lock").exists():
        raise RschedError(f"--data-dir {shown} is open to other users (mode {mode:04o}) and "
                          "holds files of its own: pass a new directory, or make it 0700")
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            p.chmod(stat.S_IMODE(p.stat().st_mode) & ~PRIVATE)
