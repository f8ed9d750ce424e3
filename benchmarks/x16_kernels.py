"""The cpu target's interleaved integer kernels (targets/c_x16.py, c_x16_q8.py) one by one, this tree against a git
revision, on one thread, interleaved in one process.

    .venv/bin/python benchmarks/x16_kernels.py [--against REV] [--rows 1536] [--cols 512] [--prompt 128] [--json]

Both trees' kernel sources (c.py's preamble, c_intrin.py, c_x16.py and, where the revision has it, c_x16_q8.py) are
compiled as the packages compile them (-O3 -march=native) into two shared objects with one timing loop each; every
kernel runs over a [rows, cols] weight matrix (by default 1536 x 512, near SmolLM2's MLP), a decode GEMV (one activation
row) and a prefill GEMM (--prompt rows in tiles), alternately in the two objects, 7 times; the table gives the
fastest time of each and the ratio. The weights are random codes with small positive scales: the timings do not
depend on the values. A revision without the 8-bit interleaved layout runs its row-at-a-time Q8_0 kernel on the same
bytes. What it shows: the kernels' arithmetic, not memory (the matrix fits in L2/L3), so a change to a kernel's
instruction mix reads here first; `benchmarks/llama_bench.py` is the whole-model benchmark of record.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (("c", "PREAMBLE"), ("c_intrin", "INTRINSICS"), ("c_x16", "X16"), ("c_x16_q8", "X16_Q8"))
# name -> (entry without suffix, activation bits, 8-bit weights)
KERNELS = {"Q4_0 x16 @8": ("q4_sym", 8, False), "Q4_0 x16 @16": ("q4_sym", 16, False),
           "Q5_0 x16 @16": ("q5_sym", 16, False), "Q4_K x16 @16": ("q4_k", 16, False),
           "Q6_K x16 @16": ("q6_k", 16, False), "Q8_0 @8": ("q8_sym", 8, True), "Q8_0 @16": ("q8_sym", 16, True),
           "Q6_K x16 @8": ("q6_k", 8, False)}  # the switch in HARNESS takes them in this order

HARNESS = r"""
#include <time.h>
static double dcc_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define CALL(NAME, ...) do { if (rows == 1) NAME(acc, __VA_ARGS__, g, nb); \
  else for (int t = 0; t < rows; t += DCC_TILE) NAME##_tile(acc, __VA_ARGS__, g, nb, t, rows); } while (0)
#define CALL_ROWS(NAME, ...) do { for (int l = 0; l < 16; ++l) { if (rows == 1) NAME(acc + l, __VA_ARGS__, 16 * g + l, nb); \
  else for (int t = 0; t < rows; t += DCC_TILE) NAME##_tile(acc + 4 * l, __VA_ARGS__, 16 * g + l, nb, t, rows); } } while (0)
double dcc_bench(int kernel, int N, int K, int rows, int iters, const uint32_t* q, const uint32_t* aux, const half* s,
                 const int8_t* x8, const int16_t* x16, const float* xd, const float* xsd, float* out) {
  const int nb = K / 32, G = N / 16;
  float acc[64];
  const double t0 = dcc_now();
  for (int it = 0; it < iters; ++it)
    for (int g = 0; g < G; ++g) {
      switch (kernel) {
        case 0: CALL(dcc_dot_q4_sym_x16_q8, q, s, x8, xd, xsd); break;
        case 1: CALL(dcc_dot_q4_sym_x16_q16, q, s, x16, xd, xsd); break;
        case 2: CALL(dcc_dot_q5_sym_x16_q16, q, aux, s, x16, xd, xsd); break;
        case 3: CALL(dcc_dot_q4_k_x16_q16, q, aux, s, s, x16, xd, xsd); break;
        case 4: CALL(dcc_dot_q6_k_x16_q16, q, aux, aux, s, x16, xd, xsd); break;
#ifdef DCC_Q8_X16
        case 5: CALL(dcc_dot_q8_sym_x16_q8, q, s, x8, xd, xsd); break;
        case 6: CALL(dcc_dot_q8_sym_x16_q16, q, s, x16, xd, xsd); break;
#else
        case 5: CALL_ROWS(dcc_dot_q8_sym_q8, q, s, x8, xd, xsd); break;
        case 6: CALL_ROWS(dcc_dot_q8_sym_q16, q, s, x16, xd, xsd); break;
#endif
        case 7: CALL(dcc_dot_q6_k_x16_q8, q, aux, aux, s, x8, xd, xsd); break;
      }
      out[g] += acc[0];
    }
  return (dcc_now() - t0) / iters;
}
"""


def source(read) -> tuple[str, bool]:
    """The kernels' C source from `read(module)` (a file's text, or None where the tree lacks it)."""
    parts, q8 = [], False
    for mod, name in SOURCES:
        text = read(mod)
        if text is None:
            continue
        start = text.index(f"{name} = ")
        q = text.index('"""', start)
        parts.append(text[q + 3:text.index('"""', q + 3)])
        q8 |= mod == "c_x16_q8"
    return ("#define DCC_Q8_X16 1\n" if q8 else "") + "".join(parts) + HARNESS, q8


