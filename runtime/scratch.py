"""Scratch directories: made by one process, marked with its pid and host, and removed by a later process once
that owner is gone (a SIGKILL leaves the owner no chance to clean up).

deploycc compile's staging directories (deploycc/staging.py) and the C compiler's work directories
(runtime/native.py) are such. A directory without a marker, or with one that cannot be read or names another
host, is never removed: nothing proves it is ours. A pid that was reused by a live process keeps its directory
until that process ends too.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from pathlib import Path

MARKER = ".deploycc-partial"  # inside a scratch directory only; never part of a package


def new_path(parent: Path, prefix: str) -> Path:
    """A fresh name `parent/PREFIX<random>` for make_at(): a caller that holds it before the directory exists can
    remove whatever an interrupted make_at() left (deploycc/staging.py)."""
    return parent / f"{prefix}{secrets.token_hex(4)}"


def make(parent: Path, prefix: str) -> Path:
    """A new directory `parent/PREFIX<random>`, marked as this process's."""
    return make_at(new_path(parent, prefix))


def make_at(path: Path) -> Path:
    """The new directory `path`, marked as this process's. Interrupted (Ctrl-C, deploycc's SIGTERM) between its
    making and its marking, it is removed: an unmarked one would never be."""
    path.mkdir(mode=0o755)
    try:
        mark(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def mark(path: Path) -> None:
    (path / MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))


def owner_gone(path: Path) -> bool:
    """Whether the process that marked `path` has ended. No marker, or an unreadable one: not ours to judge."""
    try:
        owner = json.loads((path / MARKER).read_text())
        pid, host = int(owner["pid"]), owner["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def remove_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove the directories `parent/PREFIX*` whose owner is gone; the removed ones."""
    removed = []
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        if p.name.startswith(prefix) and not p.is_symlink() and p.is_dir() and owner_gone(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed
