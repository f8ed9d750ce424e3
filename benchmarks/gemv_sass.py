"""Instructions a weight of the decode GEMV, float (schedule/gemv.py) against __dp4a (schedule/dp4a.py), counted in the
SASS that nvcc makes for sm_90: no GPU needed, the CUDA toolkit's nvcc and cuobjdump (pip: nvidia-cuda-cuobjdump).

For each decode GEMV of a model shape's first layer (benchmarks/gpu_model.py's checkpoints: random weights, the
real widths), q4f16_1 on `h100` with `dp4a` off (float activations) and on (8-bit): the kernel's CUDA C, compiled to
a cubin and disassembled. Its weight code is the loop (a backward branch's span) that multiplies the most weights,
or where nvcc unrolled it whole, the span from the first such instruction to the last; the weights are counted by
the instructions that take them (an int-to-float conversion each in the float GEMV, four a dp4a). The dp4a kernel's
rounding of x (its first loop) is added per weight: that loop's instructions x its trips over the weights a thread
multiplies. Printed: instructions a weight, and that rate against an H100 SXM's at its HBM's weight rate: 3.35 TB/s
at q4f16_1's 4.5 bits a weight (4-bit codes, an fp16 scale a 32) is 5.96 T weights/s; 132 SMs x 4 schedulers x 32
lanes x 1.98 GHz = 33.4 T thread-instructions/s. (16 s on 2 cores, the checkpoints made.)

    PATH=$PATH:<cuobjdump's bin> .venv/bin/python benchmarks/gemv_sass.py [--shape Llama-3.1-8B-shaped] [--json]
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

ISSUE = 132 * 4 * 32 * 1.98e9  # H100 SXM: thread-instructions a second
WEIGHTS = 3350e9 / (4.5 / 8)  # weights a second its HBM streams at q4f16_1's 4.5 bits


def kernels(shape: str, dp4a: bool) -> dict:
    """{program name: (K, N, CUDA C)} of the decode's one-row linears of `shape`'s 1-layer checkpoint."""
    from gpu_model import checkpoint

    import deploycc
    from deploycc import presets
    from deploycc.export import export
    from deploycc.ir.kernel import scheduled
    from deploycc.pipeline import run
    from deploycc.quantization import quantize
    from deploycc.targets.cuda import render

    target = replace(presets.load("h100").target, dp4a=dp4a)
    model = quantize(deploycc.load_model(str(checkpoint(shape, 1))), "q4f16_1", None, False,
                     activations=8 if dp4a else None)
    mod = run(export(model, 512), target, "scheduled")
    out = {}
    for name, prog in mod.programs().items():
        s = scheduled(prog)
        if s.rule == "gemv" or s.rule.startswith(("gemv-split", "gemv-norm", "gemv-dp4a-q4_sym")):
            w = next(b for b in prog.params if b.dtype == "uint32")
            n, words = (int(d.value) for d in w.shape)
            out[name] = (words * 8, n, s.rule, render(list(s.kernels), target))
    return out


def compiled(source: str, name: str, tmp: Path) -> tuple[list[tuple[int, str]], int]:
    """((address, instruction) of the kernels' SASS for sm_90, the most registers ptxas gives a kernel's thread)."""
    cu, cubin = tmp / f"{name}.cu", tmp / f"{name}.cubin"
    cu.write_text(source)
    built = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-w", "-Xptxas", "-v", "-o", str(cubin), str(cu)],
                           check=True, capture_output=True, text=True)
    text = subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    code = [(int(m[1], 16), m[2].strip()) for m in re.finditer(r"/\*([0-9a-f]+)\*/\s+([^;/]*);", text)]
    return code, max(int(m) for m in re.findall(r"Used (\d+) registers", built.stderr))


def sass(source: str, name: str, tmp: Path) -> list[tuple[int, str]]:
    """(address, instruction) of the kernel's SASS for sm_90."""
    return compiled(source, name, tmp)[0]


