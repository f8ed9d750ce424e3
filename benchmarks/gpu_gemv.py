"""The decode GEMV's variants on a CUDA GPU, one table: each shape of a 1B model's decode (q4f16_1 weights) scheduled by
schedule/gemv.py with its knobs set (rows per lane group, steps written out per trip, threads per group, and
optionally the lane groups below which K is split over slices: SPLIT_GROUPS, 0 for never, and what a lane's 8
products take once: 0 nothing, 1 their group's scale (FACTOR_SCALES), 2 also the codes' zero point (OFFSET_ONCE,
the default)), checked against numpy and timed with CUDA events
(median of 5 batches of 20 launches). Run on a machine with a GPU and CuPy:

    python benchmarks/gpu_gemv.py [--shapes 2048x2048,16384x2048,128256x2048] [--variants 1:4:128,2:2:128,4:1:64:0,...]

The default variants include today's rule with and without the split (4:1:64:2048, 4:1:64:0) and with less taken
once (4:1:64:2048:0, 4:1:64:2048:1).

GB/s counts the weight bytes (codes and scales) a launch reads, against the device's read probe.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import numpy as np

from deploycc import presets
from deploycc.ir import tir
from deploycc.kernel_runner import render
from deploycc.quantization import QUANTIZATION
from deploycc.runtime.devices import open_device
from deploycc.schedule import gemv


def program(scheme, rows: int, cols: int) -> tir.TensorProgram:
    """y[0, r] = sum_k x[0, k] * W[r, k] (a decode step's linear, one row of activations)."""
    bufs = scheme.buffers(rows, cols)
    X = tir.Buffer("x", (1, cols), "float32")
    Y = tir.Buffer("y", (1, rows), "float32")
    its = tir.iters("m r k", (1, rows, cols), "SSR")
    m, r, k = (tir.v(i) for i in its)
    mm = tir.Block("gemv", its, tir.Store(Y, (m, r), Y[m, r] + X[m, k] * scheme.value(bufs, r, k)),
                   init=tir.Store(Y, (m, r), tir.const(0.0)))
    return tir.TensorProgram("gemv", (*bufs, X, Y), mm)


def random_weights(scheme, rows: int, cols: int, rng) -> dict:
    """The scheme's packed parameters of a rows x cols weight: random codes, scales near 0.01."""
    return {n: (rng.integers(0, 2**32, sh, dtype=np.uint64).astype(np.uint32) if dt == "uint32"
                else (rng.standard_normal(sh) * 0.01).astype(dt)) for n, (sh, dt) in scheme.param_shapes(rows, cols).items()}


def launch(device, kern, args, groups: int, threads: int) -> None:
    """One launch of `groups` work-groups (a grid's x dimension holds 65,535 at most)."""
    grid = (groups, 1, 1) if groups <= 65535 else (65535, -(-groups // 65535), 1)
    device.launch(kern, args, grid, (threads, 1, 1))


def timed(device, kern, args, groups: int, threads: int, launches: int) -> float:
    """A launch's seconds: the median of 5 batches of `launches`, each the median of its CUDA events' times."""
    times = []
    for _ in range(5):
        device.start_profile()
        for _ in range(launches):
            launch(device, kern, args, groups, threads)
        times.append(statistics.median(t for _, t, _ in device.take_profile()))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="2048x2048,16384x2048,2048x8192,128256x2048,576x576,49152x576")
    ap.add_argument("--variants", default="4:1:64:0,4:1:64:2048,4:1:64:2048:0,4:1:64:2048:1,4:1:64:4096,1:1:128,2:1:128,4:2:128")
    ap.add_argument("--scheme", default="q4f16_1")
    a = ap.parse_args()
    device = open_device("cuda")
    target = presets.load("h100").target
    s = QUANTIZATION[a.scheme]
    probe = device.read_probe()
    print(f"{device.name}: read probe {probe:.0f} GB/s; {a.scheme}")
    print(f"{'shape':>12} {'rows:unroll:threads:split:scale':>31} {'rule':>12} {'us':>9} {'GB/s':>8} {'of probe':>8} "
          f"{'max err':>9}")
    rng = np.random.default_rng(0)
    for shape in a.shapes.split(","):
        rows, cols = (int(x) for x in shape.split("x"))
        packed = random_weights(s, rows, cols, rng)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        want = (s.dequantize(packed, cols) @ x[0]).astype(np.float32) if rows * cols <= 1 << 26 else None
        ins = [device.upload(packed[n]) for n in s.param_shapes(rows, cols)]
        nbytes = sum(v.nbytes for v in packed.values())
        xb, yb = device.upload(x), device.alloc(rows * 4)
        for variant in a.variants.split(","):
            knobs = [int(v) for v in variant.split(":")]
            gemv.ROWS, gemv.UNROLL, gemv.GROUP = knobs[:3]
            gemv.SPLIT_GROUPS = knobs[3] if len(knobs) > 3 else 0
            once = knobs[4] if len(knobs) > 4 else 2
            gemv.FACTOR_SCALES, gemv.OFFSET_ONCE = once >= 1, once >= 2
            t = dataclasses.replace(target, threads_per_block=max(gemv.GROUP, 32))
            sched = gemv.rule(program(s, rows, cols), t)
            k = sched.kernels[0]
            kern = device.build(render([k], t), [k.name])[k.name]
            args = [*ins, xb, yb]
            launch(device, kern, args, int(k.groups.value), k.threads)
            got = device.download(yb, (rows,), np.float32)
            err = float(np.abs(got - want).max() / np.abs(want).max()) if want is not None else float("nan")
            us = timed(device, kern, args, int(k.groups.value), k.threads, 20) * 1e6
            gbs = nbytes / (us * 1e-6) / 1e9
            print(f"{shape:>12} {variant:>31} {sched.rule:>12} {us:9.1f} {gbs:8.0f} {gbs / probe:8.1%} {err:9.1e}")


if __name__ == "__main__":
    main()
