"""Where `deploycc compile -o DIR` may write, and how it replaces what is there without losing anyone's files.

The rules (issue 12, "output safety"):
- The package is written into a fresh hidden sibling directory (`.NAME.deploycc-tmp-XXXX`) and renamed
  onto DIR at the end, so an interrupted compile never leaves something that looks like a package.
- Nothing is ever deleted unless it is proven to be a deploycc package: its manifest carries the format
  marker, its seal (manifest.sha256) matches, every other file is listed in the manifest with a matching
  sha256 (but signature.json, which signs the manifest), and nothing else is in the directory. A package is
  replaced only with --force.
- `/`, the home directory, the current directory and its parents are refused outright, as is any directory
  that holds anything else (a project with `.git`, a web app with its own manifest.json), --force or not.
- Temporary directories of compiles that were killed (SIGKILL leaves no chance to clean up) are removed by
  the next compile to the same place; each carries a marker with its owner's pid (runtime/scratch.py), and
  one whose owner is alive (a concurrent compile) is left alone. The C compiler works inside the temporary
  directory (runtime/native.py), so what it leaves goes with it.

DIR is checked twice (issue 24): before any model work (check_output), and again when the package is put in place
(Staging.commit), since anything may have appeared there while the compile ran. Both hold an exclusive flock on
`.NAME.deploycc-lock` beside DIR, from the check to the last rename, so two compiles to one place take turns: the
second finds the first's package and replaces it only with --force. The lock file does not outlive the lock: its
holder unlinks it before closing it, and whoever then holds a lock on an unlinked file (it was waiting on the file
that was removed) or on one the path no longer names sees that the path names another file, or none, and locks
again. At most one process thus holds a lock on the file DIR's lock path names, and none is left beside DIR.

Writers that take no lock (a user, an editor) are met by rename(2) itself: the package is renamed only onto an
absent or empty DIR (renaming a directory onto a non-empty one fails, and that failure is the error), and a
package being replaced is renamed aside first and checked again there: it is deleted only if it is still provably
a package, and renamed back otherwise. What such a writer puts into the set-aside package after that last check
(through a handle it opened before: a shell whose working directory it is) is removed with it: no rename can close
that window, and it is as short as the check is quick.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path

from .errors import DeployError
from .runtime import scratch
from .runtime.package import SEAL, seal_text, sha256_of
from .runtime.scratch import MARKER
from .runtime.trust import SIGNATURE, TrustError, read_signature

TMP_TAG = ".deploycc-tmp-"
OLD_TAG = ".deploycc-old-"
LOCK_TAG = ".deploycc-lock"


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
    with locked(out) if out.parent.is_dir() else nullcontext():  # no parent: nothing there to check
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
            raise DeployError(f"{out_dir} is not a deploycc package ({reason}); nothing was changed — choose a new or "
                              f"empty directory for -o (--force replaces only a package that deploycc wrote)")
        if not force:
            raise DeployError(f"{out_dir} holds a deploycc package; pass --force to replace it, or choose another -o")
    return out


@contextmanager
def locked(out: Path):
    """Hold the exclusive lock on `out`'s lock file (made if missing, removed on release; see the module doc)."""
    path = out.with_name(f".{out.name}{LOCK_TAG}")
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise DeployError(f"cannot make the lock file {path} ({e.strerror}); give -o a directory in a place you "
                              f"can write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            if _same_file(path, held):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file we waited on was removed by its holder: lock the one the path names now
    try:
        yield
    finally:
        try:
            if _same_file(path, held):  # only the file we hold: never one another process made since
                os.unlink(path)
        finally:
            os.close(fd)


def _same_file(path: Path, st: os.stat_result) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino)


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
        if rel == SIGNATURE and _is_signature(path):  # not listed: it signs the manifest (runtime/trust.py)
            continue
        if rel not in files:
            return f"{rel} is not part of it"
        if sha256_of(p) != files[rel]:
            return f"{rel} was changed after compile"
    return None


