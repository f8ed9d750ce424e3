"""The measuring half of benchmarks/compare.py: one tool, one format, one task per process.

    python bench_workers.py --worker {deploycc,llama.cpp,pytorch,llama-quantize} --task {speed,perplexity}
                            --model PATH --format FMT --ids-file IDS.json [--threads 2 --repeat 3 ...]

It prints one line `{"worker_result": {...}}` on stdout. It imports only the standard library and
numpy at module level, so llama-cpp-python's own venv runs it without deploycc; the perplexity and
peak-RSS code every tool is measured with is deploycc's runtime/perplexity.py and runtime/procstat.py,
loaded by path (numpy and the standard library only).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PPL_WINDOW = 512
PPL_STRIDE = 512
LLAMA_N_CTX = 1024
TOOLS = ("deploycc", "llama.cpp", "pytorch")


def load_runtime_module(name: str):
    """runtime/NAME.py by path: runs in interpreters that have no deploycc."""
    key = f"_deploycc_runtime_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "runtime" / f"{name}.py")
        sys.modules[key] = importlib.util.module_from_spec(spec)  # dataclasses look their module up here
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


class LogitsSession:
    """The session contract runtime/perplexity.py scores (`prefill(ids, all_logits=True)`, `reset()`), over a
    function that returns every position's logits of a fresh sequence."""

    def __init__(self, all_logits_of):
        self.all_logits_of = all_logits_of

    def reset(self) -> None:
        pass

    def prefill(self, ids, all_logits: bool = True):
        return self.all_logits_of(list(ids))


def score(session, ids: list[int]) -> dict:
    return load_runtime_module("perplexity").perplexity(session, ids, PPL_WINDOW, PPL_STRIDE).to_dict()


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
           "weights_bytes": engine.weights_bytes,
           "versions": {"deploycc_device": str(getattr(engine.device, "name", ""))}}
    if args.task == "perplexity":
        return {**res, **score(engine, ids)}

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

        return {**res, **score(LogitsSession(window_logits), ids)}

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

        return {**res, **score(LogitsSession(window_logits), ids)}

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
    res["peak_rss_mb"] = load_runtime_module("procstat").peak_rss_bytes() / 1e6
    sys.stdout.flush()
    print(json.dumps({"worker_result": res}), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="one measurement of benchmarks/compare.py")
    p.add_argument("--worker", required=True, choices=[*TOOLS, "llama-quantize"])
    p.add_argument("--task", choices=["speed", "perplexity"], default="speed")
    p.add_argument("--model", required=True)
    p.add_argument("--format", dest="fmt", required=True)
    p.add_argument("--ids-file")
    p.add_argument("--out")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--prompt-lens", type=lambda s: [int(x) for x in s.split(",")], default=[128, 512])
    p.add_argument("--gen", type=int, default=128)
    return p


if __name__ == "__main__":
    sys.exit(worker_main(build_parser().parse_args()))
