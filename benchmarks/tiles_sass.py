"""The prefill tiles' K step on the tensor cores, counted in the SASS that nvcc makes for sm_90: no GPU needed, the CUDA
toolkit's nvcc and cuobjdump (pip: nvidia-cuda-cuobjdump), as benchmarks/gemv_sass.py counts the decode GEMVs.

For each prefill linear of a model shape's first layer (benchmarks/gpu_model.py's checkpoints: random weights, the
real widths), q4f16_1 on `h100`, the tile kernel of each rule that takes it: "mma" (schedule/mma.py's rule: float
operands split in two tf32 parts, three products; the weights dequantized in the staging) and "mma-codes"
(mma.codes_rule: the 4-bit codes exact in bfloat16 and half, x in a bfloat16 and a half part, two products, the
group's scale once a step). Its K step is the loop (a backward branch's span) with the most tensor-core
instructions (HMMA); printed per K step of 32 and warp: its instructions, HMMA, shared loads and stores, global
loads; and the registers ptxas gives a thread. (About a minute on 2 cores, the checkpoints made.)

    PATH=$PATH:<cuobjdump's bin> .venv/bin/python benchmarks/tiles_sass.py [--shape Llama-3.2-1B-shaped] [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
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

    target = replace(presets.load("h100").target)
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


def registers(source: str, tmp: Path) -> int:
    cu = tmp / "r.cu"
    cu.write_text(source)
    r = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-w", "-Xptxas", "-v", "-o", str(tmp / "r.cubin"),
                        str(cu)], check=True, capture_output=True, text=True)
    return max(int(m) for m in re.findall(r"Used (\d+) registers", r.stderr))


def k_step(code: list) -> dict:
    """The counts of the loop with the most HMMA."""
    best: list = []
    for addr, ins in code:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", ins)
        if m and int(m[1], 16) < addr:
            body = [x for a, x in code if int(m[1], 16) <= a <= addr]
            if sum("HMMA" in x for x in body) > sum("HMMA" in x for x in best):
                best = body
    ops = [re.sub(r"^@!?P\w+\s+", "", x).split()[0] for x in best]
    return {"instructions": len(ops), "hmma": sum(o.startswith("HMMA") for o in ops),
            "lds": sum(o.startswith(("LDS", "LDSM")) for o in ops), "sts": sum(o.startswith("STS") for o in ops),
            "ldg": sum(o.startswith("LDG") for o in ops)}


def main() -> None:
    from gemv_sass import sass

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="Llama-3.2-1B-shaped")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (shutil.which("nvcc") and shutil.which("cuobjdump")):
        sys.exit("tiles_sass: needs nvcc and cuobjdump on PATH (pip install nvidia-cuda-cuobjdump; its bin/)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, k, n, rule, source in kernels(args.shape):
            rows.append({"kernel": name, "rule": rule, "k": k, "n": n, **k_step(sass(source, name, Path(tmp))),
                         "registers": registers(source, Path(tmp))})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'kernel':44s} {'rule':10s} {'K':>6s} {'N':>6s} {'instr':>6s} {'HMMA':>5s} {'LDS':>5s} {'STS':>5s} "
          f"{'LDG':>5s} {'regs':>5s}")
    for r in rows:
        print(f"{r['kernel'][-44:]:44s} {r['rule']:10s} {r['k']:6d} {r['n']:6d} {r['instructions']:6d} {r['hmma']:5d} "
              f"{r['lds']:5d} {r['sts']:5d} {r['ldg']:5d} {r['registers']:5d}")


if __name__ == "__main__":
    main()
