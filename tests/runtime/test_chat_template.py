"""Chat templates under limits (runtime/chat_template.py): real templates render exactly as transformers'
apply_chat_template, and each limit stops what it is meant to stop, in-process and in bounded time.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from deploycc.runtime.chat_template import LimitedEnvironment, TemplateLimits
from deploycc.runtime.tokenizer import Tokenizer, TokenizerError

from .test_tokenizer import hf_tokenizer, write_tiny_tokenizer

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
          "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
         "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
         "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
         "{{ '<|im_start|>assistant\n' }}{% endif %}")
# Llama 3.1 Instruct's template (tools, strftime_now, tojson(indent=4), slices of messages)
LLAMA31 = Path(__file__).with_name("llama31_template.jinja").read_text()
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Hi 🙂"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Crème brûlée <b>&</b>?"}],
]
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def tokenizer(tmp_path, template: str, limits: TemplateLimits | None = None) -> Tokenizer:
    return Tokenizer.from_dir(write_tiny_tokenizer(tmp_path, chat_template=template), limits=limits)


# ---- real templates: exactly transformers' rendering ------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama3", "qwen2", "llama31", "llama31-tools", "smollm2"])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "multi"])
@pytest.mark.parametrize("gen", [True, False])
def test_real_templates_match_transformers(request, tmp_path, name, conversation, gen):
    if name == "smollm2":
        template = (Path(request.getfixturevalue("smollm2_path")) / "chat_template.jinja").read_text()
    else:
        template = {"llama3": LLAMA3, "qwen2": QWEN2}.get(name, LLAMA31)
    extra = {"date_string": "26 Jul 2024"}
    if name == "llama31-tools":
        extra["tools"] = TOOLS
    path = write_tiny_tokenizer(tmp_path, chat_template=template)
    ours = Tokenizer.from_dir(path).apply_chat_template(conversation, add_generation_prompt=gen, **extra)
    theirs = hf_tokenizer(path).apply_chat_template(conversation, add_generation_prompt=gen, tokenize=False, **extra)
    assert ours == theirs


def test_loops_keep_their_semantics(tmp_path):
    """The loop wrapper keeps loop.length / loop.last / revindex on iterators, for-else, loop filters, recursion."""
    template = ("{% for m in messages | selectattr('role', 'equalto', 'user') %}{{ loop.index }}/{{ loop.length }}"
                "{{ '!' if loop.last }} {% endfor %}|{% for x in [] %}no{% else %}empty{% endfor %}|"
                "{% for i in range(6) if i is odd %}{{ i }}{{ loop.revindex }}{% endfor %}|"
                "{% for t in [1, [2, [3]], 4] recursive %}{% if t is iterable %}({{ loop(t) }}){% else %}{{ t }}"
                "{% endif %}{% endfor %}|{{ 'ab' * 3 }}{{ 'a' ~ 1 }}{{ '%s-%d' % ('x', 2) }}{{ '{:>4}'.format(7) }}"
                "{{ 'x' | center(5) }}{{ [1, 2] * 2 }}{{ 2 ** 10 }}{{ range(3) | list }}{{ 'a,b'.split(',') | join('+') }}"
                "{{ '%d' % 1700000000 }}{{ 'call {} or 5551234567'.format(1700000000) }}{{ '%s' | format(12345678) }}")
    path = write_tiny_tokenizer(tmp_path, chat_template=template)
    ours = Tokenizer.from_dir(path).apply_chat_template(CONVERSATIONS[1])
    assert ours == hf_tokenizer(path).apply_chat_template(CONVERSATIONS[1], tokenize=False)
    assert ours.startswith("1/2 2/2! |empty|")


# ---- the limits ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("template, fragment", [
    ("{% for i in range(20000) %}{% endfor %}", "range() of 20000 items is over the limit of 10000"),
    ("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{% endfor %}{% endfor %}"
     "{% endfor %}", "loop iterations and calls"),
    ("{% for c in 'x' * 999999 %}{% for d in 'y' * 999999 %}{% endfor %}{% endfor %}", "loop iterations and calls"),
    ("{{ 'a' * 400000000 }}", "'*' would build a value"),
    ("{{ ['a'] * 400000000 }}", "'*' would build a value"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "'+'"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "'~'"),
    ("{{ 10 ** 100000000 }}", "'**' would build a value"),
    ("{{ '%999999999s' % 'a' }}", "'%' would build"),
    ("{{ '{:>999999999}'.format('a') }}", "str.format would build"),
    ("{{ ('{:{}}' * 100).format(*(['a', 999999] * 100)) }}", "str.format would build"),
    ("{{ ('%*d' * 100) % ([999999, 1] * 100) }}", "'%' would build"),
    ("{{ '%.9999999f' % 1.5 }}", "'%' would build"),
    ("{{ 'a' | center(400000000) }}", "the filter center with 400000000 is over the limit"),
    ("{{ 'a'.ljust(400000000) }}", "calling ljust with 400000000"),
    ("{{ (5).to_bytes(400000000, 'big') }}", "calling to_bytes with 400000000"),
    ("{{ [1] | slice(400000000) | list }}", "the filter slice with 400000000"),
    ("{% set x = 'a' * 900000 %}{{ x | replace('a', x) }}", "the filter replace would build"),
    ("{% set x = 'a' * 900000 %}{{ x.replace('a', 'aaaa') }}", "str.replace would build"),
    ("{% set l = ['a' * 500000, 'b' * 500000] %}{{ l | join(l[0]) }}", "the filter join would build"),
    ("{{ (range(9000) | list) | tojson(indent=200) }}", "the filter tojson would build"),
    ("{{ 7 | tojson(indent=2147483648) }}", "the filter tojson with 2147483648 is over the limit"),
    ("{{ ('\\n' * 9000) | indent(200) }}", "the filter indent would build"),
    ("{{ ('a ' * 9000) | wordwrap(1, wrapstring='x' * 200) }}", "the filter wordwrap would build"),
    ("{{ lipsum(9999, min=100, max=100) }}", "lipsum would build"),
    ("{% for i in range(5000) %}{{ 'x' * 1000 }}{% endfor %}", "its output passed the limit of 1000000 characters"),
    ("{% macro m() %}{% for i in range(9000) %}{{ 'y' * 999 }}{% endfor %}{% endmacro %}{{ m() }}",
     "would build a value of more than 1000000"),
    ("{% macro m() %}{% for i in range(900) %}{{ 'y' * 999 }}{% endfor %}{% endmacro %}"
     "{% for i in range(100) %}{% set x = m() %}{% endfor %}", "built more than 32000000 characters in all"),
    ("{% set x %}{% for i in range(900) %}{{ 'z' * 999 }}{% endfor %}{% endset %}"
     "{% for i in range(100) %}{% set y %}{{ x }}{% endset %}{% endfor %}", "built more than 32000000 characters in all"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
])
def test_limit_stops_a_runaway_template(tmp_path, template, fragment):
    tok = tokenizer(tmp_path, template)
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError, match="chat template error") as e:
        tok.apply_chat_template(CONVERSATIONS[0])
    assert fragment in str(e.value) and "\n" not in str(e.value)
    assert time.perf_counter() - t0 < TemplateLimits().max_seconds + 2


def test_the_clock_stops_a_loop_in_process(tmp_path):
    """With the step limit out of the way, the wall-clock limit stops nested loops (checked at every step)."""
    limits = TemplateLimits(max_seconds=0.3, max_steps=10**12)
    tok = tokenizer(tmp_path, "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", limits)
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError, match=r"ran for more than 0.3 s"):
        tok.apply_chat_template(CONVERSATIONS[0])
    assert time.perf_counter() - t0 < 2
    exponential = tokenizer(tmp_path / "m", "{% macro r(n) %}{% if n %}{{ r(n - 1) }}{{ r(n - 1) }}{% endif %}"
                                            "{% endmacro %}{{ r(40) }}", limits)
    with pytest.raises(TokenizerError, match=r"ran for more than 0.3 s"):
        exponential.apply_chat_template(CONVERSATIONS[0])


def test_each_render_has_its_own_budget(tmp_path):
    """Renders under the limits one after another do not add up (a long chat renders every turn)."""
    limits = TemplateLimits(max_steps=200)
    tok = tokenizer(tmp_path, "{% for i in range(150) %}.{% endfor %}", limits)
    for _ in range(5):
        assert tok.apply_chat_template(CONVERSATIONS[0]) == "." * 150


@pytest.mark.parametrize("template, fragment", [
    ("{{ raise_exception('no system role here') }}", "chat template error: no system role here"),
    ("{{ messages[0].content.nothing.more }}", "chat template error:"),
    ("{{ 1 + messages }}", "TypeError"),
    ("{{ messages[7] }}{{ messages[7].role.x }}", "chat template error:"),
    ("{% break %}", "does not compile: SyntaxError"),
    ("{% for m in messages %}", "does not parse"),
    ("{% include 'other.jinja' %}", "chat template error:"),
    ("{{ ''.__class__.__mro__ }}", "chat template error:"),
    ("{{ ((((((((((((((((((((((((((((((((((((((((((((((((((1" + ")" * 50 + " }}" * 1, None),
])
def test_template_failures_are_one_line(tmp_path, template, fragment):
    tok = tokenizer(tmp_path, template)
    if fragment is None:  # deep but legal nesting renders
        assert tok.apply_chat_template(CONVERSATIONS[0]) == "1"
        return
    with pytest.raises(TokenizerError) as e:
        tok.apply_chat_template(CONVERSATIONS[0])
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_constant_folding_is_limited_too():
    """jinja evaluates constant filters while compiling: the limits apply there as well (no 400 MB string)."""
    env = LimitedEnvironment()
    t0 = time.perf_counter()
    template = env.from_string("{{ 'a' | center(400000000) }}")  # folding refused: left to run time
    with pytest.raises(Exception, match="over the limit"):
        env.render(template, {})
    assert time.perf_counter() - t0 < 1
