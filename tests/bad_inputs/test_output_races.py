"""Catalogue, continued from test_output.py: what `deploycc compile -o DIR` must not delete when something races it.

The writers of issue 24 race a real compile for cpu (it needs a C compiler): the command line runs paused at a
named point (PAUSING) while another process writes or compiles, so each interleaving happens every time. A compile
killed while the C compiler runs leaves no process and no file behind (KILL_IN_CC).
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
from conftest import require_cc

from bad_inputs.common import assert_one_line_error, compile_to, tree_digest
from fixtures import make_tiny


@pytest.fixture(scope="module")
def model() -> Path:
    return make_tiny("llama-gqa1")


# ---- writers while a compile runs (issue 24) ------------------------------------------------------

PAUSING = textwrap.dedent("""
    # python -c PAUSING FLAGS POINT ARGS...: `deploycc ARGS`, paused at POINT until FLAGS/resume exists (it writes
    # FLAGS/paused when there): weights (written), commit (before the package is put in place), rename (just
    # before the staging directory is renamed onto the output), aside (just after a package being replaced was
    # renamed aside).
    import os, sys, time
    from pathlib import Path
    import deploycc.staging as o
    import deploycc.package as p
    from deploycc.cli import main

    flags, point = Path(sys.argv[1]), sys.argv[2]
    def pause():
        (flags / "paused").write_text(str(os.getpid()))
        while not (flags / "resume").exists():
            time.sleep(0.02)
    if point == "weights":
        write = p._write_params
        def write_then_pause(*a, **k):
            r = write(*a, **k)
            pause()
            return r
        p._write_params = write_then_pause
    elif point == "commit":
        commit = o.Staging.commit
        def pause_then_commit(self):
            pause()
            commit(self)
        o.Staging.commit = pause_then_commit
    else:
        rename = os.rename
        def rename_and_pause(src, dst, *a, **k):
            if point == "rename" and ".deploycc-tmp-" in str(src):
                pause()
            rename(src, dst, *a, **k)
            if point == "aside" and ".deploycc-old-" in str(dst):
                pause()
        os.rename = rename_and_pause
    sys.argv = ["deploycc", *sys.argv[3:]]
    main()
