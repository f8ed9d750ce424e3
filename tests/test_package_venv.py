"""A package runs without deploycc: in a clean virtual environment holding only the runtime's dependencies
(numpy, tokenizers, jinja2, safetensors, pyopencl with PoCL), `python PACKAGE run` gives deploycc's own text.

The environment is cached under $DEPLOYCC_HOME/test-venv/<hash of the requirements> (default
~/.cache/deploycc), so only the first run pays for the installation.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import OFFLINE
from test_package_cli import PROMPT, assert_one_line_error, cli, needs, with_tokenizer

from fixtures import fixture_home, make_tiny

REQUIREMENTS = ["numpy", "tokenizers", "jinja2", "safetensors", "pyopencl[pocl]"]
# Nothing of the compiler side may load when a package runs.
FORBIDDEN = {"deploycc", "click", "rich", "yaml", "torch", "transformers"}


@pytest.fixture(scope="module")
def runtime_python() -> str:
    """The python of a clean venv with REQUIREMENTS only (no --system-site-packages), built once and locked
    against parallel test workers."""
    key = hashlib.sha256(json.dumps([sys.version, REQUIREMENTS]).encode()).hexdigest()[:12]
    root = fixture_home().parent / "test-venv"
    venv = root / key
    python = venv / "bin" / "python"
    done = venv / ".complete"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
            r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
                               capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                shutil.rmtree(venv, ignore_errors=True)
                if OFFLINE.search(r.stderr):
                    pytest.skip(f"cannot install the runtime's dependencies (no network): {last}")
                pytest.fail(f"pip install {' '.join(REQUIREMENTS)} failed: {last}")
            done.write_text(" ".join(REQUIREMENTS))
    return str(python)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    needs("opencl")
    root = tmp_path_factory.mktemp("venv-pkg")
    model = with_tokenizer(make_tiny("llama-gqa1"), root / "model")
    r = cli("compile", model, "--device", "cpu-opencl", "-o", root / "pkg")
    assert r.returncode == 0, r.stderr
    return root / "pkg"


def in_venv(python: str, *args, cwd: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run([python, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_the_venv_has_no_deploycc(runtime_python, tmp_path):
    r = in_venv(runtime_python, "-c", "import deploycc", cwd=tmp_path)
    assert r.returncode == 1 and "No module named 'deploycc'" in r.stderr
    r = in_venv(runtime_python, "-c", "import rich", cwd=tmp_path)
    assert r.returncode == 1 and "No module named 'rich'" in r.stderr


def test_package_runs_without_deploycc(runtime_python, package, tmp_path):
    ours = cli("run", package, "--prompt", PROMPT, "--max-tokens", "8", "--json")
    assert ours.returncode == 0, ours.stderr
    expected = json.loads(ours.stdout)
    # -X importtime lists every module the run imports, on stderr
    r = in_venv(runtime_python, "-X", "importtime", package, "run", "--prompt", PROMPT, "--max-tokens", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == expected["text"] + "\n"
    imported = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", r.stderr, re.M)}
    assert "runtime" in imported and "numpy" in imported and "tokenizers" in imported
    assert not imported & FORBIDDEN, imported & FORBIDDEN
    j = in_venv(runtime_python, package, "run", "--prompt", PROMPT, "--max-tokens", "8", "--json", cwd=tmp_path)
    assert j.returncode == 0 and json.loads(j.stdout)["generated"] == expected["generated"]


def test_package_errors_without_deploycc(runtime_python, package, tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(package, pkg)
    m = json.loads((pkg / "manifest.json").read_text())
    (pkg / "manifest.json").write_text(json.dumps({**m, "format_version": 99}))
    assert_one_line_error(in_venv(runtime_python, pkg, "run", "--prompt", "hi", cwd=tmp_path), "package format 99")
    r = in_venv(runtime_python, package, "chat", "--max-tokens", "4", cwd=tmp_path)  # stdin: empty
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
