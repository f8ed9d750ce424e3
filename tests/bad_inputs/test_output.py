"""Catalogue: where `deploycc compile -o DIR` must not write, and what it must never delete.

Every refused case asserts the one-line error and that the directory tree is byte-for-byte what it was
(`tree_digest`), with no temporary directory left beside it. A compile of the tiny llama fixture (no
tokenizer needed) on cpu-opencl takes a few seconds; the refusals happen before any model work.

The writers that race a compile, and compiles killed in the C compiler: test_output_races.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import require_cc, require_device

from bad_inputs.common import assert_one_line_error, cli, compile_to, tree_digest
from fixtures import make_tiny


@pytest.fixture(scope="module")
def model() -> Path:
    return make_tiny("llama-gqa1")


def a_project(root: Path) -> Path:
    """What a user's working directory looks like: sources, a .git directory, a web app's manifest.json."""
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('mine')\n")
    (root / "manifest.json").write_text(json.dumps({"name": "my web app", "start_url": "/"}))
    return root


def assert_untouched(root: Path, before: dict) -> None:
    assert tree_digest(root) == before
    leftovers = [p.name for p in root.parent.iterdir() if ".deploycc-" in p.name]
    assert leftovers == [], leftovers


@pytest.fixture
def package(model, tmp_path) -> Path:
    require_device("opencl")
    r = compile_to(model, tmp_path / "pkg")
    assert r.returncode == 0, r.stderr
    return tmp_path / "pkg"


# ---- places that are never an output -----------------------------------------------------------

@pytest.mark.parametrize("force", [False, True])
def test_current_directory_with_a_project(model, tmp_path, force):
    proj = a_project(tmp_path / "proj")
    before = tree_digest(proj)
    r = compile_to(model, ".", *(["--force"] if force else []), cwd=proj)
    assert_one_line_error(r, "refusing to write a package to .", "current directory")
    assert_untouched(proj, before)


def test_empty_current_directory(model, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(compile_to(model, ".", "--force", cwd=tmp_path / "empty"), "current directory")
    assert list((tmp_path / "empty").iterdir()) == []


def test_parent_of_the_current_directory(model, tmp_path):
    proj = a_project(tmp_path / "proj")
    before = tree_digest(tmp_path)
    assert_one_line_error(compile_to(model, "..", "--force", cwd=proj / "src"), "current directory or one of its parents")
    assert tree_digest(tmp_path) == before


def test_root_directory(model, tmp_path):
    assert_one_line_error(compile_to(model, "/", "--force", cwd=tmp_path), "refusing to write a package to /")


def test_home_directory(model, tmp_path):
    home = a_project(tmp_path / "home")
    before = tree_digest(home)
    r = compile_to(model, "~", "--force", cwd=tmp_path, env={"HOME": str(home)})
    assert_one_line_error(r, "refusing to write a package to")
    assert_untouched(home, before)


@pytest.mark.parametrize("force", [False, True])
def test_a_project_directory_with_git(model, tmp_path, force):
    proj = a_project(tmp_path / "proj")
    before = tree_digest(proj)
    r = compile_to(model, proj, *(["--force"] if force else []))
    assert_one_line_error(r, "is not a deploycc package", "nothing was changed")
    assert_untouched(proj, before)


@pytest.mark.parametrize("force", [False, True])
def test_a_web_app_with_its_own_manifest_json(model, tmp_path, force):
    app = tmp_path / "app"
    app.mkdir()
    (app / "manifest.json").write_text(json.dumps({"format": "deploycc-package", "name": "looks like one"}))
    (app / "index.html").write_text("<html></html>")
    before = tree_digest(app)
    r = compile_to(model, app, *(["--force"] if force else []))
    assert_one_line_error(r, "is not a deploycc package")
    assert_untouched(app, before)


def test_an_output_that_is_a_file(model, tmp_path):
    (tmp_path / "out").write_text("precious")
    assert_one_line_error(compile_to(model, tmp_path / "out", "--force"), "is not a directory")
    assert (tmp_path / "out").read_text() == "precious"


def test_an_output_that_is_a_symbolic_link(model, tmp_path):
    target = a_project(tmp_path / "elsewhere")
    before = tree_digest(target)
    (tmp_path / "link").symlink_to(target)
    assert_one_line_error(compile_to(model, tmp_path / "link", "--force"), "symbolic link")
    assert tree_digest(target) == before and (tmp_path / "link").is_symlink()


# ---- an existing package ------------------------------------------------------------------------

def test_a_package_is_replaced_only_with_force(model, package):
    before = tree_digest(package)
    assert_one_line_error(compile_to(model, package), "holds a deploycc package", "--force")
    assert_untouched(package, before)
    r = compile_to(model, package, "--force", "--override", "prefill_chunk=16")
    assert r.returncode == 0, r.stderr
    assert json.loads((package / "manifest.json").read_text())["bounds"]["prefill_chunk"] == 16
    assert [p.name for p in package.parent.iterdir()] == ["pkg"]


def test_a_package_with_a_file_of_the_user_is_kept(model, package):
    (package / "NOTES.md").write_text("my notes about this build")
    before = tree_digest(package)
    assert_one_line_error(compile_to(model, package, "--force"), "NOTES.md is not part of it")
    assert_untouched(package, before)


def test_a_package_with_an_edited_file_is_kept(model, package):
    with open(package / "kernels" / "kernels.c", "a") as f:  # compiled for the default preset, cpu
        f.write("\n// my experiment\n")
    before = tree_digest(package)
    assert_one_line_error(compile_to(model, package, "--force"), "kernels/kernels.c was changed after compile")
    assert_untouched(package, before)


def test_a_package_with_an_edited_manifest_is_kept(model, package):
    m = json.loads((package / "manifest.json").read_text())
    m["model"]["note"] = "edited by hand"
    (package / "manifest.json").write_text(json.dumps(m))
    before = tree_digest(package)
    assert_one_line_error(compile_to(model, package, "--force"), "does not match manifest.sha256")
    assert_untouched(package, before)


def test_a_package_that_was_run_can_be_replaced(model, package):
    """Running `python PKG` leaves runtime/__pycache__ (unless PYTHONDONTWRITEBYTECODE): still a package deploycc
    wrote. compileall writes the same files the import would."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package / "runtime")], check=True)
    assert any((package / "runtime" / "__pycache__").glob("*.pyc"))
    r = compile_to(model, package, "--force")
    assert r.returncode == 0, r.stderr


