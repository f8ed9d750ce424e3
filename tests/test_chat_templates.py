"""Chat templates for models whose files have none (issue 36): `compile --chat-template FILE|NAME` stores one in the
package, and a package without one says so in one line (run, chat, serve).

A tiny Llama GGUF written without tokenizer.chat_template, compiled for the cpu target twice: without a template,
`run` generates from the plain text and says so on stderr, `chat` refuses in one line naming --chat-template; with
`--chat-template FILE`, `run`'s prompt ids equal transformers' apply_chat_template of the same template over the
package's own tokenizer files. The known names render as their families' formats (chatml as the ChatML template
the other tests use, character for character); an unknown name or a template that does not parse is a one-line
error that writes nothing.
"""
from __future__ import annotations

import json

import pytest
from bad_inputs.checkpoints import tiny_gguf
from conftest import require_cc, require_module
from test_package_cli import CHATML, assert_one_line_error, cli, run_package

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>{% endif %}")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    require_module("gguf")
    return tiny_gguf(tmp_path_factory.mktemp("template") / "tiny.gguf", chat_template=None)


def test_a_gguf_without_a_template_and_with_one(gguf, tmp_path):
    require_cc()
    transformers = require_module("transformers")
    bare = tmp_path / "bare"
    r = cli("compile", gguf, "--device", "cpu", "-o", bare, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_package(bare, "run", "--prompt", "abc ab", "--max-tokens", "3", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "no chat template" in line]
    assert len(notes) == 1 and "--chat-template" in notes[0] and "plain text" in notes[0]
    assert_one_line_error(run_package(bare, "chat", input="abc\n"), "no chat template", "--chat-template")

    (tmp_path / "t.jinja").write_text(TEMPLATE)
    templated = tmp_path / "templated"
    r = cli("compile", gguf, "--device", "cpu", "-o", templated, "--chat-template", tmp_path / "t.jinja", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_package(templated, "run", "--prompt", "abc ab", "--max-tokens", "3", "--temperature", "0", "--json")
    assert r.returncode == 0 and "no chat template" not in r.stderr, r.stderr
    ours = json.loads(r.stdout)["prompt_ids"]
    config = json.loads((templated / "tokenizer_config.json").read_text())
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(templated / "tokenizer.json"),
                                               bos_token=config.get("bos_token"), eos_token=config.get("eos_token"))
    tok.chat_template = (templated / "chat_template.jinja").read_text()
    want = tok.apply_chat_template([{"role": "user", "content": "abc ab"}], add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want  # a BatchEncoding in newer transformers
    assert ours == list(want) and len(ours) > 3


def test_known_names_and_refusals(gguf, tmp_path):
    from deploycc.chat_templates import KNOWN, resolve
    from deploycc.runtime.tokenizer import Tokenizer

    class NoVocab:
        def token_to_id(self, token):
            return None

    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]

    def render(template: str) -> str:
        return Tokenizer(NoVocab(), {"bos_token": "<s>"}, template).apply_chat_template(conversation)

    assert render(resolve("chatml")) == render(CHATML)
    assert render(resolve("llama3")).startswith("<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    gemma = render(resolve("gemma"))
    assert gemma.startswith("<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!")
    assert gemma.endswith("<start_of_turn>model\n") and set(KNOWN) == {"chatml", "llama3", "gemma"}
    out = tmp_path / "never"
    r = cli("compile", gguf, "--device", "cpu", "-o", out, "--chat-template", "vicuna")
    assert_one_line_error(r, "vicuna", "chatml")
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}")
    assert_one_line_error(cli("compile", gguf, "--device", "cpu", "-o", out, "--chat-template", tmp_path / "bad.jinja"),
                          "bad.jinja")
    assert not out.exists()
