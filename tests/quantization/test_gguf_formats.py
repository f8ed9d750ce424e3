"""Every common GGUF block format kept as stored (quantization/gguf_blocks.py): dequantization bit for bit
against gguf-py, and for the cpu target integer kernels on every format (targets/c_stored.py) against the
reference that rounds the activations alike; a model whose layers mix the formats of a Q4_K_M file."""
import json

import numpy as np
import pytest
from conftest import require_cc, require_module

import deploycc
from quantization.test_gguf import random_blocks, write_tiny

gguf = require_module("gguf")
Q = gguf.GGMLQuantizationType

FORMATS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}  # gguf-py can write these


def blocks(qtype, rows, cols, rng):
    if qtype in QUANTIZABLE:
        w = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
        w[0, :32] = 0.0  # an all-zero block
        w[1, 32:64] = np.abs(w[1, 32:64])  # one-signed blocks: the minimums, the sign of d
        return gguf.quants.quantize(w, Q[qtype])
    return random_blocks(qtype, rows, cols, rng)


@pytest.mark.parametrize("qtype", FORMATS)
def test_dequantize_bit_exact_against_gguf(qtype):
    """The stored bytes split into parameters and put back are the same bytes (the package holds the file's
    bytes: its size is the file's), and the dequantize program (run by the loop-level interpreter) and the
    embedding lookup give gguf-py's values bit for bit."""
    from deploycc.ir.tir_interp import run_program
    from deploycc.quantization import BLOCK_SCHEMES

    scheme = BLOCK_SCHEMES[qtype]
    rng = np.random.default_rng(3)
    rows, cols = 5, 512
    raw = blocks(qtype, rows, cols, rng)
    want = gguf.quants.dequantize(raw, Q[qtype]).reshape(rows, cols)
    packed = scheme.from_blocks(raw)
    if hasattr(scheme, "to_blocks"):
        np.testing.assert_array_equal(scheme.to_blocks(packed), raw)
    stored = sum(a.nbytes for a in packed.values())
    assert raw.nbytes <= stored <= raw.nbytes * 1.02, (stored, raw.nbytes)  # IQ4_XS pads 6 scale bytes to 8
    np.testing.assert_array_equal(scheme.dequantize(packed, cols), want)
    out = np.zeros((rows, cols), np.float32)
    run_program(scheme.program(rows, cols), [*packed.values(), out], [])
    np.testing.assert_array_equal(out, want)
    ids = np.array([[4, 0, 2]], np.int32)
    got = np.zeros((1, 3, cols), np.float32)
    run_program(scheme.take_program(rows, cols, 2), [*packed.values(), ids, got], [])
    np.testing.assert_array_equal(got[0], want[[4, 0, 2]])


# every stored format at least once over two layers (K-quants need whole 256-value rows), Q8_0 moved into a group
# scheme beside them, a Q6_K embedding and head: what a Q4_K_M / Q5_K_M / IQ4_XS file mixes, and more
ALL_STORED = {"token_embd.weight": Q.Q6_K, "output.weight": Q.Q6_K,
              "blk.0.attn_q.weight": Q.Q5_0, "blk.0.attn_k.weight": Q.Q5_1, "blk.0.attn_v.weight": Q.IQ4_NL,
              "blk.0.attn_output.weight": Q.Q2_K, "blk.0.ffn_gate.weight": Q.Q3_K, "blk.0.ffn_up.weight": Q.Q4_K,
              "blk.0.ffn_down.weight": Q.Q5_K, "blk.1.attn_q.weight": Q.Q6_K, "blk.1.attn_k.weight": Q.IQ4_XS,
              "blk.1.attn_v.weight": Q.Q8_0, "blk.1.attn_output.weight": Q.Q4_K, "blk.1.ffn_gate.weight": Q.Q4_0,
              "blk.1.ffn_up.weight": Q.Q5_0, "blk.1.ffn_down.weight": Q.Q6_K}
