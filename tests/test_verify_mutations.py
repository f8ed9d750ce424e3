"""Mutation tests of `deploycc verify` itself: deliberately wrong packages must fail it, on every target, and the
right ones pass.

Each mutation is made where such a bug would be, the package compiled from it, and `verify` run against the
unmutated checkpoint: weights (layer 0's MLP zeroed; layer 0's k_proj rows reversed), config (a sliding window
one wider; Gemma 2's attention soft-cap removed; the rope base 1% off), model code (Qwen3's qk-norm skipped in
layer 0) and a scheduled kernel (the rows of the RMSNorm kernel's stores shifted by one, edited in the schedule,
not the source). Targets: `cpu` (integer matmuls with 8-bit activations, where verify rounds the references'
activations as the package records and holds the package to three times the reference's own spread: see
deploycc/verify.py), `cpu-opencl` (float, within 1e-3) and `h100` under the CUDA emulation (q4f16_1 with its float16
KV cache: the references round their caches alike, and their noise references move the keys and values first: the
bound that follows, 1.7-2.5e-4, is below every mutation's figure, the rope's 1.0e-3 the least). The fixtures have
realistic magnitudes (peaked attention, outlier channels: tests/fixtures.py), and `qwen3-x32`'s dimensions are
multiples of 32, so every linear of the cpu package runs integer kernels.

Each case prints its figure against its bound: `pytest -s tests/test_verify_mutations.py` is the table.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import require_cc, require_cxx, require_device

from fixtures import make_tiny

TARGETS = {"cpu": "q4f16_2", "cpu-opencl": "q0f32", "h100": "q4f16_1"}
# h100 runs under the CUDA emulation, with its float16 KV cache: verify's references round theirs alike and their
# noise references move what it rounds, and the bound that follows must still tell every mutation
OVERRIDES = ("prefill_chunk=8", "context_window=64")


def mutate_weights(src: Path, dst: Path, edit) -> Path:
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, f, metadata={"format": "pt"})
    return dst


def mutate_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def zero_mlp(t):
    t["model.layers.0.mlp.down_proj.weight"][...] = 0


def reverse_k(t):
    k = "model.layers.0.self_attn.k_proj.weight"
    t[k] = np.ascontiguousarray(t[k][::-1])


# Code mutations run in the compiling process, before compile_model (a subprocess: nothing leaks into the tests).
SKIP_QK_NORM = """
import deploycc.models.llama as L
forward = L.LlamaAttention.forward
def skipped(self, x, cache, layer, rope):
    if layer != 0 or not hasattr(self, "q_norm"):
        return forward(self, x, cache, layer, rope)
    norms = self.__dict__.pop("q_norm"), self.__dict__.pop("k_norm")
    try:
        return forward(self, x, cache, layer, rope)
    finally:
        self.q_norm, self.k_norm = norms
L.LlamaAttention.forward = skipped
"""
SHIFT_NORM_STORE = """
import dataclasses
import deploycc.schedule as S
from deploycc.ir import sym
from deploycc.ir.kernel import Schedule
from deploycc.ir.tir import Store
from deploycc.ir.tir_rewrite import Substitute

schedule_program = S.schedule_program
def shifted(prog, target, rules=S.RULES):
    out = schedule_program(prog, target, rules)
    if not prog.name.startswith("rms_norm"):
        return out
    s = out.attrs["schedule"]

    class Shift(Substitute):
        def store(self, st):
            if st.buffer.name == prog.params[-1].name and len(st.indices) >= 2:
                i = list(st.indices)
                i[-2] = (sym.as_expr(i[-2]) + 1) % sym.as_expr(st.buffer.shape[-2])
                return Store(st.buffer, tuple(i), st.value)
            return super().store(st)
    kernels = tuple(dataclasses.replace(k, body=Shift({}, {}, fresh=False).stmt(k.body)) for k in s.kernels)
    return type(out)(out.name, out.params, out.body, out.sym_params, out.num_outputs,
                     {**out.attrs, "schedule": Schedule(kernels, s.workspace, s.rule)})
S.schedule_program = shifted
"""

MUTATIONS = {
    # name: (fixture, how: ("weights", edit) | ("config", changes) | ("code", source))
    "layer 0 MLP zeroed": ("qwen3-x32", ("weights", zero_mlp)),
    "layer 0 k_proj rows reversed": ("qwen3-x32", ("weights", reverse_k)),
    "sliding window one wider": ("mistral-gqa4-window", ("config", {"sliding_window": 6})),
    "attention soft-cap removed": ("gemma2-gqa2-softcap", ("config", {"attn_logit_softcapping": None})),
    "rope base 1% off": ("qwen3-x32", ("config", lambda cfg: {"rope_parameters": {
        **cfg["rope_parameters"], "rope_theta": cfg["rope_parameters"]["rope_theta"] * 1.01}})),
    "layer 0 qk-norm skipped": ("qwen3-x32", ("code", SKIP_QK_NORM)),
    "RMSNorm kernel's stores one row off": ("qwen3-x32", ("code", SHIFT_NORM_STORE)),
}


def compile_package(src: Path, device: str, out: Path, patch: str = "") -> Path:
    script = textwrap.dedent(patch) + textwrap.dedent(f"""
        from deploycc.package import compile_model
        compile_model({str(src)!r}, {device!r}, {TARGETS[device]!r}, overrides={OVERRIDES!r}, out={str(out)!r})
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def verify(pkg: Path, src: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "deploycc", "verify", str(pkg), "--source", str(src), "--json"],
                       capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout)
    assert (r.returncode == 0) == report["passed"], r.stderr[-2000:]
    return report


def figure(report: dict) -> str:
    return (f"{report['metric']} {report[report['metric']]:.3g} against the bound {report['tolerance']:.3g}"
            + (f" (the reference's own spread {report['noise']:.3g})" if report.get("noise") is not None else ""))


def needs(device: str, monkeypatch):
    if device == "cpu":
        require_cc()
    elif device == "h100":
        require_cxx()
        monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "forward")  # the compile's checks and verify's subprocess
    else:
        require_device("opencl")


@pytest.mark.parametrize("device", sorted(TARGETS))
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_wrong_package_fails_verify(name, device, tmp_path, monkeypatch):
    needs(device, monkeypatch)
    fixture, (kind, how) = MUTATIONS[name]
    src = make_tiny(fixture)
    patch = ""
    if kind == "weights":
        mutated = mutate_weights(src, tmp_path / "model", how)
    elif kind == "config":
        changes = how if isinstance(how, dict) else how(json.loads((src / "config.json").read_text()))
        mutated = mutate_config(src, tmp_path / "model", **changes)
    else:
        mutated, patch = src, how
    report = verify(compile_package(mutated, device, tmp_path / "pkg", patch), src)
    print(f"{name} on {device}: {figure(report)}: {'passed (WRONG)' if report['passed'] else 'failed, as it must'}")
    assert not report["passed"], f"verify passed a package with {name}: {figure(report)}"


@pytest.mark.parametrize("device", sorted(TARGETS))
@pytest.mark.parametrize("fixture", sorted({f for f, _ in MUTATIONS.values()}))
def test_the_right_package_passes_verify(fixture, device, tmp_path, monkeypatch):
    needs(device, monkeypatch)
    src = make_tiny(fixture)
    report = verify(compile_package(src, device, tmp_path / "pkg"), src)
    print(f"{fixture} unmutated on {device}: {figure(report)}")
    assert report["passed"], report["failure"]
