"""The benchmark of record on the CPU: deploycc against llama.cpp's own C++ `llama-bench`, on the GGUF files users
download, interleaved in one run.

    .venv/bin/python benchmarks/llama_bench.py [--types Q4_0,Q4_1,Q4_K_M,Q5_K_M,Q8_0] [--prompt-lens 128,512] [--busy 1]
                                               [--shapes Qwen2.5-0.5B-shaped,Llama-3.2-1B-shaped] [--why]
                                               [--gen 128] [--threads 2] [--repeat 2] [--preset cpu] [--json]

For each GGUF file (SmolLM2-135M-Instruct, made from the f16 conversion by llama.cpp's own `llama-quantize`:
benchmarks/build_llama_cpp.py, which also builds llama-bench for AVX2 alone; with --shapes, random-weight
checkpoints with the shapes of Qwen2.5-0.5B and Llama-3.2-1B quantized to Q4_0 and Q4_K_M), deploycc compiles a package of the
file as stored (cached under $DEPLOYCC_HOME/bench/llama_bench/) and `deploycc bench` measures it; llama-bench
measures the same file with `-p P -n N -t T -r 1`. Each repeat runs every file, llama-bench then deploycc, so the
two tools see the same minutes of this VM's drifting memory bandwidth; a read-bandwidth probe (compare.py's) runs
before and after each repeat. The table gives medians over the repeats, the ratio deploycc / llama-bench, and the
package's weight bytes against the file's tensor bytes. With --why, every deploycc row under 1.2x llama-bench in any
column gets `deploycc bench --roofline`'s per-kernel table of a decode step after the run (where the time goes).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_llama_cpp import ensure  # noqa: E402
from compare import measure_bandwidth  # noqa: E402

from deploycc.runtime import roofline as rl  # noqa: E402

HOME = Path(os.environ.get("DEPLOYCC_HOME", Path.home() / ".cache" / "deploycc"))
ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
            fam = {k.strip(): v.strip() for k, v in (x.split(":", 1) for x in Path("/proc/cpuinfo").read_text()
                                                       .split("\n\n")[0].splitlines() if ":" in x)}
            flags = set(fam.get("flags", "").split())
            isa = ("AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags
                   else "AVX2" if "avx2" in flags else "no AVX2")
            return f"{name} (family {fam.get('cpu family')} model {fam.get('model')}), {os.cpu_count()} cores, {isa}"
    return platform.processor()


def file_tensor_bytes(path: Path) -> int:
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


def package_for(path: Path, preset: str, activations: str) -> Path:
    """A deploycc package of the GGUF file as stored, compiled once per compiler version, file and activation
    choice (auto: deploycc's default, calibrated; 8: every linear at 8 bits, the arithmetic llama.cpp does)."""
    from compare import package_is_current

    out = HOME / "bench" / "llama_bench" / f"{path.stem}-{preset}-a{activations}"
    if not package_is_current(out, path, preset):
        log(f"compile {path.name} for {preset}, activations {activations}")
        subprocess.run([sys.executable, "-m", "deploycc", "compile", str(path), "--device", preset, "-o", str(out),
                        "--activations", activations, "--force", "--json"], check=True, stdout=subprocess.DEVNULL,
                       cwd=ROOT)
    return out


def deploycc_bench(pkg: Path, prompt: int, gen: int) -> dict:
    r = subprocess.run([sys.executable, "-m", "deploycc", "bench", str(pkg), "--prompt-len", str(prompt), "--gen-len",
                        str(gen), "--repeat", "1", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "deploycc bench failed")
    return json.loads(r.stdout)


def roofline(pkg: Path, gen: int) -> dict:
    """`deploycc bench --roofline`'s decode step: per kernel, its share, bytes and GB/s against the read probe."""
    r = subprocess.run([sys.executable, "-m", "deploycc", "bench", str(pkg), "--gen-len", str(gen), "--repeat", "1",
                        "--roofline", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "deploycc bench failed")
    out = json.loads(r.stdout)
    return {"profile": out["profile"], "roofline": out["roofline"]}


def llama_bench(exe: str, path: Path, prompt: int, gen: int, threads: int) -> dict:
    """{"pp": tok/s at `prompt`, "tg": tok/s over `gen`} from llama-bench's JSON."""
    r = subprocess.run([exe, "-m", str(path), "-p", str(prompt), "-n", str(gen), "-t", str(threads), "-r", "1",
                        "-o", "json"], capture_output=True, text=True, timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "llama-bench failed")
    out = {}
    for row in json.loads(r.stdout):
        key = "pp" if row["n_prompt"] else "tg"
        out[key] = row["avg_ts"]
        out["system_info"] = row.get("cpu_info", "") + " | " + row.get("backends", "")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_0,Q4_1,Q4_K_M,Q5_K_M,Q8_0")
    ap.add_argument("--prompt-lens", default="128,512")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--preset", default="cpu", help="deploycc preset (cpu: this CPU's ISA; cpu-avx2: AVX2 alone)")
    ap.add_argument("--activations", default="auto,8", help="deploycc variants: auto (the default), 8, 16")
    ap.add_argument("--busy", type=int, default=0, help="Keep this many cores busy with another process meanwhile "
                                                        "(the figures under load)")
    ap.add_argument("--shapes", default="", help="Also random-weight checkpoints of these model shapes "
                                                 "(build_llama_cpp.SHAPES), at --shaped-types")
    ap.add_argument("--shaped-types", default="Q4_0,Q4_K_M")
    ap.add_argument("--why", action="store_true", help="Per-kernel roofline table of each row under 1.2x")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    shapes = [m for m in args.shapes.split(",") if m]
    shaped_types = args.shaped_types.split(",")
    built = ensure(shapes=shapes, shaped_types=shaped_types)
    variants = args.activations.split(",")
    prompts = [int(p) for p in args.prompt_lens.split(",")]
    files = {t: Path(built["gguf"][t]) for t in args.types.split(",") if t}
    files.update({f"{m} {t}": Path(built["shaped"][m][t]) for m in shapes for t in shaped_types})
    types = list(files)
    pkgs = {(t, a): package_for(f, args.preset, a) for t, f in files.items() for a in variants}
    samples: dict[str, dict[str, list[float]]] = {t: {} for t in types}
    probes, info = [], ""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        for rep in range(args.repeat):
            probes.append(measure_bandwidth(tries=3)["read_gb_s"])
            for t in types:
                for i, p in enumerate(prompts):
                    ll = llama_bench(built["llama_bench"], files[t], p, args.gen if i == 0 else 0, args.threads)
                    info = ll.get("system_info", info)
                    s = samples[t]
                    s.setdefault(f"llama pp{p}", []).append(ll["pp"])
                    if i == 0:
                        s.setdefault("llama tg", []).append(ll["tg"])
                    line = f"[{rep + 1}/{args.repeat}] {t} p{p}: llama pp {ll['pp']:.1f}" + (
                        f" tg {ll['tg']:.1f}" if i == 0 else "")
                    for a in variants:
                        ours = deploycc_bench(pkgs[t, a], p, args.gen if i == 0 else 1)
                        s.setdefault(f"deploycc-{a} pp{p}", []).append(ours["prefill_tok_s"])
                        if i == 0:
                            s.setdefault(f"deploycc-{a} tg", []).append(ours["decode_tok_s"])
                        line += f" | deploycc ({a}) pp {ours['prefill_tok_s']:.1f}" + (
                            f" tg {ours['decode_tok_s']:.1f}" if i == 0 else "")
                    log(line)
            probes.append(measure_bandwidth(tries=3)["read_gb_s"])
    finally:
        for b in busy:
            b.kill()
    rows = []
    for t in types:
        med = {k: statistics.median(v) for k, v in samples[t].items()}
        weights = {a: json.loads((pkgs[t, a] / "manifest.json").read_text())["memory"]["weights_bytes"] for a in variants}
        rows.append({"type": t, "file_tensor_bytes": file_tensor_bytes(files[t]), "package_weight_bytes": weights, **med})
    why = {}
    if args.why:
        for row in rows:
            for a in variants:
                worst = min(row[f"deploycc-{a} {k}"] / row[f"llama {k}"] for k in [f"pp{p}" for p in prompts] + ["tg"])
                if worst < 1.2:
                    log(f"why: {row['type']} deploycc ({a}) is {worst:.2f}x at worst: bench --roofline")
                    why[f"{row['type']} deploycc ({a})"] = roofline(pkgs[row["type"], a], args.gen)
    result = {"cpu": cpu_name(), "threads": args.threads, "preset": args.preset, "gen": args.gen, "prompts": prompts,
              "repeat": args.repeat, "variants": variants, "busy_cores": args.busy, "bandwidth_read_gb_s": probes,
              "llama_bench": built["llama_bench"], "rows": rows, "why": why,
              "command": shlex.join([os.path.relpath(sys.executable), os.path.relpath(__file__), *(argv or sys.argv[1:])])}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(render(result))


def render(r: dict) -> str:
    lines = [f"CPU: {r['cpu']}; {r['threads']} threads; deploycc preset {r['preset']}; llama-bench {r['llama_bench']}"
             + (f"; {r['busy_cores']} core(s) kept busy by another process" if r["busy_cores"] else ""),
             "read bandwidth probes (GB/s, numpy, before/after each repeat): "
             + ", ".join(f"{b:.1f}" for b in r["bandwidth_read_gb_s"]),
             f"medians of {r['repeat']} interleaved repeats; decode {r['gen']} tokens; deploycc (auto): the default "
             f"package (calibrated 8/16-bit activations), deploycc (8): 8-bit activations everywhere, as llama.cpp", ""]
    head = ["file", "tool", "weights MB (file)"] + [f"prefill {p} tok/s" for p in r["prompts"]] + ["decode tok/s"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in r["rows"]:
        def cells(tool, key, size):
            out = [row["type"], tool, size]
            for p in r["prompts"]:
                v = row[f"{key} pp{p}"]
                out.append(f"{v:.1f}" + ("" if key == "llama" else f" ({v / row[f'llama pp{p}']:.2f}x)"))
            v = row[f"{key} tg"]
            out.append(f"{v:.1f}" + ("" if key == "llama" else f" ({v / row['llama tg']:.2f}x)"))
            return "| " + " | ".join(out) + " |"
        lines.append(cells("llama-bench", "llama", f"{row['file_tensor_bytes'] / 1e6:.1f}"))
        for a in r["variants"]:
            size = row["package_weight_bytes"][a]
            lines.append(cells(f"deploycc ({a})", f"deploycc-{a}",
                               f"{size / 1e6:.1f} ({size / row['file_tensor_bytes']:.2f}x)"))
    for name, w in r.get("why", {}).items():
        p, roof = w["profile"], w["roofline"]
        probe = min(roof["bandwidth_before"]["all_threads_gb_s"], roof["bandwidth_after"]["all_threads_gb_s"])
        lines += ["", f"where the time goes, {name}: decode step {p['wall_ms_per_token']:.2f} ms, "
                      f"{roof['achieved_gb_s']:.1f} GB/s, {100 * roof['roofline_fraction']:.0f}% of the all-thread "
                      f"read probe ({probe:.1f} GB/s)", *rl.compute_lines(roof),  # the dot probe, the balance
                  f"| kernel | launches / token | ms / token | share | {' | '.join(rl.COLUMNS)} |",
                  "|---|" + "--:|" * (3 + len(rl.COLUMNS))]
        for k in p["kernels"][:8]:
            lines.append(f"| {k['kernel']} | {k['launches_per_token']:.0f} | {k['ms_per_token']:.2f} | "
                         f"{100 * k['share']:.0f}% | {' | '.join(rl.kernel_cells(k))} |")
    lines += ["", f"command: {r['command']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    log(f"done in {time.perf_counter() - t0:.0f} s")