K_SHAPE = dict(hidden_size=256, intermediate_size=256, head_dim=64)
STORED = {"Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}


# the AVX2 build on every x86 machine, the AVX-512 build where the CPU has it, native where it differs from both,
# plain C once
KERNEL_CASES = [("x86-64-v3", 8), ("x86-64-v3", 16), ("x86-64-v4", 8), ("x86-64-v4", 16), ("native", 8),
                ("generic", 8)]


def _check_kernels(model, isa: str, bits: int) -> set[str]:
    """Every kernel of `model` for the cpu target at `isa` against the loop-level interpreter, on activations
    rounded to `bits` as the integer kernels round them; prefill lengths 1, 5 and 14 (tiles of 4 with a residue),
    each with a decode step. Returns the schedule rules that ran."""
    from dataclasses import replace

    from conftest import require_device

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
    from deploycc.runtime import native
    from deploycc.transform.merge_matmuls import function_params

    require_cc()
    device = require_device("cpu")
    if not set(native.isa_flags(isa)) <= (native.cpu_flags() or set()):
        pytest.skip(f"this CPU cannot run {isa} code")
    target = replace(presets.load("cpu").target, isa=isa)
    compiled = run_pipeline(export(model, 40), target, "scheduled")
    runner = KernelRunner(device, target)
    runner.prebuild(compiled.programs().values())  # one C compile for the module's kernels
    ran: set[str] = set()

    def checked(prog, arrays, sym_args):
        n_in = len(prog.inputs)
        rule = scheduled(prog).rule
        exact = [a if i < n_in else np.zeros_like(a) for i, a in enumerate(arrays)]
        if rule.startswith(("qgemv", "qgemm")):
            x = next(s.buffers[0] for k in scheduled(prog).kernels for s in walk(k.body)
                     if isinstance(s, Intrin) and s.name.startswith("quantize"))
            at = list(prog.params).index(x)
            exact[at] = round_activations_np(arrays[at], bits)
        run_program(prog, exact, sym_args)
        runner(prog, arrays, sym_args)
        ran.add(rule)
        for got, want in zip(arrays[n_in:], exact[n_in:]):
            np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()) + 1e-6, rtol=1e-5,
                                       err_msg=f"{prog.name} ({rule})")

    interp = Interpreter(compiled, run_program=checked)
    params = [np.ascontiguousarray(a) for a in function_params(compiled, model.params())]
    cfg = model.config
    rng = np.random.default_rng(0)
    for seq_len in (1, 5, 14):
        cache = RefKVCache(cfg.num_hidden_layers, 40, cfg.num_key_value_heads, cfg.head_dim)
        interp.run("prefill_all", np.array([rng.integers(0, cfg.vocab_size, seq_len)], np.int32), cache, *params)
        interp.run("decode", np.array([[1]], np.int32), cache, *params)
    return ran


@pytest.mark.parametrize("isa,bits", KERNEL_CASES)
def test_stored_formats_integer_kernels_match_the_interpreter(tmp_path, isa, bits):
    """Each stored format's decode GEMV and prefill GEMM (targets/c_stored.py: the AVX2 branch on x86-64-v3, VNNI
    where the CPU has it, plain C on generic) against the loop-level interpreter run on the activations rounded as
    the kernels round them: 1e-5 of the output's largest magnitude (the integer arithmetic exactly, but for float
    summation order)."""
    from deploycc.quantization import quantize
    from deploycc.runtime import native

    if isa == "native" and any(set(native.isa_flags(isa)) == set(native.isa_flags(o)) for o in ("x86-64-v3", "x86-64-v4")):
        pytest.skip("native is the x86-64-v3 or v4 build on this CPU, which runs above")
    path, _ = write_tiny(tmp_path, ALL_STORED, **K_SHAPE)
    model = quantize(deploycc.load_model(str(path)), "gguf", groups=True, activations=bits)
    ran = _check_kernels(model, isa, bits)
    want = {f"{kind}-gguf_{t.lower()}" for t in STORED for kind in ("qgemv", "qgemm")}
    assert want <= ran, sorted(want - ran)


