"""Benchmarks of a package's engine, shared by `python PACKAGE bench` and `deploycc bench`: prefill and decode tok/s
with peak memory (bench), batched decode over the page pool (batch_bench), and a decode step kernel by kernel
(profile_decode, which bench --roofline divides by the bandwidth: roofline.py)."""
from __future__ import annotations

import statistics
import time

import numpy as np

from .generate import UsageError
from .procstat import peak_rss_bytes
from .vm import DTensor


def bench(engine, prompt_len: int = 128, gen_len: int = 128, repeat: int = 3, seed: int = 0) -> dict:
    """Prefill and decode speed on random prompt ids (seeded), after one warm-up run; medians over `repeat`.
    Decode feeds back the greedy token, as generation does; the times include copying logits back."""
    window = int(engine.context_window)
    if prompt_len < 1 or gen_len < 1 or repeat < 1:
        raise UsageError("--prompt-len, --gen-len and --repeat must be >= 1")
    if prompt_len + gen_len > window:
        raise UsageError(f"--prompt-len {prompt_len} + --gen-len {gen_len} exceed the package's context window of "
                         f"{window}; choose smaller lengths")
    vocab = int(engine.vocab_size)
    ids = np.random.default_rng(seed).integers(0, vocab, prompt_len).tolist()

    def once(decodes: int) -> tuple[float, float]:
        engine.reset()
        t0 = time.perf_counter()
        logits = engine.prefill(ids)
        t1 = time.perf_counter()
        for _ in range(decodes):
            logits = engine.decode(int(np.argmax(logits)))
        return t1 - t0, time.perf_counter() - t1

    once(min(gen_len, 8))  # warm-up: first launches, lazy driver work, page faults of the weights
    runs = [once(gen_len) for _ in range(repeat)]
    prefill_s = [p for p, _ in runs]
    decode_s = [d for _, d in runs]
    mem = engine.manifest.get("memory", {})
    weights, kv, act = (int(mem.get(k) or 0) for k in ("weights_bytes", "kv_cache_bytes", "activation_bytes"))
    return {
        "package": str(engine.path), "model": engine.manifest["model"].get("architecture"),
        "device": getattr(engine.device, "name", "") or engine.manifest["preset"]["backend"],
        "preset": engine.manifest["preset"]["name"], **engine.variants,
        "prompt_len": prompt_len, "gen_len": gen_len, "repeat": repeat,
        "prefill_tok_s": round(prompt_len / statistics.median(prefill_s), 3),
        "decode_tok_s": round(gen_len / statistics.median(decode_s), 3),
        "prefill_seconds": [round(x, 6) for x in prefill_s], "decode_seconds": [round(x, 6) for x in decode_s],
        "peak_rss_bytes": peak_rss_bytes(),
        "device_memory": {"weights_bytes": weights, "kv_cache_bytes": kv, "activation_bytes": act,
                          "total_bytes": weights + kv + act},
    }


