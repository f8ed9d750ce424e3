"""The cpu target's integer matmuls (deploycc/schedule/qgemv.py) kernel by kernel against the loop-level
interpreter: decode GEMVs (qgemv-*) and prefill GEMMs (qgemm-*: a quantize kernel into workspace buffers, then
tiles of TILE rows) of two tiny Llamas (hidden 32: one block per row; hidden 96 / intermediate 160: 3 and 5
blocks, so the two-blocks-per-step paths and their odd tails run), in each 4/8-bit scheme and for each branch
of the intrinsic table, at prefill lengths below, equal to, one past and many times the tile. Activations are
rounded to 8 bits per block of 32, so each output is held to 3% of the output's largest magnitude (+1e-4)
against the float interpreter (measured up to 1.2% with hidden size 32, one block per row), and to 1e-5 of it
against the interpreter run on the activations rounded as the kernels round them (measured 1e-7 to 2e-7):
that is the integer arithmetic exactly, but for float summation order. The same with 16-bit activations (int16
codes), plain and interleaved. Float kernels of the same run to 1e-4."""
import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import require_cc, require_device

import deploycc
from deploycc import presets
from deploycc.export import export
from deploycc.interp import Interpreter
from deploycc.ir.kernel import scheduled
from deploycc.ir.tir import Intrin, walk
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.op.attention import RefKVCache
from deploycc.op.linalg import round_activations_np
from deploycc.pipeline import run as run_pipeline
from deploycc.quantization import quantize
from deploycc.schedule import qgemv
from deploycc.transform.merge_matmuls import function_params
from fixtures import make_tiny

CONTEXT = 40


def activation_of(prog):
    """The input an integer schedule quantizes (the first buffer of its quantize intrinsic)."""
    return next(s.buffers[0] for k in scheduled(prog).kernels for s in walk(k.body)
                if isinstance(s, Intrin) and s.name.startswith("quantize"))


def test_integer_matmuls_can_be_switched_off():
    target = replace(presets.load("cpu").target, integer_matmuls=False)
    model = quantize(deploycc.load_model(str(make_tiny("llama-wide"))), "q4f16_2")
    compiled = run_pipeline(export(model, CONTEXT), target, "scheduled")
    assert not {scheduled(p).rule for p in compiled.programs().values()} & {"qgemv-q4_asym", "qgemm-q4_asym"}


def test_tile_size_agrees_with_the_intrinsics():
    from deploycc.targets.c_intrin import INTRINSICS

    assert int(re.search(r"#define DCC_TILE (\d+)", INTRINSICS)[1]) == qgemv.TILE


# Each branch of the intrinsic table (targets/c_intrin.py), all runnable on an AVX-512 VNNI CPU: native (512-bit
# vpdpbusd, two blocks per step), x86-64-v4 and x86-64-v3 (no VNNI: AVX2 vpmaddubsw), generic (plain C).
ISAS = ("native", "x86-64-v4", "x86-64-v3", "generic")


# (scheme, head, interleaved layout, fixture): llama-gqa1 has one block per row, llama-wide 3 and 5; the interleaved
# layout (InterleavedScheme, 4- and 8-bit: 512-bit VNNI or AVX2 on native, its plain-C branch on generic) on
# llama-wide, whose rows all come in 16s (llama-gqa1's MLP rows, 56, do not)
CASES = [(s, h, False, f) for s, h in (("q4f16_1", None), ("q4f16_2", "q8f16_0"), ("q8f16_0", None))
         for f in ("llama-gqa1", "llama-wide")] + [("q4f16_1", None, True, "llama-wide"),
                                                    ("q4f16_2", "q8f16_0", True, "llama-wide"),
                                                    ("q8f16_0", None, True, "llama-wide")]
# 16-bit activations (int16 codes: vpmaddwd, vpdpwssd on AVX-512 VNNI) in the plain layouts, 3 and 5 blocks per row
CASES16 = [(s, h, False, "llama-wide", 16) for s, h in (("q4f16_1", None), ("q4f16_2", "q8f16_0"), ("q8f16_0", None))] + [
    (s, h, True, "llama-wide", 16) for s, h in (("q4f16_1", None), ("q4f16_2", "q8f16_0"), ("q8f16_0", None))]
# (interleaved: c_x16.py, 8-bit c_x16_q8.py)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("scheme,head,interleave,fixture,bits", [c + (8,) for c in CASES] + CASES16)
def test_integer_matmuls_match_the_interpreter(scheme, head, interleave, isa, fixture, bits):
    require_cc()
    device = require_device("cpu")
    from deploycc.runtime import native

    if not set(native.isa_flags(isa)) <= (native.cpu_flags() or set()):
        pytest.skip(f"this CPU cannot run {isa} code")
    target = replace(presets.load("cpu").target, isa=isa)
    # every weight the integer kernels take multiplies activations rounded to `bits` (as compile marks them)
    model = quantize(deploycc.load_model(str(make_tiny(fixture))), scheme, head, interleave, activations=bits)
    compiled = run_pipeline(export(model, CONTEXT), target, "scheduled")
    rules = {scheduled(p).rule for p in compiled.programs().values()}
    fmt = {"q4f16_1": "q4_sym", "q4f16_2": "q4_asym", "q8f16_0": "q8_sym"}[scheme] + ("_x16" if interleave else "")
    assert f"qgemv-{fmt}" in rules and f"qgemm-{fmt}" in rules, rules
    runner = KernelRunner(device, target)
    runner.prebuild(compiled.programs().values())  # one C compile for the module's kernels
    ran: set[str] = set()

    def checked(prog, arrays, sym_args):
        n_in = len(prog.inputs)
        ref = [a if i < n_in else np.zeros_like(a) for i, a in enumerate(arrays)]
        run_program(prog, ref, sym_args)
        rule = scheduled(prog).rule
        integer = rule.startswith(("qgemv", "qgemm"))
        if integer:  # the interpreter on x rounded as the kernel rounds it: equal but for float summation order
            x = list(prog.params).index(activation_of(prog))
            exact = [round_activations_np(a, bits) if i == x else a if i < n_in else np.zeros_like(a) for i, a in enumerate(arrays)]
            run_program(prog, exact, sym_args)
        runner(prog, arrays, sym_args)
        ran.add(rule)
        for got, want in zip(arrays[n_in:], ref[n_in:]):
            atol = 3e-2 * float(np.abs(want).max()) + 1e-4 if integer and want.size else 1e-4
            np.testing.assert_allclose(got, want, atol=atol, rtol=1e-4, err_msg=f"{prog.name} ({rule})")
        if integer:
            for got, want in zip(arrays[n_in:], exact[n_in:]):
                np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()) + 1e-6, rtol=1e-5,
                                           err_msg=f"{prog.name} ({rule}) against the {bits}-bit activations")

    interp = Interpreter(compiled, run_program=checked)
    params = [np.ascontiguousarray(a) for a in function_params(compiled, model.params())]
    cfg = model.config
    rng = np.random.default_rng(0)
    for seq_len in (1, 5, qgemv.TILE, qgemv.TILE + 1, 3 * qgemv.TILE + 2):
        cache = RefKVCache(cfg.num_hidden_layers, CONTEXT, cfg.num_key_value_heads, cfg.head_dim)
        ids = np.array([rng.integers(0, cfg.vocab_size, seq_len)], np.int32)
        interp.run("prefill_all", ids, cache, *params)
        interp.run("decode", np.array([[1]], np.int32), cache, *params)
    assert f"qgemv-{fmt}" in ran and f"qgemm-{fmt}" in ran
