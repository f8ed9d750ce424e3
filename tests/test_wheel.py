"""deploycc as a built wheel, not the editable checkout: every subpackage and preset is in it, and its
`deploycc` command compiles and runs a package from another directory.

The wheel is built offline (`pip wheel --no-deps --no-build-isolation`) from a copy of the sources, then
installed with `pip --python` into a fresh venv made `--without-pip`. That venv sees the third-party
dependencies through a .pth line naming this interpreter's site-packages; a path named in a .pth file is
only added to sys.path (the .pth files inside it, among them the editable install's finder, are not run),
so `import deploycc` can only resolve to the wheel.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, require_device
from test_package_cli import with_tokenizer

from fixtures import make_tiny

# Folder in the checkout -> the package it installs as (pyproject.toml's package-dir).
MAPPED = {"deploycc": "deploycc", "targets": "deploycc.targets", "models": "deploycc.models",
          "runtime": "deploycc.runtime", "configs": "deploycc.configs"}


def run(*args, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def expected_packages() -> set[str]:
    """Every package of the checkout, named as installed."""
    found = set()
    for folder, name in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for folder in MAPPED:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    r = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
            "-q", "-w", out, src, cwd=src)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("deploycc-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    r = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv.parent)
    assert r.returncode == 0, r.stderr
    python = venv / "bin" / "python"
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    Path(purelib, "main-venv-deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    r = run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
            "--disable-pip-version-check", "-q", wheel, cwd=venv.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return venv


def test_wheel_holds_every_subpackage_and_preset(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages == expected_packages()
    assert "deploycc.quantization" in packages and "deploycc.runtime.devices" in packages
    presets = {Path(n).name for n in names if n.startswith("deploycc/configs/") and n.endswith(".yaml")}
    assert presets == {p.name for p in (ROOT / "configs").glob("*.yaml")}
    assert {"deploycc/web/deploycc.js", "deploycc/web/index.html"} <= set(names)  # the browser bundle's sources
    assert not [n for n in names if n.split("/")[0] in ("targets", "models", "runtime", "configs", "tests")]


def test_installed_wheel_compiles_and_runs(venv, tmp_path):
    require_device("opencl")
    python = venv / "bin" / "python"
    r = run(python, "-c", "import deploycc, deploycc.quantization, deploycc.runtime.devices as d; "
                          "print(deploycc.__file__); print(d.__file__)", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert all(Path(line).resolve().is_relative_to(venv.resolve()) for line in r.stdout.split()), r.stdout
    model = with_tokenizer(make_tiny("llama-gqa1"), tmp_path / "model")
    r = run(venv / "bin" / "deploycc", "compile", model, "--device", "cpu-opencl", "--quantization", "q4f16_1",
            "-o", tmp_path / "pkg", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run(venv / "bin" / "deploycc", "run", tmp_path / "pkg", "--prompt", "hi", "--max-tokens", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip(), "the package printed a reply"