def batch_bench(engine, sequences: list[int], prompt_len: int = 128, gen_len: int = 128, seed: int = 0) -> dict:
    """The batched step's capacity (an engine loaded with paged=True): for each count of sequences, each prefilled
    with its own random prompt (seeded), the aggregate tok/s of gen_len greedy decode steps of all of them at
    once (after a warm-up), and the time of one step."""
    cache = engine.cache
    if prompt_len < 1 or gen_len < 1 or not sequences or min(sequences) < 1:
        raise UsageError("--prompt-len, --gen-len and every --sequences count must be >= 1")
    if prompt_len + gen_len > engine.context_window:
        raise UsageError(f"--prompt-len {prompt_len} + --gen-len {gen_len} exceed the package's context window of "
                         f"{engine.context_window}; choose smaller lengths")
    if max(sequences) > cache.sequences:
        raise UsageError(f"--sequences {max(sequences)} exceeds the {cache.sequences} sequences a step of this package "
                         f"holds; recompile with --override max_num_sequences=N")
    pages = cache.pages_for(prompt_len + gen_len)
    if max(sequences) * pages > cache.available:
        raise UsageError(f"{max(sequences)} sequences of {prompt_len + gen_len} tokens need {max(sequences) * pages} "
                         f"KV pages; the pool has {cache.available}: recompile with --override kv_pool_tokens=N")
    rng = np.random.default_rng(seed)

    def run(n: int, steps: int) -> float:
        tables = [cache.take(pages) for _ in range(n)]
        try:
            tokens = []
            for table in tables:  # each prompt in steps of the prefill chunk
                ids = rng.integers(0, engine.vocab_size, prompt_len).tolist()
                for at in range(0, prompt_len, engine.prefill_chunk):
                    chunk = ids[at:at + engine.prefill_chunk]
                    logits = engine.step(chunk, [table], [at], [len(chunk)])
                tokens.append(int(np.argmax(logits[0])))
            t0 = time.perf_counter()
            for k in range(steps):
                logits = engine.step(tokens, tables, [prompt_len + k] * n, [1] * n)
                tokens = [int(t) for t in np.argmax(logits, axis=1)]
            return time.perf_counter() - t0
        finally:
            for table in tables:
                cache.give(table)

    run(1, min(gen_len, 8))  # warm-up
    rows = []
    for n in sequences:
        seconds = run(n, gen_len)
        rows.append({"sequences": n, "decode_tok_s": round(n * gen_len / seconds, 3),
                     "step_ms": round(1000 * seconds / gen_len, 3), "function": engine.step_function(n)})
    return {"package": str(engine.path), "preset": engine.manifest["preset"]["name"], "prompt_len": prompt_len,
            "gen_len": gen_len, "rows": rows}


def batch_bench_lines(r: dict) -> list[str]:
    one = r["rows"][0]["decode_tok_s"] if r["rows"][0]["sequences"] == 1 else None
    out = [f"package        {r['package']} ({r['preset']}), batched decode after {r['prompt_len']}-token prompts",
           "sequences   decode tok/s   ms / step   function" + ("   x 1 sequence" if one else "")]
    for row in r["rows"]:
        ratio = f"   {row['decode_tok_s'] / one:13.2f}" if one else ""
        out.append(f"{row['sequences']:9d}   {row['decode_tok_s']:12.1f}   {row['step_ms']:9.2f}   "
                   f"{row['function']:8s}{ratio}")
    return out


def mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def profile_decode(engine, prompt_len: int = 128, steps: int = 32) -> dict:
    """Where a decode step's time goes: wall time per token, the device time of every kernel (profiling
    events), and the host's own time to run the step's bytecode and enqueue its launches, measured with
    the device held idle (so kernels do not compete with it for the cores). OpenCL, CUDA and cpu. On cpu the
    package's step runs as one native call: host time is the decode step's time outside that call, and
    the kernels are timed running the same bytecode launch by launch."""
    dev = engine.device
    if not hasattr(dev, "start_profile"):
        raise UsageError(f"--profile needs the opencl, cuda or cpu backend; this package runs on "
                         f"{engine.manifest['preset']['backend']}")
    window = int(engine.context_window)
    if prompt_len + 3 * steps + 8 > window:
        raise UsageError(f"--prompt-len {prompt_len} leaves no room for {3 * steps + 8} profiled decode steps in the "
                         f"context window of {window}")
    ids = np.random.default_rng(0).integers(0, int(engine.vocab_size), prompt_len).tolist()
    engine.reset()
    tok = int(np.argmax(engine.prefill(ids)))
    for _ in range(4):
        tok = int(np.argmax(engine.decode(tok)))
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = int(np.argmax(engine.decode(tok)))
    wall = (time.perf_counter() - t0) / steps
    host = []
    native = {f: fn.native for f, fn in engine.vm.functions.items() if fn.native is not None}
    for _ in range(steps if native else 0):
        prologue, epilogue, call, slots, values = native["decode"]
        inside = []

        def timed_call(call=call, inside=inside):
            t = time.perf_counter()
            call()
            inside.append(time.perf_counter() - t)
        engine.vm.functions["decode"].native = (prologue, epilogue, timed_call, slots, values)
        t = time.perf_counter()
        tok = int(np.argmax(engine.decode(tok)))
        host.append(time.perf_counter() - t - inside[0])
        engine.vm.functions["decode"].native = native["decode"]
    for _ in range(0 if native else steps):
        dev.write(engine.ids_buf, np.array([[tok]], np.int32))
        release = dev.gate()
        t = time.perf_counter()
        res = engine.vm.run("decode", DTensor(engine.ids_buf, (1, 1), "int32"), engine.cache)
        host.append(time.perf_counter() - t)
        release()
        tok = int(np.argmax(engine._download(res)[0, -1]))
    for f in native:  # kernels one launch at a time, from the same bytecode
        engine.vm.functions[f].native = None
    dev.start_profile()
    try:
        for _ in range(steps):
            tok = int(np.argmax(engine.decode(tok)))
    finally:
        timed = dev.take_profile()
        for f, n in native.items():
            engine.vm.functions[f].native = n
    return _profile_rows(timed, steps, wall, host)


