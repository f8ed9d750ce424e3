"""The default SmolLM2 package on a real model (issue 25): what `make demo` compiles (cpu, the preset's q4f16_2 with
an 8-bit head, activation precision calibrated per linear by deploycc/calibrate.py).

- greedy (`run --temperature 0`), "What is the capital of France?" is answered with Paris (8-bit activations on
  every linear answered "L'Étoile, la Marseur, ...");
- of the first PROMPTS of benchmarks/agreement.py's 100 everyday chat prompts, the package keeps float32
  transformers' first 32 greedy tokens whole on at least AGREEMENT of them (the figure over all 100 and its spread:
  docs/quantization.md, "Activation precision");
- `verify` passes against the numpy reference that rounds each linear's input as the package records;
- `verify --kernels` passes: every kernel against its loop-level program on this CPU.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
AGREEMENT = 0.90  # measured 0.99 (8-bit activations everywhere: 0.39); greedy near-ties move it a few points
PROMPTS = 50  # half the benchmark's: 3,200 decode steps took two minutes of the suite beside the other worker


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "deploycc", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def package(smollm2_cpu_package):
    return smollm2_cpu_package  # compiled by the CLI, once per run (tests/conftest.py)


def test_greedy_answer_is_paris(package):
    r = cli("run", package, "--prompt", "What is the capital of France?", "--max-tokens", "16", "--temperature", "0",
            "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Paris" in json.loads(r.stdout)["text"]


def test_keeps_transformers_greedy_tokens(package, smollm2_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import agreement

    ids, want, eos = agreement.reference_tokens(Path(smollm2_path), PROMPTS, batched=True)
    got, _ = agreement.package_tokens(package, ids)
    kept = agreement.agreement(want, got, eos)
    print(f"agreement {kept:.0%} of {len(ids)} prompts")
    assert kept >= AGREEMENT


def test_verify_passes(package, smollm2_path):
    r = cli("verify", package, "--source", smollm2_path, "--steps", "2", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["passed"], report.get("failure")
    assert report["metric"] == "p90_rel_rms" and report["top1_agreement"] >= 0.9


def test_verify_kernels_passes(package):
    r = cli("verify", package, "--kernels", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
