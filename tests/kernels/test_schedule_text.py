# ruff: noqa: E501  (expected IR text is kept verbatim)
"""Schedule rules stated as text: a small program before and after its rule, on the adreno preset (an OpenCL GPU:
the rules' GPU shapes) or, for the cpu target's own rules (integer matmuls, blocked attention), the cpu preset. The
printer shows a scheduled program's kernels as loop nests under the program (thread
loops, shared and local allocations, barriers); the texts were read and checked by hand once, then frozen, so a
change to a rule shows here as a diff of loops rather than only as a speed or a failure elsewhere."""
from functools import cache

from transform.test_fusion_text import module

import deploycc
from deploycc import op, presets  # noqa: F401  (op registers the ops)
from deploycc.export import export
from deploycc.ir import BlockBuilder, Tensor, Var, sym
from deploycc.ir.printer import program_text
from deploycc.pipeline import run as run_pipeline
from deploycc.quantization import quantize
from deploycc.schedule import RULES, dispatch, schedule_program
from deploycc.transform import legalize
from deploycc.transform.annotate_patterns import annotate_patterns
from deploycc.transform.fuse_ops import fuse_ops
from deploycc.transform.fuse_tensor import fuse_tensor
from fixtures import make_tiny


def schedule_text(prog, preset: str = "adreno", rules=RULES) -> str:
    """What scheduling adds to a program's text; the program's own text (frozen in test_fusion_text for the fused
    ones) must print unchanged above it."""
    text, plain = program_text(schedule_program(prog, presets.load(preset).target, rules)), program_text(prog)
    assert text.startswith(plain.rstrip("\n") + "\n    # scheduled")
    return text[len(plain):]


def scheduled(name: str, rules=RULES) -> str:
    return schedule_text(fuse_tensor(fuse_ops(annotate_patterns(module())))[name], rules=rules)


def decode_linear(preset: str = "adreno") -> str:
    """A decode step's linear: one row of 64 activations against 16 outputs."""
    bb = BlockBuilder()
    x, w = Var("x", Tensor((1, 64))), Var("w", Tensor((16, 64)))
    with bb.function("main", [x, w], auto_dataflow=True):
        bb.finish(bb.call("linear", x, w))
    return schedule_text(legalize(bb.module)["linear"], preset)


def norm_rows() -> str:
    """RMSNorm of rows of 64: a reduction along each row, then an elementwise pass over it."""
    bb = BlockBuilder()
    x, w = Var("x", Tensor((sym.var("n"), 64))), Var("w", Tensor((64,)))
    with bb.function("main", [x, w], auto_dataflow=True):
        bb.finish(bb.call("rms_norm", x, w, eps=1e-5))
    return schedule_text(legalize(bb.module)["rms_norm"])


@cache
def tiny_fused():
    """A tiny Llama (2 layers, hidden 32) in q4f16_1 with 8-bit activations, fused as the cpu pipeline fuses it."""
    model = quantize(deploycc.load_model(str(make_tiny("llama-gqa1"))), "q4f16_1", None, False, activations=8)
    return run_pipeline(export(model, 64), presets.load("cpu").target, "fused")


def tiny_on_cpu(name: str) -> str:
    return schedule_text(tiny_fused()[name], "cpu")


def test_matmul_rule_tiles_with_the_prologue_in_the_tile_load_and_the_epilogue_after():
    assert scheduled("fused_dequantize_linear_add", tuple(r for r in RULES if r is not dispatch.rule)) == MATMUL


def test_a_row_count_known_at_run_time_dispatches_between_the_few_row_gemv_and_the_tiles():
    """The same program with every rule: four kernels (the decode GEMV at one row, the few-row GEMV in chunks of 4 rows
    and of 8, the tiles), each with a work-group count that is zero outside its range (schedule/dispatch.py); what
    each does is checked by running them (test_dispatch_rows.py)."""
    heads = [ln for ln in scheduled("fused_dequantize_linear_add").splitlines() if ln.startswith(("    #", "    kernel"))]
    assert heads == DISPATCH_HEADS


def test_row_rule_one_thread_per_element():
    assert scheduled("fused_exp_multiply") == ROW


def test_gemv_rule_rows_per_group_whose_lanes_split_the_reduction():
    assert decode_linear() == GEMV