def test_an_empty_directory_is_used(model, tmp_path):
    require_device("opencl")
    (tmp_path / "empty").mkdir()
    r = compile_to(model, tmp_path / "empty")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "empty" / "manifest.sha256").is_file()


# ---- interrupted compiles -------------------------------------------------------------------------

KILL_AFTER_WEIGHTS = textwrap.dedent("""
    import os, signal, sys
    import deploycc.package as p
    write = p._write_params
    def write_then_die(*a, **k):
        write(*a, **k)
        os.kill(os.getpid(), signal.SIGKILL)   # as the OOM killer or `kill -9` would
    p._write_params = write_then_die
    p.compile_model(sys.argv[1], "cpu-opencl", out=sys.argv[2], force=True)
""")


def test_a_terminated_compile_removes_its_staging(model, tmp_path):
    """SIGTERM (a service manager, `timeout`, a CI runner) unwinds the compile like Ctrl-C: exit 143, no package,
    no staging directory left (it used to die at once and leave it for the next compile to remove)."""
    require_cc()
    out = tmp_path / "dist" / "pkg"
    p = subprocess.Popen([sys.executable, "-m", "deploycc", "compile", str(model), "--device", "cpu", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (out.parent.is_dir() and any(out.parent.glob(".pkg.deploycc-tmp-*"))):  # writing the package now
        assert p.poll() is None and time.time() < deadline, p.stderr.read()[-2000:]
        time.sleep(0.01)
    p.terminate()
    assert p.wait(timeout=60) == 143
    assert "Traceback" not in p.stderr.read()
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("when", ["marking it", "just made"])
def test_a_sigterm_as_the_staging_directory_appears_leaves_none(tmp_path, monkeypatch, when):
    """The SIGTERM of the test above, at the two instants it once found about one compile in 25 under load: while the
    staging directory was being marked, and between its making and Staging.__enter__'s return (`with` calls no
    __exit__ when __enter__ raises). Staging names the directory before it is made and removes it when the making
    is interrupted (runtime/scratch.py make_at removes one it could not mark): nothing is left beside -o."""
    import signal

    from deploycc import staging
    from deploycc.cli import _terminated
    from deploycc.runtime import scratch

    before = signal.signal(signal.SIGTERM, _terminated)  # deploycc's own (cli.main), restored below
    target = "mark" if when == "marking it" else "make_at"
    real = getattr(scratch, target)

    def then_sigterm(*a, **k):
        out = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return out
    monkeypatch.setattr(scratch, target, then_sigterm)
    out = tmp_path / "dist" / "pkg"
    try:
        with pytest.raises(SystemExit) as e:
            with staging.Staging(out):
                pytest.fail("the block ran: the signal came too late")
    finally:
        signal.signal(signal.SIGTERM, before)
    assert e.value.code == 143 and list(out.parent.iterdir()) == []


def test_a_killed_compile_is_cleaned_up_by_the_next(model, tmp_path):
    require_device("opencl")
    out = tmp_path / "dist" / "pkg"
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_WEIGHTS, str(model), str(out)], capture_output=True)
    assert killed.returncode == -9
    stale = [p for p in out.parent.iterdir()]
    assert len(stale) == 1 and stale[0].name.startswith(".pkg.deploycc-tmp-") and not out.exists()
    assert (stale[0] / "params").is_dir()  # the weights were written when it died
    r = compile_to(model, out)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in out.parent.iterdir()] == ["pkg"]


