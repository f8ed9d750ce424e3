"""Shared helpers of the bad-input catalogue (tests/bad_inputs/): every case runs the real command line in a
subprocess and asserts exit code 1, one line `error: ...` on stderr, no traceback, and (for compile) that
nothing besides a complete package is left and nothing of the user's was removed.

Each test module of this directory is one area (output safety, packages, checkpoints and GGUF, presets,
tokenizers and templates, chat and run); the catalogue is their union (`pytest tests/bad_inputs`).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, input: str | bytes | None = None, env: dict | None = None, cwd=None, timeout: int = 300):
    """`python -m deploycc ARGS`; text mode unless `input` is bytes."""
    binary = isinstance(input, bytes)
    return subprocess.run([sys.executable, "-m", "deploycc", *map(os.fsdecode, map(str, args))], capture_output=True,
                          text=not binary, input=input, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


def run_package(pkg: Path, *args, input: str | None = None, cwd=None, timeout: int = 300):
    """The package's own entry point (`python PKG ...`), as a user without deploycc runs it."""
    return subprocess.run([sys.executable, str(pkg), *map(str, args)], capture_output=True, text=True, input=input,
                          timeout=timeout, cwd=cwd)


def assert_one_line_error(r, *fragments, code: int = 1):
    """Exit `code`, exactly one stderr line starting with `error: `, no traceback, each fragment in that line."""
    err = r.stderr if isinstance(r.stderr, str) else r.stderr.decode("utf-8", "replace")
    out = r.stdout if isinstance(r.stdout, str) else r.stdout.decode("utf-8", "replace")
    assert r.returncode == code, (r.returncode, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def tree_digest(path: Path) -> dict[str, str]:
    """relative path -> sha256 of every file below `path` (directories as 'dir'): a snapshot to prove that
    nothing of the user's was changed or removed."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = "dir" if p.is_dir() and not p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest() \
            if p.is_file() else "other"
    return out


def reseal(pkg: Path) -> None:
    """Make a package's hashes agree with files changed on purpose (to reach the checks behind the hash
    check, as a hostile or careless editor could): every file's sha256 in manifest.json["files"], then the
    manifest's own sha256 in manifest.sha256."""
    import json

    m = json.loads((pkg / "manifest.json").read_text())
    if isinstance(m, dict) and isinstance(m.get("files"), dict):
        m["files"] = {rel: hashlib.sha256((pkg / rel).read_bytes()).hexdigest() if (pkg / rel).is_file() else digest
                      for rel, digest in m["files"].items()}
        (pkg / "manifest.json").write_text(json.dumps(m, indent=1))
    seal_manifest(pkg)


def launches_with(bytecode: dict, weight: str) -> set[tuple[str, int]]:
    """(kernel, buffer argument index) of every vm.launch of bytecode.json that passes the weight `weight`: the
    argument tables an editor who reshapes a weight changes too, so the dry run agrees."""
    out = set()
    for spec in bytecode["functions"].values():
        regs = {r for r, name in enumerate(spec["params"]) if name == weight} | \
            {r for name, r in spec["constants"] if name == weight}
        for ins in spec["instructions"]:
            if ins.get("fn") == "vm.launch":
                out |= {(ins["args"][0]["k"], j) for j, a in enumerate(ins["args"][3:]) if a.get("r") in regs}
    return out


def seal_manifest(pkg: Path) -> None:
    """Only manifest.sha256 (sha256sum's format) made to agree with manifest.json as it is now."""
    digest = hashlib.sha256((pkg / "manifest.json").read_bytes()).hexdigest()
    (pkg / "manifest.sha256").write_text(f"{digest}  manifest.json\n")


def compile_to(model, out, *extra, cwd=None, env=None):
    """`deploycc compile MODEL -o OUT EXTRA...` (cli)."""
    return cli("compile", model, "-o", out, *extra, cwd=cwd, env=env)
