"""What `run`, `chat` and `serve` sample with when not told (issue 25): the model's generation_config.json
(temperature, top_p, top_k, min_p, repetition_penalty; do_sample false is greedy), else llama.cpp's llama-cli
defaults (run, chat) or OpenAI's (serve). What the command line or a request gives wins, and --temperature 0 is
the plain greedy argmax it always was. Observed through `run --json`'s "sampler", chat's /stats and the real
server, with `deploycc` and `python PKG` alike, on the tiny llama package (native cpu) whose generation_config.json
is rewritten (and the manifest resealed) for each case.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import require_cc, require_module
from test_package_cli import MODEL, PROMPT, cli, rehash, run_package, with_tokenizer

from fixtures import make_tiny

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
MODEL_SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.05}
LLAMA_CLI = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.0}
GC = "generation_config.json"


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    """"model": generation_config.json with MODEL_SAMPLING; "plain": the fixture's own (eos and bos ids, no sampling
    field); "greedy": MODEL_SAMPLING with do_sample false. One compile, copied."""
    from deploycc.package import compile_model

    require_cc()
    root = tmp_path_factory.mktemp("sampling")
    model = with_tokenizer(make_tiny(MODEL), root / "model")
    plain = json.loads((model / GC).read_text())
    assert not set(plain) & {*FIELDS, "do_sample"}
    (model / GC).write_text(json.dumps({**plain, **MODEL_SAMPLING}))
    out = {"model": Path(compile_model(str(model), "cpu", out=str(root / "model-pkg")))}
    for name, config in (("plain", plain), ("greedy", {**plain, **MODEL_SAMPLING, "do_sample": False})):
        pkg = Path(shutil.copytree(out["model"], root / name))
        (pkg / GC).write_text(json.dumps(config))
        rehash(pkg, GC)
        out[name] = pkg
    return out


def run_json(how: str, pkg: Path, *args: str) -> dict:
    argv = ("run", *(() if how == "package" else (pkg,)), "--prompt", PROMPT, "--max-tokens", "12", *args, "--json")
    r = run_package(pkg, *argv) if how == "package" else cli(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def chat_lines(how: str, pkg: Path, *args: str) -> list[str]:
    argv = ("chat", *(() if how == "package" else (pkg,)), "--max-tokens", "6", *args)
    r = (run_package(pkg, *argv, input="hi\n/stats\n") if how == "package" else cli(*argv, input="hi\n/stats\n"))
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    return r.stdout.splitlines()


def old_greedy(pkg: Path, **options) -> list[int]:
    """The ids of generate's own defaults (greedy, no penalty; what run did before), in this process."""
    from deploycc.runtime.batch import session_of
    from deploycc.runtime.engine import Engine
    from deploycc.runtime.generate import generate

    engine = Engine.load(pkg, paged="auto")
    stats: dict = {}
    "".join(generate(session_of(engine), engine.tokenizer, PROMPT, max_tokens=12, stats=stats, **options))
    return stats["generated"]


HOW = pytest.mark.parametrize("how", ["deploycc", "package"])


# ---- run -----------------------------------------------------------------------------------------------

@HOW
def test_run_samples_with_the_generation_config(packages, how):
    r = run_json(how, packages["model"])
    assert r["sampler"] == {**MODEL_SAMPLING, "min_p": 0.0, "seed": 0, "from": dict.fromkeys(FIELDS, GC)}
    given = run_json(how, packages["model"], "--temperature", "0.7", "--top-p", "0.9", "--top-k", "50", "--min-p", "0",
                     "--repetition-penalty", "1.05")
    greedy = run_json(how, packages["model"], "--temperature", "0")
    assert r["generated"] == given["generated"] != greedy["generated"]  # sampled, with these settings


@HOW
def test_run_options_win(packages, how):
    r = run_json(how, packages["model"], "--temperature", "1.3", "--top-k", "5")
    assert r["sampler"] == {"temperature": 1.3, "top_p": 0.9, "top_k": 5, "min_p": 0.0, "repetition_penalty": 1.05,
                            "seed": 0, "from": {**dict.fromkeys(FIELDS, GC), "temperature": "the command line",
                                                "top_k": "the command line"}}
    assert r["generated"] != run_json(how, packages["model"])["generated"]


@HOW
def test_run_temperature_zero_is_the_old_greedy(packages, how):
    """--temperature 0 is the argmax of the logits, without the model's repetition penalty of 1.05."""
    r = run_json(how, packages["model"], "--temperature", "0")
    assert r["sampler"]["temperature"] == 0 and r["sampler"]["repetition_penalty"] == 1.0
    assert r["generated"] == old_greedy(packages["model"])
    assert old_greedy(packages["model"]) != old_greedy(packages["model"], repetition_penalty=1.05)  # it would show


