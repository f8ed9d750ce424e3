"""Bad input, packages: a compiled package edited after compile, then resealed (every sha256 and manifest.sha256
made to agree, as a careless or hostile editor could), so the package validator — not the hash check — is
what must refuse it. Each case runs `deploycc run PKG --prompt hi` and `python PKG run --prompt hi` and
expects exit 1, one line `error: ...` naming the field, no traceback, and no crash.
"""
from __future__ import annotations

import json
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tiny_package import compile_tiny_package

from bad_inputs.common import assert_one_line_error, cli, reseal, run_package

LONG = "word " * 300  # past the package's context window and prefill chunk
NOT_A_PACKAGE = "is not a deploycc package manifest"  # the one error that does not say to recompile


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return compile_tiny_package(tmp_path_factory.mktemp("bad-packages"))


# ---- edits -------------------------------------------------------------------------------------------

def manifest(change):
    return lambda pkg: _edit(pkg / "manifest.json", change)


def bytecode(change):
    return lambda pkg: _edit(pkg / "bytecode.json", change)


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _summarise(m) -> None:
    """The memory summary made to agree with the edit, so the check behind it is what fails."""
    m["memory"]["activation_bytes"] = sum(s["bytes"] for s in m["storages"])
    kv = m["kv_cache"]
    m["memory"]["kv_cache_bytes"] = 2 * kv["layers"] * m["bounds"]["context_window"] * kv["kv_heads"] * kv["head_dim"] * 4
    m["memory"]["weights_bytes"] = sum(4 * math.prod(p["shape"]) for p in m["params"])  # all float32 (q0f32)


def _ring_rows(m) -> None:
    """Rings claimed for the layers of a model without sliding windows, the memory summary made to agree."""
    kv = m["kv_cache"]
    kv["rows"] = [16] * kv["layers"]
    m["bounds"]["prefill_chunk"] = 8
    kv["pool"]["sequences"] = min(kv["pool"]["sequences"], 8)
    m["memory"]["kv_cache_bytes"] = 2 * kv["layers"] * 16 * kv["kv_heads"] * kv["head_dim"] * 4


def _shrink_storage(m) -> None:
    m["storages"][0]["bytes"] = 28672 - 4  # a full prefill chunk needs 28672
    _summarise(m)


def _raise_bounds(m) -> None:
    m["bounds"].update(context_window=1024, prefill_chunk=1024)
    m["kv_cache"]["pool"].update(pages=64)  # a page pool that holds the raised window, as the check wants
    _summarise(m)


def _shorter_embedding(m) -> None:
    m["params"][0]["shape"] = [50, 32]
    _summarise(m)


def _launch(bc, kernel, fname="prefill"):
    return next(ins for ins in bc["functions"][fname]["instructions"] if ins.get("fn") == "vm.launch"
                and ins["args"][0]["k"] == kernel)


def _meta(bc) -> list[dict]:
    """The step function's kv.meta instructions (its batch's metadata: pos, seq, slot, pages, last)."""
    return [ins for ins in bc["functions"]["step"]["instructions"] if ins.get("fn") == "kv.meta"]


def _pool_write_without_slots(bc) -> None:
    """The first append to the page pool given the tokens' positions where it takes their pool rows."""
    pos = next(ins["dst"] for ins in _meta(bc) if ins["args"][1]["str"] == "pos")
    _launch(bc, "kv_copy_paged", "step")["args"][4] = {"r": pos}


def _kv_offset(bc) -> None:
    ins = _launch(bc, "kv_copy")
    ins["args"][-1] = {"s": "total_len"}  # offset: rows past this step's


def _write_weight(bc) -> None:
    ins = _launch(bc, "rms_norm")
    ins["args"][5] = ins["args"][4]  # the output buffer := the norm's weight


def _params_file_lies(pkg: Path) -> None:
    """The safetensors shard rewritten with a shorter embedding; the manifest still says [101, 32]."""
    from safetensors.numpy import load_file, save_file

    f = pkg / "params" / "params-00000.safetensors"
    tensors = load_file(str(f))
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:50].copy()
    save_file(tensors, str(f))


def _write(rel: str, data: bytes):
    return lambda pkg: (pkg / rel).write_bytes(data)


def _set(*path_and_value):
    *path, value = path_and_value

    def change(doc):
        for k in path[:-1]:
            doc = doc[k]
        doc[path[-1]] = value
    return change


def _instruction(fname, i, **fields):
    return lambda bc: bc["functions"][fname]["instructions"][i].update(fields)