def _profile_rows(timed: list, steps: int, wall: float, host: list[float]) -> dict:
    """The profile of `steps` steps: `timed` (kernel, seconds[, weight bytes]) launch by launch, `wall` seconds per
    step, `host` the host's seconds of each step."""
    kernels: dict[str, list] = {}
    weight_bytes: dict[str, int] = {}
    for name, sec, *streamed in timed:  # cpu: also the bytes of weights the launch read
        kernels.setdefault(name, []).append(sec)
        weight_bytes[name] = weight_bytes.get(name, 0) + (streamed[0] if streamed else 0)
    total = sum(t[1] for t in timed) / steps
    rows = sorted(({"kernel": k, "launches_per_token": len(v) / steps, "us_each": 1e6 * sum(v) / len(v),
                    "ms_per_token": 1e3 * sum(v) / steps, "share": sum(v) / steps / total if total else 0.0,
                    "weight_bytes_per_token": weight_bytes[k] / steps}
                   for k, v in kernels.items()), key=lambda r: -r["ms_per_token"])
    return {"steps": steps, "wall_ms_per_token": 1e3 * wall, "kernel_ms_per_token": 1e3 * total,
            "host_ms_per_token": 1e3 * float(np.median(host)), "launches_per_token": len(timed) / steps,
            "kernels": rows}