@HOW
def test_run_do_sample_false_is_greedy(packages, how):
    """do_sample false: greedy with the model's repetition penalty, as transformers' greedy search."""
    r = run_json(how, packages["greedy"])
    assert r["sampler"] == {**MODEL_SAMPLING, "min_p": 0.0, "temperature": 0.0, "seed": 0,
                            "from": dict.fromkeys(FIELDS, GC)}
    assert r["generated"] == old_greedy(packages["greedy"], repetition_penalty=1.05)
    assert run_json(how, packages["greedy"], "--seed", "5")["generated"] == r["generated"]


@HOW
def test_run_without_model_settings_uses_llama_cpp_defaults(packages, how):
    r = run_json(how, packages["plain"])
    assert r["sampler"] == {**LLAMA_CLI, "seed": 0, "from": dict.fromkeys(FIELDS, "llama.cpp's defaults")}
    given = run_json(how, packages["plain"], "--temperature", "0.8", "--top-p", "0.95", "--top-k", "40", "--min-p",
                     "0.05", "--repetition-penalty", "1")
    assert r["generated"] == given["generated"] != run_json(how, packages["plain"], "--temperature", "0")["generated"]


# ---- chat ----------------------------------------------------------------------------------------------

@HOW
def test_chat_stats_names_the_sampler(packages, how):
    lines = chat_lines(how, packages["model"])
    assert lines[-1] == ("sampler: temperature 0.7, top_p 0.9, top_k 50, min_p 0, repetition_penalty 1.05 "
                         "(from generation_config.json)")
    reply = run_package(packages["model"], "run", "--prompt", "hi", "--max-tokens", "6").stdout
    assert "\n".join(lines[:-2]) + "\n" == reply  # chat samples as run does
    assert chat_lines(how, packages["model"], "--temperature", "0", "--top-k", "3")[-1] == \
        "sampler: greedy, temperature 0, repetition_penalty 1 (from the command line)"
    assert chat_lines(how, packages["model"], "--top-k", "3")[-1] == \
        ("sampler: temperature 0.7, top_p 0.9, top_k 3, min_p 0, repetition_penalty 1.05 (temperature, top_p, min_p, "
         "repetition_penalty from generation_config.json; top_k from the command line)")
    assert chat_lines(how, packages["plain"])[-1] == \
        "sampler: temperature 0.8, top_p 0.95, top_k 40, min_p 0.05, repetition_penalty 1 (from llama.cpp's defaults)"
    assert chat_lines(how, packages["greedy"])[-1] == \
        "sampler: greedy, temperature 0, repetition_penalty 1.05 (from generation_config.json)"


# ---- serve ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def serving(pkg: Path):
    require_module("starlette")
    require_module("uvicorn")
    from serving import free_port, start

    port = free_port()
    proc = start([sys.executable, str(pkg), "serve", "--port", str(port), "--model-name", "tiny"], port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def complete(url: str, **fields) -> str:
    from serving import post

    status, body = post(url + "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, **fields})
    assert status == 200, body
    return body["choices"][0]["text"]


def test_serve_do_sample_false_is_greedy(packages):
    """Unseeded requests take a random seed each; greedy by the package's generation_config.json, they agree with
    each other and with `run` (plain text, as /v1/completions takes the prompt)."""
    want = run_json("package", packages["greedy"], "--no-chat")["text"]
    with serving(packages["greedy"]) as url:
        assert complete(url) == complete(url) == want
        assert complete(url, temperature=1.0, seed=3) != want  # the request's temperature wins


def test_serve_samples_with_the_generation_config(packages):
    with serving(packages["model"]) as url:
        default = complete(url, seed=3)
        assert default == complete(url, seed=3, temperature=0.7, top_p=0.9)
        assert default != complete(url, seed=3, temperature=1.0, top_p=1.0)  # not OpenAI's defaults
        assert complete(url, temperature=0) == run_json("package", packages["model"], "--no-chat",
                                                        "--temperature", "0")["text"]
    with serving(packages["plain"]) as url:  # no sampling fields: OpenAI's temperature 1, top_p 1
        default = complete(url, seed=3)
        assert default == complete(url, seed=3, temperature=1.0, top_p=1.0)
        assert default != complete(url, seed=3, temperature=0.8, top_p=0.95)
