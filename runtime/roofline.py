"""bench --roofline: a decode step against this machine's memory bandwidth (issue 34, item 4).

The bandwidth is read right before and right after the decode is measured, by the package's own native code
(`dcc_read_probe` in targets/c_pool.py: 256 MiB XORed as 64-bit words, gcc vectorises it) on one thread and on
every thread of the package's pool, best of 3 each: this VM's bandwidth drifts from minute to minute, so a fraction
of the roofline means something only against a probe taken beside the run it divides. A step must read every
weight a decode launch streams (the profile counts the bytes of the weight buffers each launch is given; a lookup of
one embedding row counts one row) and the KV cache rows up to the context. Achieved GB/s = those bytes / the
step's wall time; per kernel, its weight bytes / its time. A kernel far below the bandwidth with few bytes per
launch is bound by something else (arithmetic, synchronisation, launch cost), not by memory.

Arithmetic: the manifest gives each matmul kernel its multiply-adds per row of activations (deploycc/vm/programs.py
kernel_work), so a decode step's operations per weight byte and per second are known per kernel, and
`dcc_dot_probe` (targets/c_pool.py) measures the most the integer dot products the kernels use can do on every
thread (8- and 16-bit activations). A kernel whose operations per byte exceed the machine's balance (peak
operations / bandwidth) is bound by arithmetic; its fraction of the dot peak says how close it comes.
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
    if hasattr(lib, "dcc_dot_probe"):
        out["dot_gops"] = dot_probe(lib)
    return out


def dot_probe(lib, seconds: float = 0.05, tries: int = 3) -> dict[str, float]:
    """{"8": Gop/s, "16": Gop/s}: the integer dot products the kernels are built on (targets/c_pool.py
    dcc_dot_probe), on every thread of the pool, best of `tries` runs of about `seconds`; an operation is a
    multiply or an add (2 per multiply-add), as the kernels' figures count them."""
    import ctypes

    lib.dcc_dot_probe.restype = ctypes.c_uint64
    lib.dcc_dot_probe.argtypes = (ctypes.c_int64, ctypes.c_int, ctypes.c_int)
    out = {}
    for bits in (8, 16):
        iters = 1 << 12
        while True:  # long enough to time
            t = time.perf_counter()
            lib.dcc_dot_probe(iters, bits, 1)
            if time.perf_counter() - t > seconds / 4 or iters >= 1 << 30:
                break
            iters *= 4
        best = 0.0
        for _ in range(tries):
            t = time.perf_counter()
            macs = lib.dcc_dot_probe(iters, bits, 1)
            best = max(best, 2 * macs / (time.perf_counter() - t) / 1e9)
        out[str(bits)] = best
    return out


def kv_bytes(manifest: dict, context: int) -> int:
    """Bytes of KV cache a decode step at `context` tokens reads: keys and values of every layer, up to its ring."""
    kv = manifest["kv_cache"]
    rows = kv.get("rows") or [0] * kv["layers"]
    width = kv["kv_heads"] * kv["head_dim"] * {"float32": 4, "float16": 2}.get(kv.get("dtype", "float32"), 4)
    return 2 * sum(min(r or context, context) for r in rows) * width


def roofline(engine, profile: dict, before: dict, after: dict, context: int) -> dict:
    """The decode step of `profile` (runtime/bench.py profile_decode) against the bandwidth probes around it."""
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
    entries = engine.manifest["kernels"]["entries"]
    peak = before.get("dot_gops") or {}
    for k in kernels:
        k["roofline_share"] = k["gb_s"] / bw if bw else 0.0
        work = entries.get(k["kernel"], {})
        if "macs_per_row" in work:  # a matmul: operations per weight byte and per second, against the dot probe
            ops = 2 * work["macs_per_row"] * k["launches_per_token"]  # a decode step: one row per launch
            per = k.get("weight_bytes_per_token", 0.0)
            k["ops_per_byte"] = ops / per if per else 0.0
            k["gops"] = ops / (k["ms_per_token"] / 1e3) / 1e9 if k["ms_per_token"] else 0.0
            roof = peak.get(str(work.get("activation_bits", 0)))
            if roof:
                k["compute_share"] = k["gops"] / roof
    achieved = (weights + kv) / step_s / 1e9
    return {"bandwidth_before": before, "bandwidth_after": after, "context": context, "weight_bytes_per_step": weights,
            "kv_bytes_per_step": kv, "step_ms": profile["wall_ms_per_token"], "achieved_gb_s": achieved,
            "roofline_fraction": achieved / bw if bw else 0.0,
            "roofline_tok_s": bw * 1e9 / (weights + kv) if weights + kv else 0.0,
            **({"balance_ops_per_byte": {b: g / bw for b, g in peak.items()}} if peak and bw else {})}


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
            f"(its limit: {r['roofline_tok_s']:.0f} tok/s)"] + compute_lines(r)


def compute_lines(r: dict) -> list[str]:
    peak, balance = r["bandwidth_before"].get("dot_gops"), r.get("balance_ops_per_byte")
    if not peak or not balance:
        return []
    return [f"integer dot peak (all threads): {peak['8']:.0f} Gop/s with 8-bit activations, {peak['16']:.0f} with "
            f"16-bit; against the lower read probe that is {balance['8']:.1f} / {balance['16']:.1f} operations per "
            f"weight byte: a matmul that does more per byte than that is bound by arithmetic, not by memory"]


COLUMNS = ("weight MB / launch", "GB/s", "of roofline", "ops / byte", "Gop/s", "of dot peak")


def kernel_cells(k: dict) -> tuple[str, ...]:
    """A profiled kernel's cells under COLUMNS (the arithmetic ones empty for a kernel that is not a matmul)."""
    cells = (f"{k['weight_mb_per_launch']:.2f}", f"{k['gb_s']:.1f}", f"{100 * k['roofline_share']:.0f}%")
    if "ops_per_byte" not in k:
        return cells + ("", "", "")
    share = f"{100 * k['compute_share']:.0f}%" if "compute_share" in k else ""
    return cells + (f"{k['ops_per_byte']:.1f}", f"{k['gops']:.1f}", share)

