"""A call's files on disk, written so that a crash loses nothing and no one takes a live call's journal: atomic
writes (temp file + rename), and the journal's advisory lock (`flock`), held by its recorder from the call's
start until its record is written (`duetaspan.pipeline.abandoned` finishes only unlocked journals)."""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so abandoned calls are not finished there (`abandoned.py`)
    fcntl = None  # type: ignore[assignment]


FILE_MODE = 0o600  # artifacts: caller audio and transcripts, readable by their owner only


def lock_journal(fd: int) -> bool:
    """Take an exclusive advisory lock on an open journal without waiting; False when another open file holds
    it (a live call, in this process or another). The lock goes with the process: a killed one frees it."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def replace_locked(path: Path, text: str) -> int:
    """Write `text` to a temp file, lock it, and rename it over `path` (atomic); returns the locked fd, which the
    caller closes once the record is written, so that no one takes the journal for an abandoned one between."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        lock_journal(fd)
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data) :]
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` at once (temp file + rename): a reader sees the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


__all__ = ["FILE_MODE", "lock_journal", "replace_locked", "write_atomic"]