def test_vectorize_on_opencl_keeps_the_split_reduction_in_vector_registers():
    """On cpu-opencl (vector types, 16 lanes, rows the pool's cores take) the same linear's lane loop is an explicit
    vector reduction (schedule/vectorize.py): both operands read with vload, one 16-lane accumulator per output of
    the register tile, summed into the scalar accumulator after the loop."""
    assert decode_linear("cpu-opencl") == GEMV_OPENCL


def test_row_block_rule_one_group_per_row_with_a_tree_reduction():
    assert norm_rows() == ROW_BLOCK


def test_qgemv_rule_rounds_the_activations_once_then_one_integer_dot_per_output():
    """Decode of the tiny model's output head (101 outputs): the activations rounded to 8 bits once, before the
    group loop, then one tensorized integer dot product per output row."""
    assert tiny_on_cpu("fused_dequantize_q4f16__linear4") == QGEMV


def test_attention_rule_on_cpu_online_softmax_over_blocks_of_keys():
    """One (query, head) per group; keys in blocks of 16 with a running maximum and sum, the last partial block
    masked apart."""
    assert tiny_on_cpu("attention") == ATTENTION


def test_no_scheduled_line_is_long():
    for text in (MATMUL, ROW, GEMV, GEMV_OPENCL, ROW_BLOCK, QGEMV, ATTENTION):
        assert max(len(line) for line in text.splitlines()) < 200


GEMV_OPENCL = """    # scheduled (row): 1 kernel(s)
    kernel linear(x, w, y), groups=1, threads=8:  # writes y
        for g in range(1, thread "group"):
            for t in range(8, thread "local"):
                if (t + 8 * g < 8):
                    acc0_0 = alloc((1,), "float32", "local")
                    acc0_1 = alloc((1,), "float32", "local")
                    acc0_0[0] = 0.0
                    acc0_1[0] = 0.0
                    for ko in range(4, lanes_reduce into acc0_0, acc0_1):
                        acc0_0 += (vload(x, 64 * (t // 8) + 16 * ko + 64 * g, float32x16) * vload(w, 128 * (t % 8) + 16 * ko, float32x16))
                        acc0_1 += (vload(x, 64 * (t // 8) + 16 * ko + 64 * g, float32x16) * vload(w, 128 * (t % 8) + 16 * ko + 64, float32x16))
                    y[t // 8 + g, 2 * (t % 8)] = acc0_0[0]
                    y[t // 8 + g, 2 * (t % 8) + 1] = acc0_1[0]
"""

DISPATCH_HEADS = [
    "    # scheduled (gemv|gemv-rows|gemv-rows|matmul): 4 kernel(s)",
    "    kernel fused_dequantize_linear_add_one(a0, a1, a2, a3, out, n: int), groups=2 * max(0, min(1, -n + 2)), threads=64:  # writes out",
    "    kernel fused_dequantize_linear_add_rows4(a0, a1, a2, a3, out, n: int), groups=2 * ((n + 3) // 4) * max(0, min(1, -n + 5)) * min(1, max(0, n - 1)), threads=64:  # writes out",
    "    kernel fused_dequantize_linear_add_rows(a0, a1, a2, a3, out, n: int), groups=2 * ((n + 7) // 8) * max(0, min(1, -n + 33)) * min(1, max(0, n - 4)), threads=64:  # writes out",
    "    kernel fused_dequantize_linear_add(a0, a1, a2, a3, out, n: int), groups=((n + 63) // 64) * min(1, max(0, n - 32)), threads=256:  # writes out",
]