def _with_unkept(tmp_path):
    """The K-quant tiny model with one IQ2_XXS tensor (no kernels here: converted to Q8_0) and one BF16 tensor
    (to float32), each written into the file after the rest."""
    qtypes = dict(ALL_STORED)
    del qtypes["blk.1.attn_q.weight"], qtypes["blk.0.attn_q.weight"]
    path, _ = write_tiny(tmp_path, qtypes, **K_SHAPE)
    reader = gguf.GGUFReader(str(path))
    out = tmp_path / "unkept.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    rng = np.random.default_rng(5)
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        if t.name == "blk.0.attn_q.weight":  # IQ2_XXS: 66 bytes per 256 values, f16 d first
            raw = rng.integers(0, 256, (shape[0], shape[1] // 256, 66), dtype=np.uint8)
            raw[:, :, 0:2] = (np.full((shape[0], shape[1] // 256, 1), 2e-3)).astype(np.float16).view(np.uint8)
            w.add_tensor(t.name, raw.reshape(shape[0], -1), raw_dtype=Q.IQ2_XXS)
        elif t.name == "blk.1.attn_q.weight":
            bf = (np.asarray(t.data, np.float32).view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(t.name, bf.view(np.uint8).reshape(shape[0], -1), raw_dtype=Q.BF16)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_an_unkept_type_is_converted_by_a_rule_that_compile_prints(tmp_path):
    """IQ2_XXS (no kernels here) becomes Q8_0 and BF16 becomes float32, each said in one line of compile's output
    with its tensor count and bytes; every kept type keeps its file's bytes (within the 2% of IQ4_XS's padding),
    and the output prints the package's weight bytes against the file's."""
    import subprocess
    import sys

    path = _with_unkept(tmp_path)
    r = subprocess.run([sys.executable, "-m", "deploycc", "compile", str(path), "--device", "cpu", "--activations", "8",
                        "-o", str(tmp_path / "pkg")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("converted")]
    assert len(lines) == 2, r.stderr
    assert any(x.startswith("converted IQ2_XXS -> Q8_0: 1 tensors") for x in lines), lines
    assert any(x.startswith("converted BF16 -> F32: 1 tensors") for x in lines), lines
    assert "weights by GGUF type:" in r.stdout and "against the file's tensors" in r.stdout, r.stdout
    m = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    rows = {(x["type"], x["into"]): x for x in m["model"]["weights_by_type"]}
    assert rows[("IQ2_XXS", "Q8_0")]["tensors"] == 1 and rows[("BF16", "F32")]["tensors"] == 1
    for (_qtype, into), row in rows.items():
        if into == "kept":
            assert row["file_bytes"] <= row["package_bytes"] <= 1.02 * row["file_bytes"], row
    assert {q for q, into in rows if into == "kept"} >= STORED



Q5_MIX = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q5_0, **{f"blk.{n}.{t}.weight": Q.Q5_0 if n == 0 else Q.Q5_1
                                                                   for n in (0, 1) for t in ("attn_q", "attn_k",
                                                                   "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                                   "ffn_down")}}


def _check_interleaved(qtype, scheme, cols, rng):
    """An interleaved layout of 32 rows x `cols` of random `qtype` blocks: the file's bytes (as many, and `plain`
    puts them back), dequantized by numpy, by the loop-level program and by the embedding lookup (rows gathered by
    token ids: the row's 16-lane group and lane split by shifts), bit for bit against gguf-py."""
    from deploycc.ir.tir_interp import run_program

    raw = blocks(qtype, 32, cols, rng)
    want = gguf.quants.dequantize(raw, Q[qtype]).reshape(32, cols)
    plain = scheme.plain_scheme.from_blocks(raw)
    packed = scheme.interleave(plain)
    assert sum(a.nbytes for a in packed.values()) == raw.nbytes
    assert all(np.array_equal(plain[k].view(np.uint8), v.view(np.uint8)) for k, v in scheme.plain(packed).items())
    np.testing.assert_array_equal(scheme.dequantize(packed, cols), want)
    out = np.zeros((32, cols), np.float32)
    run_program(scheme.program(32, cols), [*packed.values(), out], [])
    np.testing.assert_array_equal(out, want)
    ids = np.array([[17, 0, 31, 5, 16]], np.int32)
    got = np.zeros((1, 5, cols), np.float32)
    run_program(scheme.take_program(32, cols, 2), [*packed.values(), ids, got], [])
    np.testing.assert_array_equal(got[0], want[ids[0]])


@pytest.mark.parametrize("isa,bits", [("x86-64-v3", 8), ("x86-64-v3", 16), ("x86-64-v4", 8), ("generic", 8)])
def test_interleaved_q5_kernels_match_the_interpreter(tmp_path, isa, bits):
    """Q5_0 / Q5_1 linears whose rows come in 16s take the interleaved layout (InterleavedQ5: the file's bytes,
    rearranged) on x86: its kernels (targets/c_x16.py) against the interpreter on identically rounded
    activations, 1e-5 of the largest output; its dequantization bit for bit against gguf-py."""
    from deploycc.quantization import quantize
    from deploycc.quantization.gguf_blocks import INTERLEAVED_Q5

    for qtype, scheme in INTERLEAVED_Q5.items():
        _check_interleaved(qtype, scheme, 96, np.random.default_rng(4))
    path, _ = write_tiny(tmp_path, Q5_MIX, hidden_size=64, intermediate_size=96, head_dim=16)
    model = quantize(deploycc.load_model(str(path)), "gguf", interleave=True, groups=True, activations=bits)
    assert {s.name for s in model.quantized_names().values()} >= {"gguf_q5_0x16", "gguf_q5_1x16"}
    ran = _check_kernels(model, isa, bits)
    assert {"qgemv-q5_sym_x16", "qgemm-q5_sym_x16", "qgemv-q5_asym_x16", "qgemm-q5_asym_x16"} <= ran, ran


@pytest.mark.parametrize("isa,bits", [("x86-64-v3", 8), ("x86-64-v3", 16), ("x86-64-v4", 8), ("generic", 8)])
def test_interleaved_q8_0_kernels_match_the_interpreter(tmp_path, isa, bits):
    """Q8_0 linears, and a tied Q8_0 table with its output head (what llama-quantize's Q4_K_M writes for SmolLM2 and
    Qwen2.5), whose rows come in 16s take the 8-bit interleaved layout (quantization/group.py InterleavedScheme
    bits=8: the file's signed bytes and scales, as many, rearranged): dequantized, by numpy, the loop-level program
    and the embedding lookup, bit for bit against gguf-py; its kernels (targets/c_x16_q8.py) against the interpreter
    on identically rounded activations, 1e-5 of the largest output."""
    from deploycc.ir.tir_interp import run_program
    from deploycc.quantization import INTERLEAVED, quantize
    from deploycc.quantization.gguf_blocks import BLOCK_SCHEMES

    rows, cols = 32, 96
    raw = blocks("Q8_0", rows, cols, np.random.default_rng(7))
    want = gguf.quants.dequantize(raw, Q.Q8_0).reshape(rows, cols)
    scheme = INTERLEAVED["q8f16_0"]
    packed = scheme.interleave(BLOCK_SCHEMES["Q8_0"].to_group(raw), cols)
    assert sum(a.nbytes for a in packed.values()) == raw.nbytes
    stored = raw.reshape(rows, cols // 32, 34)[:, :, 2:].view(np.int8).reshape(rows // 16, 16, cols // 32, 8, 4)
    np.testing.assert_array_equal(packed["q_weight"].view(np.int8).reshape(rows // 16, cols // 32, 8, 16, 4),
                                  stored.transpose(0, 2, 3, 1, 4))  # word 16 j + l: row l's values 4 j .. 4 j + 3
    np.testing.assert_array_equal(scheme.dequantize(packed, cols), want)
    out = np.zeros((rows, cols), np.float32)
    run_program(scheme.program(rows, cols), [*packed.values(), out], [])
    np.testing.assert_array_equal(out, want)
    ids = np.array([[17, 0, 31, 5, 16]], np.int32)
    got = np.zeros((1, 5, cols), np.float32)
    run_program(scheme.take_program(rows, cols, 2), [*packed.values(), ids, got], [])
    np.testing.assert_array_equal(got[0], want[ids[0]])
    q8 = {"token_embd.weight": Q.Q8_0, **{f"blk.{n}.{t}.weight": Q.Q8_0 for n in (0, 1) for t in (
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}}
    path, _ = write_tiny(tmp_path, q8, tied=True, vocab_multiple=16, hidden_size=64, intermediate_size=96, head_dim=16)
    model = quantize(deploycc.load_model(str(path)), "gguf", interleave=True, groups=True, activations=bits)
    names = {k: s.name for k, s in model.quantized_names().items()}
    assert set(names.values()) == {"q8f16_0x16"}, names  # the table too: the lookup and the head read it
    ran = _check_kernels(model, isa, bits)
    assert {"qgemv-q8_sym_x16", "qgemm-q8_sym_x16"} <= ran, ran


# tied, as Llama-3.2-1B is (llama-quantize stores the table as Q6_K)
K_MIX = {"token_embd.weight": Q.Q6_K,
         **{f"blk.{n}.{t}.weight": Q.Q4_K if n == 0 else Q.Q5_K
            for n in (0, 1) for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")},
         "blk.0.ffn_down.weight": Q.Q6_K, "blk.1.ffn_down.weight": Q.Q5_K}


@pytest.mark.parametrize("isa,bits", [("x86-64-v3", 8), ("x86-64-v3", 16), ("x86-64-v4", 8), ("x86-64-v4", 16),
                                      ("generic", 8)])
def test_interleaved_k_quant_kernels_match_the_interpreter(tmp_path, isa, bits):
    """Q4_K / Q5_K / Q6_K linears whose rows come in 16s take the interleaved layout (InterleavedK: the file's bytes,
    rearranged, the 6-bit scales as 12 planes of 16 rows that the kernel unpacks per super-block; InterleavedQ6: the
    top bits beside the nibbles they complete, the int8 scales in planes of 16 rows) on x86: its
    kernels (targets/c_x16.py) against the interpreter on identically rounded activations, 1e-5 of the largest
    output; its dequantization, numpy and the loop-level program, bit for bit against gguf-py; its bytes the file's."""
    from deploycc.quantization import quantize
    from deploycc.quantization.gguf_blocks import INTERLEAVED_K

    rng = np.random.default_rng(6)
    for qtype, scheme in INTERLEAVED_K.items():
        _check_interleaved(qtype, scheme, 512, rng)
    path, _ = write_tiny(tmp_path, K_MIX, tied=True, vocab_multiple=16, **K_SHAPE)
    model = quantize(deploycc.load_model(str(path)), "gguf", interleave=True, groups=True, activations=bits)
    names = {k: s.name for k, s in model.quantized_names().items()}
    assert set(names.values()) >= {"gguf_q4_kx16", "gguf_q5_kx16", "gguf_q6_kx16"}
    assert names["model.embed_tokens.weight"] == "gguf_q6_kx16"  # the tied head and the lookup read it interleaved
    ran = _check_kernels(model, isa, bits)
    assert {f"{kind}-q{b}_k_x16" for kind in ("qgemv", "qgemm") for b in (4, 5, 6)} <= ran, ran


# what llama-quantize's Q4_K_M writes (Q5_0 where a row is not whole 256-value super-blocks, Q4_K, Q6_K, Q8_0)
Q4_K_M_MIX = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "blk.0.attn_q.weight": Q.Q5_0,
              "blk.0.attn_k.weight": Q.Q5_0, "blk.0.attn_v.weight": Q.Q8_0, "blk.0.attn_output.weight": Q.Q5_0,
              "blk.0.ffn_gate.weight": Q.Q4_K, "blk.0.ffn_up.weight": Q.Q4_K, "blk.0.ffn_down.weight": Q.Q6_K,
              "blk.1.attn_q.weight": Q.Q4_K, "blk.1.attn_k.weight": Q.Q4_K, "blk.1.attn_v.weight": Q.Q6_K,
              "blk.1.attn_output.weight": Q.Q4_K, "blk.1.ffn_gate.weight": Q.Q5_0, "blk.1.ffn_up.weight": Q.Q5_0,
              "blk.1.ffn_down.weight": Q.Q4_K}


def test_q4_k_m_mix_compiled_for_cpu_matches_transformers(tmp_path):
    """A model whose layers mix Q5_0, Q4_K, Q6_K and Q8_0 as a Q4_K_M file does, compiled for `cpu` with the
    default (calibrated) activations, passes `verify --against transformers` (transformers dequantizes the same
    blocks, gguf_file=; verify rounds its activations as the package records and holds the package to the spread
    of that rounding), and its package weighs what the file's tensors do."""
    import subprocess
    import sys

    path, _ = write_tiny(tmp_path, Q4_K_M_MIX, **K_SHAPE)
    out = tmp_path / "pkg"
    r = subprocess.run([sys.executable, "-m", "deploycc", "compile", str(path), "--device", "cpu", "-o", str(out),
                        "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    rows = summary["weights_by_type"]
    assert {x["type"] for x in rows if x["into"] == "kept"} >= {"Q5_0", "Q4_K", "Q6_K", "Q8_0"}
    assert all(x["package_bytes"] == x["file_bytes"] for x in rows), rows
    r = subprocess.run([sys.executable, "-m", "deploycc", "verify", str(out), "--against", "transformers", "--steps", "2",
                        "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    v = json.loads(r.stdout)
    assert v["passed"], v
