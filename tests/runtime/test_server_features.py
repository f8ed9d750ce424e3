"""What applications need from the server (issue 36), on the real server with the official `openai` client.

Structured output (runtime/grammar.py, llguidance): every token of a reply one the grammar allows.

The tiny llama (random weights) with a byte-level BPE tokenizer trained on JSON text, compiled for the cpu target:
sampled at temperature 1 it writes noise, so a reply that parses and validates against its schema is the grammar's
doing (the same requests without the grammar are checked not to be JSON). Through the Python Engine API, the
package's own `run --json-schema/--grammar`, and the real server driven by the official `openai` client:
`response_format` json_schema (whole, streamed, and `chat.completions.parse` with a pydantic model), json_object,
and the refusals (a schema the engine cannot compile, a malformed response_format) as one-line 400s / errors.

Log probabilities: greedy picks the top entry, the listed probabilities sum to at most 1, the first token's equals
the log-softmax of the package engine's own prefill logits, a stream's entries are the whole reply's, the
completions form lines up with the text; usage leaves the end-of-sequence token out. n > 1: each choice is the
reply of a request with seed + index, the choices after the first share the prompt's pages (the prefix-cache
counter of /metrics grows by their full pages), streamed choices carry their index, usage sums them.
"""
from __future__ import annotations

import json
import re
import sys
import time

import pytest
from conftest import require_cc, require_module
from serving import free_port, metric, start
from test_package_cli import assert_one_line_error, run_package, with_tokenizer

from fixtures import make_tiny

openai = require_module("openai")
jsonschema = require_module("jsonschema")
pydantic = require_module("pydantic")
require_module("llguidance")

SCHEMA = {"type": "object",
          "properties": {"answer": {"enum": ["yes", "no"]}, "count": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3}},
          "required": ["answer", "count", "tags"], "additionalProperties": False}
CORPUS = ['{"answer": "yes", "count": 12, "tags": ["red", "blue"]}\n', '{"answer": "no", "count": 7, "tags": []}\n',
          "What is the capital of France? Paris is the capital of France.\n",
          "system user assistant: you are a tiny test model. Be brief. 0123456789\n"] * 8
GBNF = 'root ::= "colour: " ("red" | "green" | "blue") "."\n'


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    require_cc()
    from deploycc.package import compile_model

    root = tmp_path_factory.mktemp("structured")
    model = with_tokenizer(make_tiny("llama-gqa1"), root / "model", CORPUS)  # an alphabet with JSON's characters
    # a context of 4096 (the weights do not depend on it): room for a reply that lasts seconds (the gauges' test)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return compile_model(str(model), "cpu", out=str(root / "pkg"), context_window=4096)


@pytest.fixture(scope="module")
def engine(package):
    from deploycc.runtime.engine import Engine

    return Engine.load(package)


def test_engine_api_replies_validate_against_the_schema(engine):
    """Five seeds at temperature 1: each reply parses and validates, and ends at eos (the grammar complete);
    without the grammar the same seeds give no JSON document."""
    from deploycc.runtime.grammar import Grammar

    grammar = Grammar.json_schema(SCHEMA)
    for seed in range(5):
        stats: dict = {}
        text = "".join(engine.generate("hello", max_tokens=120, temperature=1.0, seed=seed, grammar=grammar,
                                       stats=stats))
        jsonschema.validate(json.loads(text), SCHEMA)
        assert stats["finish_reason"] == "eos", (text, stats["finish_reason"])
        free = "".join(engine.generate("hello", max_tokens=60, temperature=1.0, seed=seed))
        with pytest.raises(ValueError):
            jsonschema.validate(json.loads(free), SCHEMA)


