"""Every quantization scheme of SmolLM2-135M-Instruct on one preset: weights, prefill, decode, perplexity.

    .venv/bin/python benchmarks/schemes.py [--device cpu-opencl] [--prompt-len 128] [--gen-len 128]
                                           [--repeat 3] [--no-perplexity] [--json]

Packages are compiled with `deploycc compile` into $DEPLOYCC_HOME/bench/schemes/<device>/<name> (reused
while newer than the compiler's sources), timed with `deploycc bench --json` and scored with `deploycc
perplexity --json` on the README's text (the first 20000 characters of the sorted pydoc_data.topics).
Each command runs in its own process, one after another.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compare import TEXT_CHARS, deploycc_cli, ensure_model, load_fetch_script, log, package_is_current  # noqa: E402

# (name, source, compile arguments); source "hf" = the checkpoint, "gguf" = the shipped Q4_1 GGUF file.
SCHEMES = [
    ("q0f32", "hf", ["--quantization", "q0f32"]),
    ("q0f16", "hf", ["--quantization", "q0f16"]),
    ("q8f16_0", "hf", ["--quantization", "q8f16_0"]),
    ("q4f32_1", "hf", ["--quantization", "q4f32_1"]),
    ("q4f16_1", "hf", ["--quantization", "q4f16_1"]),
    ("q4f16_2", "hf", ["--quantization", "q4f16_2"]),
    ("q4f16_2 + q8f16_0 head", "hf", ["--quantization", "q4f16_2", "--head-quantization", "q8f16_0"]),
    ("GGUF Q4_1/Q8_0 as-is", "gguf", []),
]


def run_json(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        raise RuntimeError(f"{shlex.join(cmd[:3])} failed: {lines[-1] if lines else r.returncode}")
    return json.loads(r.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu-opencl")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-perplexity", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", "2")
    fetch = load_fetch_script()
    hf_dir, gguf = ensure_model(fetch)
    out_dir = fetch.cache_home() / "bench" / "schemes" / args.device
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    text = Path(tempfile.mkdtemp()) / "topics.txt"
    text.write_text("".join(topics[k] for k in sorted(topics))[:TEXT_CHARS])
    cli, rows = deploycc_cli(), []
    for name, src, extra in SCHEMES:
        pkg = out_dir / name.replace(" ", "").replace("/", "_")
        source = hf_dir if src == "hf" else gguf
        row = {"scheme": name, "compile": shlex.join(["deploycc", "compile", str(source), "--device", args.device,
                                                      *extra, "-o", "PKG"])}
        rows.append(row)
        try:
            if not package_is_current(pkg, source, args.device):
                log(f"{name}: compiling")
                run_json([*cli, "compile", str(source), "--device", args.device, *extra, "-o", str(pkg), "--force",
                          "--json"])
            log(f"{name}: bench")
            b = run_json([*cli, "bench", str(pkg), "--prompt-len", str(args.prompt_len), "--gen-len",
                          str(args.gen_len), "--repeat", str(args.repeat), "--json"])
            row.update(weights_mb=b["device_memory"]["weights_bytes"] / 1e6, prefill_tok_s=b["prefill_tok_s"],
                       decode_tok_s=b["decode_tok_s"], peak_rss_mb=b["peak_rss_bytes"] / 1e6, device=b["device"])
            if not args.no_perplexity:
                log(f"{name}: perplexity")
                row["perplexity"] = run_json([*cli, "perplexity", str(pkg), "--text", str(text), "--json"])["perplexity"]
        except RuntimeError as e:
            row["error"] = str(e)
            log(f"{name}: {e}")
    if args.json:
        print(json.dumps({"device": args.device, "prompt_len": args.prompt_len, "gen_len": args.gen_len,
                          "repeat": args.repeat, "rows": rows}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"SmolLM2-135M-Instruct on {args.device}: prompt {args.prompt_len}, {args.gen_len} generated, "
                    f"median of {args.repeat}")
    for c in ("scheme", "weights MB", "prefill tok/s", "decode tok/s", "peak RSS MB", "perplexity"):
        t.add_column(c, justify="left" if c == "scheme" else "right")
    for r in rows:
        if "error" in r:
            t.add_row(r["scheme"], "failed: " + r["error"], "", "", "", "")
            continue
        t.add_row(r["scheme"], f"{r['weights_mb']:.0f}", f"{r['prefill_tok_s']:.1f}", f"{r['decode_tok_s']:.1f}",
                  f"{r['peak_rss_mb']:.0f}", f"{r['perplexity']:.4f}" if "perplexity" in r else "—")
    Console(width=160).print(t)
    devs = {r.get("device") for r in rows if r.get("device")}
    print("device: " + ", ".join(sorted(devs)))
    print("command: " + shlex.join([os.path.relpath(sys.executable), os.path.relpath(__file__), *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
