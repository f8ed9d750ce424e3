"""Catalogue: text inputs, tokenizer files and chat templates.

Undecodable text (a prompt, a chat line) becomes U+FFFD and the command goes on; a binary file given as
text, a tokenizer that does not load or does not fit the model's vocabulary, and a chat template that
raises, runs away or builds too much are one line `error: ...`, exit 1, found before any compile or
model work where they can be. Every case runs the real command line with a 60 s timeout, so a hang
fails instead of blocking. Template cases run `deploycc run MODEL` (the numpy reference path), whose
tokenizer and template are checked before the model is built.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_device
from test_package_cli import CHATML, with_tokenizer
from tokenizers import Tokenizer as Backend

from bad_inputs.common import assert_one_line_error, cli, reseal
from fixtures import make_tiny

T = 60  # seconds per command: a hang fails the case


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return with_tokenizer(make_tiny("llama-gqa1"), tmp_path_factory.mktemp("text") / "model")


@pytest.fixture(scope="module")
def package(model, tmp_path_factory) -> Path:
    require_device("opencl")
    out = tmp_path_factory.mktemp("text-pkg") / "pkg"
    r = cli("compile", model, "-o", out, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def variant(model: Path, dst: Path, config: dict | None = None, files: dict | None = None) -> Path:
    """A copy of `model` with tokenizer_config.json keys replaced (None removes one) and files written."""
    shutil.copytree(model, dst)
    if config is not None:
        cfg = json.loads((dst / "tokenizer_config.json").read_text())
        cfg.update(config)
        cfg = {k: v for k, v in cfg.items() if v is not None}
        (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    for name, content in (files or {}).items():
        (dst / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return dst


def bigger_tokenizer(src: Path, dst: Path) -> None:
    """src's tokenizer.json with one added token, whose id is the model's vocab_size: one past its embedding."""
    tok = Backend.from_file(str(src / "tokenizer.json"))
    tok.add_special_tokens(["<|extra|>"])
    tok.save(str(dst / "tokenizer.json"))


def package_cmd(pkg: Path, *args, input: bytes | None = None):
    """`python PKG ...` with bytes arguments as they are (argv can hold any bytes)."""
    return subprocess.run([sys.executable, str(pkg), *args], capture_output=True, input=input, timeout=T)


def assert_no_traceback(r):
    for stream in (r.stdout, r.stderr):
        text = stream if isinstance(stream, str) else stream.decode("utf-8", "replace")
        assert "Traceback" not in text, text[-3000:]


# ---- undecodable text: replaced, and the command goes on -----------------------------------------------

def test_invalid_utf8_prompt_is_replaced(package):
    r = cli("run", package, "--prompt", os.fsdecode(b"\xff\xfe hi"), "--max-tokens", "3", "--json", timeout=T)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prompt"] == "\ufffd\ufffd hi"
    clean = cli("run", package, "--prompt", "\ufffd\ufffd hi", "--max-tokens", "3", "--json", timeout=T)
    assert json.loads(clean.stdout)["generated"] == json.loads(r.stdout)["generated"]


def test_invalid_utf8_prompt_in_the_package_cli(package):
    r = package_cmd(package, "run", "--prompt", b"\xff\xfe hi", "--max-tokens", "3")
    assert r.returncode == 0 and r.stderr.decode().startswith("prefill "), r.stderr
    assert_no_traceback(r)


@pytest.mark.parametrize("how", ["deploycc", "package"])
def test_invalid_utf8_chat_line_keeps_the_repl(package, how):
    lines = b"hi\n\xff\xfe there \xc3\n/stats\nhi\n"
    r = (cli("chat", package, "--max-tokens", "4", input=lines, timeout=T) if how == "deploycc"
         else package_cmd(package, "chat", "--max-tokens", "4", input=lines))
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    out = r.stdout.decode()
    assert len(out.splitlines()) == 5 and out.splitlines()[2].startswith("prefill "), out
    assert out.splitlines()[3].startswith("sampler: "), out


def test_perplexity_of_a_binary_file(package):
    assert_one_line_error(cli("perplexity", package, "--text", "/bin/ls", timeout=T), "/bin/ls is not UTF-8 text",
                          "give a text file")


def test_perplexity_of_a_file_with_nul_bytes(package, tmp_path):
    (tmp_path / "nul.txt").write_bytes(b"text\x00more text")
    assert_one_line_error(cli("perplexity", package, "--text", tmp_path / "nul.txt", timeout=T), "NUL bytes")


# ---- tokenizer files: refused at compile, and before a compile for run / chat --------------------------------

def test_garbage_tokenizer_json_fails_the_compile(model, tmp_path):
    src = variant(model, tmp_path / "m", files={"tokenizer.json": '{"model": {"type": "BPE", "vocab": 3}}'})
    assert_one_line_error(cli("compile", src, "-o", tmp_path / "pkg", timeout=T), "tokenizer.json could not be loaded")
    assert not (tmp_path / "pkg").exists()


def test_tokenizer_larger_than_the_vocabulary_fails_the_compile(model, tmp_path):
    src = variant(model, tmp_path / "m")
    bigger_tokenizer(model, src)
    line = assert_one_line_error(cli("compile", src, "-o", tmp_path / "pkg", timeout=T), "token id 101",
                                 "vocabulary has 101 entries")
    assert "<|extra|>" in line and not (tmp_path / "pkg").exists()


def test_tokenizer_config_that_is_a_list(model, tmp_path):
    src = variant(model, tmp_path / "m", files={"tokenizer_config.json": "[1, 2]"})
    assert_one_line_error(cli("compile", src, "-o", tmp_path / "pkg", timeout=T), "should hold a JSON object, not list")
    assert_one_line_error(cli("run", src, "--prompt", "hi", timeout=T), "should hold a JSON object, not list")


def test_chat_template_that_is_not_a_string(model, tmp_path):
    src = variant(model, tmp_path / "m", config={"chat_template": 42})
    assert_one_line_error(cli("compile", src, "-o", tmp_path / "pkg", timeout=T), "chat_template should be a string")
    assert_one_line_error(cli("run", src, "--prompt", "hi", timeout=T), "chat_template should be a string")


def test_chat_template_file_that_is_not_utf8(model, tmp_path):
    src = variant(model, tmp_path / "m", config={"chat_template": None}, files={"chat_template.jinja": b"\xff{{ x }}"})
    assert_one_line_error(cli("run", src, "--prompt", "hi", timeout=T), "chat_template.jinja is not UTF-8 text")


def test_eos_token_id_that_is_not_an_id(model, tmp_path):
    src = variant(model, tmp_path / "m", files={"generation_config.json": '{"eos_token_id": "abc"}'})
    assert_one_line_error(cli("run", src, "--prompt", "hi", timeout=T), "eos_token_id should be a token id")


@pytest.mark.parametrize("config, fragment", [('{"temperature": -1}', "temperature must be a finite number >= 0"),
                                              ('{"top_p": 0}', "top_p must be in (0, 1]"),
                                              ('{"do_sample": "yes"}', "do_sample should be true or false")])
def test_generation_config_sampling_that_the_sampler_refuses(model, tmp_path, config, fragment):
    """A sampling setting of generation_config.json that the sampler cannot use fails the compile and a run in one
    line naming the file, even where the command line would override it."""
    src = variant(model, tmp_path / "m", files={"generation_config.json": config})
    assert_one_line_error(cli("compile", src, "-o", tmp_path / "pkg", timeout=T), "generation_config.json: ", fragment)
    assert_one_line_error(cli("run", src, "--prompt", "hi", "--temperature", "0", timeout=T), fragment)


def test_tampered_package_tokenizer(package, tmp_path):
    pkg = shutil.copytree(package, tmp_path / "pkg")
    bigger_tokenizer(package, pkg)
    reseal(pkg)  # as an editor would: the hashes agree, the tokenizer no longer fits the embedding
    assert_one_line_error(cli("run", pkg, "--prompt", "hi", timeout=T), "token id 101", "vocabulary has 101 entries")
    r = package_cmd(pkg, "chat", input=b"hi\n")
    assert_one_line_error(r, "token id 101")


@pytest.mark.parametrize("command", ["run", "chat"])
def test_model_without_a_tokenizer_is_refused_before_compiling(model, tmp_path, command):
    require_device("opencl")
    src = variant(model, tmp_path / "m")
    (src / "tokenizer.json").unlink()
    home = tmp_path / "home"
    args = ("--prompt", "hi") if command == "run" else ()
    r = cli(command, src, "--device", "cpu-opencl", *args, env={"DEPLOYCC_HOME": str(home)}, input="hi\n", timeout=T)
    assert_one_line_error(r, "has no tokenizer.json")
    assert not (home / "packages").exists() or not any((home / "packages").iterdir())


def test_broken_template_is_refused_before_compiling(model, tmp_path):
    require_device("opencl")
    src = variant(model, tmp_path / "m", config={"chat_template": "{{ raise_exception('roles must alternate') }}"})
    home = tmp_path / "home"
    r = cli("chat", src, "--device", "cpu-opencl", env={"DEPLOYCC_HOME": str(home)}, input="hi\n", timeout=T)
    assert_one_line_error(r, "chat template error: roles must alternate")
    assert not (home / "packages").exists() or not any((home / "packages").iterdir())


def test_huge_padding_in_tokenizer_json_is_ignored(model, tmp_path):
    """A fixed padding length of 10^12 in tokenizer.json would make every encode allocate terabytes (a native
    abort); like transformers, the runtime encodes without the file's padding and truncation."""
    src = variant(model, tmp_path / "m")
    spec = json.loads((src / "tokenizer.json").read_text())
    spec["padding"] = {"strategy": {"Fixed": 10**12}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                       "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    (src / "tokenizer.json").write_text(json.dumps(spec))
    r = cli("run", src, "--prompt", "hi", "--max-tokens", "2", "--json", timeout=T)
    plain = cli("run", model, "--prompt", "hi", "--max-tokens", "2", "--json", timeout=T)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prompt_ids"] == json.loads(plain.stdout)["prompt_ids"]


# ---- chat templates: limits and failures, one line each ---------------------------------------------------

TEMPLATES = {
    "range over the limit": ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
                             "range() of 100000 items is over the limit"),
    "runaway nested loops": ("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
                             "loop iterations and calls (a runaway loop?)"),
    "huge repetition": ("{{ 'a' * 400000000 }}", "'*' would build a value of more than 1000000 characters"),
    "doubling a string": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                          "{% endfor %}{{ ns.s }}", "'~' would build a value of more than"),
    "output over the limit": ("{% for i in range(5000) %}{{ messages[0]['content'] * 200 }}{% endfor %}",
                              "its output passed the limit of 1000000 characters"),
    "huge format width": ("{{ '%999999999s' % 'a' }}", "'%' would build a value"),
    "huge power": ("{{ 2 ** 1000000000 }}", "'**' would build a value"),
    "raises": ("{{ raise_exception('This model only chats in French') }}",
               "chat template error: This model only chats in French"),
    "undefined attribute": ("{{ messages[0].content.nothing.here }}", "chat template error:"),
    "undefined name": ("{{ tools_list.name }}", "'tools_list' is undefined"),
    "type error": ("{{ 1 + messages }}", "chat template error: TypeError"),
    "endless recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
    "syntax error": ("{% for m in messages %}{{ m }}", "does not parse"),
}


@pytest.mark.parametrize("case", sorted(TEMPLATES))
def test_chat_template(model, tmp_path, case):
    template, fragment = TEMPLATES[case]
    src = variant(model, tmp_path / "m", config={"chat_template": template})
    assert_one_line_error(cli("run", src, "--prompt", "hi", timeout=T), fragment)


def test_template_over_the_limit_in_a_package_chat_keeps_the_repl(package, tmp_path):
    """A template that fails on long messages only: that turn is an error line, the next turn is answered."""
    pkg = shutil.copytree(package, tmp_path / "pkg")
    cfg = json.loads((pkg / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% if messages[-1]['content']|length > 20 %}{{ messages[-1]['content'] * 100000 }}"
                            "{% endif %}" + CHATML)
    (pkg / "tokenizer_config.json").write_text(json.dumps(cfg))
    reseal(pkg)
    r = package_cmd(pkg, "chat", "--max-tokens", "3", input=b"hi\n" + b"x" * 30 + b"\nhi\n")
    assert_one_line_error(subprocess.CompletedProcess([], 1, "", r.stderr.decode()), "would build a value")
    assert r.returncode == 0 and len(r.stdout.decode().splitlines()) == 2