def build(src: str, tmp: Path, tag: str):
    c, so = tmp / f"{tag}.c", tmp / f"{tag}.so"
    c.write_text(src)
    subprocess.run(["gcc", "-O3", "-std=gnu11", "-fPIC", "-shared", "-march=native", "-o", str(so), str(c)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.dcc_bench.restype = ctypes.c_double
    return lib


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default="HEAD", help="git revision to compare with (default HEAD: uncommitted work)")
    ap.add_argument("--rows", type=int, default=1536)
    ap.add_argument("--cols", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    N, K, P = args.rows, args.cols, args.prompt
    if N % 16 or K % 256:
        ap.error("--rows must be a multiple of 16 and --cols of 256 (the K-quants' super-blocks)")

    def at_rev(mod):
        r = subprocess.run(["git", "show", f"{args.against}:targets/{mod}.py"], cwd=ROOT, capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    def here(mod):
        path = ROOT / "targets" / f"{mod}.py"
        return path.read_text() if path.exists() else None

    with tempfile.TemporaryDirectory() as d:
        (old_src, old_q8), (new_src, _) = source(at_rev), source(here)
        libs = {args.against: build(old_src, Path(d), "rev"), "this tree": build(new_src, Path(d), "tree")}
        rng = np.random.default_rng(0)
        q = rng.integers(0, 1 << 32, N * K // 4, dtype=np.uint64).astype(np.uint32)  # 8 bits per weight, the most
        aux = rng.integers(0, 1 << 32, N * K // 8, dtype=np.uint64).astype(np.uint32)
        s = rng.uniform(0.001, 0.01, N * K // 16).astype(np.float16)
        x8 = rng.integers(-127, 128, P * K, dtype=np.int8)
        x16 = rng.integers(-32767, 32768, P * K, dtype=np.int16)
        xd, xsd = np.full(P * K // 32, 1e-3, np.float32), np.ones(P * K // 16, np.float32)
        out = np.zeros(N, np.float32)
        ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        rows = []
        for i, name in enumerate(KERNELS):
            for r in (1, P):
                best = {tag: float("inf") for tag in libs}
                for _ in range(7):
                    for tag, lib in libs.items():
                        t = lib.dcc_bench(i, N, K, r, 100 if r == 1 else 2, ptr(q), ptr(aux), ptr(s), ptr(x8), ptr(x16),
                                          ptr(xd), ptr(xsd), ptr(out))
                        best[tag] = min(best[tag], t)
                rows.append({"kernel": name, "activation_rows": r, **{f"{tag} us": best[tag] * 1e6 for tag in libs},
                             "speedup": best[args.against] / best["this tree"]})
    result = {"cpu": _cpu(), "matrix": [N, K], "against": args.against,
              "note": "" if old_q8 else
              f"{args.against} has no 8-bit interleaved layout: its Q8_0 rows run the row-at-a-time kernel",
              "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"CPU: {result['cpu']}; one thread; weights [{N}, {K}]; fastest of 7 interleaved runs")
    if result["note"]:
        print(result["note"])
    print(f"| kernel | activation rows | {args.against} us | this tree us | speedup |\n|---|--:|--:|--:|--:|")
    for row in rows:
        print(f"| {row['kernel']} | {row['activation_rows']} | {row[f'{args.against} us']:.1f} | {row['this tree us']:.1f} "
              f"| {row['speedup']:.2f}x |")


def _cpu() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from llama_bench import cpu_name

    return cpu_name()


if __name__ == "__main__":
    main()
