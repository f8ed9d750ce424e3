"""A long-lived worker for tests/fuzz/test_fuzz_package.py: reads one package path per line on stdin, loads
it, runs a prefill of a few tokens and two decode steps on the package's device, and answers with one JSON
line: {"kind": "ran", "logits": sha256 of the logits rounded to 1e-4} | {"kind": "error", "type", "message"}
(one of the runtime's user errors) | {"kind": "other", "type", "message"} (any other exception: a bug).
A native crash ends the process; the parent sees EOF and the signal, and starts another worker."""
from __future__ import annotations

import hashlib
import json
import sys
import traceback

import numpy as np

from deploycc.runtime.cli import USER_ERRORS
from deploycc.runtime.engine import Engine

PROMPT = [5, 17, 3, 42, 8, 1, 99]


def run(path: str) -> dict:
    try:
        engine = Engine.load(path)
        logits = [engine.prefill(PROMPT)]
        for _ in range(2):
            logits.append(engine.decode(int(np.argmax(logits[-1]))))
    except USER_ERRORS as e:
        return {"kind": "error", "type": type(e).__name__, "message": str(e)[:300]}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the test
        tail = traceback.format_exc().strip().splitlines()[-3:]
        return {"kind": "other", "type": type(e).__name__, "message": " | ".join(tail)[:600]}
    digest = hashlib.sha256(np.round(np.concatenate(logits).astype(np.float64), 4).tobytes()).hexdigest()
    return {"kind": "ran", "logits": digest}


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(run(line.strip())), flush=True)


if __name__ == "__main__":
    main()
