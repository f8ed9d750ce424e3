"""`verify --kernels`: every kernel of a package against its loop-level program, on the package's own device
(runtime/kernel_check.py, runtime/loopir.py; the programs travel in kernels/programs.json, deploycc/vm/programs.py).

Tiny packages of qwen3-x32 (every linear a multiple of 32, so the cpu target's integer kernels take all of them) on
cpu (q4f16_2, 8-bit activations), cpu-opencl and cpu-webgpu (q4f16_1): every kernel agrees with its program, bit for
bit where the program rounds no float, within kernel_check.FLOAT_TOLERANCE (1e-4 of the output's largest element)
otherwise (measured at most 6e-7); from the package alone (`python -S PKG verify --kernels`, deploycc not
importable); and a package whose RMSNorm kernel stores each row rotated by one element (its C or OpenCL source
edited, the .so rebuilt, the package resealed) fails, in one line naming that kernel. The package-side interpreter
agrees with deploycc's (deploycc/ir/tir_interp.py) on every program of a module, and rounds activations as
deploycc/op/linalg.py does.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bad_inputs.common import cli, reseal, run_package
from conftest import require_cc, require_device

from fixtures import make_tiny

FIXTURE = "qwen3-x32"
TARGETS = {"cpu": "q4f16_2", "cpu-opencl": "q4f16_1", "cpu-webgpu": "q4f16_1"}
BACKEND = {"cpu": "cpu", "cpu-opencl": "opencl", "cpu-webgpu": "webgpu"}
FORBIDDEN = {"deploycc", "click", "rich", "yaml", "torch", "transformers"}


def needs(device: str) -> None:
    if device == "cpu":
        require_cc()
    else:
        require_device(BACKEND[device])


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """device -> a tiny package for it, compiled once."""
    from deploycc.package import compile_model

    made: dict[str, Path] = {}

    def get(device: str) -> Path:
        needs(device)
        if device not in made:
            out = tmp_path_factory.mktemp("verify-kernels") / device
            made[device] = compile_model(str(make_tiny(FIXTURE)), device, quantization=TARGETS[device],
                                         context_window=64, out=str(out))
        return made[device]
    return get


@pytest.mark.parametrize("device", sorted(TARGETS))
def test_every_kernel_agrees_with_its_program(package, device):
    from deploycc.runtime.kernel_check import FLOAT_TOLERANCE, check_kernels

    pkg = package(device)
    report = check_kernels(pkg)
    assert report.passed, report.failure
    entries = json.loads((pkg / "manifest.json").read_text())["kernels"]["entries"]
    assert {k for r in report.results for k in r.kernels} == set(entries)  # every kernel, each once
    floats = [r for r in report.results if r.tolerance]
    assert floats and all(r.worst_error < FLOAT_TOLERANCE / 20 for r in floats), \
        max((r.worst_error, r.name) for r in floats)
    if device == "cpu-webgpu":  # the cache writes carry the rope (vm/kv_fuse.py): checked as float, not as a copy
        assert any(k.startswith("kv_append") for r in report.results if r.tolerance for k in r.kernels)
    else:
        assert any(r.tolerance == 0 for r in report.results)  # copies and gathers: bit for bit
    sizes = {v for r in report.results for s in r.sizes for k, v in s.items() if k == "seq_len"}
    chunk = json.loads((pkg / "manifest.json").read_text())["bounds"]["prefill_chunk"]
    assert {1, chunk} <= sizes and any(s % 2 for s in sizes - {1}), sizes  # corners and odd interior sizes


def test_package_checks_itself_without_the_compiler(package, tmp_path):
    """`python -S PKG verify --kernels --json` with the runtime's dependencies only (deploycc not importable)."""
    import numpy

    pkg = package("cpu")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(Path(numpy.__file__).parents[1])
    no = subprocess.run([sys.executable, "-S", "-c", "import deploycc"], capture_output=True, text=True, env=env,
                        cwd=tmp_path)
    assert no.returncode == 1 and "No module named 'deploycc'" in no.stderr
    r = subprocess.run([sys.executable, "-S", "-X", "importtime", str(pkg), "verify", "--kernels", "--json"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["passed"] and report["kernels"] and all(k["passed"] for k in report["kernels"])
    imported = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", r.stderr, re.M)}
    assert "runtime" in imported and not imported & FORBIDDEN, imported & FORBIDDEN


def test_the_compiler_cli_runs_the_same_check(package):
    pkg = package("cpu")
    r = cli("verify", pkg, "--kernels")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert "worst error" in lines[0] and lines[-1].startswith("ok: ")
    assert any(ln.split()[3] == "rms_norm" for ln in lines[1:-1])


def rotate_rms_norm_store(source: str) -> str:
    """The RMSNorm kernel (C and OpenCL C alike) storing each row's element j2 at (j2 + 1) % 64: in bounds, wrong."""
    start = source.index(" rms_norm(")
    end = source.index("\n}\n", start)
    body = source[start:end]
    assert body.count("+ j2] = (") == 1, body
    return source[:start] + body.replace("+ j2] = (", "+ (j2 + 1) % 64] = (") + source[end:]


@pytest.mark.parametrize("device", ["cpu", "cpu-opencl"])
def test_a_kernel_with_a_shifted_store_fails(package, device, tmp_path):
    from deploycc.runtime import native

    pkg = tmp_path / "pkg"
    shutil.copytree(package(device), pkg)
    m = json.loads((pkg / "manifest.json").read_text())
    src = pkg / m["kernels"]["entries"]["rms_norm"]["file"]
    src.write_text(rotate_rms_norm_store(src.read_text()))
    if device == "cpu":  # the kernels run from the shared object compiled from that source
        t = m["target"]
        native.build_shared(src.read_text(), pkg / m["kernels"]["native"]["library"], t["isa"], t["fast_math"],
                            pkg / "kernels")
    reseal(pkg)
    r = run_package(pkg, "verify", "--kernels")
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0] == r.stderr.strip().splitlines()[-1], r.stderr
    assert errors[0].startswith("error: kernel rms_norm disagrees with its loop-level program: error "), errors[0]
    failed = [ln for ln in r.stdout.splitlines() if "FAILED" in ln]
    assert len(failed) == 2 and failed[0].split()[3] == "rms_norm", failed  # the row, and the verdict
    assert float(failed[0].split()[0]) > 0.1  # three orders of magnitude above the bound


def test_compile_writes_nothing_when_a_kernel_fails(tmp_path, monkeypatch):
    """compile --verify-kernels checks the staged package; held to an impossible bound, nothing is written."""
    require_cc()
    from deploycc.errors import DeployError
    from deploycc.package import compile_model
    from deploycc.runtime import kernel_check

    monkeypatch.setattr(kernel_check, "FLOAT_TOLERANCE", -1.0)
    with pytest.raises(DeployError, match=r"^kernel \S+ .*disagrees with its loop-level program: .*no package was"):
        compile_model(str(make_tiny(FIXTURE)), "cpu", context_window=64, out=str(tmp_path / "out"), verify_kernels=True)
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


# ---- the package's interpreter against deploycc's -------------------------------------------------------

@pytest.mark.parametrize("fixture,device", [("qwen3-x32", "cpu"), ("gemma2-gqa2-softcap", "cpu-opencl"),
                                            ("mistral-gqa4-window", "cpu-opencl")])
def test_the_package_interpreter_agrees_with_deploycc(fixture, device):
    """runtime/loopir.py on each program's JSON form against deploycc/ir/tir_interp.py on the program, on the
    inputs the check draws: equal but for float32 summation order (loopir sums products with einsum)."""
    import deploycc
    from deploycc import pipeline, presets
    from deploycc.export import export
    from deploycc.ir.tir_interp import run_program as interpret
    from deploycc.package import pool_of
    from deploycc.quantization import quantize
    from deploycc.runtime import loopir
    from deploycc.runtime.kernel_check import Ranges, make_inputs
    from deploycc.vm.programs import program_json

    preset = presets.load(device)
    integer = preset.target.kind == "cpu" and preset.target.integer_matmuls
    model = quantize(deploycc.load_model(str(make_tiny(fixture))), "q4f16_2" if integer else "q4f16_1",
                     groups=integer, activations=8 if integer else None)
    ctx, chunk = 32, 8
    lowered = pipeline.compile(export(model, ctx, chunk, pool_of(preset, ctx, chunk)), preset.target, chunk).lowered
    ranges = Ranges({"bounds": {"prefill_chunk": chunk, "context_window": ctx},
                     "kv_cache": {"pool": {"sequences": 4, "page_size": 16}}})
    rng = np.random.default_rng(0)
    for name, prog in lowered.programs.items():
        doc = json.loads(json.dumps(program_json(prog, lowered.sites[name])))  # as the package holds it
        for env in ranges.sizes(doc, rng):
            ins = make_inputs(doc, env, rng, ctx)
            ours, theirs = [a.copy() for a in ins], [a.copy() for a in ins]
            loopir.run_program(doc, ours, env)
            interpret(prog, theirs, [env[v] for v in doc["sym_params"]])
            for a, b in zip(ours[len(ins) - prog.num_outputs:], theirs[len(ins) - prog.num_outputs:]):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()), err_msg=f"{name} {env}")


