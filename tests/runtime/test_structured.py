"""Structured output (runtime/grammar.py, llguidance): every token of a reply one the grammar allows.

The tiny llama (random weights) with a byte-level BPE tokenizer trained on JSON text, compiled for the cpu target:
sampled at temperature 1 it writes noise, so a reply that parses and validates against its schema is the grammar's
doing (the same requests without the grammar are checked not to be JSON). Through the Python Engine API, the
package's own `run --json-schema/--grammar`, and the real server driven by the official `openai` client:
`response_format` json_schema (whole, streamed, and `chat.completions.parse` with a pydantic model), json_object,
and the refusals (a schema the engine cannot compile, a malformed response_format) as one-line 400s / errors.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import require_cc, require_module
from serving import free_port, start
from test_package_cli import CHATML, assert_one_line_error, run_package

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


def json_tokenizer_model(dst: Path) -> Path:
    """The tiny llama with a byte-level BPE tokenizer whose alphabet holds JSON's characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    src = make_tiny("llama-gqa1")
    vocab_size = json.loads((src / "config.json").read_text())["vocab_size"]
    shutil.copytree(src, dst)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() == vocab_size
    tok.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML}, indent=1))
    return dst


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    require_cc()
    from deploycc.package import compile_model

    root = tmp_path_factory.mktemp("structured")
    return compile_model(str(json_tokenizer_model(root / "model")), "cpu", out=str(root / "pkg"))


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
    proc = start([sys.executable, str(package), "serve", "--port", str(port), "--model-name", "tiny"], port)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
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