# (id, edit, fragment of the error, prompt)
CASES = [
    ("storage shrunk", manifest(_shrink_storage), "needs 28672 bytes of storage 0", "hi"),
    ("storage shrunk, summary not", manifest(_set("storages", 0, "bytes", 100)), "memory.activation_bytes is 147776", "hi"),
    ("bounds raised, long prompt", manifest(_raise_bounds), "as buffer 1 of kv_copy, which takes float32 [128, 4, 8]", LONG),
    ("unknown builtin", bytecode(_instruction("decode", 2, fn="vm.exec")), "fn is 'vm.exec'", "hi"),
    ("goto", bytecode(_instruction("decode", 2, op="goto")), "op is 'goto'; expected one of call, ret", "hi"),
    ("register out of range", bytecode(_instruction("decode", 2, args=[{"r": 9999}])), "must be an integer in 0..55, "
                                                                                      "got 9999", "hi"),
    ("register never written", bytecode(_instruction("decode", 2, args=[{"r": 40}])), "reads register 40 before", "hi"),
    ("kernel file outside the package", manifest(_set("kernels", "entries", "take", "file", "../../etc/passwd")),
     "file is '../../etc/passwd', not a file of the package's kernels/", "hi"),
    ("params shape lie, manifest", manifest(_shorter_embedding), "passes float32 [50, 32] (weight) as buffer 0 of take",
     "hi"),
    ("params shape lie, safetensors", _params_file_lies, "tensor model.embed_tokens.weight is [50, 32] F32, the manifest "
                                                         "says [101, 32] float32", "hi"),
    ("bytecode not JSON", _write("bytecode.json", b'{"version": 1, "functions": {'), "bytecode.json is unreadable", "hi"),
    ("bytecode not UTF-8", _write("bytecode.json", b'{"version": "\xff\xfe"}'), "bytecode.json is unreadable", "hi"),
    ("bytecode a list", _write("bytecode.json", b"[1, 2, 3]"), "bytecode.json must be an object, got [1, 2, 3]", "hi"),
    ("kernel source not UTF-8", _write("kernels/kernels.cl", b"__kernel void take(\xff"), "is not UTF-8 text", "hi"),
    ("context_window a string", manifest(_set("bounds", "context_window", "128")), "bounds.context_window must be an "
                                                                                   "integer", "hi"),
    ("context_window NaN", manifest(_set("bounds", "context_window", float("nan"))), "got nan", "hi"),
    ("kv_cache a list", manifest(_set("kv_cache", [2, 4, 8])), "kv_cache must be an object", "hi"),
    ("params null", manifest(_set("params", None)), "params must be a list, got None", "hi"),
    ("KV rings smaller than a step", manifest(_set("kv_cache", "rows", [1, 1])), "kv_cache.rows[0] is 1; a ring holds at "
                                                                               "least a step's 128 rows", "hi"),
    ("KV rings a number", manifest(_set("kv_cache", "rows", 16)), "kv_cache.rows must list the ring rows of each of "
                                                                 "the 2 layers", "hi"),
    ("KV rings without windows", manifest(_ring_rows), "passes float32 [16, 4, 8] (cache) as buffer 1 of kv_copy, "
                                                       "which takes float32 [128, 4, 8]", "hi"),
    ("storage bytes 2**63", manifest(_set("storages", 1, "bytes", 2**63)), "storages[1].bytes must be an integer", "hi"),
    ("format marker", manifest(_set("format", "deploycc-pkg")), NOT_A_PACKAGE, "hi"),
    ("vocab_size 0", manifest(_set("vocab_size", 0)), "vocab_size must be an integer in 1..", "hi"),
    ("vocab_size not the logits'", manifest(_set("vocab_size", 200)), "not the logits: float32 [1, 1, 200]", "hi"),
    ("no decode", bytecode(lambda bc: bc["functions"].pop("decode")), "functions lacks 'decode'", "hi"),
    ("KV rows out of the step", bytecode(_kv_offset), "lets kv_copy write rows 1..1 of the KV cache", "hi"),
    ("kernel writes a weight", bytecode(_write_weight), "lets rms_norm write its buffer 2, which is the weight", "hi"),
    ("divide by zero", bytecode(lambda bc: _launch(bc, "take")["args"].__setitem__(1, {"s": ["//", "seq_len", 0]})),
     "positive constant divisor", "hi"),
    ("page pool smaller than a context window", manifest(_set("kv_cache", "pool", "pages", 1)),
     "kv_cache.pool.pages must be an integer in 8..", "hi"),
    ("no step beside a page pool", bytecode(lambda bc: bc["functions"].pop("step")),
     "must have a step function exactly where manifest.json kv_cache has a pool", "hi"),
    ("page pool written without the slots", bytecode(_pool_write_without_slots),
     "lets kv_copy_paged write the KV cache without affine int arguments", "hi"),
    ("unknown step metadata", bytecode(lambda bc: _meta(bc)[0]["args"].__setitem__(1, {"str": "frob"})),
     "args[1].str is 'frob'", "hi"),
]


@pytest.mark.parametrize("edit,fragment,prompt", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_edited_package(base, tmp_path, edit, fragment, prompt):
    pkg = shutil.copytree(base, tmp_path / "pkg")
    edit(pkg)
    reseal(pkg)
    fragments = (fragment,) if fragment == NOT_A_PACKAGE else (fragment, "; recompile")
    with ThreadPoolExecutor(2) as pool:  # the two command lines at once: each is mostly interpreter start-up
        runs = [pool.submit(cli, "run", pkg, "--prompt", prompt, timeout=120),
                pool.submit(run_package, pkg, "run", "--prompt", prompt, timeout=120)]
    for r in runs:
        assert_one_line_error(r.result(), *fragments)


def test_a_python_without_the_runtime_dependencies(base):
    """`python -S PKG` sees no site-packages (no numpy, no tokenizers): one line naming the missing module."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-S", str(base), "run", "--prompt", "hi"], capture_output=True, text=True,
                       timeout=60)
    assert_one_line_error(r, "this package needs the Python module", "pip install numpy")
