"""The performance model (deploycc/perfmodel.py) against what a lent GPU measured, kernel by kernel.

Takes a package compiled here from the code that ran there (its kernels' names and schedules must be the same) and
the JSON that `deploycc bench PKG --roofline --json` (a decode step's profile) or `deploycc bench PKG --sequences
1,16 --profile --json` (the batched step's) printed there, and prints, per kernel, the measured time of a launch, the
model's, and the bound the model names; then the step's measured and predicted time. The profile times each launch
between CUDA events, which adds to each the gap the events make: where the step also ran as a CUDA graph (its wall
time the GPU's), that gap is (kernel time - wall time) / launches, and the measured column has it taken off.

    .venv/bin/python benchmarks/gpu_calibrate.py PKG RESULT.json [--which N] [--context 192] [--sequences 16] [--json]

RESULT.json may hold several results one after another (gpu_check.sh's lease-bench.jsonl): --which picks one (by its
position, from 0), else the first with a profile.

The results of the lease of 2026-11-28 (an H200) are in benchmarks/results/h200-2026-11-28/ (docs/gpu.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def documents(text: str) -> list[dict]:
    """The JSON documents of a file, one after another (pretty-printed ones too)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        doc, i = decoder.raw_decode(text, i)
        out.append(doc)


def profile_of(result: dict, sequences: int | None) -> dict:
    if sequences is None:
        return result["profile"]
    return next(p for p in result["profiles"] if p["sequences"] == sequences)


def compare(pkg: str, result: dict, context: int, sequences: int | None) -> dict:
    from deploycc.perfmodel import predict

    prof = profile_of(result, sequences)
    pred = predict(pkg, context=context, sequences=(sequences,) if sequences else ())
    step = pred["steps"][f"step{sequences}" if sequences else "decode"]
    graphs = sequences is None and bool(result.get("cuda_graphs"))
    gap = (prof["kernel_ms_per_token"] - prof["wall_ms_per_token"]) / prof["launches_per_token"] * 1e3 if graphs else 0.0
    by_kernel: dict[str, list] = {}
    for x in step.launches:
        by_kernel.setdefault(x.kernel, []).append(x)
    rows = []
    for k in prof["kernels"]:
        launches = by_kernel.get(k["kernel"], [])
        model_us = sum(x.seconds for x in launches) / len(launches) * 1e6 if launches else None
        rows.append({"kernel": k["kernel"], "launches": k["launches_per_token"], "measured_us": k["us_each"] - gap,
                     "model_us": model_us, "bound": launches[0].bound if launches else "",
                     "model_launches": len(launches)})
    return {"package": pkg, "sequences": sequences or 1, "context": context, "event_gap_us": gap, "kernels": rows,
            "measured_step_ms": prof["wall_ms_per_token"], "model_step_ms": step.seconds * 1e3,  # a step's, batched too
            "model_device_ms": step.device_s * 1e3,
            "measured_kernel_ms": prof["kernel_ms_per_token"] - gap * prof["launches_per_token"] / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package")
    ap.add_argument("result", help="the JSON bench printed on the GPU machine")
    ap.add_argument("--context", type=int, default=192, help="the decode step's context (prompt + half the generated)")
    ap.add_argument("--sequences", type=int, help="the batched step of this many sequences (a --sequences result)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--which", type=int, help="the result's position in RESULT.json, from 0")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = documents(Path(a.result).read_text())
    if a.which is not None:
        result = results[a.which]
    else:
        result = next((r for r in results if r.get("profile") or r.get("profiles")), None)
        if result is None:
            sys.exit(f"{a.result} holds no profiled result (bench --roofline or --profile)")
    out = compare(a.package, result, a.context, a.sequences)
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return
    print(f"{Path(a.package).name}, {out['sequences']} sequence(s), context {a.context}; the profile's gap between "
          f"events, taken off: {out['event_gap_us']:.1f} us a launch")
    print(f"{'kernel':52s} {'launches':>8s} {'measured us':>11s} {'model us':>9s}  bound")
    for r in out["kernels"][:a.top]:
        model = f"{r['model_us']:9.1f}" if r["model_us"] is not None else f"{'-':>9s}"
        print(f"{r['kernel'][:52]:52s} {r['launches']:8.0f} {r['measured_us']:11.1f} {model}  {r['bound']}")
    print(f"step: measured {out['measured_step_ms']:.2f} ms (kernels {out['measured_kernel_ms']:.2f}), "
          f"model {out['model_step_ms']:.2f} ms (device {out['model_device_ms']:.2f})")


if __name__ == "__main__":
    main()