MATMUL = """    # scheduled (matmul): 1 kernel(s)
    kernel fused_dequantize_linear_add(a0, a1, a2, a3, out, n: int), groups=(n + 63) // 64, threads=256:  # writes out
        for g in range((n + 63) // 64, thread "group"):
            for t in range(256, thread "local"):
                As = alloc((1040,), "float32", "shared")
                Bs = alloc((1040,), "float32", "shared")
                acc = alloc((16,), "float32", "local")
                a_r = alloc((4,), "float32", "local")
                b_r = alloc((4,), "float32", "local")
                acc[0] = 0.0
                acc[1] = 0.0
                acc[2] = 0.0
                acc[3] = 0.0
                acc[4] = 0.0
                acc[5] = 0.0
                acc[6] = 0.0
                acc[7] = 0.0
                acc[8] = 0.0
                acc[9] = 0.0
                acc[10] = 0.0
                acc[11] = 0.0
                acc[12] = 0.0
                acc[13] = 0.0
                acc[14] = 0.0
                acc[15] = 0.0
                for kt in range(1):
                    for e in range(4):
                        if ((t // 16 + 64 * g + 16 * e < n) and (t % 16 + 16 * kt < 8)):
                            As[65 * (t % 16) + t // 16 + 16 * e] = a2[t // 16 + 64 * g + 16 * e, t % 16 + 16 * kt]
                        else:
                            As[65 * (t % 16) + t // 16 + 16 * e] = 0.0
                    for e_1 in range(4):
                        if ((t // 16 + 16 * e_1 < 16) and (t % 16 + 16 * kt < 8)):
                            Bs[65 * (t % 16) + t // 16 + 16 * e_1] = (float32(a0[t // 16 + 16 * e_1, t % 16 + 16 * kt]) * a1[t // 16 + 16 * e_1])
                        else:
                            Bs[65 * (t % 16) + t // 16 + 16 * e_1] = 0.0
                    barrier("shared")
                    for kk in range(16):
                        a_r[0] = As[t // 16 + 65 * kk]
                        a_r[1] = As[t // 16 + 65 * kk + 16]
                        a_r[2] = As[t // 16 + 65 * kk + 32]
                        a_r[3] = As[t // 16 + 65 * kk + 48]
                        b_r[0] = Bs[t % 16 + 65 * kk]
                        b_r[1] = Bs[t % 16 + 65 * kk + 16]
                        b_r[2] = Bs[t % 16 + 65 * kk + 32]
                        b_r[3] = Bs[t % 16 + 65 * kk + 48]
                        acc[0] = (acc[0] + (a_r[0] * b_r[0]))
                        acc[1] = (acc[1] + (a_r[0] * b_r[1]))
                        acc[2] = (acc[2] + (a_r[0] * b_r[2]))
                        acc[3] = (acc[3] + (a_r[0] * b_r[3]))
                        acc[4] = (acc[4] + (a_r[1] * b_r[0]))
                        acc[5] = (acc[5] + (a_r[1] * b_r[1]))
                        acc[6] = (acc[6] + (a_r[1] * b_r[2]))
                        acc[7] = (acc[7] + (a_r[1] * b_r[3]))
                        acc[8] = (acc[8] + (a_r[2] * b_r[0]))
                        acc[9] = (acc[9] + (a_r[2] * b_r[1]))
                        acc[10] = (acc[10] + (a_r[2] * b_r[2]))
                        acc[11] = (acc[11] + (a_r[2] * b_r[3]))
                        acc[12] = (acc[12] + (a_r[3] * b_r[0]))
                        acc[13] = (acc[13] + (a_r[3] * b_r[1]))
                        acc[14] = (acc[14] + (a_r[3] * b_r[2]))
                        acc[15] = (acc[15] + (a_r[3] * b_r[3]))
                    barrier("shared")
                if ((t // 16 + 64 * g < n) and (t % 16 < 16)):
                    t1_1 = alloc((1,), "float32", "local")
                    t1_1[0] = (0.0 + acc[0])
                    out[t // 16 + 64 * g, t % 16] = (t1_1[0] + a3[t // 16 + 64 * g, t % 16])
                if ((t // 16 + 64 * g < n) and (t % 16 + 16 < 16)):
                    t1_2 = alloc((1,), "float32", "local")
                    t1_2[0] = (0.0 + acc[1])
                    out[t // 16 + 64 * g, t % 16 + 16] = (t1_2[0] + a3[t // 16 + 64 * g, t % 16 + 16])
                if ((t // 16 + 64 * g < n) and (t % 16 + 32 < 16)):
                    t1_3 = alloc((1,), "float32", "local")
                    t1_3[0] = (0.0 + acc[2])
                    out[t // 16 + 64 * g, t % 16 + 32] = (t1_3[0] + a3[t // 16 + 64 * g, t % 16 + 32])
                if ((t // 16 + 64 * g < n) and (t % 16 + 48 < 16)):
                    t1_4 = alloc((1,), "float32", "local")
                    t1_4[0] = (0.0 + acc[3])
                    out[t // 16 + 64 * g, t % 16 + 48] = (t1_4[0] + a3[t // 16 + 64 * g, t % 16 + 48])
                if ((t // 16 + 64 * g + 16 < n) and (t % 16 < 16)):
                    t1_5 = alloc((1,), "float32", "local")
                    t1_5[0] = (0.0 + acc[4])
                    out[t // 16 + 64 * g + 16, t % 16] = (t1_5[0] + a3[t // 16 + 64 * g + 16, t % 16])
                if ((t // 16 + 64 * g + 16 < n) and (t % 16 + 16 < 16)):
                    t1_6 = alloc((1,), "float32", "local")
                    t1_6[0] = (0.0 + acc[5])
                    out[t // 16 + 64 * g + 16, t % 16 + 16] = (t1_6[0] + a3[t // 16 + 64 * g + 16, t % 16 + 16])
                if ((t // 16 + 64 * g + 16 < n) and (t % 16 + 32 < 16)):
                    t1_7 = alloc((1,), "float32", "local")
                    t1_7[0] = (0.0 + acc[6])
                    out[t // 16 + 64 * g + 16, t % 16 + 32] = (t1_7[0] + a3[t // 16 + 64 * g + 16, t % 16 + 32])
                if ((t // 16 + 64 * g + 16 < n) and (t % 16 + 48 < 16)):
                    t1_8 = alloc((1,), "float32", "local")
                    t1_8[0] = (0.0 + acc[7])
                    out[t // 16 + 64 * g + 16, t % 16 + 48] = (t1_8[0] + a3[t // 16 + 64 * g + 16, t % 16 + 48])
                if ((t // 16 + 64 * g + 32 < n) and (t % 16 < 16)):
                    t1_9 = alloc((1,), "float32", "local")
                    t1_9[0] = (0.0 + acc[8])
                    out[t // 16 + 64 * g + 32, t % 16] = (t1_9[0] + a3[t // 16 + 64 * g + 32, t % 16])
                if ((t // 16 + 64 * g + 32 < n) and (t % 16 + 16 < 16)):
                    t1_10 = alloc((1,), "float32", "local")
                    t1_10[0] = (0.0 + acc[9])
                    out[t // 16 + 64 * g + 32, t % 16 + 16] = (t1_10[0] + a3[t // 16 + 64 * g + 32, t % 16 + 16])
                if ((t // 16 + 64 * g + 32 < n) and (t % 16 + 32 < 16)):
                    t1_11 = alloc((1,), "float32", "local")
                    t1_11[0] = (0.0 + acc[10])
                    out[t // 16 + 64 * g + 32, t % 16 + 32] = (t1_11[0] + a3[t // 16 + 64 * g + 32, t % 16 + 32])
                if ((t // 16 + 64 * g + 32 < n) and (t % 16 + 48 < 16)):
                    t1_12 = alloc((1,), "float32", "local")
                    t1_12[0] = (0.0 + acc[11])
                    out[t // 16 + 64 * g + 32, t % 16 + 48] = (t1_12[0] + a3[t // 16 + 64 * g + 32, t % 16 + 48])
                if ((t // 16 + 64 * g + 48 < n) and (t % 16 < 16)):
                    t1_13 = alloc((1,), "float32", "local")
                    t1_13[0] = (0.0 + acc[12])
                    out[t // 16 + 64 * g + 48, t % 16] = (t1_13[0] + a3[t // 16 + 64 * g + 48, t % 16])
                if ((t // 16 + 64 * g + 48 < n) and (t % 16 + 16 < 16)):
                    t1_14 = alloc((1,), "float32", "local")
                    t1_14[0] = (0.0 + acc[13])
                    out[t // 16 + 64 * g + 48, t % 16 + 16] = (t1_14[0] + a3[t // 16 + 64 * g + 48, t % 16 + 16])
                if ((t // 16 + 64 * g + 48 < n) and (t % 16 + 32 < 16)):
                    t1_15 = alloc((1,), "float32", "local")
                    t1_15[0] = (0.0 + acc[14])
                    out[t // 16 + 64 * g + 48, t % 16 + 32] = (t1_15[0] + a3[t // 16 + 64 * g + 48, t % 16 + 32])
                if ((t // 16 + 64 * g + 48 < n) and (t % 16 + 48 < 16)):
                    t1_16 = alloc((1,), "float32", "local")
                    t1_16[0] = (0.0 + acc[15])
                    out[t // 16 + 64 * g + 48, t % 16 + 48] = (t1_16[0] + a3[t // 16 + 64 * g + 48, t % 16 + 48])
"""