def test_activations_are_rounded_as_the_compiler_rounds_them():
    from deploycc.op.linalg import round_activations_np
    from deploycc.runtime.loopir import round_activations

    x = np.random.default_rng(0).standard_normal((5, 96)).astype(np.float32) * 3
    x[1, :32] = 0  # an all-zero block stays zero
    for bits in (8, 16):
        assert np.array_equal(round_activations(x, bits), round_activations_np(x, bits))


@pytest.mark.parametrize("content,says", [
    ("[", "is unreadable"),  # not JSON
    ('{"version": 1, "programs": [7, {"name": "x"}]}', "malformed entry"),
    (None, "carries no loop-level programs"),  # a package from before verify --kernels
])
def test_a_broken_programs_file_is_one_line(package, tmp_path, content, says):
    from bad_inputs.common import assert_one_line_error

    pkg = tmp_path / "pkg"
    shutil.copytree(package("cpu"), pkg)
    m = json.loads((pkg / "manifest.json").read_text())
    if content is None:
        (pkg / m["kernels"].pop("programs")).unlink()
        del m["files"]["kernels/programs.json"]
        (pkg / "manifest.json").write_text(json.dumps(m))
    else:
        (pkg / m["kernels"]["programs"]).write_text(content)
    reseal(pkg)
    assert_one_line_error(run_package(pkg, "verify", "--kernels", "--json"), says)