def test_grammar_errors_are_one_line(engine):
    from deploycc.runtime.grammar import Grammar, GrammarError

    for bad, fragment in (({"type": "strang"}, "strang"), ([1, 2], "must be a JSON object")):
        with pytest.raises(GrammarError, match=fragment) as e:
            Grammar.json_schema(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(GrammarError, match="colour"):
        Grammar.text("root ::= colour")


def test_package_run_with_a_schema_and_a_gbnf_grammar(package, tmp_path):
    schema, grammar = tmp_path / "schema.json", tmp_path / "colour.gbnf"
    schema.write_text(json.dumps(SCHEMA))
    grammar.write_text(GBNF)
    r = run_package(package, "run", "--prompt", "hi", "--json-schema", schema, "--temperature", "1", "--seed", "3",
                    "--max-tokens", "120", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    jsonschema.validate(json.loads(json.loads(r.stdout)["text"]), SCHEMA)
    r = run_package(package, "run", "--prompt", "hi", "--grammar", grammar, "--temperature", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.fullmatch(r"colour: (red|green|blue)\.", json.loads(r.stdout)["text"])
    (tmp_path / "bad.json").write_text('{"type": "object", "properties": {"a": {"type": "strang"}}}')
    assert_one_line_error(run_package(package, "run", "--prompt", "hi", "--json-schema", tmp_path / "bad.json"),
                          "bad.json", "strang")
    assert_one_line_error(run_package(package, "run", "--prompt", "hi", "--json-schema", schema, "--grammar", grammar),
                          "not both")


@pytest.fixture(scope="module")
def client(package):
    port = free_port()
    proc = start([sys.executable, str(package), "serve", "--port", str(port), "--model-name", "tiny",
                  "--max-num-sequences", "4"], port)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    client.url = f"http://127.0.0.1:{port}"
    yield client
    proc.terminate()
    proc.wait(timeout=30)


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def test_server_json_schema_whole_and_streamed(client):
    messages = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
    for seed in (1, 2):
        r = client.chat.completions.create(model="tiny", messages=messages, temperature=1.0, seed=seed,
                                           max_tokens=120, response_format=response_format(SCHEMA))
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        stream = client.chat.completions.create(model="tiny", messages=messages, temperature=1.0, seed=seed,
                                                max_tokens=120, response_format=response_format(SCHEMA), stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == r.choices[0].message.content  # same seed, same constrained sampling
    r = client.completions.create(model="tiny", prompt="JSON:", temperature=1.0, seed=5, max_tokens=120,
                                  extra_body={"response_format": response_format(SCHEMA)})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


def test_server_parse_with_a_pydantic_model(client):
    from typing import Literal

    class Reply(pydantic.BaseModel):
        answer: Literal["yes", "no"]
        count: int = pydantic.Field(ge=0, le=99)  # an unbounded int: noise fills the context window with digits

    r = client.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=1.0,
                                      seed=7, max_tokens=120, response_format=Reply)
    assert isinstance(r.choices[0].message.parsed, Reply)


def test_server_json_object(client):
    """Any JSON object: the reply starts as one and, where it ends before max_tokens, is one."""
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=1.0,
                                       seed=3, max_tokens=200, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("rf,fragment", [
    (response_format({"type": "object", "properties": {"a": {"type": "strang"}}}), "strang"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "name"),
    ({"type": "xml"}, "response_format must be"),
    ({"type": "json_schema", "json_schema": {"name": "r", "schema": [1]}}, "must be a JSON object"),
])
def test_server_refuses_bad_response_formats(client, rf, fragment):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       response_format=rf)
    err = e.value.body
    assert err["param"] == "response_format" and fragment in err["message"] and "\n" not in err["message"], err


# ---- log probabilities --------------------------------------------------------------------------------------------

def test_chat_logprobs_greedy_top_entries_and_the_engine(client, engine):
    import numpy as np

    from deploycc.runtime.generate import encode_prompt, log_softmax

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12, logprobs=True,
                                       top_logprobs=5)
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens and "".join(e.token for e in content) == c.message.content
    for e in content:
        assert len(e.top_logprobs) == 5 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert sum(np.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-6 and e.bytes == list(e.token.encode())
    engine.reset()  # the first token's log probability against the single-sequence engine's prefill
    want = log_softmax(engine.prefill(encode_prompt(engine.tokenizer, messages)))
    assert content[0].logprob == pytest.approx(float(want.max()), abs=2e-3)
    stream = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12,
                                            logprobs=True, top_logprobs=5, stream=True)
    streamed = [e for ch in stream if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def test_completion_logprobs_and_usage_without_eos(client):
    r = client.completions.create(model="tiny", prompt="Paris is", temperature=0, max_tokens=10, logprobs=3)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert "".join(lp.tokens) == text and len(lp.token_logprobs) == len(lp.tokens) == r.usage.completion_tokens
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) <= 3 and max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs,
                                                                                          lp.token_logprobs))
    ended = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=120,
                                           temperature=1.0, seed=0, response_format=response_format(SCHEMA),
                                           logprobs=True)
    assert ended.choices[0].finish_reason == "stop"  # ended at eos: the eos is no completion token
    assert ended.usage.completion_tokens == len(ended.choices[0].logprobs.content)


@pytest.mark.parametrize("fields,param", [({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                                          ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 3}, "logprobs"),
                                          ({"n": 5}, "n"), ({"n": 0}, "n")])
def test_bad_logprobs_and_n_are_400(client, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body=fields)
    assert e.value.body["param"] == param and "\n" not in e.value.body["message"]


# ---- n > 1 --------------------------------------------------------------------------------------------------------

