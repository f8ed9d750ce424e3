"""fuse_tensor(gathers=True), the GPU presets': an intermediate that a gather reads (`take` at indices that are values)
is inlined where its producer only relabels its input, as the server's step's final norm does (the hidden states
[1, seq_len, H] reshaped to [seq_len, H], each sequence's last token taken, then normed). Before, its fused program
kept the copy of every token's hidden state and normed the taken rows one thread a row (the fallback rule: on an
H200, 32.6 us of the SmolLM2-shaped step's 2.53 ms in three launches); now it is one program the row_block rule
schedules. A reshape that computes its indices (an axis split in two) is not inlined: an index computed from an
iterator cannot take a gathered value."""
import json

import numpy as np
import pytest

from deploycc import op, presets  # noqa: F401  (op registers the ops)
from deploycc.interp import Interpreter
from deploycc.ir import BlockBuilder, ShapeExpr, Tensor, Var, sym, tir
from deploycc.package import compile_model
from deploycc.schedule import schedule_program
from deploycc.transform import legalize
from deploycc.transform.annotate_patterns import annotate_patterns
from deploycc.transform.fuse_ops import fuse_ops
from deploycc.transform.fuse_tensor import fuse_tensor
from fixtures import make_tiny

H = 64  # the row_block rule takes rows of 32 elements or more


def module(split: bool):
    """main(x, idx, w) = rms_norm(take(reshape(x, [n, H]), idx), w): x is [1, n, H], or [n, 2, H / 2] with `split`
    (a reshape whose input index is i1 // (H / 2), not an iterator)."""
    n, b = sym.var("n"), sym.var("b")
    bb = BlockBuilder()
    x = Var("x", Tensor((n, 2, H // 2) if split else (1, n, H)))
    idx, w = Var("idx", Tensor((b,), "int32")), Var("w", Tensor((H,)))
    with bb.function("main", [x, idx, w], auto_dataflow=True):
        flat = bb.call("reshape", x, ShapeExpr((n, H)))
        rows = bb.call("take", flat, idx)
        bb.finish(bb.call("rms_norm", rows, w, eps=1e-5))
    return legalize(bb.module)


def blocks(prog) -> list[str]:
    return [s.name for s in tir.walk(prog.body) if isinstance(s, tir.Block)]


@pytest.mark.parametrize("split", [False, True])
def test_a_gathered_relabel_is_inlined_and_computes_the_same(split):
    """With gathers, the [1, n, H] -> [n, H] copy is gone from the fused program and it is scheduled by row_block on
    h100 (one block a row); the split reshape keeps its copy; without gathers (the cpu presets) both keep it. Every
    variant within 1e-6 of numpy (the interpreter runs each fused program's blocks)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, H // 2) if split else (1, 5, H)).astype(np.float32)
    idx = np.array([4, 0, 2], np.int32)
    w = rng.standard_normal(H).astype(np.float32)
    rows = x.reshape(5, H)[idx]
    want = w * rows / np.sqrt((rows * rows).mean(-1, keepdims=True) + 1e-5)
    for gathers in (False, True):
        fused = fuse_tensor(fuse_ops(annotate_patterns(module(split))), gathers=gathers)
        (prog,) = fused.programs().values()
        inlined = gathers and not split
        assert ("reshape" in blocks(prog)) != inlined, blocks(prog)
        got = Interpreter(fused).run("main", x, idx, w)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        rule = schedule_program(prog, presets.load("h100").target).attrs["schedule"].rule
        assert (rule == "row_block") == inlined, rule


def test_the_servers_final_norm_is_one_row_block_kernel_on_gpu_presets(tmp_path):
    """A tiny Llama's package: on h100 the step's final norm (reshape, take, rms_norm) is one kernel of the row_block
    rule, on cpu-opencl the program it had (a copy, the sums of squares, the norm). The step's logits on each backend
    against the single-sequence engine: tests/runtime/test_batch.py::test_batched_steps_match_the_single_sequence_engine."""
    src = make_tiny("llama-gqa1")
    found = {}
    for preset in ("h100", "cpu-opencl"):
        pkg = compile_model(str(src), preset, "q0f32", context_window=64, out=str(tmp_path / preset),
                            overrides=("prefill_chunk=16", "max_num_sequences=4", "kv_pool_tokens=64"))
        programs = json.loads((pkg / "kernels" / "programs.json").read_text())["programs"]
        (p,) = [p for p in programs if "take_rms_norm" in p["name"]]
        found[preset] = (p["schedule"]["rule"], len(p["schedule"]["kernels"]))
    assert found == {"h100": ("row_block", 1), "cpu-opencl": ("fallback", 3)}, found