ROW = """    # scheduled (row): 1 kernel(s)
    kernel fused_exp_multiply(a0, out, n: int), groups=(16 * n + 127) // 128, threads=128:  # writes out
        for g in range((16 * n + 127) // 128, thread "group"):
            for t in range(128, thread "local"):
                if (t + 128 * g < 16 * n):
                    out[t + 128 * g] = (exp(a0[t + 128 * g]) * a0[t + 128 * g])
"""

GEMV = """    # scheduled (gemv): 1 kernel(s)
    kernel linear(x, w, y), groups=2, threads=64:  # writes y
        for g in range(2, thread "group"):
            for t in range(64, thread "local"):
                acc = alloc((4,), "float32", "local")
                acc[0] = 0.0
                acc[1] = 0.0
                acc[2] = 0.0
                acc[3] = 0.0
                if (4 * (t // 32) + 8 * g < 16):
                    for kk in range(1):
                        if (8 * (t % 32) + 256 * kk < 64):
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk]))
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 1] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk + 1]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 1] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk + 1]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 1] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk + 1]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 1] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk + 1]))
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 2] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk + 2]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 2] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk + 2]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 2] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk + 2]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 2] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk + 2]))
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 3] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk + 3]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 3] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk + 3]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 3] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk + 3]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 3] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk + 3]))
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 4] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk + 4]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 4] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk + 4]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 4] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk + 4]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 4] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk + 4]))
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 5] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk + 5]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 5] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk + 5]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 5] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk + 5]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 5] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk + 5]))
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 6] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk + 6]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 6] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk + 6]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 6] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk + 6]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 6] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk + 6]))
                            acc[0] = (acc[0] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 7] * w[4 * ((t // 32 + 2 * g) % 4), 8 * (t % 32) + 256 * kk + 7]))
                            if (4 * (t // 32) + 8 * g + 1 < 16):
                                acc[1] = (acc[1] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 7] * w[4 * ((t // 32 + 2 * g) % 4) + 1, 8 * (t % 32) + 256 * kk + 7]))
                            if (4 * (t // 32) + 8 * g + 2 < 16):
                                acc[2] = (acc[2] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 7] * w[4 * ((t // 32 + 2 * g) % 4) + 2, 8 * (t % 32) + 256 * kk + 7]))
                            if (4 * (t // 32) + 8 * g + 3 < 16):
                                acc[3] = (acc[3] + (x[(t // 32 + 2 * g) // 4, 8 * (t % 32) + 256 * kk + 7] * w[4 * ((t // 32 + 2 * g) % 4) + 3, 8 * (t % 32) + 256 * kk + 7]))
                subgroup_reduce('add', width=32):
                    acc[0] = acc[0]
                    acc[1] = acc[1]
                    acc[2] = acc[2]
                    acc[3] = acc[3]
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4)] = (0.0 + acc[0])
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g + 1 < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4) + 1] = (0.0 + acc[1])
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g + 2 < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4) + 2] = (0.0 + acc[2])
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g + 3 < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4) + 3] = (0.0 + acc[3])
"""

