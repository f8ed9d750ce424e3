"""SmolLM2-135M-Instruct compiled with q0f32 into packages for cpu-opencl (PoCL) and cpu-webgpu
(lavapipe): the Engine greedily generates the same 24 tokens as transformers for the three chat
prompts (cpu-webgpu: the first prompt's first 10 tokens in CI, since lavapipe runs about 1 token/s on two cores;
all three prompts' 24 were checked by hand, and DEPLOYCC_FULL_WEBGPU=1 runs them), and the chat answer to the
France question names Paris."""
from __future__ import annotations

import os

import pytest
from conftest import require_device, require_module

from deploycc.package import compile_model
from deploycc.runtime.engine import Engine
from deploycc.runtime.generate import encode_prompt

pytestmark = pytest.mark.model

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three primary colors."]
NEW_TOKENS = 24
WEBGPU_TOKENS = 10  # "The capital of France is Paris." and more: within 10 tokens


@pytest.fixture(scope="module")
def reference(smollm2_path):
    """transformers' greedy continuation of each templated prompt."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    from deploycc.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(smollm2_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    out = {}
    for p in PROMPTS:
        ids = encode_prompt(tok, p)
        with torch.no_grad():
            gen = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=NEW_TOKENS, do_sample=False)
        out[p] = gen[0, len(ids):].tolist()
    return out


@pytest.fixture(scope="module", params=["cpu-opencl", "cpu-webgpu"])
def engine(request, smollm2_path, tmp_path_factory):
    require_device(request.param.split("-")[1])
    out = compile_model(smollm2_path, request.param, out=str(tmp_path_factory.mktemp("pkg") / "smollm2"),
                        context_window=512)
    return request.param, Engine.load(out)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_package_generates_like_transformers(engine, reference, prompt):
    preset, eng = engine
    tokens = NEW_TOKENS
    if preset == "cpu-webgpu" and not os.environ.get("DEPLOYCC_FULL_WEBGPU"):
        if prompt != PROMPTS[0]:
            pytest.skip("lavapipe is slow: one prompt in CI (DEPLOYCC_FULL_WEBGPU=1 runs all)")
        tokens = WEBGPU_TOKENS
    stats: dict = {}
    text = "".join(eng.generate(prompt, max_tokens=tokens, stats=stats))
    assert stats["generated"] == reference[prompt][:tokens], f"{preset}: {text!r}"
    if "France" in prompt:
        assert "Paris" in text
    print(f"{preset}: {prompt!r} -> {text!r} (prefill {stats['prefill_tok_s']:.1f} tok/s, "
          f"decode {stats['decode_tok_s']:.2f} tok/s)")
