"""bench --roofline: a decode step against this machine's memory bandwidth (issue 34, item 4).

The bandwidth is read right before and right after the decode is measured, by the package's own native code
(`dcc_read_probe` in targets/c_pool.py: 256 MiB XORed as 64-bit words, gcc vectorises it) on one thread and on
every thread of the package's pool, best of 3 each: this VM's bandwidth drifts from minute to minute, so a fraction
of the roofline means something only against a probe taken beside the run it divides. A step must read every
weight a decode launch streams (the profile counts the bytes of the weight buffers each launch is given; a lookup of
one embedding row counts one row) and the KV cache rows up to the context. Achieved GB/s = those bytes / the
step's wall time; per kernel, its weight bytes / its time. A kernel far below the bandwidth with few bytes per
launch is bound by something else (arithmetic, synchronisation, launch cost), not by memory.
"""
from __future__ import annotations

import time

import numpy as np

PROBE_BYTES = 256 << 20


def probe(engine, tries: int = 3) -> dict | None:
    """{"one_thread_gb_s", "all_threads_gb_s", "threads"}, or None when the package's native module lacks the probe
    (compiled by an older deploycc) or the package is not a cpu package."""
    if hasattr(engine.device, "read_probe"):  # a GPU: its memory, read by its own kernel
        gb_s = engine.device.read_probe()
        return {"one_thread_gb_s": gb_s, "all_threads_gb_s": gb_s, "threads": None, "device": engine.device.name}
    lib = next((lib for lib in getattr(engine.device, "libs", []) if hasattr(lib, "dcc_read_probe")), None)
    if lib is None:
        return None
    import ctypes

    lib.dcc_read_probe.restype = ctypes.c_uint64
    lib.dcc_read_probe.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int)
    buf = np.ones(PROBE_BYTES, np.uint8)  # written once, so every page is real memory
    out = {}
    for key, every in (("one_thread_gb_s", 0), ("all_threads_gb_s", 1)):
        best = float("inf")
        for _ in range(tries):
            t = time.perf_counter()
            lib.dcc_read_probe(buf.ctypes.data, PROBE_BYTES, every)
            best = min(best, time.perf_counter() - t)
        out[key] = PROBE_BYTES / best / 1e9
    out["threads"] = int(getattr(engine.device, "threads", 0) or 0) or None
    return out


def kv_bytes(manifest: dict, context: int) -> int:
    """Bytes of KV cache a decode step at `context` tokens reads: keys and values of every layer, up to its ring."""
    kv = manifest["kv_cache"]
    rows = kv.get("rows") or [0] * kv["layers"]
    width = kv["kv_heads"] * kv["head_dim"] * {"float32": 4, "float16": 2}.get(kv.get("dtype", "float32"), 4)
    return 2 * sum(min(r or context, context) for r in rows) * width


def roofline(engine, profile: dict, before: dict, after: dict, context: int) -> dict:
    """The decode step of `profile` (runtime/cli.py profile_decode) against the bandwidth probes around it."""
    kernels = profile["kernels"]
    weights = 0.0
    for k in kernels:
        per = k.get("weight_bytes_per_token", 0.0)
        if "take" in k["kernel"]:  # a lookup reads one row per token, not the table
            per = per / max(1, int(engine.vocab_size))
        k["weight_mb_per_launch"] = per / max(k["launches_per_token"], 1e-9) / 1e6
        k["gb_s"] = per / (k["ms_per_token"] / 1e3) / 1e9 if k["ms_per_token"] else 0.0
        weights += per
    kv = kv_bytes(engine.manifest, context)
    step_s = profile["wall_ms_per_token"] / 1e3
    bw = min(before["all_threads_gb_s"], after["all_threads_gb_s"])
    for k in kernels:
        k["roofline_share"] = k["gb_s"] / bw if bw else 0.0
    achieved = (weights + kv) / step_s / 1e9
    return {"bandwidth_before": before, "bandwidth_after": after, "context": context, "weight_bytes_per_step": weights,
            "kv_bytes_per_step": kv, "step_ms": profile["wall_ms_per_token"], "achieved_gb_s": achieved,
            "roofline_fraction": achieved / bw if bw else 0.0,
            "roofline_tok_s": bw * 1e9 / (weights + kv) if weights + kv else 0.0}


def roofline_lines(r: dict) -> list[str]:
    b, a = r["bandwidth_before"], r["bandwidth_after"]
    if b.get("device"):
        head = (f"read bandwidth of {b['device']} (before / after the decode): {b['all_threads_gb_s']:.0f} / "
                f"{a['all_threads_gb_s']:.0f} GB/s")
        return [head, f"a decode step at context {r['context']} reads {r['weight_bytes_per_step'] / 1e6:.1f} MB of weights "
                f"and {r['kv_bytes_per_step'] / 1e6:.1f} MB of KV cache: {r['step_ms']:.2f} ms per step is "
                f"{r['achieved_gb_s']:.1f} GB/s, {100 * r['roofline_fraction']:.1f}% of the lower probe "
                f"(its limit: {r['roofline_tok_s']:.0f} tok/s)"]
    return [f"read bandwidth (the package's pool; before / after the decode): one thread {b['one_thread_gb_s']:.1f} / "
            f"{a['one_thread_gb_s']:.1f} GB/s, all threads {b['all_threads_gb_s']:.1f} / {a['all_threads_gb_s']:.1f} GB/s",
            f"a decode step at context {r['context']} reads {r['weight_bytes_per_step'] / 1e6:.1f} MB of weights and "
            f"{r['kv_bytes_per_step'] / 1e6:.1f} MB of KV cache: {r['step_ms']:.2f} ms per step is "
            f"{r['achieved_gb_s']:.1f} GB/s, {100 * r['roofline_fraction']:.0f}% of the lower all-thread probe "
            f"(its limit: {r['roofline_tok_s']:.0f} tok/s)"]
