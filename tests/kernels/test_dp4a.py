"""cuda's decode GEMV on __dp4a (deploycc/schedule/dp4a.py) under the CUDA emulation, and packages that use it.

Kernel by kernel, a tiny Llama in each 4/8-bit format the rule takes (q4f16_1: (c - 8) s, q4f16_2: c s + m,
q8f16_0: (c - 128) s), with one block of 32 inputs a row (llama-gqa1, hidden 32) and 3 and 5 (llama-wide, hidden 96,
intermediate 160), on `h100` (the first in forward thread order, the second shuffled), and a Qwen3 and a Gemma 2 in
q4f16_1 (a tied head; a soft cap after it) in shuffled and reverse order: every dp4a kernel against the loop-level
interpreter run on the activations rounded as the kernels round them (round_activations_np), to 1e-5 of the
output's largest magnitude (measured up to 2.6e-7: integer dot products, then float32 scales in another order); the
prefill's rounding program bit for bit (its codes are the reference's); every other kernel to 1e-4. Negative
controls: the same dp4a outputs against the interpreter on unrounded activations miss by more than 1e-3 (the test
sees the rounding), and the kernel without its barrier between rounding x into shared memory and reading it fails
under the shuffled order (shared memory is poisoned before each block).

Whole packages: a tiny Llama compiled for `h100` with `--activations 8` launches dp4a kernels in decode, records
its rounded linears (manifest kernels.activations) and passes `verify` against the numpy reference that rounds
alike, on the emulation; compiled without it (auto), its activations stay float (no rounding, no record); 16 bits
are refused (dp4a takes 8), and so is 8 on `rtx4090`, which has no integer kernels.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import require_cxx, require_device

import deploycc
from deploycc import presets
from deploycc.errors import DeployError
from deploycc.export import export
from deploycc.interp import Interpreter
from deploycc.ir.kernel import allocs_of, scheduled, strip_allocs
from deploycc.ir.tir import Barrier, walk
from deploycc.ir.tir_interp import reduction_parts, run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.op.attention import RefKVCache
from deploycc.op.linalg import round_activations_np
from deploycc.pipeline import run as run_pipeline
from deploycc.quantization import quantize
from deploycc.transform.merge_matmuls import function_params
from deploycc.vm.programs import rounded_input
from fixtures import make_tiny

CONTEXT = 40
FORMATS = {"q4f16_1": "q4_sym", "q4f16_2": "q4_asym", "q8f16_0": "q8_sym"}


def emulation(order: str):
    require_cxx()
    from deploycc.runtime.devices import open_device

    return open_device("cuda", emulate=order)


def compiled_model(scheme: str, fixture: str):
    target = presets.load("h100").target
    assert target.dp4a
    model = quantize(deploycc.load_model(str(make_tiny(fixture))), scheme, None, False, activations=8)
    return target, model, run_pipeline(export(model, CONTEXT), target, "scheduled")


def run_steps(compiled, model, checked, lengths=(1, 5, 17)):
    interp = Interpreter(compiled, run_program=checked)
    params = [np.ascontiguousarray(a) for a in function_params(compiled, model.params())]
    cfg = model.config
    rng = np.random.default_rng(0)
    for seq_len in lengths:
        cache = RefKVCache(cfg.num_hidden_layers, CONTEXT, cfg.num_key_value_heads, cfg.head_dim)
        interp.run("prefill_all", np.array([rng.integers(0, cfg.vocab_size, seq_len)], np.int32), cache, *params)
        interp.run("decode", np.array([[1]], np.int32), cache, *params)


CASES = [(s, "llama-gqa1", "forward") for s in FORMATS] + [(s, "llama-wide", "shuffle") for s in FORMATS] + [
    ("q4f16_1", "qwen3-x32", "shuffle"),  # a tied head, the queries' and keys' norms
    ("q4f16_1", "gemma2-gqa2-softcap", "reverse")]  # GELU's gate, the logits' soft cap after the head


@pytest.mark.parametrize("scheme,fixture,order", CASES)
def test_dp4a_kernels_match_the_interpreter(scheme, fixture, order):
    check_kernels(scheme, fixture, emulation(order))


def test_dp4a_kernels_match_the_interpreter_on_a_cuda_gpu():
    """The same checks, every case, on a real NVIDIA GPU (skipped without one: benchmarks/gpu_check.sh runs it)."""
    device = require_device("cuda")
    for scheme, fixture, _ in CASES:
        check_kernels(scheme, fixture, device)


@pytest.mark.parametrize("scheme", ["q4f16_1", "q8f16_0"])
def test_dp4a_kernels_split_over_k(scheme, monkeypatch):
    """K split over slices of four warps (gemv.slices; forced: with MIN_TRIPS 0 the fixture's K of one trip is split
    in eight, seven slices past it), the shuffled order: the same checks."""
    from deploycc.schedule import gemv

    monkeypatch.setattr(gemv, "MIN_TRIPS", 0)
    rules = check_kernels(scheme, "llama-wide", emulation("shuffle"))
    assert f"gemv-dp4a-{FORMATS[scheme]}-split8" in rules, rules
    # what `takes` allows (it is asked before the rule runs) covers the block's shared memory, the slices' sums too
    from deploycc.schedule.dp4a import shared_bytes

    _, _, compiled = compiled_model(scheme, "llama-wide")
    split = [p for p in compiled.programs().values() if scheduled(p).rule.endswith("-split8")]
    assert split
    for p in split:
        (k,) = scheduled(p).kernels
        used = sum(4 * int(np.prod([int(d.value) for d in b.shape])) for b in allocs_of(k.body) if b.scope == "shared")
        K = int(np.prod([int(d.value) for d in rounded_input(p).shape]))  # one row of activations: its inputs
        assert 0 < used <= shared_bytes(K), (p.name, used, shared_bytes(K))


def check_kernels(scheme, fixture, device):
    target, model, compiled = compiled_model(scheme, fixture)
    runner = KernelRunner(device, target)
    ran: dict[str, float] = {}
    unrounded: list[float] = []

    def checked(prog, arrays, sym_args):
        n_in = len(prog.inputs)
        rule = scheduled(prog).rule
        ref = [a if i < n_in else np.zeros_like(a) for i, a in enumerate(arrays)]
        plain = [a if i < n_in else np.zeros_like(a) for i, a in enumerate(arrays)]
        if rule.startswith("gemv-dp4a"):
            x = list(prog.params).index(rounded_input(prog))
            ref[x] = round_activations_np(arrays[x], 8)
            run_program(prog, plain, sym_args)
        run_program(prog, ref, sym_args)
        runner(prog, arrays, sym_args)
        for got, want, loose in zip(arrays[n_in:], ref[n_in:], plain[n_in:]):
            scale = float(np.abs(want).max()) if want.size else 0.0
            err = float(np.abs(got - want).max()) if want.size else 0.0
            if rule.startswith("gemv-dp4a"):
                assert err <= 1e-5 * scale + 1e-6, f"{prog.name} ({rule}): {err:.3e} of {scale:.3e}"
                unrounded.append(float(np.abs(got - loose).max()) / scale)
            elif "round_activations" in prog.name:
                np.testing.assert_array_equal(got, want, err_msg=prog.name)  # the same codes and scales
            else:
                np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"{prog.name} ({rule})")
            ran[rule] = max(ran.get(rule, 0.0), err / max(scale, 1e-30))

    run_steps(compiled, model, checked)
    assert any(r.startswith(f"gemv-dp4a-{FORMATS[scheme]}") for r in ran), ran
    rounding = [p for p in compiled.programs().values() if "round_activations" in p.name]
    assert rounding, "the prefill's float matmuls read a rounding program"
    for p in rounding:  # of a materialized input (a reshape may come along): its codes are the reference's, bit for bit
        _, rhs = reduction_parts(strip_allocs(p.body)[0])
        assert rhs.op == "abs" and rhs.src[0].op == "load", p.name
    # the negative control of the comparison: without the rounding, the dp4a outputs are far from the interpreter's
    assert max(unrounded) > 1e-3, max(unrounded)
    return set(ran)


def test_a_missing_barrier_fails_under_the_shuffled_order(monkeypatch):
    """The barrier between rounding x into shared words and the lanes' reads of them, removed (the renderer writes
    none): poisoned shared memory and the shuffled thread order make the outputs wrong."""
    from deploycc.targets.cuda import CUDARenderer

    target, model, compiled = compiled_model("q4f16_1", "llama-wide")
    prog = next(p for p in compiled.programs().values() if scheduled(p).rule == "gemv-dp4a-q4_sym")
    assert sum(isinstance(s, Barrier) for k in scheduled(prog).kernels for s in walk(k.body)) == 1
    rng = np.random.default_rng(1)
    shapes = [tuple(int(d.value) for d in b.shape) for b in prog.params]
    arrays = [rng.integers(0, 1 << 32, s, dtype=np.uint64).astype(np.uint32) if b.dtype == "uint32"
              else rng.standard_normal(s).astype(b.dtype) for b, s in zip(prog.params, shapes)]
    n_in = len(prog.inputs)
    want = [a.copy() if i < n_in else np.zeros_like(a) for i, a in enumerate(arrays)]
    x = list(prog.params).index(rounded_input(prog))
    want[x] = round_activations_np(want[x], 8)
    run_program(prog, want, [])
    for barrier in (True, False):
        if not barrier:
            monkeypatch.setattr(CUDARenderer, "barrier", "")
        got = [a.copy() if i < n_in else np.zeros_like(a) for i, a in enumerate(arrays)]
        KernelRunner(emulation("shuffle"), target)(prog, got, [])
        close = all(np.allclose(g, w, atol=1e-5 * float(np.abs(w).max())) for g, w in zip(got[n_in:], want[n_in:]))
        assert close == barrier, "the kernel without its barrier agreed" if not barrier else "the kernel disagreed"


def test_h100_packages_round_what_they_record_and_verify(tmp_path, monkeypatch):
    from deploycc.package import compile_model
    from deploycc.verify import verify_package

    require_cxx()
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "shuffle")
    h100 = compile_model(str(make_tiny("llama-wide")), "h100", "q4f16_1", out=str(tmp_path / "h100"), activations="8")
    m = json.loads((tmp_path / "h100" / "manifest.json").read_text())
    assert set(m["kernels"]["activations"].values()) == {8} and "lm_head" in m["kernels"]["activations"]
    assert m["target"]["dp4a"] is True
    assert "__dp4a(" in (tmp_path / "h100" / "kernels" / "kernels.cu").read_text()
    report = verify_package(h100, steps=3)
    assert report.passed, report.failure
    assert "activations rounded to 8 bits" in report.reference and "a float16 KV cache" in report.reference
    # with a float32 cache the kernels compute what the graph says to float32 summation order; the preset's float16
    # one rounds each key and value, and one near a tie between two halves may round either way in the package and
    # the reference, which the 8-bit roundings after it carry to every later position (verify's bound, above)
    exact = compile_model(str(make_tiny("llama-wide")), "h100", "q4f16_1", out=str(tmp_path / "f32"), activations="8",
                          overrides=("kv_cache=float32",))
    report = verify_package(exact, steps=3)
    assert report.passed and report.measured < 1e-5, report.measured
    # without --activations 8 the activations stay float: no rounding, no record, the float GEMV
    compile_model(str(make_tiny("llama-wide")), "h100", "q4f16_1", out=str(tmp_path / "auto"))
    m = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert "activations" not in m["kernels"]
    text = (tmp_path / "auto" / "kernels" / "kernels.cu").read_text()
    assert "__dp4a(" not in text and "rintf(" not in text
    with pytest.raises(DeployError, match="--activations 8 or auto"):
        compile_model(str(make_tiny("llama-wide")), "h100", "q4f16_1", out=str(tmp_path / "a16"), activations="16")
    assert not (tmp_path / "a16").exists()
    assert not presets.load("rtx4090").target.dp4a  # its float GEMV is not issue-bound (benchmarks/gemv_sass.py)
    with pytest.raises(DeployError, match="preset rtx4090 keeps activations float"):  # asked for, nothing would round
        compile_model(str(make_tiny("llama-wide")), "rtx4090", "q4f16_1", out=str(tmp_path / "rtx"), activations="8")
    assert not (tmp_path / "rtx").exists()


def test_cpu_presets_are_untouched():
    """The dp4a rule and the absorb predicate leave the cpu target as it was: every linear of rounded activations
    absorbed (no rounding program), the integer rules, no dp4a."""
    model = quantize(deploycc.load_model(str(make_tiny("llama-wide"))), "q4f16_1", None, False, activations=8)
    compiled = run_pipeline(export(model, CONTEXT), presets.load("cpu").target, "scheduled")
    rules = {scheduled(p).rule for p in compiled.programs().values()}
    assert not any(p.attrs.get("op") == "round_activations" for p in compiled.programs().values())
    assert "qgemv-q4_sym" in rules and not any(r.startswith("gemv-dp4a") for r in rules)
    with pytest.raises(ValueError, match="sm_61"):
        replace(presets.load("cpu").target, dp4a=True)
