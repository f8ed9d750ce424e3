"""Where `deploycc compile -o DIR` may write, and how it replaces what is there without losing anyone's files.

The rules (issue 12, "output safety"):
- The package is written into a fresh hidden sibling directory (`.NAME.deploycc-tmp-XXXX`) and renamed
  onto DIR at the end, so an interrupted compile never leaves something that looks like a package.
- Nothing is ever deleted unless it is proven to be a deploycc package: its manifest carries the format
  marker, its seal (manifest.sha256) matches, every other file is listed in the manifest with a matching
  sha256, and nothing else is in the directory. A package is replaced only with --force.
- `/`, the home directory, the current directory and its parents are refused outright, as is any directory
  that holds anything else (a project with `.git`, a web app with its own manifest.json), --force or not.
- Temporary directories of compiles that were killed (SIGKILL leaves no chance to clean up) are removed by
  the next compile to the same place; each carries a marker with its owner's pid, and one whose owner is
  alive (a concurrent compile) is left alone.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from pathlib import Path

from .errors import DeployError
from .runtime.package import SEAL, seal_text, sha256_of

TMP_TAG = ".deploycc-tmp-"
OLD_TAG = ".deploycc-old-"
MARKER = ".deploycc-partial"  # inside a temporary directory only; never part of a package


def check_output(out_dir: Path, force: bool) -> Path:
    """The absolute output path, once it is safe to write there (DeployError otherwise). Nothing is changed."""
    out = Path(os.path.abspath(out_dir.expanduser()))
    cwd = Path.cwd().resolve()
    real = out.resolve()
    if real == Path(real.anchor) or real == Path.home().resolve():
        raise DeployError(f"refusing to write a package to {out_dir} ({real}); give -o a new directory such as dist/model")
    if real == cwd or real in cwd.parents:
        raise DeployError(f"refusing to write a package to {out_dir}: it is the current directory or one of its parents; "
                          f"give -o a new directory such as dist/model")
    if out.is_symlink():
        raise DeployError(f"{out_dir} is a symbolic link; give -o the directory itself, or a new one")
    if not out.exists():
        return out
    if not out.is_dir():
        raise DeployError(f"{out_dir} exists and is not a directory; choose another -o")
    if not any(out.iterdir()):
        return out
    reason = foreign_content(out)
    if reason:
        raise DeployError(f"{out_dir} is not a deploycc package ({reason}); nothing was changed — choose a new or empty "
                          f"directory for -o (--force replaces only a package that deploycc wrote)")
    if not force:
        raise DeployError(f"{out_dir} holds a deploycc package; pass --force to replace it, or choose another -o")
    return out


def foreign_content(path: Path) -> str | None:
    """None if `path` is provably a deploycc package as compile wrote it (runtime/__pycache__ directories that
    running it made aside); else what is not."""
    try:
        manifest_bytes = (path / "manifest.json").read_bytes()
        manifest = json.loads(manifest_bytes)
        seal = (path / SEAL).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        return f"it has no {Path(e.filename).name}"
    except (OSError, ValueError) as e:
        return f"its manifest is unreadable: {type(e).__name__}"
    if not isinstance(manifest, dict) or manifest.get("format") != "deploycc-package":
        return "manifest.json is not a deploycc manifest"
    if seal != seal_text(manifest_bytes):
        return "manifest.json does not match manifest.sha256"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "its manifest lists no files"
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_symlink():
            return f"{rel} is a symbolic link"
        if p.is_dir():
            continue
        if rel in ("manifest.json", SEAL) or (p.parent.name == "__pycache__" and p.suffix == ".pyc"):
            continue
        if rel not in files:
            return f"{rel} is not part of it"
        if sha256_of(p) != files[rel]:
            return f"{rel} was changed after compile"
    return None


class Staging:
    """A temporary sibling directory for the package being written; `commit()` puts it in place.

        with Staging(out) as tmp:
            ... write into tmp ...
            staging.commit()
    Leaving the block without commit (an error, Ctrl-C) removes the temporary directory.
    """

    def __init__(self, out: Path):
        self.out = out
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.out)
        self.tmp = _marked_dir(self.out, TMP_TAG)
        return self.tmp

    def commit(self) -> None:
        """Rename the finished package onto `out`; an existing package (checked by check_output) goes aside
        first and is removed after, so a crash at any point leaves either package whole."""
        (self.tmp / MARKER).unlink()
        old = None
        if self.out.exists():
            if any(self.out.iterdir()):
                old = self.out.with_name(f".{self.out.name}{OLD_TAG}{secrets.token_hex(4)}")
                self.out.rename(old)
                _write_marker(old)
            else:
                self.out.rmdir()
        self.tmp.rename(self.out)
        self.tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def __exit__(self, exc_type, exc, tb):
        if self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        return False


def remove_stale(out: Path) -> list[Path]:
    """Remove the temporary and set-aside directories of earlier compiles to `out` whose process is gone."""
    removed = []
    if not out.parent.is_dir():
        return removed
    for p in out.parent.iterdir():
        if not p.name.startswith(f".{out.name}") or p.is_symlink() or not p.is_dir():
            continue
        rest = p.name[len(out.name) + 1:]
        if not (rest.startswith(TMP_TAG) or rest.startswith(OLD_TAG)) or not _owner_gone(p / MARKER):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _marked_dir(out: Path, tag: str) -> Path:
    tmp = out.with_name(f".{out.name}{tag}{secrets.token_hex(4)}")
    tmp.mkdir(mode=0o755)
    _write_marker(tmp)
    return tmp


def _write_marker(path: Path) -> None:
    (path / MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))


def _owner_gone(marker: Path) -> bool:
    """Whether the compile that made this directory has ended. No marker, or an unreadable one: not ours to judge."""
    try:
        owner = json.loads(marker.read_text())
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
