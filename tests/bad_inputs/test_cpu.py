"""Catalogue: the cpu target's own bad inputs. A cpu package carries native code (kernels/kernels.so) and the data
that binds it (manifest kernels.native: the CPU flags it was built for, the weights table and shape heap its step
functions index, the instructions left to Python around each native call). Each package case edits a compiled
cpu package, reseals it (every sha256 and manifest.sha256 made to agree, so the hash check is not what refuses
it), and runs `deploycc run PKG` and `python PKG run`: exit 1, one line `error: ...` naming what is wrong and
saying what to do, no traceback, and no crash (a signal is a negative exit code). A compile without a C compiler
is one line and leaves nothing behind.

The base package is the tiny llama with a tokenizer compiled for `cpu` with prefill_chunk 16, so the prompt LONG
(more than 16 tokens with the chat template) prefills in chunks, the later ones with seq_len < total_len.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import require_cc
from tiny_package import compile_tiny_package

from bad_inputs.common import assert_one_line_error, cli, launches_with, reseal, run_package
from fixtures import make_tiny

LONG = "x" * 50  # over 16 tokens with the template: prefilled in chunks of 16
NATIVE = "manifest.json: kernels.native"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    require_cc()
    return compile_tiny_package(tmp_path_factory.mktemp("bad-cpu-packages"), "cpu", ("prefill_chunk=16",))


# ---- edits -------------------------------------------------------------------------------------------

def native(change):
    """An edit of manifest.json's kernels.native section."""
    def edit(pkg: Path) -> None:
        m = json.loads((pkg / "manifest.json").read_text())
        change(m["kernels"]["native"])
        (pkg / "manifest.json").write_text(json.dumps(m))
    return edit


def _add_flag(n) -> None:
    n["cpu_flags"] = sorted(n["cpu_flags"] + ["amx_fp8_fake"])


def _garbage(pkg: Path) -> None:
    (pkg / "kernels" / "kernels.so").write_bytes(random.Random(0).randbytes(8192))