def test_a_killed_recompile_keeps_the_old_package_and_is_cleaned_up(model, package):
    before = tree_digest(package)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_WEIGHTS, str(make_tiny("llama-gqa1")), str(package)],
                            capture_output=True)
    assert killed.returncode == -9
    assert tree_digest(package) == before  # the old package is whole
    assert compile_to(model, package, "--force").returncode == 0
    assert [p.name for p in package.parent.iterdir()] == ["pkg"]


def test_the_temporary_directory_of_a_running_compile_is_left_alone(model, tmp_path):
    """A marker naming a live process (this one) means a concurrent compile: not stale."""
    require_device("opencl")
    from deploycc.staging import MARKER

    out = tmp_path / "dist" / "pkg"
    live = out.parent / ".pkg.deploycc-tmp-live"
    live.mkdir(parents=True)
    import socket

    (live / MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    unmarked = out.parent / ".pkg.deploycc-tmp-unmarked"  # not provably ours: never removed
    unmarked.mkdir()
    assert compile_to(model, out).returncode == 0
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([live.name, unmarked.name, "pkg"])


def test_an_error_during_compile_leaves_nothing(model, tmp_path):
    """A preset whose limits the kernels cannot meet fails after the passes ran; nothing is left."""
    out = tmp_path / "dist" / "pkg"
    r = compile_to(model, out, "--device", "cpu-webgpu", "--override", "target.max_storage_buffers=2")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_a_damaged_entry_of_the_package_cache_is_compiled_again(tmp_path):
    """`run MODEL --device` compiles into deploycc's own cache; an entry changed since (a disk error, an edit)
    is removed and compiled anew rather than refused as 'not a package'."""
    require_device("opencl")
    from test_package_cli import with_tokenizer

    model = with_tokenizer(make_tiny("llama-gqa1"), tmp_path / "model")
    env = {"DEPLOYCC_HOME": str(tmp_path / "home")}
    args = ("run", model, "--device", "cpu-opencl", "--prompt", "hi", "--max-tokens", "3", "--json")
    first = cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    [entry] = (tmp_path / "home" / "packages").iterdir()
    with open(entry / "kernels" / "kernels.cl", "a") as f:
        f.write("\n// damaged\n")
    again = cli(*args, env=env)
    assert again.returncode == 0, again.stderr
    assert "// damaged" not in (entry / "kernels" / "kernels.cl").read_text()
    assert json.loads(again.stdout)["generated"] == json.loads(first.stdout)["generated"]
    assert [p.name for p in (tmp_path / "home" / "packages").iterdir()] == [entry.name]
