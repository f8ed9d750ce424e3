"""The prefill tiles' K step on the tensor cores, counted in the SASS that nvcc makes for sm_90: no GPU needed, the CUDA
toolkit's nvcc and cuobjdump (pip: nvidia-cuda-cuobjdump), as benchmarks/gemv_sass.py counts the decode GEMVs.

For each prefill linear of a model shape's first layer (benchmarks/gpu_model.py's checkpoints: random weights, the
real widths), q4f16_1 on `h100`, the tile kernel of each rule that takes it: "mma" (schedule/mma.py's rule: float
operands split in two tf32 parts, three products; the weights dequantized in the staging) and "mma-codes"
(mma.codes_rule: the 4-bit codes exact in bfloat16 and half, x in a bfloat16 and a half part, two products, the
group's scale once a span of 32). Printed per K step and warp (its 32 x 32 outputs): the step's K, the instructions it
issues (and per 32 of K), HMMA, shared loads and stores, global loads (k_step says how they are found and
counted); and the registers ptxas gives a thread. (About 15 s on 2 cores, the checkpoints made.)

    PATH=$PATH:<cuobjdump's bin> .venv/bin/python benchmarks/tiles_sass.py [--shape Llama-3.2-1B-shaped] [--json]
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def kernels(shape: str) -> list:
    """[(program, K, N, rule, CUDA C)] of the prefill linears of `shape`'s 1-layer checkpoint, under each tile rule."""
    from gpu_model import checkpoint

    import deploycc
    from deploycc import presets
    from deploycc.export import export
    from deploycc.pipeline import run
    from deploycc.quantization import quantize
    from deploycc.schedule import mma
    from deploycc.schedule.matmul import prefill_matmul
    from deploycc.targets.cuda import render

    target = presets.load("h100").target
    model = quantize(deploycc.load_model(str(checkpoint(shape, 1))), "q4f16_1", None, False)
    mod = run(export(model, 512), target, "fused")
    out = []
    for name, prog in mod.programs().items():
        p = prefill_matmul(prog, 16)
        if p is None or p.m_total.is_const or "dequantize" not in name:
            continue
        for rule in (mma.rule, mma.codes_rule):
            s = rule(prog, target)
            if s is not None:
                out.append((name, int(p.red.extent), int(p.col.extent), s.rule, render(list(s.kernels), target)))
    return out


PRODUCTS = {"mma": 3, "mma-codes": 2}  # tensor-core products a multiply-add takes (3xTF32; x's two parts)


def _macs(op: str) -> int:
    """The multiply-adds of one HMMA (HMMA.16816: m16 n8 k16)."""
    m = re.match(r"HMMA\.(16)(8)(\d+)", op)
    return int(m[1]) * int(m[2]) * int(m[3])


def k_step(code: list, rule: str) -> dict:
    """The counts of a warp's K step over its 32 x 32 outputs, and its instructions per 32 of K: the loop (a backward
    branch's span) with the most HMMA, widest first; a loop inside it that nvcc kept (3xTF32's four steps of 8)
    counted once a trip, its trips those that make a step of 32's multiply-adds (32 x 32 x 32 x the products a
    multiply-add takes); without one, the step's K is its HMMA's multiply-adds over 32 x 32 x the products."""
    loops = []
    for addr, ins in code:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", ins)
        if m and int(m[1], 16) < addr:
            loops.append((int(m[1], 16), addr))
    ops = {a: re.sub(r"^@!?P\w+\s+", "", x).split()[0] for a, x in code}

    def hmma(lo, hi):
        return [ops[a] for a in ops if lo <= a <= hi and ops[a].startswith("HMMA")]
    outer = max(loops, key=lambda s: (len(hmma(*s)), s[1] - s[0]))
    macs = sum(_macs(o) for o in hmma(*outer))
    inner = [s for s in loops if s != outer and outer[0] <= s[0] and s[1] <= outer[1] and hmma(*s)]
    # a loop kept inside (3xTF32's) makes a step of 32 in its trips; else the step's K is what its HMMA multiply
    trips, k = (32 * 32 * 32 * PRODUCTS[rule] // macs, 32) if inner else (1, macs // (32 * 32 * PRODUCTS[rule]))
    count = {"k_step": k, "instructions": 0, "hmma": 0, "lds": 0, "sts": 0, "ldg": 0}
    for a, op in ops.items():
        if not outer[0] <= a <= outer[1]:
            continue
        times = trips if any(lo <= a <= hi for lo, hi in inner) else 1
        count["instructions"] += times
        count["hmma"] += times * op.startswith("HMMA")
        count["lds"] += times * op.startswith(("LDS", "LDSM"))
        count["sts"] += times * op.startswith("STS")
        count["ldg"] += times * op.startswith("LDG")
    count["per_32"] = count["instructions"] * 32 / k
    return count


def main() -> None:
    from gemv_sass import arguments, compiled

    args = arguments(__doc__, "Llama-3.2-1B-shaped", "tiles_sass")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, k, n, rule, source in kernels(args.shape):
            code, regs = compiled(source, name, Path(tmp))
            rows.append({"kernel": name, "rule": rule, "k": k, "n": n, **k_step(code, rule), "registers": regs})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'kernel':44s} {'rule':10s} {'K':>6s} {'N':>6s} {'step':>4s} {'instr':>6s} {'/32 K':>6s} {'HMMA':>5s} "
          f"{'LDS':>5s} {'STS':>5s} {'LDG':>5s} {'regs':>5s}")
    for r in rows:
        print(f"{r['kernel'][-44:]:44s} {r['rule']:10s} {r['k']:6d} {r['n']:6d} {r['k_step']:4d} {r['instructions']:6d} "
              f"{r['per_32']:6.0f} {r['hmma']:5d} {r['lds']:5d} {r['sts']:5d} {r['ldg']:5d} {r['registers']:5d}")


if __name__ == "__main__":
    main()