def test_n_choices_are_seeded_samples_sharing_the_prompt_pages(client):
    prompt = "system user assistant: you are a tiny test model. Be brief. What is the capital of France?"
    messages = [{"role": "user", "content": prompt}]
    before = metric(client.url, "deploycc_prefix_cache_hit_tokens_total")
    r = client.chat.completions.create(model="tiny", messages=messages, temperature=1.0, seed=11, max_tokens=16, n=3)
    shared = metric(client.url, "deploycc_prefix_cache_hit_tokens_total") - before
    assert [c.index for c in r.choices] == [0, 1, 2]
    full_pages = (r.usage.prompt_tokens - 1) // 16 * 16
    assert full_pages >= 32 and shared >= 2 * full_pages, (shared, full_pages)  # choices 1 and 2 took them
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) == 3
    for i, text in enumerate(texts):  # choice i is the reply of seed 11 + i
        one = client.chat.completions.create(model="tiny", messages=messages, temperature=1.0, seed=11 + i,
                                             max_tokens=16)
        assert one.choices[0].message.content == text
    assert r.usage.completion_tokens == sum(
        len(client.chat.completions.create(model="tiny", messages=messages, temperature=1.0, seed=11 + i, max_tokens=16,
                                           logprobs=True).choices[0].logprobs.content) for i in range(3))
    stream = client.chat.completions.create(model="tiny", messages=messages, temperature=1.0, seed=11, max_tokens=16,
                                            n=3, stream=True, stream_options={"include_usage": True})
    parts, finished, usage = {0: [], 1: [], 2: []}, set(), None
    for ch in stream:
        usage = ch.usage or usage
        for c in ch.choices:
            parts[c.index].append(c.delta.content or "")
            if c.finish_reason:
                finished.add(c.index)
    assert ["".join(parts[i]) for i in range(3)] == texts and finished == {0, 1, 2}
    assert usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens


def test_gateway_metrics_while_a_request_runs(client):
    """The names an inference gateway routes on (Gateway API Inference Extension: vLLM's), while a stream runs and
    after it ends."""
    from serving import metrics

    def gauges() -> dict:
        return {line.split()[0]: float(line.split()[1]) for line in metrics(client.url).splitlines()
                if line.startswith("vllm:")}

    require_module("llguidance")
    # 3000 letters before the reply may end (a random reply could end in its first tokens, before the gauges are
    # read; 200 letters, a few hundred milliseconds here, once ended first on a loaded machine)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3000,
                                            temperature=1.0, seed=1, stream=True,
                                            extra_body={"grammar": "start: /[a-z]{3000}/"})
    next(iter(stream))  # the first chunk (the role) may come before the batcher admits the request and takes its pages
    for _ in range(100):
        during = gauges()
        if during["vllm:kv_cache_usage_perc"] > 0:
            break
        time.sleep(0.05)
    stream.close()
    assert during["vllm:num_requests_running"] == 1 and during["vllm:num_requests_waiting"] == 0
    assert 0 < during["vllm:kv_cache_usage_perc"] == during["vllm:gpu_cache_usage_perc"] <= 1
    for _ in range(100):  # the stream's job ends at its next token
        if gauges()["vllm:num_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert gauges()["vllm:num_requests_running"] == 0


def test_echo_prompt_logprobs_equal_the_engines_prefill(client, engine):
    """lm-eval's log-likelihood request (echo, logprobs, max_tokens 0): the prompt's log probabilities, from one
    batched step with every token's logits (step_all), equal the log-softmax of the single-sequence engine's
    prefill_all; with a completion after it, whole and streamed alike."""
    from deploycc.runtime.generate import log_softmax

    prompt = "What is the capital of France? Paris is"
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    ids = engine.tokenizer.encode(prompt, add_special_tokens=True)
    assert r.choices[0].text == prompt == "".join(lp.tokens) and r.usage.prompt_tokens == len(ids) > 5
    assert r.usage.completion_tokens == 0 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    engine.reset()
    rows = engine.prefill(ids, all_logits=True)
    want = [float(log_softmax(rows[i - 1])[ids[i]]) for i in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=2e-3)
    assert all(len(top) <= 2 for top in lp.top_logprobs[1:])
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, echo=True, logprobs=1, temperature=0)
    text, lp = whole.choices[0].text, whole.choices[0].logprobs
    assert text.startswith(prompt) and "".join(lp.tokens) == text
    assert len(lp.tokens) == len(ids) + whole.usage.completion_tokens
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(want, abs=2e-3)
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, echo=True, logprobs=1, temperature=0,
                                       stream=True)
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == text
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == lp.tokens
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, echo=True, temperature=0)
    assert plain.choices[0].text.startswith(prompt) and plain.choices[0].logprobs is None
