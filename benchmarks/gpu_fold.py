"""The decode step with what transform/inline_prologue.py folds into the GEMVs against the same package with a kernel
of its own for it, one table: SmolLM2-135M- and Llama-3.2-1B-shaped `h100 q4f16_1` packages compiled here with
everything folded (today's), with the RMS norms as kernels (FOLD_NORMS off), and with the MLP's gated product as a
kernel (FOLD_GATED off), then `deploycc bench PKG --repeat 2 --json` on each in turn, twice (interleaved: the GPU's
clocks drift over a lease). Needs the shaped checkpoints (benchmarks/build_llama_cpp.py make_shaped) under
$DEPLOYCC_HOME/models, a GPU and CuPy (benchmarks/gpu_check.sh lease runs it):

    python benchmarks/gpu_fold.py [--shapes SmolLM2-135M-shaped,Llama-3.2-1B-shaped] [--out DIR] [--json]

Each fold saves a launch a layer and costs the GEMV instructions: a norm's a fifth more (6.53 a weight against 5.50
in nvcc's SASS for sm_90); the gated product's more where many lane groups each recompute it for their inputs (the
1B's down projection: 512 lane groups, 12.19 a weight; it streamed its weights at half the gate and up projection's
rate on an H200). Which wins is what this measures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from deploycc.package import compile_model
from deploycc.transform import inline_prologue

sys.path.insert(0, str(Path(__file__).parent))
from build_llama_cpp import checkpoint_dir  # noqa: E402


def bench(pkg: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "deploycc", "bench", str(pkg), "--repeat", "2", "--json"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout)


VARIANTS = {"folded": {}, "norms": {"FOLD_NORMS": False}, "gated": {"FOLD_GATED": False}}  # what is a kernel of its own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="SmolLM2-135M-shaped,Llama-3.2-1B-shaped")
    ap.add_argument("--out", default="/tmp/fold")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for shape in a.shapes.split(","):
        pkgs = {}
        for name, off in VARIANTS.items():
            for flag in ("FOLD_NORMS", "FOLD_GATED"):
                setattr(inline_prologue, flag, off.get(flag, True))
            pkgs[name] = compile_model(str(checkpoint_dir(shape)), "h100", quantization="q4f16_1", force=True,
                                       out=f"{a.out}/{shape}-{name}")
        for trial in range(2):
            for name, pkg in pkgs.items():
                r = bench(pkg)
                rows.append({"shape": shape, "variant": name, "trial": trial,
                             **{k: r.get(k) for k in ("decode_tok_s", "prefill_tok_s", "error")}})
    inline_prologue.FOLD_NORMS = inline_prologue.FOLD_GATED = True
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'shape':24s} {'own kernel':>10s} {'trial':>5s} {'decode tok/s':>12s} {'prefill tok/s':>13s}")
    for r in rows:
        print(f"{r['shape']:24s} {r['variant'] if r['variant'] != 'folded' else '-':>10s} {r['trial']:5d} "
              f"{r['decode_tok_s'] or 0:12.1f} {r['prefill_tok_s'] or 0:13.1f} {r['error'] or ''}")


if __name__ == "__main__":
    main()