""")


def start_paused(flags: Path, point: str, *args) -> subprocess.Popen:
    """A real `deploycc ARGS` (PAUSING), once it is paused at `point`."""
    flags.mkdir()
    p = subprocess.Popen([sys.executable, "-c", PAUSING, str(flags), point, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (flags / "paused").exists():
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            pytest.fail(f"the compile did not reach {point}: {p.communicate()[1][-3000:]}")
        time.sleep(0.05)
    return p


def resume(p: subprocess.Popen, flags: Path) -> subprocess.CompletedProcess:
    (flags / "resume").touch()
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.fixture
def cpu_package(model, tmp_path) -> Path:
    require_cc()
    r = compile_to(model, tmp_path / "dist" / "pkg", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    return tmp_path / "dist" / "pkg"


def test_a_file_written_into_a_new_output_while_compiling_is_kept(model, tmp_path):
    """The issue's reproduction: `-o DIR` names a new directory; while the compile runs, another process (a shell)
    makes DIR and writes a file into it. The compile must fail and leave the file."""
    require_cc()
    out = tmp_path / "dist" / "pkg"
    p = start_paused(tmp_path / "flags", "weights", "compile", model, "--device", "cpu", "-o", out, "--json")
    subprocess.run(["sh", "-c", 'mkdir -p "$1" && echo notes > "$1/NOTES.txt"', "sh", str(out)], check=True)
    assert_one_line_error(resume(p, tmp_path / "flags"), "was written to while this compile ran", "nothing was changed")
    assert (out / "NOTES.txt").read_text() == "notes\n"
    assert [q.name for q in out.iterdir()] == ["NOTES.txt"]
    assert [q.name for q in out.parent.iterdir()] == ["pkg"]


def test_a_file_written_into_a_package_being_replaced_is_kept(model, cpu_package, tmp_path):
    """--force replaces a package; a file the user writes into it while the compile runs makes it something
    else, which is kept whole."""
    before = tree_digest(cpu_package)
    p = start_paused(tmp_path / "flags", "weights", "compile", model, "--device", "cpu", "-o", cpu_package, "--force",
                     "--json")
    (cpu_package / "NOTES.txt").write_text("my notes about this build")
    r = resume(p, tmp_path / "flags")
    assert_one_line_error(r, "was written to while this compile ran", "NOTES.txt is not part of it", "nothing was changed")
    assert tree_digest(cpu_package) == {**before, "NOTES.txt": tree_digest(cpu_package)["NOTES.txt"]}
    assert (cpu_package / "NOTES.txt").read_text() == "my notes about this build"
    assert [q.name for q in cpu_package.parent.iterdir()] == ["pkg"]


def test_a_file_written_into_a_package_set_aside_is_put_back(model, cpu_package, tmp_path):
    """The package being replaced is renamed aside before it is removed; a shell whose working directory it is
    writes a file into it right then (it takes no lock). The package is checked again there and renamed back."""
    before = tree_digest(cpu_package)
    go = tmp_path / "go"
    shell = subprocess.Popen(["sh", "-c", 'while [ ! -e "$1" ]; do sleep 0.02; done; echo notes > NOTES.txt', "sh",
                              str(go)], cwd=cpu_package)
    p = start_paused(tmp_path / "flags", "aside", "compile", model, "--device", "cpu", "-o", cpu_package, "--force",
                     "--json")
    assert not cpu_package.exists()  # renamed aside, with the shell inside it
    go.touch()
    assert shell.wait(timeout=60) == 0
    r = resume(p, tmp_path / "flags")
    assert_one_line_error(r, "NOTES.txt is not part of it", "nothing was changed")
    assert (cpu_package / "NOTES.txt").read_text() == "notes\n"
    assert {k: v for k, v in tree_digest(cpu_package).items() if k != "NOTES.txt"} == before
    assert [q.name for q in cpu_package.parent.iterdir()] == ["pkg"]


def test_an_output_filled_just_before_the_rename_is_kept(model, tmp_path):
    """A writer that takes no lock fills the new output between the compile's last check and its rename: the
    rename of a directory onto a non-empty one fails, and that is the error."""
    require_cc()
    out = tmp_path / "dist" / "pkg"
    p = start_paused(tmp_path / "flags", "rename", "compile", model, "--device", "cpu", "-o", out, "--json")
    out.mkdir()
    (out / "NOTES.txt").write_text("notes")
    assert_one_line_error(resume(p, tmp_path / "flags"), "was written to while this compile ran", "nothing was changed")
    assert [q.name for q in out.iterdir()] == ["NOTES.txt"] and (out / "NOTES.txt").read_text() == "notes"
    assert [q.name for q in out.parent.iterdir()] == ["pkg"]


def test_a_package_set_aside_is_kept_when_its_place_is_taken(model, cpu_package, tmp_path):
    """--force: the package was set aside and found whole, and then a writer that takes no lock made the output
    again before the new package could be renamed there. Neither the writer's file nor the old package is
    deleted, now or by the next compile's cleanup; the error says where the package is."""
    from deploycc.staging import remove_stale

    before = tree_digest(cpu_package)
    p = start_paused(tmp_path / "flags", "aside", "compile", model, "--device", "cpu", "-o", cpu_package, "--force",
                     "--json")
    cpu_package.mkdir()
    (cpu_package / "NOTES.txt").write_text("notes")
    line = assert_one_line_error(resume(p, tmp_path / "flags"), "nothing was deleted", "the package that was there")
    [old] = [q for q in cpu_package.parent.iterdir() if q.name != "pkg"]
    assert str(old) in line and tree_digest(old) == before
    assert remove_stale(cpu_package) == [] and tree_digest(old) == before
    assert [q.name for q in cpu_package.iterdir()] == ["NOTES.txt"]


