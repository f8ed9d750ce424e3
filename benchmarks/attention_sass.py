"""The prefill attention's key tile, counted in the SASS that nvcc makes for sm_90 (no GPU needed: nvcc and cuobjdump,
as benchmarks/tiles_sass.py counts the matmul tiles): the tensor cores' tiles (schedule/attention_mma.py, a float16
cache) and the SIMT tiles (schedule/attention_tiles.py, a float32 cache), for 512 queries of 32 heads over 8 kv heads
on `h100`. Printed per head_dim: the rule, registers, the key-tile loop's instructions and HMMA a warp, the loops
kept inside it with theirs, and the instructions a multiply-add (QK^T and PV) for a warp's 32 threads where no loop
is kept inside (the count of one trip is then the tile's).

    PATH=$PATH:<cuobjdump's bin> .venv/bin/python benchmarks/attention_sass.py
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def program(n: int, h: int, kvh: int, d: int, kv: str):
    from deploycc.ir import sym, tir

    t = sym.var("total_len")
    q = tir.Buffer("q", (sym.as_expr(n), sym.as_expr(h), sym.as_expr(d)))
    k, v = (tir.Buffer(x, (t, sym.as_expr(kvh), sym.as_expr(d)), kv) for x in ("k", "v"))
    o = tir.Buffer("o", (sym.as_expr(n), sym.as_expr(h), sym.as_expr(d)))
    return tir.TensorProgram("attention", (q, k, v, o), None, (), 1, {"op": "attention", "scale": 0.125})


def main() -> None:
    from gemv_sass import compiled

    from deploycc import presets
    from deploycc.schedule import attention_mma, attention_tiles, schedule_program
    from deploycc.targets.cuda import render

    target = presets.load("h100").target
    for d in (64, 128, 256):
        for kv in ("float16", "float32"):
            prog = schedule_program(program(512, 32, 8, d, kv), target)
            s = prog.attrs["schedule"]
            with tempfile.TemporaryDirectory() as tmp:
                code, regs = compiled(render(list(s.kernels), target), "attention", Path(tmp))
            loops = [(int(m[1], 16), a) for a, x in code if (m := re.search(r"BRA\s+0x([0-9a-f]+)", x))
                     and int(m[1], 16) < a]
            ops = {a: re.sub(r"^@!?P\w+\s+", "", x).split()[0] for a, x in code}

            def count(lo, hi, prefix=""):
                return sum(lo <= a <= hi and op.startswith(prefix) for a, op in ops.items())
            outer = max(loops, key=lambda x: x[1] - x[0])
            inner = [x for x in loops if x != outer and outer[0] <= x[0] and x[1] <= outer[1]]
            if s.rule == "attention-mma":
                rows, bk = attention_mma.shape(target, d)
                warps, queries = rows * attention_mma.parts(d), 16 * rows
            else:
                bk, warps, queries = attention_tiles.key_tile(target, d), 4, 16
            macs = queries * bk * d * 2 / warps  # a warp's share of a tile's QK^T and PV
            per = f"{32 * count(*outer) / macs:.2f}" if not inner else "-"
            print(f"head_dim {d:3d} {kv:7s} {s.rule:15s} registers {regs:3d}  tile loop {count(*outer):5d} "
                  f"HMMA {count(*outer, 'HMMA'):4d}  inner loops {[count(*x) for x in inner]}  per MAC {per}")


if __name__ == "__main__":
    main()