def test_gather_and_place_equal_numpy_indexing():
    """loopir's row-wise gather and its stores through views give what numpy's broadcasting index gives (the
    tiny programs are too small to take them; SmolLM2's paged attention and lm_head do)."""
    from deploycc.runtime.loopir import gather, place

    rng = np.random.default_rng(0)
    cache = rng.standard_normal((64, 3, 16)).astype(np.float32)
    h, i, j, c = (np.arange(n).reshape([n if a == k else 1 for a in range(4)]) for k, n in enumerate((9, 5, 256, 16)))
    rows = rng.integers(0, 64, (1, 5, 256, 1))  # a page table's rows: varies along i and j
    for ix in ((rows, h // 3, c), (rows, np.asarray(2), c), (j % 4 + rows * 0, h % 3, c)):
        assert np.array_equal(gather(cache, ix), cache[ix])
    out, ref = np.zeros((5, 9, 16), np.float32), np.zeros((5, 9, 16), np.float32)
    val = rng.standard_normal((9, 5, 1, 16)).astype(np.float32)
    place(out, (i, h, c), val, (9, 5, 1, 16), np.add)
    ref[np.broadcast_to(i, (9, 5, 1, 16)), np.broadcast_to(h, (9, 5, 1, 16)), np.broadcast_to(c, (9, 5, 1, 16))] += val
    assert np.array_equal(out, ref)
    place(out, (i[:, :, :, :1] * 0 + 4 - i, h, c), val, (9, 5, 1, 16))  # reversed rows: numpy's index
    assert np.array_equal(out[::-1], np.transpose(val[:, :, 0], (1, 0, 2)))