@pytest.mark.parametrize("force", [False, True])
def test_two_compiles_to_one_new_output(model, tmp_path, force):
    """Both start on a new -o; the first pauses before putting its package in place until the second has put
    its own there. Without --force the first then finds a package and leaves it; with it, it replaces it whole."""
    require_cc()
    out = tmp_path / "dist" / "pkg"
    flag = ["--force"] if force else []
    first = start_paused(tmp_path / "flags", "commit", "compile", model, "--device", "cpu", "-o", out, *flag,
                         "--override", "prefill_chunk=16", "--json")
    second = compile_to(model, out, "--device", "cpu", *flag, "--json")
    assert second.returncode == 0, second.stderr
    written = tree_digest(out)
    r = resume(first, tmp_path / "flags")
    assert [q.name for q in out.parent.iterdir()] == ["pkg"]
    from deploycc.staging import foreign_content

    assert foreign_content(out) is None
    chunk = json.loads((out / "manifest.json").read_text())["bounds"]["prefill_chunk"]
    if force:
        assert r.returncode == 0, r.stderr
        assert chunk == 16  # the first's, whole
    else:
        assert_one_line_error(r, "holds a deploycc package written while this compile ran", "pass --force")
        assert tree_digest(out) == written and chunk != 16


def flock_waiters(pid: int) -> bool:
    """Whether process `pid` waits for an flock (a `->` line of /proc/locks)."""
    return any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(pid)
               for line in Path("/proc/locks").read_text().splitlines())