def profile_steps(engine, sequences: list[int], prompt_len: int = 128, steps: int = 16) -> list[dict]:
    """profile_decode for the server's batched step (an engine loaded with paged=True): for each count of sequences,
    each prefilled with its own random prompt, the step that decodes one token of every one of them: wall time, the
    device time of every kernel (launch by launch), and the host's time to run the step's bytecode (the device held
    idle; on cpu, the step outside its one native call). Its "per token" figures are per step."""
    dev, cache = engine.device, engine.cache
    if not hasattr(dev, "start_profile"):
        raise UsageError(f"--profile needs the opencl, cuda or cpu backend; this package runs on "
                         f"{engine.manifest['preset']['backend']}")
    need = prompt_len + 3 * steps + 4
    if need > engine.context_window:
        raise UsageError(f"--prompt-len {prompt_len} leaves no room for {3 * steps + 4} profiled steps in the context "
                         f"window of {engine.context_window}")
    pages = cache.pages_for(need)
    if max(sequences) > cache.sequences or max(sequences) * pages > cache.available:
        raise UsageError(f"{max(sequences)} sequences of {need} tokens do not fit this package's step and page pool; "
                         f"recompile with --override max_num_sequences=N and kv_pool_tokens=N")
    rng = np.random.default_rng(0)
    out = []
    for n in sequences:
        tables = [cache.take(pages) for _ in range(n)]
        try:
            tokens = []
            for table in tables:
                ids = rng.integers(0, engine.vocab_size, prompt_len).tolist()
                for at in range(0, prompt_len, engine.prefill_chunk):
                    chunk = ids[at:at + engine.prefill_chunk]
                    logits = engine.step(chunk, [table], [at], [len(chunk)])
                tokens.append(int(np.argmax(logits[0])))
            at = prompt_len

            def step(tokens):
                nonlocal at
                logits = engine.step(tokens, tables, [at] * n, [1] * n)
                at += 1
                return [int(t) for t in np.argmax(logits, axis=1)]
            for _ in range(4):
                tokens = step(tokens)
            t0 = time.perf_counter()
            for _ in range(steps):
                tokens = step(tokens)
            wall = (time.perf_counter() - t0) / steps
            host = [_host_seconds(engine, tokens, tables, at + k, n) for k in range(steps)]
            at += steps
            fn = engine.vm.functions[engine.step_function(n)]  # step_one for one sequence where the package has it
            native = fn.native
            fn.native = None  # kernels one launch at a time, from the same bytecode
            dev.start_profile()
            try:
                for _ in range(steps):
                    tokens = step(tokens)
            finally:
                timed = dev.take_profile()
                fn.native = native
        finally:
            for table in tables:
                cache.give(table)
        out.append({"sequences": n, "function": engine.step_function(n), **_profile_rows(timed, steps, wall, host)})
    return out


def _host_seconds(engine, tokens: list[int], tables: list, at: int, n: int) -> float:
    """The host's time of one batched step: the VM running its bytecode with the device held idle (the launches only
    enqueued), or on cpu the step outside its native call; a step at position `at` of each sequence, its tokens
    those of the last timed step (their logits are not needed)."""
    name = engine.step_function(n)
    dev, fn = engine.device, engine.vm.functions[name]
    engine.cache.plan(tables, [at] * n, [1] * n)
    ids = np.asarray(tokens, np.int32).reshape(1, -1)
    if fn.native is not None:
        prologue, epilogue, call, slots, values = fn.native
        inside = []

        def timed_call():
            t = time.perf_counter()
            call()
            inside.append(time.perf_counter() - t)
        fn.native = (prologue, epilogue, timed_call, slots, values)
        try:
            t = time.perf_counter()
            engine._download(engine._step(name, ids))
            return time.perf_counter() - t - inside[0]
        finally:
            fn.native = (prologue, epilogue, call, slots, values)
    dev.write(engine.ids_buf, ids)
    release = dev.gate() if hasattr(dev, "gate") else (lambda: None)
    t = time.perf_counter()
    res = engine.vm.run(name, DTensor(engine.ids_buf, (1, ids.shape[1]), "int32"), engine.cache)
    seconds = time.perf_counter() - t
    release()
    engine._download(res)
    return seconds


def bench_lines(r: dict) -> list[str]:
    m = r["device_memory"]
    return [f"package        {r['package']} ({r['preset']} on {r['device']})",
            f"prompt / gen   {r['prompt_len']} / {r['gen_len']} tokens, median of {r['repeat']}",
            f"prefill        {r['prefill_tok_s']:.1f} tok/s",
            f"decode         {r['decode_tok_s']:.1f} tok/s",
            f"peak RSS       {mb(r['peak_rss_bytes'])}",
            f"device memory  {mb(m['total_bytes'])} (weights {mb(m['weights_bytes'])}, KV cache "
            f"{mb(m['kv_cache_bytes'])}, activations {mb(m['activation_bytes'])})"]


def parse_counts(text: str) -> list[int]:
    """--sequences 1,4,8: positive integers, or a ValueError that says so."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"--sequences expects positive counts like 1,4,8, got {text!r}")
    return counts
