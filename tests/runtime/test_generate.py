"""The generation loop on a real (tiny, random) Llama checkpoint, checked against transformers' generate.

The checkpoint is made here with transformers: a LlamaConfig whose vocabulary is the tiny byte-level
tokenizer's, weights drawn with a large spread so that greedy choices are far from ties.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_module

import deploycc
from deploycc.runtime.generate import ContextWindowError, encode_prompt, generate
from deploycc.runtime.tokenizer import Tokenizer

from .test_tokenizer import write_tiny_tokenizer

torch = require_module("torch")
transformers = require_module("transformers")

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
PROMPT = "The quick brown fox jumps over the lazy dog. Crème brûlée 🙂"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = write_tiny_tokenizer(tmp_path_factory.mktemp("tiny-llama"))
    vocab = Tokenizer.from_dir(path).vocab_size
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                                   initializer_range=0.5)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_model(checkpoint):
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def model(checkpoint):
    return deploycc.load_model(str(checkpoint))


@pytest.fixture(scope="module")
def session(model):
    return deploycc.reference_session(model)


@pytest.fixture(scope="module")
def tok(checkpoint):
    return Tokenizer.from_dir(checkpoint)


def hf_generate(hf_model, ids, max_new_tokens, eos=2, **kwargs) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0,
                                **kwargs)
    return out[0, len(ids):].tolist()


def run(session, tok, prompt, **kwargs) -> tuple[str, dict]:
    stats = {}
    text = "".join(generate(session, tok, prompt, stats=stats, **kwargs))
    return text, stats


@pytest.mark.parametrize("chat", [True, False])
def test_greedy_matches_transformers(session, tok, hf_model, checkpoint, chat):
    text, stats = run(session, tok, PROMPT, max_tokens=20, chat=chat)
    ids = encode_prompt(tok, PROMPT, chat)
    if chat:  # the templated prompt encodes as transformers encodes it
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
        templated = hf_tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                               tokenize=False)
        assert ids == hf_tok(templated, add_special_tokens=False)["input_ids"]
        assert ids[:1] == [tok.token_to_id("<|im_start|>")]
    assert stats["prompt_tokens"] == len(ids)
    assert len(stats["generated"]) == 20 and stats["finish_reason"] == "length"
    assert stats["generated"] == hf_generate(hf_model, ids, 20)
    assert text == tok.decode([t for t in stats["generated"] if t not in tok.eos_token_ids], skip_special_tokens=True)


def test_repetition_penalty_matches_transformers(session, tok, hf_model):
    _, stats = run(session, tok, PROMPT, max_tokens=20, repetition_penalty=1.5)
    ids = encode_prompt(tok, PROMPT)
    assert stats["generated"] == hf_generate(hf_model, ids, 20, repetition_penalty=1.5)
    assert stats["generated"] != run(session, tok, PROMPT, max_tokens=20)[1]["generated"]


def test_messages_and_stats(session, tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    pieces = list(generate(session, tok, msgs, max_tokens=6, stats=(stats := {})))
    assert stats["prompt_tokens"] == len(tok.encode(tok.apply_chat_template(msgs), add_special_tokens=False))
    assert len(stats["generated"]) == 6 and stats["finish_reason"] == "length"
    assert all(pieces) and all(isinstance(p, str) for p in pieces)
    for key in ("prefill_seconds", "decode_seconds", "prefill_tok_s", "decode_tok_s"):
        assert stats[key] > 0, key


def test_eos_ends_generation(session, tok, hf_model, checkpoint):
    greedy = run(session, tok, PROMPT, max_tokens=12)[1]["generated"]
    eos = greedy[5]
    stopper = Tokenizer(tok.backend, tok.config, tok.chat_template, eos_token_ids=[eos])
    text, stats = run(session, stopper, PROMPT, max_tokens=12)
    assert stats["generated"] == greedy[:greedy.index(eos) + 1]
    assert stats["finish_reason"] == "eos"
    assert stats["generated"] == hf_generate(hf_model, encode_prompt(tok, PROMPT), 12, eos=[eos, 2])
    assert text == tok.decode(greedy[:greedy.index(eos)], skip_special_tokens=True)


def test_closing_early_fills_stats(session, tok):
    stats = {}
    it = generate(session, tok, PROMPT, max_tokens=20, stats=stats)
    next(it)
    it.close()
    assert stats["finish_reason"] == "cancelled" and 1 <= len(stats["generated"]) < 20


def test_stop_strings(session, tok):
    pieces = list(generate(session, tok, PROMPT, max_tokens=24))
    full = "".join(pieces)
    # A stop string spanning two streamed pieces: its first part must be held back, not yielded.
    k = next(i for i in range(1, len(pieces) - 1) if pieces[i].strip() and pieces[i + 1].strip())
    stop = pieces[k][-1] + pieces[k + 1][:2]
    text, stats = run(session, tok, PROMPT, max_tokens=24, stop=["never-appears", stop])
    assert text == full[:full.index(stop)]
    assert stats["finish_reason"] == "stop"
    assert len(stats["generated"]) < 24
    assert "".join(generate(session, tok, PROMPT, max_tokens=24, stop=stop)) == text  # a single string works too


def test_sampling_reproducible(session, tok):
    kw = dict(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50)
    text, stats = run(session, tok, PROMPT, seed=1, **kw)
    again, stats2 = run(session, tok, PROMPT, seed=1, **kw)
    assert (text, stats["generated"]) == (again, stats2["generated"])
    assert stats["generated"] != run(session, tok, PROMPT, seed=2, **kw)[1]["generated"]


def test_context_window_fills_up(model, tok):
    small = deploycc.reference_session(model, context_window=16)
    ids = encode_prompt(tok, "Hello world", chat=False)
    assert len(ids) < 15
    _, stats = run(small, tok, "Hello world", chat=False, max_tokens=100)
    assert len(stats["generated"]) == 16 - len(ids)
    assert stats["finish_reason"] == "context"


def test_context_window_error(model, tok):
    small = deploycc.reference_session(model, context_window=16)
    with pytest.raises(ContextWindowError) as e:
        list(generate(small, tok, PROMPT * 3, max_tokens=8))
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and "\n" not in msg
    n = len(encode_prompt(tok, PROMPT * 3))
    assert f"prompt is {n} tokens" in msg and "context window is 16" in msg and "shorten the prompt" in msg


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
    (dict(stop=[""]), "stop must be a string or a list of non-empty strings"),
    (dict(temperature=-1), "temperature must be"),
])
def test_bad_arguments(session, tok, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(session, tok, PROMPT, **kwargs)


def test_messages_need_a_chat_template(session, tmp_path):
    plain = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path, chat_template=None))
    assert encode_prompt(plain, "Hello") == plain.encode("Hello")  # a string falls back to plain text
    with pytest.raises(ValueError, match="no chat template"):
        generate(session, plain, [{"role": "user", "content": "Hello"}])


# ---- the runtime is self-contained ---------------------------------------------------------------

def test_runtime_imports_nothing_from_the_compiler():
    bad = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = re.match(r"\s*(?:from|import)\s+(deploycc[\w.]*)", line)
            if m and not (m.group(1) + ".").startswith("deploycc.runtime."):
                bad.append(f"{path.name}:{n}: {line.strip()}")
            if path.parent == RUNTIME and re.match(r"\s*from\s+\.\.", line):
                bad.append(f"{path.name}:{n}: {line.strip()}")
    assert not bad, "runtime must not import the compiler:\n" + "\n".join(bad)


def test_runtime_copy_works_alone(tmp_path, checkpoint):
    """A package carries a copy of runtime/; it must import and tokenize without deploycc."""
    import shutil

    shutil.copytree(RUNTIME, tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; from runtime.tokenizer import Tokenizer; import runtime.generate, runtime.sampler; "
            f"t = Tokenizer.from_dir({str(checkpoint)!r}); assert t.decode(t.encode('hi 🙂')) == 'hi 🙂'; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'deploycc'], 'deploycc was imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