def test_a_compile_waits_while_another_puts_its_package_in_place(model, tmp_path):
    """The first compile holds the output's lock from its last check to its rename (paused just before the
    rename); a second one started then waits at its own first check, and once the first is done finds its
    package there (no --force: it stops, before any model work)."""
    require_cc()
    if not Path("/proc/locks").exists():
        pytest.skip("no /proc/locks to see a waiting lock in")
    out = tmp_path / "dist" / "pkg"
    first = start_paused(tmp_path / "flags", "rename", "compile", model, "--device", "cpu", "-o", out, "--json")
    second = subprocess.Popen([sys.executable, "-m", "deploycc", "compile", str(model), "--device", "cpu", "-o", str(out),
                               "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while second.poll() is None and not flock_waiters(second.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flock_waiters(second.pid), ("the second compile did not wait", second.poll())
    r = resume(first, tmp_path / "flags")
    assert r.returncode == 0, r.stderr
    written = tree_digest(out)
    out2, err2 = second.communicate(timeout=300)
    assert_one_line_error(subprocess.CompletedProcess(second.args, second.returncode, out2, err2),
                          "holds a deploycc package", "pass --force")
    assert tree_digest(out) == written
    assert [q.name for q in out.parent.iterdir()] == ["pkg"]


# ---- the C compiler of a killed compile ---------------------------------------------------------

KILL_IN_CC = textwrap.dedent("""
    # python -c KILL_IN_CC PIDS compile ARGS... | build SOURCE: SIGKILLed (as `kill -9` or the OOM killer would)
    # while the C compiler proper runs; PIDS gets the processes below this one at that moment.
    import os, signal, subprocess, sys, time
    from pathlib import Path

    def below(root):
        parent = {}
        for d in Path("/proc").iterdir():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (ValueError, OSError):
                pass
        out, todo = [], [root]
        while todo:
            pid = todo.pop()
            kids = [p for p, pp in parent.items() if pp == pid]
            out += kids
            todo += kids
        return out

    def compiling(pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        except OSError:
            return False
        return os.path.basename(argv[0]) in (b"cc1", b"cc1plus") or b"-cc1" in argv

    class KillInCompiler(subprocess.Popen):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            deadline = time.monotonic() + 60
            while not any(compiling(p) for p in below(os.getpid())) and time.monotonic() < deadline:
                time.sleep(0.005)
            pids.write_text(" ".join(map(str, below(os.getpid()))))
            os.kill(os.getpid(), signal.SIGKILL)

    pids = Path(sys.argv[1])
    subprocess.Popen = KillInCompiler
    if sys.argv[2] == "build":
        from deploycc.runtime import native
        native.build_cached(Path(sys.argv[3]).read_text(), "generic", False)
    else:
        from deploycc.cli import main
        sys.argv = ["deploycc", *sys.argv[2:]]
        main()
""")


def assert_all_ended(pids_file: Path, within: float = 2.0) -> None:
    """Every process recorded in `pids_file` has ended (or is a zombie) within `within` seconds: nothing of the
    compiler goes on writing after the compile was killed."""
    pids = [int(p) for p in pids_file.read_text().split()]
    assert pids, "no compiler process was running"

    def alive(pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in pids if alive(p)], [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in pids if alive(p)]


def test_a_compile_killed_in_the_c_compiler_leaves_nothing_behind(model, tmp_path):
    """The compiler's work directory lies inside the compile's staging directory and its temporary files too
    (TMPDIR): nothing lands in /tmp, nothing of the compiler outlives the compile, and the next compile removes
    what was left."""
    require_cc()
    out = tmp_path / "dist" / "pkg"
    (tmp_path / "tmp").mkdir()
    # a cache of its own: a library of these kernels built before would be copied, and no compiler would run
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "DEPLOYCC_HOME": str(tmp_path / "home")}
    killed = subprocess.run([sys.executable, "-c", KILL_IN_CC, str(tmp_path / "pids"), "compile", str(model), "--device",
                             "cpu", "-o", str(out), "--json"], capture_output=True, text=True, env=env)
    assert killed.returncode == -9, killed.stderr
    assert_all_ended(tmp_path / "pids")
    assert list((tmp_path / "tmp").iterdir()) == []
    [stale] = out.parent.iterdir()
    assert stale.name.startswith(".pkg.deploycc-tmp-")
    assert [w.name[:4] for w in (stale / "kernels").iterdir() if w.is_dir()] == [".cc-"]
    r = compile_to(model, out, "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    assert [q.name for q in out.parent.iterdir()] == ["pkg"]


def test_a_killed_build_of_the_native_cache_is_cleaned_up_by_the_next(tmp_path, monkeypatch):
    """The cpu device's build_cached (no staging directory): a marked work directory in the cache, which the
    next build removes once its owner is gone (one whose owner lives is left alone)."""
    require_cc()
    from deploycc.runtime import native, scratch

    source = "".join(f"double f{i}(const double *a, int n) {{ double s = 0; for (int j = 0; j < n; j++) "
                     f"s += a[j] * {i} + a[n - j - 1]; return s; }}\n" for i in range(400))
    (tmp_path / "module.c").write_text(source)
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    tmp.mkdir()
    killed = subprocess.run([sys.executable, "-c", KILL_IN_CC, str(tmp_path / "pids"), "build",
                             str(tmp_path / "module.c")], capture_output=True, text=True,
                            env={**os.environ, "TMPDIR": str(tmp), "DEPLOYCC_HOME": str(home)})
    assert killed.returncode == -9, killed.stderr
    assert_all_ended(tmp_path / "pids")
    assert list(tmp.iterdir()) == []
    [stale] = (home / "native").iterdir()
    assert stale.name.startswith(native.CC_WORK) and (stale / scratch.MARKER).is_file()
    live = scratch.make(home / "native", native.CC_WORK)  # this process's: a build that still runs
    monkeypatch.setenv("DEPLOYCC_HOME", str(home))
    so = native.build_cached(source, "generic", False)
    assert sorted(p.name for p in (home / "native").iterdir()) == sorted([so.name, live.name])


def test_the_c_compiler_is_killed_with_its_group_on_a_timeout(tmp_path):
    """A compiler that does not finish: its whole process group (a child it started included) ends with the
    error."""
    from deploycc.runtime import native

    script = 'sleep 60 & echo $! > pids; echo $$ >> pids; wait'
    with pytest.raises(native.NativeError, match="did not finish within 1 s"):
        native._run_compiler(["sh", "-c", script], [], tmp_path, timeout=1)
    assert_all_ended(tmp_path / "pids", within=0.5)
