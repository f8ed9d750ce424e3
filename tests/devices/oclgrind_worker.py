"""Run a package's OpenCL kernels for tests/devices/test_oclgrind.py, under `oclgrind`, which puts its simulator
in place of the OpenCL library (so the only platform is Oclgrind): PKG SOURCE -> one JSON line with the
device's name and the largest |logit difference| from deploycc's numpy reference of SOURCE.

One prompt of prefill_chunk + 2 tokens (a full chunk, then a partial one after it) and a greedy decode
step: each kernel runs at least once with seq_len = prefill_chunk, with a seq_len below it on a non-empty
cache, and for one token. With --step, also a batched step over the page pool: two sequences of 3 and 2
tokens (the paged attention and the pool's row copies), each sequence's logits against the reference's
prefill of its tokens. Oclgrind interprets every work-item (a tiled matmul of the tiny models takes about a
second with race detection), so this is all it runs."""
from __future__ import annotations

import json
import sys

import numpy as np

from deploycc.hub import load_model
from deploycc.runtime.engine import Engine
from deploycc.session import reference_session


def main(package: str, source: str, *options: str) -> None:
    engine = Engine.load(package)
    m = engine.manifest
    head = m.get("head_quantization", m["quantization"])
    ref = reference_session(load_model(source), context_window=engine.context_window, quantization=m["quantization"],
                            head_quantization=None if head == m["quantization"] else head,
                            kv_cache=m["kv_cache"]["dtype"])  # adreno's float16 cache: the reference rounds alike
    ids = np.random.default_rng(0).integers(0, engine.vocab_size, engine.prefill_chunk + 2).tolist()
    got, want = [engine.prefill(ids)], [ref.prefill(ids)]
    token = int(np.argmax(want[-1]))
    got.append(engine.decode(token))
    want.append(ref.decode(token))
    if "--step" in options:
        paged = Engine.load(package, paged=True)
        size = paged.manifest["kv_cache"]["pool"]["page_size"]
        seqs, tables, free = [ids[:3], ids[3:5]], [], iter(range(paged.manifest["kv_cache"]["pool"]["pages"]))
        for s in seqs:
            tables.append([next(free) for _ in range(-(-len(s) // size))])
        got.extend(paged.step(seqs[0] + seqs[1], tables, [0, 0], [len(s) for s in seqs]))
        for s in seqs:
            ref.reset()
            want.append(ref.prefill(s))
    diff = max(float(np.max(np.abs(np.asarray(g, np.float64) - w))) for g, w in zip(got, want))
    print(json.dumps({"device": engine.device.name, "max_abs_diff": diff, "kv_cache": m["kv_cache"]["dtype"],
                      "largest_logit": max(float(np.max(np.abs(w))) for w in want)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