ROW_BLOCK = """    # scheduled (row_block): 1 kernel(s)
    kernel rms_norm(x, w, y, n: int), groups=n, threads=64:  # writes y
        for g in range(n, thread "group"):
            for u in range(64, thread "local"):
                red0 = alloc((2,), "float32", "shared")
                sumsq_1 = alloc((1,), "float32", "local")
                acc0 = alloc((1,), "float32", "local")
                acc0[0] = 0.0
                for k in range(1):
                    if (u + 64 * k < 64):
                        acc0[0] = (acc0[0] + (x[g, u + 64 * k] * x[g, u + 64 * k]))
                subgroup_reduce('add', width=32):
                    acc0[0] = acc0[0]
                if (u % 32 == 0):
                    red0[u // 32] = acc0[0]
                barrier("shared")
                acc0[0] = (red0[0] + red0[1])
                sumsq_1[0] = acc0[0]
                for k_1 in range(1):
                    if (u + 64 * k_1 < 64):
                        y[g, u + 64 * k_1] = (w[u + 64 * k_1] * (x[g, u + 64 * k_1] * rsqrt(((sumsq_1[0] / float32(64)) + 1e-05))))
"""

QGEMV = """    # scheduled (qgemv-q4_sym): 1 kernel(s)
    kernel fused_dequantize_q4f16__linear4(a0, a1, a2, out), groups=101, threads=1:  # writes out
        xq = alloc((32,), "int8", "local")
        xd = alloc((1,), "float32", "local")
        xsd = alloc((1,), "float32", "local")
        quantize_q8_pairs(a2, xq, xd, xsd, 0, 32, 0)  # writes xq, xd, xsd
        for g in range(101, thread "group"):
            for t in range(1, thread "local"):
                if (t + g < 101):
                    acc = alloc((1,), "float32", "local")
                    dot_q4_sym_q8(acc, a0, a1, xq, xd, xsd, t + g, 1)  # writes acc
                    for i in range(1):
                        for l in range(1):
                            out[0, 0, t + l + g] = (0.0 + acc[l + i])
"""

