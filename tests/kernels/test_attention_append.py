"""A decode step's attention that makes its own queries and appends its own key and value (vm/kv_attend.py,
schedule/attention_append.py): each tiny package's attention_append program against its loop-level program
(`verify --kernels`: the output and both caches compared, every row) under the CUDA emulation in two thread orders,
on PoCL (the adreno preset) and on lavapipe with a float16 cache in both WGSL variants (shader-f16, and the packed
one that writes the cache with atomics and so reads it with atomicLoad).

Negative controls, each of which `verify --kernels` must catch: the block that holds the new key does not store it
(the cache's row and the attention's output are wrong), and it stores it in the cache but not in its tile (the
tile's loads leave that row to it: its shared memory is what the emulation poisoned). The logits of whole packages,
bit for bit against the package without the fusion: tests/runtime/test_kv_fuse.py.
"""
from __future__ import annotations

import json

import pytest
from conftest import require_cxx, require_device

from deploycc.ir import tir
from deploycc.ir.tir import Seq
from deploycc.package import compile_model
from deploycc.runtime.kernel_check import FLOAT_TOLERANCE, check_kernels
from deploycc.schedule.attention_append import Append
from fixtures import make_tiny

MODEL = "llama-gqa3-llama3rope"


def package(tmp_path, preset: str, overrides: tuple = ()):
    pkg = compile_model(str(make_tiny(MODEL)), preset, "q0f32", context_window=64, out=str(tmp_path / "pkg"),
                        overrides=overrides)
    bc = json.loads((pkg / "bytecode.json").read_text())
    launched = [i["args"][0]["k"] for i in bc["functions"]["decode"]["instructions"] if i.get("fn") == "vm.launch"]
    layers = json.loads((pkg / "manifest.json").read_text())["kv_cache"]["layers"]
    assert sum(k.startswith("attention_append") and k.endswith("_part") for k in launched) == layers, launched
    assert not [k for k in launched if k.startswith("kv_append")], launched
    return pkg


def appends(pkg):
    """verify --kernels' report, and its results for the attention_append programs."""
    report = check_kernels(pkg)
    ours = [r for r in report.results if r.name.startswith("attention_append")]
    assert ours and all({"offset", "total", "cap"} <= set(s) for r in ours for s in r.sizes)
    return report, ours


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_under_the_cuda_emulation(tmp_path, monkeypatch, order):
    require_cxx()
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", order)
    report, ours = appends(package(tmp_path, "h100"))
    assert report.passed, report.failure
    assert all(r.worst_error < FLOAT_TOLERANCE / 20 for r in ours), [(r.name, r.worst_error) for r in ours]
    assert {s["total"] for r in ours for s in r.sizes} >= {1, 64}  # one key (the new one alone) and a full cache


def test_on_a_cuda_gpu(tmp_path, monkeypatch):
    """The same on a CUDA GPU, its blocks at once (benchmarks/gpu_check.sh's lease runs it); skipped, saying so,
    where there is none."""
    require_device("cuda")
    monkeypatch.delenv("DEPLOYCC_CUDA_EMULATE", raising=False)
    report, ours = appends(package(tmp_path, "h100"))
    assert report.passed, report.failure


def never(*_):
    return tir.index(0).cmp("eq", tir.index(1))


@pytest.mark.parametrize("broken", ["the new row not stored", "the new row not put into the tile"])
def test_negative_controls(tmp_path, monkeypatch, broken):
    require_cxx()
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "reverse")
    prologue = Append.prologue
    if broken == "the new row not stored":
        monkeypatch.setattr(Append, "prologue", lambda self, kv, u, t, g, sm_q, holds, tile: prologue(
            self, kv, u, t, g, sm_q, never(), tile))
    else:
        monkeypatch.setattr(Append, "prologue", lambda self, kv, u, t, g, sm_q, holds, tile: prologue(
            self, kv, u, t, g, sm_q, holds, lambda *a: Seq(())))
    report, ours = appends(package(tmp_path, "h100"))
    assert not all(r.passed for r in ours), [(r.name, r.worst_error) for r in ours]


def test_on_pocl(tmp_path):
    require_device("opencl")
    report, ours = appends(package(tmp_path, "adreno"))
    assert report.passed, report.failure


@pytest.mark.parametrize("f16", ["1", "0"])
def test_on_lavapipe_with_a_half_cache(tmp_path, monkeypatch, f16):
    require_device("webgpu")
    monkeypatch.setenv("DEPLOYCC_WEBGPU_F16", f16)
    report, ours = appends(package(tmp_path, "cpu-webgpu", ("kv_cache=float16",)))
    assert report.passed, report.failure
    assert report.device and all(r.worst_error < FLOAT_TOLERANCE / 20 for r in ours)