def arguments(doc: str, shape: str, script: str) -> argparse.Namespace:
    """A SASS benchmark's --shape and --json, the toolchain it needs checked."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--shape", default=shape)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (shutil.which("nvcc") and shutil.which("cuobjdump")):
        sys.exit(f"{script}: needs nvcc and cuobjdump on PATH (pip install nvidia-cuda-cuobjdump; its bin/)")
    return args


def weights_in(body: list[str], dp4a: bool) -> int:
    """The 4-bit weights a span of SASS multiplies: a float conversion each in the float GEMV (I2F), four a dp4a
    (IDP.4A) in the other."""
    ops = [re.sub(r"^@!?P\w+\s+", "", x).split()[0] for x in body]
    if dp4a:
        return 4 * sum(1 for o in ops if o.startswith(("IDP.4A", "IDP4A")))
    return sum(1 for o in ops if o.startswith("I2F"))


def weight_code(code: list[tuple[int, str]], dp4a: bool) -> tuple[int, int]:
    """(instructions, weights) of the weight loop: the loop (a backward branch's span) with the most weights, or where
    nvcc unrolled it whole, the span from the first instruction that multiplies a weight to the last."""
    best = (0, 0)
    for addr, ins in code:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", ins)
        if not m or int(m[1], 16) >= addr:
            continue
        body = [x for a, x in code if int(m[1], 16) <= a <= addr]
        if weights_in(body, dp4a) > best[1]:
            best = (len(body), weights_in(body, dp4a))
    if best[1]:
        return best
    marks = [i for i, (_, x) in enumerate(code) if weights_in([x], dp4a)]
    body = [x for _, x in code[marks[0]:marks[-1] + 1]] if marks else []
    return len(body), weights_in(body, dp4a)


def rounding_code(code: list[tuple[int, str]], k: int) -> float:
    """The dp4a kernel's first phase (each block rounds x: a loop of 32 blocks of 32 inputs a trip, 4 lanes a block)
    in instructions a weight: its loop's instructions x trips over the weights a thread multiplies (ROWS rows of a
    warp's K, over 32 lanes)."""
    from deploycc.schedule import dp4a

    for addr, ins in code:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", ins)
        if m and int(m[1], 16) < addr:
            body = [x for a, x in code if int(m[1], 16) <= a <= addr]
            if any("F2I" in x for x in body):
                trips = -(-k // dp4a.BLOCK // (dp4a.THREADS // (dp4a.BLOCK // dp4a.PER_LANE)))
                return len(body) * trips / (dp4a.ROWS * k / 32)
    return 0.0


def main() -> None:
    args = arguments(__doc__, "Llama-3.1-8B-shaped", "gemv_sass")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dp4a in (False, True):
            for name, (k, n, rule, source) in kernels(args.shape, dp4a).items():
                code = sass(source, name, Path(tmp))
                instructions, weights = weight_code(code, dp4a)
                rounding = rounding_code(code, k) if dp4a else 0.0
                per = instructions / weights + rounding if weights else float("nan")
                rows.append({"kernel": name, "rule": rule, "k": k, "n": n, "instructions": instructions,
                             "weights": weights, "rounding_per_weight": rounding, "instructions_per_weight": per,
                             "issue_fraction_at_bandwidth": per * WEIGHTS / ISSUE})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'kernel':44s} {'rule':18s} {'K':>6s} {'N':>7s} {'instr':>6s} {'weights':>7s} {'round':>6s} "
          f"{'ins/w':>6s} {'issue':>6s}")
    for r in rows:
        print(f"{r['kernel'][-44:]:44s} {r['rule']:18s} {r['k']:6d} {r['n']:7d} {r['instructions']:6d} "
              f"{r['weights']:7d} {r['rounding_per_weight']:6.2f} {r['instructions_per_weight']:6.2f} "
              f"{r['issue_fraction_at_bandwidth']:6.0%}")


if __name__ == "__main__":
    main()