ATTENTION = """    # scheduled (attention): 1 kernel(s)
    kernel attention(q, k, v, o, seq_len: int, total_len: int), groups=4 * seq_len, threads=1:  # writes o
        for g in range(4 * seq_len, thread "group"):
            for t in range(1, thread "local"):
                if (t + g < 4 * seq_len):
                    acc = alloc((8,), "float32", "local")
                    p = alloc((16,), "float32", "local")
                    s = alloc((16,), "float32", "local")
                    bm = alloc((1,), "float32", "local")
                    corr = alloc((1,), "float32", "local")
                    dot = alloc((1,), "float32", "local")
                    l = alloc((1,), "float32", "local")
                    m = alloc((1,), "float32", "local")
                    m[0] = -1e+30
                    l[0] = 0.0
                    for c_1 in range(8):
                        acc[c_1] = 0.0
                    for jb in range(((t + g) % seq_len + total_len - seq_len + 1) // 16):
                        for jj in range(16):
                            dot[0] = 0.0
                            for c_2 in range(8):
                                dot[0] = (dot[0] + (q[(t + g) % seq_len, (t + g) // seq_len, c_2] * k[jj + 16 * jb, (t + g) // seq_len, c_2]))
                            s[jj] = (dot[0] * 0.3535533905932738)
                        bm[0] = m[0]
                        for jj_1 in range(16):
                            bm[0] = max(bm[0], s[jj_1])
                        corr[0] = exp((m[0] - bm[0]))
                        l[0] = (l[0] * corr[0])
                        for c_3 in range(8):
                            acc[c_3] = (acc[c_3] * corr[0])
                        m[0] = bm[0]
                        for jj_2 in range(16):
                            p[jj_2] = exp((s[jj_2] - m[0]))
                        for jj_3 in range(16):
                            l[0] = (l[0] + p[jj_3])
                            for c_4 in range(8):
                                acc[c_4] = (acc[c_4] + (p[jj_3] * v[jj_3 + 16 * jb, (t + g) // seq_len, c_4]))
                    if (16 * (((t + g) % seq_len + total_len - seq_len + 1) // 16) < (t + g) % seq_len + total_len - seq_len + 1):
                        for jj_4 in range(16):
                            s[jj_4] = -1e+30
                        for jj_5 in range((t + g) % seq_len - 16 * (((t + g) % seq_len + total_len - seq_len + 1) // 16) + total_len - seq_len + 1):
                            dot[0] = 0.0
                            for c_5 in range(8):
                                dot[0] = (dot[0] + (q[(t + g) % seq_len, (t + g) // seq_len, c_5] * k[16 * (((t + g) % seq_len + total_len - seq_len + 1) // 16) + jj_5, (t + g) // seq_len, c_5]))
                            s[jj_5] = (dot[0] * 0.3535533905932738)
                        bm[0] = m[0]
                        for jj_6 in range(16):
                            bm[0] = max(bm[0], s[jj_6])
                        corr[0] = exp((m[0] - bm[0]))
                        l[0] = (l[0] * corr[0])
                        for c_6 in range(8):
                            acc[c_6] = (acc[c_6] * corr[0])
                        m[0] = bm[0]
                        for jj_7 in range(16):
                            p[jj_7] = exp((s[jj_7] - m[0]))
                        for jj_8 in range((t + g) % seq_len - 16 * (((t + g) % seq_len + total_len - seq_len + 1) // 16) + total_len - seq_len + 1):
                            l[0] = (l[0] + p[jj_8])
                            for c_7 in range(8):
                                acc[c_7] = (acc[c_7] + (p[jj_8] * v[16 * (((t + g) % seq_len + total_len - seq_len + 1) // 16) + jj_8, (t + g) // seq_len, c_7]))
                    for c_8 in range(8):
                        o[(t + g) % seq_len, (t + g) // seq_len, c_8] = (acc[c_8] / l[0])
"""
