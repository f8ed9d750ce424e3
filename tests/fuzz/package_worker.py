"""A long-lived worker for tests/fuzz/test_fuzz_package.py: reads one package path per line on stdin, loads
it, runs a prefill of a few tokens and two decode steps on the package's device, and answers with one JSON
line: {"kind": "ran", "logits": sha256 of the logits rounded to 1e-4} | {"kind": "error", "type", "message"}
(one of the runtime's user errors) | {"kind": "other", "type", "message"} (any other exception: a bug).
A native crash ends the process; the parent sees EOF and the signal, and starts another worker.

With --native (the cpu target's fuzzer) it also fills the context window (a prompt of context_window - 1 tokens,
at most LONGEST, then one decode step) and, where the package has a page pool, runs a batched step of two
sequences; and every buffer of the cpu device ends at an inaccessible page (an electric fence), so a step
that reads or writes past a weight, a storage, the KV cache or the ids dies of SIGSEGV here instead of
silently touching the next allocation."""
from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import sys
import traceback

import numpy as np

from deploycc.runtime.cli import USER_ERRORS
from deploycc.runtime.engine import Engine

PROMPT = [5, 17, 3, 42, 8, 1, 99]
LONGEST = 2048  # tokens of the window-filling prompt (a mutated context window may be large)


def fenced_zeros(nbytes: int) -> np.ndarray:
    """`nbytes` zero bytes, 64-byte aligned, that end (but for the alignment's slack) where a PROT_NONE page
    begins: runtime/devices/cpu.py's aligned_zeros with a guard page after the buffer."""
    page = mmap.PAGESIZE
    size = -(-max(nbytes, 1) // 64) * 64
    pages = -(-size // page)
    region = mmap.mmap(-1, (pages + 1) * page)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))  # the export keeps the mapping alive
    if ctypes.CDLL(None, use_errno=True).mprotect(ctypes.c_void_p(address + pages * page), page, 0) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    end = pages * page
    return np.frombuffer(region, np.uint8)[end - size:end - size + nbytes]


def run_native(engine, logits: list) -> None:
    """The window filled up to its last position, then a batched step where the package has one."""
    engine.reset()
    n = min(engine.context_window - 1, LONGEST)
    if n > 0:
        logits.append(engine.prefill([(7 * i + 3) % engine.vocab_size for i in range(n)]))
        logits.append(engine.decode(int(np.argmax(logits[-1]))))
    if "pool" in engine.manifest["kv_cache"]:
        paged = Engine.load(engine.path, paged=True)
        pool = paged.manifest["kv_cache"]["pool"]
        free, counts, tables = list(range(pool["pages"])), [], []
        for want in (3, 1):  # two sequences of 3 and 1 tokens where the bounds and the pool allow
            n = min(want, paged.prefill_chunk - sum(counts), paged.context_window)
            need = -(-n // pool["page_size"]) if n > 0 else 0
            if n < 1 or len(counts) == pool["sequences"] or need > len(free):
                break
            counts.append(n)
            tables.append([free.pop(0) for _ in range(need)])
        ids = [(5 * i + 1) % paged.vocab_size for i in range(sum(counts))]
        logits.append(paged.step(ids, tables, [0] * len(counts), counts).reshape(-1))


def run(path: str, native: bool) -> dict:
    try:
        engine = Engine.load(path)
        logits = [engine.prefill(PROMPT)]
        for _ in range(2):
            logits.append(engine.decode(int(np.argmax(logits[-1]))))
        if native:
            run_native(engine, logits)
    except USER_ERRORS as e:
        return {"kind": "error", "type": type(e).__name__, "message": str(e)[:300]}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the test
        tail = traceback.format_exc().strip().splitlines()[-3:]
        return {"kind": "other", "type": type(e).__name__, "message": " | ".join(tail)[:600]}
    digest = hashlib.sha256(np.round(np.concatenate(logits).astype(np.float64), 4).tobytes()).hexdigest()
    return {"kind": "ran", "logits": digest}


def main() -> None:
    native = "--native" in sys.argv[1:]
    if native:
        from deploycc.runtime.devices import cpu

        cpu.aligned_zeros = fenced_zeros
    for line in sys.stdin:
        print(json.dumps(run(line.strip(), native)), flush=True)


if __name__ == "__main__":
    main()