def _is_signature(path: Path) -> bool:
    try:
        return read_signature(path) is not None
    except TrustError:
        return False


class Staging:
    """A temporary sibling directory for the package being written; `commit()` puts it in place.

        with Staging(out, force) as tmp:
            ... write into tmp ...
            staging.commit()
    Leaving the block without commit (an error, Ctrl-C) removes the temporary directory.
    """

    def __init__(self, out: Path, force: bool = False):
        self.out = out
        self.force = force
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.out)
        # named before it is made: a SIGTERM or Ctrl-C as it appears (a terminated compile left it behind about once in
        # 25 under load, 2026-11-29) raises here, and `with` calls no __exit__ when __enter__ raises
        self.tmp = scratch.new_path(self.out.parent, f".{self.out.name}{TMP_TAG}")
        try:
            scratch.make_at(self.tmp)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.tmp

    def commit(self) -> None:
        """Rename the finished package onto `out`, after checking `out` again under the lock: an absent or empty
        directory is taken; a package is replaced only with --force: it goes aside, is checked again there and
        is marked and removed only once the new one is in place, so a crash at any point leaves either package
        whole. Anything else is left as it is, and the compile fails with nothing changed."""
        out, old = self.out, None
        with locked(out):
            if out.is_symlink() or (out.exists() and not out.is_dir()):
                raise DeployError(f"{out} was replaced by a {'symbolic link' if out.is_symlink() else 'file'} while "
                                  f"this compile ran; nothing was changed — choose another -o")
            if out.is_dir() and any(out.iterdir()):
                reason = foreign_content(out)
                if reason:
                    raise DeployError(_written_meanwhile(out, reason))
                if not self.force:
                    raise DeployError(f"{out} holds a deploycc package written while this compile ran; pass --force "
                                      f"to replace it, or choose another -o")
                old = out.with_name(f".{out.name}{OLD_TAG}{secrets.token_hex(4)}")
                out.rename(old)
                try:
                    reason = foreign_content(old)  # a writer that takes no lock may have added a file since
                except BaseException:  # Ctrl-C while hashing a large package
                    _put_back(old, out)
                    raise
                if reason:
                    raise DeployError(_written_meanwhile(out, reason, _put_back(old, out)))
            (self.tmp / MARKER).unlink()
            try:
                self.tmp.rename(out)  # fails if a writer that takes no lock filled `out` since the check
            except BaseException as e:
                kept = _put_back(old, out) if old is not None else ""
                if not isinstance(e, OSError):
                    raise
                raise DeployError(_written_meanwhile(out, f"it was filled after the last check: {e.strerror}",
                                                     kept)) from None
            self.tmp = None
        if old is not None:
            scratch.mark(old)  # if this removal is cut short, the next compile ends it
            shutil.rmtree(old, ignore_errors=True)

    def __exit__(self, exc_type, exc, tb):
        if self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        return False


def _written_meanwhile(out: Path, reason: str, kept: str = "") -> str:
    """The error of a commit that found `out` written to by someone else while it compiled."""
    changed = f"nothing was deleted: {kept}" if kept else "nothing was changed"
    return (f"{out} was written to while this compile ran and is not a deploycc package ({reason}); {changed} — "
            f"choose a new or empty directory for -o")


def _put_back(old: Path, out: Path) -> str:
    """Rename the package set aside back onto `out`: '' if done, else where it stays (for the error)."""
    try:
        old.rename(out)  # onto an absent or empty `out` only
        return ""
    except OSError:
        return f"the package that was there is kept as {old}, since {out.name} was written again"


def remove_stale(out: Path) -> list[Path]:
    """Remove the temporary and set-aside directories of earlier compiles to `out` whose process is gone."""
    return [p for tag in (TMP_TAG, OLD_TAG) for p in scratch.remove_stale(out.parent, f".{out.name}{tag}")]
