"""Fuzzing the loaders with hypothesis: safetensors headers, GGUF files and config.json values.

Each loader's fuzz runs in its own subprocess (loader_worker.py), whose address space is limited to what it
holds after a warm-up plus 200 MB, with a 10 s alarm on every case: so an input that makes a loader
allocate gigabytes or loop is a failure (MemoryError, CaseTimeout), like any exception other than the
project's own error classes (DeployError; SafetensorsError from the runtime's reader). Derandomized, so
CI sees the same inputs every run; each loader takes about 10 s here.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import make_tiny

pytest.importorskip("hypothesis")
WORKER = Path(__file__).with_name("loader_worker.py")
MIN_INPUTS = 1000


def run_worker(loader: str, timeout: int = 300) -> subprocess.CompletedProcess:
    for name in ("llama-gqa1", "qwen2-gqa5-tied", "gpt2-odd"):
        make_tiny(name)  # made here, with the suite's cache, not inside the limited worker
    return subprocess.run([sys.executable, str(WORKER), loader], capture_output=True, text=True, timeout=timeout)


def summary(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-8000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("FUZZ "))
    return json.loads(line[5:])


def outcomes(s: dict, prefix: str) -> tuple[int, int]:
    o = s["outcomes"]
    return (sum(v for k, v in o.items() if k.startswith(prefix) and k.endswith(":loaded")),
            sum(v for k, v in o.items() if k.startswith(prefix) and k.endswith(":refused")))


def test_memory_limit_is_real():
    """The worker's bound fails a case that allocates 300 MB (else the fuzzers could not see a blow-up)."""
    r = run_worker("selfcheck", timeout=60)
    assert r.returncode != 0 and "MemoryError" in r.stderr, (r.returncode, r.stderr[-2000:])


def test_fuzz_safetensors_headers():
    s = summary(run_worker("safetensors"))
    assert s["inputs"] >= MIN_INPUTS, s
    # every input went through both readers and load_model; some headers were valid, most were not
    for reader in ("runtime", "hub", "load_model"):
        loaded, refused = outcomes(s, reader)
        assert loaded + refused == s["inputs"] and refused > 0, (reader, s)
    assert outcomes(s, "hub")[0] > 0 and outcomes(s, "load_model")[0] > 0, s


def test_fuzz_gguf():
    s = summary(run_worker("gguf"))
    assert s["inputs"] >= MIN_INPUTS, s
    loaded, refused = outcomes(s, "gguf")
    assert loaded > 0 and refused > 0, s


def test_fuzz_config_values():
    s = summary(run_worker("config"))
    assert s["inputs"] >= MIN_INPUTS, s
    for family in ("llama", "qwen2", "gpt2"):
        loaded, refused = outcomes(s, f"config-{family}")
        assert loaded > 0 and refused > 0, (family, s)
