"""The prefill tiles on the tensor cores (schedule/mma.py), one table: each shape of a 1B model's prefill linears
(q4f16_1 weights, M rows of activations) in the 3xTF32 tiles (mma.rule, the weights dequantized to float) with and
without their K steps' prefetch (mma.PREFETCH), and in the codes' tiles (mma.codes_rule: the 4-bit codes in bfloat16
and half products, the group's scale once a span of 32) at their K step of 64 and of 32 (mma.CODES_K), and at 32 with
the next step's operands prefetched into registers (mma.CODES_PREFETCH: 163 registers, against 126), checked
against numpy and timed with CUDA events (median of 5 batches of 10 launches). Run on a machine with a GPU and CuPy
(benchmarks/gpu_check.sh lease runs it):

    python benchmarks/gpu_tiles.py [--rows 128,512] [--shapes 2048x2048,16384x2048,2048x8192]

TFLOP/s counts the multiply-adds as two operations; us per K step is the time over the K steps a block runs one
after another (the performance model's serial term charges 2 x 1.05 us a step).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from deploycc import presets
from deploycc.ir import tir
from deploycc.kernel_runner import render
from deploycc.quantization import QUANTIZATION
from deploycc.runtime.devices import open_device
from deploycc.schedule import mma

sys.path.insert(0, str(Path(__file__).parent))
from gpu_gemv import launch, random_weights, timed  # noqa: E402


def program(scheme, m: int, rows: int, cols: int) -> tir.TensorProgram:
    """y[i, r] = sum_k x[i, k] * W[r, k] over m rows of activations (a prefill's linear)."""
    bufs = scheme.buffers(rows, cols)
    X = tir.Buffer("x", (m, cols), "float32")
    Y = tir.Buffer("y", (m, rows), "float32")
    its = tir.iters("m r k", (m, rows, cols), "SSR")
    i, r, k = (tir.v(it) for it in its)
    mm = tir.Block("tiles", its, tir.Store(Y, (i, r), Y[i, r] + X[i, k] * scheme.value(bufs, r, k)),
                   init=tir.Store(Y, (i, r), tir.const(0.0)))
    return tir.TensorProgram("tiles", (*bufs, X, Y), mm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="128,512")
    ap.add_argument("--shapes", default="2048x2048,16384x2048,2048x8192")
    ap.add_argument("--scheme", default="q4f16_1")
    a = ap.parse_args()
    device = open_device("cuda")
    target = presets.load("h100").target
    s = QUANTIZATION[a.scheme]
    print(f"{device.name}; {a.scheme}; tiles of {mma.BM} x {mma.BN}, K steps of {mma.BK}")
    print(f"{'M':>5} {'shape':>12} {'tiles':>17} {'us':>9} {'TFLOP/s':>8} {'us/K step':>9} {'max err':>9}")
    rng = np.random.default_rng(0)
    for m in (int(x) for x in a.rows.split(",")):
        for shape in a.shapes.split(","):
            rows, cols = (int(x) for x in shape.split("x"))
            packed = random_weights(s, rows, cols, rng)
            x = rng.standard_normal((m, cols)).astype(np.float32)
            want = (x @ s.dequantize(packed, cols).T).astype(np.float32)
            ins = [device.upload(packed[n]) for n in s.param_shapes(rows, cols)]
            xb, yb = device.upload(x), device.alloc(m * rows * 4)
            for variant in ("3xTF32", "3xTF32 prefetch", "codes", "codes step 32", "codes prefetch 32"):
                mma.PREFETCH = variant == "3xTF32 prefetch"
                mma.CODES_PREFETCH = variant == "codes prefetch 32"
                mma.CODES_K = 32 if variant.endswith("32") else 64
                rule = mma.codes_rule if variant.startswith("codes") else mma.rule
                k = rule(program(s, m, rows, cols), target).kernels[0]
                kern = device.build(render([k], target), [k.name])[k.name]
                args = [*ins, xb, yb]
                launch(device, kern, args, int(k.groups.value), k.threads)
                got = device.download(yb, (m, rows), np.float32)
                err = float(np.abs(got - want).max() / np.abs(want).max())
                us = timed(device, kern, args, int(k.groups.value), k.threads, 10) * 1e6
                steps = -(-cols // (mma.CODES_K if variant.startswith("codes") else mma.BK))
                print(f"{m:>5} {shape:>12} {variant:>17} {us:9.1f} {2 * m * rows * cols / (us * 1e-6) / 1e12:8.1f} "
                      f"{us / steps:9.2f} {err:9.1e}")
    mma.PREFETCH, mma.CODES_PREFETCH, mma.CODES_K = False, False, 64


if __name__ == "__main__":
    main()
