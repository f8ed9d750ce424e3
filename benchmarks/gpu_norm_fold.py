"""The decode step with the RMS norms folded into the GEMVs after them (transform/inline_prologue.py, FOLD_NORMS)
against the same package with a norm kernel of their own, one table: SmolLM2-135M- and Llama-3.2-1B-shaped `h100
q4f16_1` packages compiled both ways here, then `deploycc bench PKG --repeat 2 --json` on each, folded and not in
turn, twice (interleaved: the GPU's clocks drift over a lease). Needs the shaped checkpoints (benchmarks/
build_llama_cpp.py make_shaped) under $DEPLOYCC_HOME/models, a GPU and CuPy (benchmarks/gpu_check.sh lease runs it):

    python benchmarks/gpu_norm_fold.py [--shapes SmolLM2-135M-shaped,Llama-3.2-1B-shaped] [--out DIR] [--json]

The fold saves two launches a layer and one (the final norm), and costs the GEMVs it joins a fifth more instructions
(6.53 a weight against 5.50 in nvcc's SASS for sm_90): which wins is what this measures.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="SmolLM2-135M-shaped,Llama-3.2-1B-shaped")
    ap.add_argument("--out", default="/tmp/norm-fold")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for shape in a.shapes.split(","):
        pkgs = {}
        for fold in (True, False):
            inline_prologue.FOLD_NORMS = fold
            pkgs[fold] = compile_model(str(checkpoint_dir(shape)), "h100", quantization="q4f16_1", force=True,
                                       out=f"{a.out}/{shape}-{'folded' if fold else 'norms'}")
        for trial in range(2):
            for fold in (True, False):
                r = bench(pkgs[fold])
                rows.append({"shape": shape, "folded": fold, "trial": trial,
                             **{k: r.get(k) for k in ("decode_tok_s", "prefill_tok_s", "error")}})
    inline_prologue.FOLD_NORMS = True
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'shape':24s} {'norms':>8s} {'trial':>5s} {'decode tok/s':>12s} {'prefill tok/s':>13s}")
    for r in rows:
        print(f"{r['shape']:24s} {'folded' if r['folded'] else 'kernels':>8s} {r['trial']:5d} "
              f"{r['decode_tok_s'] or 0:12.1f} {r['prefill_tok_s'] or 0:13.1f} {r['error'] or ''}")


if __name__ == "__main__":
    main()
