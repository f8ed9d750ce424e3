# ruff: noqa: E501  (expected IR text is kept verbatim)
"""Schedule rules stated as text: a small program before and after its rule, on the adreno preset (an OpenCL GPU:
the rules' GPU shapes). The printer shows a scheduled program's kernels as loop nests under the program (thread
loops, shared and local allocations, barriers); the texts were read and checked by hand once, then frozen, so a
change to a rule shows here as a diff of loops rather than only as a speed or a failure elsewhere."""
from transform.test_fusion_text import module

from deploycc import op, presets  # noqa: F401  (op registers the ops)
from deploycc.ir import BlockBuilder, Tensor, Var
from deploycc.ir.printer import program_text
from deploycc.schedule import schedule_program
from deploycc.transform import legalize
from deploycc.transform.annotate_patterns import annotate_patterns
from deploycc.transform.fuse_ops import fuse_ops
from deploycc.transform.fuse_tensor import fuse_tensor


def schedule_text(prog) -> str:
    """What scheduling adds to a program's text; the program's own text (frozen in test_fusion_text for the fused
    ones) must print unchanged above it."""
    text, plain = program_text(schedule_program(prog, presets.load("adreno").target)), program_text(prog)
    assert text.startswith(plain.rstrip("\n") + "\n    # scheduled")
    return text[len(plain):]


def scheduled(name: str) -> str:
    return schedule_text(fuse_tensor(fuse_ops(annotate_patterns(module())))[name])


def decode_linear() -> str:
    """A decode step's linear: one row of 64 activations against 16 outputs."""
    bb = BlockBuilder()
    x, w = Var("x", Tensor((1, 64))), Var("w", Tensor((16, 64)))
    with bb.function("main", [x, w], auto_dataflow=True):
        bb.finish(bb.call("linear", x, w))
    return schedule_text(legalize(bb.module)["linear"])


def test_matmul_rule_tiles_with_the_prologue_in_the_tile_load_and_the_epilogue_after():
    assert scheduled("fused_dequantize_linear_add") == MATMUL


def test_row_rule_one_thread_per_element():
    assert scheduled("fused_exp_multiply") == ROW


def test_gemv_rule_rows_per_group_whose_lanes_split_the_reduction():
    assert decode_linear() == GEMV


def test_no_scheduled_line_is_long():
    for text in (MATMUL, ROW, GEMV):
        assert max(len(line) for line in text.splitlines()) < 200


MATMUL = """    # scheduled (matmul): 1 kernel(s)
    kernel fused_dequantize_linear_add(a0, a1, a2, a3, out, n: int), groups=(n + 15) // 16, threads=256:  # writes out
        for g in range((n + 15) // 16, thread "group"):
            for t in range(256, thread "local"):
                As = alloc((16, 16), "float32", "shared")
                Bs = alloc((16, 16), "float32", "shared")
                acc = alloc((1,), "float32", "local")
                acc[0] = 0.0
                for kt in range(1):
                    if ((t // 16 + 16 * g < n) and (t % 16 + 16 * kt < 8)):
                        As[t // 16, t % 16] = a2[t // 16 + 16 * g, t % 16 + 16 * kt]
                    else:
                        As[t // 16, t % 16] = 0.0
                    if ((t // 16 < 16) and (t % 16 + 16 * kt < 8)):
                        Bs[t // 16, t % 16] = (float32(a0[t // 16, t % 16 + 16 * kt]) * a1[t // 16])
                    else:
                        Bs[t // 16, t % 16] = 0.0
                    barrier("shared")
                    for kk in range(16):
                        acc[0] = (acc[0] + (As[t // 16, kk] * Bs[t % 16, kk]))
                    barrier("shared")
                if ((t // 16 + 16 * g < n) and (t % 16 < 16)):
                    t1_1 = alloc((1,), "float32", "local")
                    t1_1[0] = acc[0]
                    out[t // 16 + 16 * g, t % 16] = (t1_1[0] + a3[t // 16 + 16 * g, t % 16])
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
                red = alloc((4, 64), "float32", "shared")
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
                red[0, t] = acc[0]
                red[1, t] = acc[1]
                red[2, t] = acc[2]
                red[3, t] = acc[3]
                barrier("shared")
                if (t % 32 < 16):
                    red[0, t] = (red[0, t] + red[0, t + 16])
                    red[1, t] = (red[1, t] + red[1, t + 16])
                    red[2, t] = (red[2, t] + red[2, t + 16])
                    red[3, t] = (red[3, t] + red[3, t + 16])
                barrier("shared")
                if (t % 32 < 8):
                    red[0, t] = (red[0, t] + red[0, t + 8])
                    red[1, t] = (red[1, t] + red[1, t + 8])
                    red[2, t] = (red[2, t] + red[2, t + 8])
                    red[3, t] = (red[3, t] + red[3, t + 8])
                barrier("shared")
                if (t % 32 < 4):
                    red[0, t] = (red[0, t] + red[0, t + 4])
                    red[1, t] = (red[1, t] + red[1, t + 4])
                    red[2, t] = (red[2, t] + red[2, t + 4])
                    red[3, t] = (red[3, t] + red[3, t + 4])
                barrier("shared")
                if (t % 32 < 2):
                    red[0, t] = (red[0, t] + red[0, t + 2])
                    red[1, t] = (red[1, t] + red[1, t + 2])
                    red[2, t] = (red[2, t] + red[2, t + 2])
                    red[3, t] = (red[3, t] + red[3, t + 2])
                barrier("shared")
                if (t % 32 < 1):
                    red[0, t] = (red[0, t] + red[0, t + 1])
                    red[1, t] = (red[1, t] + red[1, t + 1])
                    red[2, t] = (red[2, t] + red[2, t + 1])
                    red[3, t] = (red[3, t] + red[3, t + 1])
                barrier("shared")
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4)] = (0.0 + red[0, t])
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g + 1 < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4) + 1] = (0.0 + red[1, t])
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g + 2 < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4) + 2] = (0.0 + red[2, t])
                if ((t % 32 == 0) and (4 * (t // 32) + 8 * g + 3 < 16)):
                    y[(t // 32 + 2 * g) // 4, 4 * ((t // 32 + 2 * g) % 4) + 3] = (0.0 + red[3, t])
"""