def _truncated(pkg: Path) -> None:
    """The first half of the real object: an ELF header whose segments reach past the end of the file."""
    so = pkg / "kernels" / "kernels.so"
    data = so.read_bytes()
    so.write_bytes(data[:len(data) // 2])


def _cc(pkg: Path, source: Path, *flags: str) -> None:
    r = subprocess.run([*require_cc(), "-O0", "-shared", "-fPIC", "-pthread", "-march=native", *flags, str(source), "-o",
                        str(pkg / "kernels" / "kernels.so"), "-lm"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def _not_a_module(pkg: Path) -> None:
    """A valid shared object that is no deploycc module: no dcc_init, no kernels, no steps."""
    src = pkg / "kernels" / "other.c"
    src.write_text("int not_deploycc(int x) { return x + 1; }\n")
    _cc(pkg, src)
    src.unlink()


def _no_decode_step(pkg: Path) -> None:
    """The package's own kernels.c compiled with its decode step renamed: every kernel is there, dcc_decode not."""
    _cc(pkg, pkg / "kernels" / "kernels.c", "-Ddcc_decode=dcc_decode_renamed")


def _swap_weights(n) -> None:
    w = n["weights"]
    w[0], w[-1] = w[-1], w[0]


def _reverse_prefill_heap(n) -> None:
    heap = n["functions"]["prefill"]["heap"]
    assert heap == ["seq_len", "total_len", "batch", "pages_len"], heap
    heap.reverse()


def _shorten_decode_prologue(n) -> None:
    """Leave out the last prologue instruction (decode's match that binds total_len): the native call would read
    a shape value nothing set."""
    n["functions"]["decode"]["prologue"] -= 1


def _set(key, value):
    return lambda n: n.__setitem__(key, value)


# Found by the cpu package fuzzer (tests/fuzz/test_fuzz_package.py: test_fuzz_cpu_package).

def _unnamed_param(pkg: Path) -> None:
    """A param without its name: the native weight table's check read the names before the params were checked
    (a KeyError traceback)."""
    m = json.loads((pkg / "manifest.json").read_text())
    del m["params"][-1]["name"]
    (pkg / "manifest.json").write_text(json.dumps(m))


def _head_cut_with_its_tables(pkg: Path) -> None:
    """lm_head's 4-bit weights cut to one row of the vocabulary's, and everything JSON says about it made to agree:
    the params file, the argument tables of the kernels launched with it, the memory summary. The schema and the
    dry run pass; the compiled head kernel still reads every row (past the end of the buffer: garbage logits, or
    a crash where the page ends)."""
    from safetensors.numpy import load_file, save_file

    m = json.loads((pkg / "manifest.json").read_text())
    bc = json.loads((pkg / "bytecode.json").read_text())
    p = next(p for p in m["params"] if p["name"] == "lm_head.q_weight")
    tensors = load_file(str(pkg / p["file"]))
    tensors[p["name"]] = np.ascontiguousarray(tensors[p["name"]][:1])
    save_file(tensors, str(pkg / p["file"]))
    cut = [1, *p["shape"][1:]]
    m["memory"]["weights_bytes"] -= (p["shape"][0] - 1) * tensors[p["name"]].nbytes
    p["shape"] = cut
    for kernel, j in launches_with(bc, p["name"]):
        m["kernels"]["entries"][kernel]["args"]["buffers"][j]["shape"] = cut
    (pkg / "manifest.json").write_text(json.dumps(m))


def _decode_launch_twice(pkg: Path) -> None:
    """decode's first kernel launched twice in bytecode.json, the native section's epilogue moved to agree: a
    valid bytecode, but not the one kernels.so's decode step was compiled from."""
    m = json.loads((pkg / "manifest.json").read_text())
    bc = json.loads((pkg / "bytecode.json").read_text())
    code = bc["functions"]["decode"]["instructions"]
    first = next(i for i, ins in enumerate(code) if ins.get("fn") == "vm.launch")
    code.insert(first, code[first])
    fn = m["kernels"]["native"]["functions"]["decode"]
    fn["epilogue"] = [i + 1 for i in fn["epilogue"]]
    (pkg / "bytecode.json").write_text(json.dumps(bc))
    (pkg / "manifest.json").write_text(json.dumps(m))


# (id, edit, fragments of the error, prompt)
CASES = [
    ("CPU flag this CPU lacks", native(_add_flag),
     ("needs CPU features this CPU lacks (amx_fp8_fake)", "compile it for this machine with --device cpu"), "x"),
    ("kernels.so garbage", _garbage, ("not a complete 64-bit shared object", "kernels.so", "recompile the package"), "x"),
    ("kernels.so truncated", _truncated, ("kernels.so", "recompile the package"), "x"),
    ("kernels.so not a deploycc module", _not_a_module, ("kernels.so", "recompile the package"), "x"),
    ("kernels.so without the decode step", _no_decode_step, ("dcc_decode", "recompile the package"), "x"),
    ("native isa not the target's", native(_set("isa", "x86-64-v4")),
     (f"{NATIVE}.isa is 'x86-64-v4', but the target was compiled for 'native'", "; recompile"), "x"),
    ("native weights truncated", native(lambda n: n["weights"].__delitem__(slice(1, None))),
     (f"{NATIVE}.weights", "; recompile"), "x"),
    ("native weights reordered", native(_swap_weights), (f"{NATIVE}.weights", "; recompile"), "x"),
    ("prefill heap reversed", native(_reverse_prefill_heap), (f"{NATIVE}.functions.prefill.heap", "; recompile"), LONG),
    ("decode prologue shortened", native(_shorten_decode_prologue),
     (f"{NATIVE}.functions.decode.prologue", "; recompile"), "x"),
    ("decode epilogue emptied", native(lambda n: n["functions"]["decode"].__setitem__("epilogue", [])),
     (f"{NATIVE}.functions.decode.epilogue", "; recompile"), "x"),
    ("param without a name", _unnamed_param, ("manifest.json: params[", "lacks 'name'", "; recompile"), "x"),
    ("head weight cut, its argument tables too", _head_cut_with_its_tables,
     ("kernels.so was compiled for other kernel argument tables than manifest.json kernels.entries",
      "; recompile"), "x"),
    ("decode launch repeated, epilogue moved", _decode_launch_twice,
     ("kernels.so was compiled from another bytecode.json function decode", "; recompile"), "x"),
]


@pytest.mark.parametrize("edit,fragments,prompt", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_edited_cpu_package(base, tmp_path, edit, fragments, prompt):
    pkg = shutil.copytree(base, tmp_path / "pkg")
    edit(pkg)
    reseal(pkg)
    with ThreadPoolExecutor(2) as pool:  # the two command lines at once: each is mostly interpreter start-up
        runs = [pool.submit(cli, "run", pkg, "--prompt", prompt, "--max-tokens", "4", timeout=120),
                pool.submit(run_package, pkg, "run", "--prompt", prompt, "--max-tokens", "4", timeout=120)]
    for r in runs:
        assert_one_line_error(r.result(), *fragments)


def test_the_base_package_runs(base):
    """The cases above fail because of their edit: the package as compiled answers both prompts."""
    for prompt in ("x", LONG):
        r = cli("run", base, "--prompt", prompt, "--max-tokens", "4", "--json", timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout)
        assert len(out["generated"]) == 4
    assert out["prompt_tokens"] > 16  # LONG takes more than one prefill chunk


# ---- compile -----------------------------------------------------------------------------------------

def test_compile_without_a_c_compiler(tmp_path):
    """$CC unset and nothing but python on PATH (no cc, gcc or clang), ziglang not installed: `compile --device cpu`
    is one line naming how to install one, and leaves neither the package nor its temporary directory."""
    if importlib.util.find_spec("ziglang") is not None:
        pytest.skip("ziglang is installed here: `python -m ziglang cc` is a C compiler")
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env.update(PATH=str(bare), DEPLOYCC_HOME=str(tmp_path / "home"))
    out = tmp_path / "out" / "pkg"
    out.parent.mkdir()
    r = subprocess.run([sys.executable, "-m", "deploycc", "compile", str(make_tiny("llama-gqa1")), "--device", "cpu",
                        "-o", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert_one_line_error(r, "no C compiler found for the cpu target", "apt-get install gcc", "pip install ziglang")
    assert not out.exists()
    assert list(out.parent.iterdir()) == [], list(out.parent.iterdir())
