"""kv.append with the programs that make its keys and values, one launch a layer (deploycc/vm/kv_fuse.py; GPU presets).

Each tiny model is compiled twice for the GPU preset, as it is and with the fusion turned off (kv_fuse.members_of
made to find nothing), and both packages run the same tokens: prompts and greedy decodes, and the batched steps over
the page pool with two sequences at once. On the CUDA emulation the single-sequence logits must be equal bit for bit
(the same float operations in another kernel; the emulation's C++ contracts no multiply-add on x86-64), on lavapipe
and a GPU within 1e-6 of the largest logit (their compilers may fuse multiply-adds differently in another kernel);
the batched steps' within 1e-5 (which sequences share a step is the threads' timing, and a step of two rows takes
other GEMVs).
The fused package launches no rope or kv_pair kernel: one kv_append launch a layer in each step, three launches a
layer fewer than the other package; in a decode step not even that, the attention making the append's work itself
(vm/kv_attend.py: four launches a layer fewer). The models: a Llama (rope on queries and keys), a Mistral whose sliding window
keeps a ring of rows, a Qwen3 whose queries and keys are normed before the rope (the values' slice moves down to join
the append: kv_fuse.sink_producers) and GPT-2 (no rope: slices with a bias).
"""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from conftest import require_cxx, require_device

from deploycc.package import compile_model
from deploycc.runtime.batch import Batcher
from deploycc.runtime.engine import Engine
from deploycc.vm import kv_fuse
from fixtures import make_tiny

CASES = [("cuda-emu", "llama-gqa3-llama3rope"), ("cuda-emu", "mistral-gqa4-window"),
         ("cuda-emu", "qwen3-gqa2-headdim-window"), ("cuda-emu", "gpt2-odd"), ("webgpu", "llama-gqa3-llama3rope"),
         ("cuda", "qwen3-gqa2-headdim-window")]  # on a GPU where there is one (skipped here, with the reason)
PRESETS = {"cuda-emu": "h100", "webgpu": "cpu-webgpu", "cuda": "h100"}
FUNCTIONS = ("prefill", "decode", "step")


def package(tmp_path_factory, model: str, preset: str, fused: bool = True):
    out = tmp_path_factory.mktemp(f"{model}-{preset}-{'on' if fused else 'off'}") / "pkg"
    with pytest.MonkeyPatch.context() as m:
        if not fused:
            m.setattr(kv_fuse, "members_of", lambda *a: None)
        return compile_model(str(make_tiny(model)), preset, "q0f32", context_window=64, out=str(out),
                             overrides=("prefill_chunk=16", "max_num_sequences=4", "kv_pool_tokens=128"))


def launched(pkg) -> dict[str, list[str]]:
    bc = json.loads((pkg / "bytecode.json").read_text())
    return {f: [i["args"][0]["k"] for i in bc["functions"][f]["instructions"] if i.get("fn") == "vm.launch"]
            for f in FUNCTIONS}


def run(pkg, prompts: list[list[int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The single-sequence engine's logits for each prompt and 6 greedy decodes; the batched steps' for both
    prompts, then 3 decodes of both at once."""
    engine = Engine.load(pkg)
    out = []
    for ids in prompts:
        engine.reset()
        out.append(engine.prefill(ids))
        for _ in range(6):
            out.append(engine.decode(int(np.argmax(out[-1]))))
    batcher = Batcher(Engine.load(pkg, paged=True))
    both: list = [None, None]
    prefilled = threading.Barrier(2)

    def one(i):  # the two prompts, then both decoding in the same steps
        s = batcher.session()
        try:
            logits = [s.prefill(prompts[i])]
            prefilled.wait(timeout=300)
            for _ in range(3):
                logits.append(s.decode(int(np.argmax(logits[-1]))))
            both[i] = logits
        finally:
            s.close()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert batcher.stats["steps"] > 0
    return out, both[0] + both[1]


@pytest.mark.parametrize("backend,model", CASES)
def test_the_append_makes_its_keys_and_values(tmp_path_factory, monkeypatch, backend, model):
    if backend == "cuda-emu":
        require_cxx()
        monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "reverse")
    else:
        require_device(backend)
    fused = package(tmp_path_factory, model, PRESETS[backend])
    plain = package(tmp_path_factory, model, PRESETS[backend], fused=False)
    layers = json.loads((fused / "manifest.json").read_text())["kv_cache"]["layers"]
    got, want = launched(fused), launched(plain)
    for f in FUNCTIONS:
        assert not [k for k in got[f] if "rope_apply" in k or k.startswith("kv_pair")], got[f]
        # a decode step's attention makes the append's work itself (vm/kv_attend.py): one launch a layer fewer
        appends = [k for k in got[f] if k.startswith("kv_append")]
        attends = [k for k in got[f] if k.startswith("attention_append") and k.endswith("_part")]
        assert (len(appends), len(attends)) == ((0, layers) if f == "decode" else (layers, 0)), got[f]
        assert len(want[f]) - len(got[f]) == (4 if f == "decode" else 3) * layers, f
        assert [k for k in want[f] if k.startswith("kv_pair")], "the package without the fusion has its kv_pair"
    if model == "mistral-gqa4-window":
        assert any(json.loads((fused / "manifest.json").read_text())["kv_cache"]["rows"]), "a ring of rows"
    vocab = Engine.load(fused).vocab_size
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(0, vocab, n)] for n in (21, 7)]
    (single, batched), (single_plain, batched_plain) = run(fused, prompts), run(plain, prompts)
    for x, y in zip(single, single_plain):
        if backend == "cuda-emu":
            np.testing.assert_array_equal(x, y)
        else:
            assert float(np.abs(x - y).max()) <= 1e-6 * max(1.0, float(np.abs(y).max()))
    for x, y in zip(batched, batched_plain):  # which sequences share a step is the threads' timing: float noise
        assert float(np.abs(x - y).max()) <= 1e-5 * max(1.0, float(np.abs(y).max()))
