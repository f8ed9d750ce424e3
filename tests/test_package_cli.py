"""The package commands end to end: compile, run, chat, bench, verify, devices, inspect --stage vm / --memory,
and every bad input as one line `error: ...`, exit 1, no traceback.

Packages are compiled from the tiny llama fixture with a tiny byte-level BPE tokenizer (its vocabulary
as large as the model's) and a ChatML template, for cpu-opencl (PoCL) and cpu-webgpu (lavapipe).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_cc, require_device

from fixtures import make_tiny

MODEL = "llama-gqa1"
PROMPT = "What is the capital of France?"
LONG = "word " * 200  # ~1000 tokens: more than the fixture's context window of 128
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = ["What is the capital of France? Paris is the capital of France.\n",
          "Hello, world! The quick brown fox jumps over the lazy dog.\n",
          "system user assistant: you are a tiny test model. Be brief. 0123456789\n"] * 8
STATS = re.compile(r"^prefill (\d+) tokens at [\d.]+ tok/s, decode (\d+) tokens at [\d.]+ tok/s \((\w+)\)$")


# ---- helpers -----------------------------------------------------------------------------------

def with_tokenizer(src: Path, dst: Path, corpus: list[str] = CORPUS) -> Path:
    """A copy of checkpoint `src` with a byte-level BPE tokenizer of exactly the model's vocab_size, trained on
    `corpus` (its characters are the alphabet)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    vocab_size = json.loads((src / "config.json").read_text())["vocab_size"]
    shutil.copytree(src, dst)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() == vocab_size
    tok.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML}, indent=1))
    return dst


def cli(*args, input: str | None = None, env: dict | None = None, cwd=None):
    return subprocess.run([sys.executable, "-m", "deploycc", *map(str, args)], capture_output=True, text=True,
                          input=input, timeout=300, env={**os.environ, **(env or {})}, cwd=cwd)


def run_package(pkg: Path, *args, python: str = sys.executable, input: str | None = None, cwd=None):
    return subprocess.run([python, str(pkg), *map(str, args)], capture_output=True, text=True, input=input,
                          timeout=300, cwd=cwd)


def assert_one_line_error(r, *fragments):
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def needs(backend: str) -> None:
    """Skip (locally) or fail (CI=true) without a `backend` device: conftest.require_device."""
    require_device(backend)


def copy_package(pkg: Path, dst: Path) -> Path:
    shutil.copytree(pkg, dst)
    return dst


def rehash(pkg: Path, rel: str) -> None:
    """Make the manifest agree with a file changed on purpose, to reach the checks behind the hash check."""
    import hashlib

    from bad_inputs.common import seal_manifest

    m = json.loads((pkg / "manifest.json").read_text())
    m["files"][rel] = hashlib.sha256((pkg / rel).read_bytes()).hexdigest()
    (pkg / "manifest.json").write_text(json.dumps(m))
    seal_manifest(pkg)


# ---- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return with_tokenizer(make_tiny(MODEL), tmp_path_factory.mktemp("model") / MODEL)


@pytest.fixture(scope="module")
def compiled(model_dir, tmp_path_factory):
    """preset -> (package dir, the compile's CompletedProcess), compiled once per module."""
    root = tmp_path_factory.mktemp("packages")
    made: dict = {}

    def get(preset: str):
        needs(preset.split("-")[1])
        if preset not in made:
            out = root / preset
            r = cli("compile", model_dir, "--device", preset, "-o", out)
            assert r.returncode == 0, r.stderr
            made[preset] = (out, r)
        return made[preset]
    return get


@pytest.fixture(params=["cpu-opencl", "cpu-webgpu"])
def package(request, compiled) -> Path:
    return compiled(request.param)[0]


@pytest.fixture
def opencl_package(compiled) -> Path:
    return compiled("cpu-opencl")[0]


# ---- compile -----------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["cpu-opencl", "cpu-webgpu"])
def test_compile_prints_path_and_summary(compiled, preset):
    pkg, r = compiled(preset)
    lines = r.stdout.strip().splitlines()
    assert lines[0] == str(pkg) and len(lines) == 2, r.stdout
    m = json.loads((pkg / "manifest.json").read_text())
    assert lines[1].startswith(f"{preset} ({preset.split('-')[1]}), q0f32, context window 128: ")
    assert f"{len(m['kernels']['entries'])} kernels, weights " in lines[1]
    assert "KV cache 65.5 KB" in lines[1] and "activations " in lines[1]
    assert "KV cache 65.5 KB (float32)," in lines[1]  # its type named, as inspect --memory names it
    assert "write weights" in r.stderr and "tensors" in r.stderr  # the progress display, on stderr
    for f in ("manifest.json", "bytecode.json", "__main__.py", "runtime/cli.py", "tokenizer.json", "tokenizer_config.json"):
        assert (pkg / f).is_file(), f
    assert oct(pkg.stat().st_mode & 0o777) == oct(0o755)


def test_compile_json(model_dir, tmp_path):
    """No --device: the native cpu preset where a C compiler is found (make test installs gcc), its
    default quantization q4f16_2."""
    require_cc()
    r = cli("compile", model_dir, "-o", tmp_path / "pkg", "--override", "prefill_chunk=16", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = json.loads(r.stdout)
    m = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert out["package"] == str(tmp_path / "pkg") and out["preset"] == "cpu" and out["backend"] == "cpu"
    assert out["prefill_chunk"] == 16 and out["context_window"] == 128 and out["quantization"] == "q4f16_2"
    assert out["kernels"] == len(m["kernels"]["entries"]) and out["memory"] == m["memory"]
    assert out["source"] == str(model_dir.resolve()) and out["kv_cache_dtype"] == "float32"


def test_compile_says_a_half_cache(model_dir, tmp_path):
    """The KV cache's type is named in the summary line beside its bytes (as inspect --memory names it): a float16
    one (here `--override kv_cache=float16` on cpu-opencl) half a float32 cache's (test_compile_prints_path_and_summary:
    65.5 KB), and in --json."""
    needs("opencl")
    r = cli("compile", model_dir, "--device", "cpu-opencl", "--override", "kv_cache=float16", "-o", tmp_path / "pkg")
    assert r.returncode == 0, r.stderr
    assert "KV cache 32.8 KB (float16), activations " in r.stdout.splitlines()[1]
    r = cli("compile", model_dir, "--device", "cpu-opencl", "--override", "kv_cache=float16", "-o", tmp_path / "pkg",
            "--force", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["kv_cache_dtype"] == "float16", r.stderr


def test_compile_head_quantization(model_dir, tmp_path):
    """--head-quantization: the embedding (the tied head) in another scheme, recorded in the manifest; the
    package runs and its logits equal the reference session of the same two schemes (1e-4)."""
    needs("opencl")
    r = cli("compile", model_dir, "-o", tmp_path / "pkg", "--device", "cpu-opencl", "--quantization", "q4f16_2",
            "--head-quantization", "q8f16_0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["quantization"], out["head_quantization"]) == ("q4f16_2", "q8f16_0")
    params = json.loads((tmp_path / "pkg" / "manifest.json").read_text())["params"]
    names = json.dumps(params)
    assert "embed_tokens.q_weight" in names and "q_min" in names
    from deploycc.runtime.engine import Engine
    from deploycc.session import reference_session

    ids = [3, 1, 4, 1, 5]
    want = reference_session(str(model_dir), quantization="q4f16_2", head_quantization="q8f16_0").prefill(ids)
    np.testing.assert_allclose(Engine.load(tmp_path / "pkg").prefill(ids), want, atol=1e-4, rtol=0)
    assert_one_line_error(cli("compile", model_dir, "-o", tmp_path / "bad", "--head-quantization", "q3"),
                          "head quantization q3 is not available")
    assert not (tmp_path / "bad").exists()


# ---- run ---------------------------------------------------------------------------------------

def test_run_json_matches_reference(package, model_dir):
    args = ("--prompt", PROMPT, "--max-tokens", "12", "--temperature", "0", "--json")
    pkg, ref = cli("run", package, *args), cli("run", model_dir, *args)
    assert pkg.returncode == 0 and ref.returncode == 0, pkg.stderr + ref.stderr
    a, b = json.loads(pkg.stdout), json.loads(ref.stdout)
    assert a["package"] == str(package) and b["device"] == "reference"
    assert a["prompt"] == PROMPT and a["prompt_ids"] == b["prompt_ids"] and len(a["prompt_ids"]) == a["prompt_tokens"]
    assert a["generated"] == b["generated"] and 1 <= len(a["generated"]) <= 12
    assert a["text"] == b["text"]
    t = a["timings"]
    assert t["prefill_tok_s"] > 0 and t["prefill_seconds"] > 0 and set(t) >= {"decode_tok_s", "decode_seconds"}
    streamed = cli("run", package, "--prompt", PROMPT, "--max-tokens", "12", "--temperature", "0")
    assert streamed.returncode == 0 and streamed.stdout == a["text"] + "\n"
    itself = run_package(package, "run", "--prompt", PROMPT, "--max-tokens", "12", "--temperature", "0")
    assert itself.returncode == 0 and itself.stdout == a["text"] + "\n", itself.stderr


def test_run_sampling_is_seeded(opencl_package):
    args = ("--prompt", PROMPT, "--max-tokens", "10", "--temperature", "1.5", "--top-k", "20", "--json")
    a, b, c = (json.loads(cli("run", opencl_package, *args, "--seed", s).stdout)["generated"] for s in (7, 7, 8))
    assert a == b and a != c


def test_run_model_with_device_compiles_once_into_the_cache(model_dir, tmp_path):
    needs("opencl")
    env = {"DEPLOYCC_HOME": str(tmp_path / "home")}
    first = cli("run", model_dir, "--device", "cpu-opencl", "--prompt", PROMPT, "--max-tokens", "6", env=env)
    assert first.returncode == 0 and "compiling" in first.stderr, first.stderr
    [pkg] = (tmp_path / "home" / "packages").iterdir()
    stamp = (pkg / "manifest.json").stat().st_mtime_ns
    second = cli("run", model_dir, "--device", "cpu-opencl", "--prompt", PROMPT, "--max-tokens", "6", env=env)
    assert second.returncode == 0 and STATS.match(second.stderr.strip()) and second.stdout == first.stdout  # no compile
    assert list((tmp_path / "home" / "packages").iterdir()) == [pkg] and (pkg / "manifest.json").stat().st_mtime_ns == stamp
    other = cli("run", model_dir, "--device", "cpu-opencl", "--context-window", "64", "--prompt", "hi", "--max-tokens", "2",
                "--json", env=env)
    assert other.returncode == 0 and json.loads(other.stdout)["package"] != str(pkg)
    assert len(list((tmp_path / "home" / "packages").iterdir())) == 2


# ---- chat --------------------------------------------------------------------------------------

def chat(pkg: Path, *lines: str, args=("--max-tokens", "6", "--temperature", "0")):
    return cli("chat", pkg, *args, input="".join(f"{x}\n" for x in lines))


def test_chat_piped(opencl_package):
    r = chat(opencl_package, "hi", "/stats", "/system Be brief.", "hi", "/reset", "/stats", "/help", "/exit", "ignored")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert ">>>" not in r.stdout and "chatting with" not in r.stdout  # no decoration without a terminal
    lines = r.stdout.splitlines()
    one = run_package(opencl_package, "run", "--prompt", "hi", "--max-tokens", "6", "--temperature", "0").stdout
    one = one.rstrip("\n")
    assert lines[0] == one  # the first turn is a plain chat-template prompt
    m = STATS.match(lines[1])
    assert m and int(m[1]) > 5 and 1 <= int(m[2]) <= 6, lines[1]
    assert lines[2] == lines[7] == "sampler: greedy, temperature 0, repetition_penalty 1 (from the command line)"
    assert lines[3] == "(system prompt set)"
    assert lines[5] == "(conversation reset)"
    second = STATS.match(lines[6])  # /stats after /reset: still the last reply's numbers
    assert second and int(second[1]) > int(m[1]), "the second turn carries the first in its prompt"
    assert "/system TEXT" in r.stdout and "/exit" in lines[-1]  # /help; nothing after /exit is answered
    assert len(lines) == 8 + len(r.stdout.split("commands:")[1].strip().splitlines()) + 1


def test_chat_prompt_over_the_context_window_keeps_the_session(opencl_package):
    failed = chat(opencl_package, "hi", LONG, "hi", "/stats")
    plain = chat(opencl_package, "hi", "hi", "/stats")
    assert failed.returncode == 0, failed.stderr
    assert_one_line_error(subprocess.CompletedProcess([], 1, "", failed.stderr), "context window is 128")
    # the failed turn left no trace: the same replies and the same prompt length afterwards
    a, b = failed.stdout.splitlines(), plain.stdout.splitlines()
    assert a[:2] == b[:2] and STATS.match(a[2])[1] == STATS.match(b[2])[1]


def test_chat_drops_the_oldest_turns_when_the_history_fills_the_window(opencl_package):
    from deploycc.runtime.generate import encode_prompt
    from deploycc.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(opencl_package)
    reply = json.loads(cli("run", opencl_package, "--prompt", "hi", "--max-tokens", "6", "--temperature", "0",
                           "--json").stdout)["text"]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]

    def length(messages, n):
        return len(encode_prompt(tok, messages + [{"role": "user", "content": " ".join(["word"] * n)}]))

    n = next(n for n in range(1, 200) if length(history, n) >= 128)
    assert length([], n) < 127, "the message alone must fit, with room for a reply"
    text = " ".join(["word"] * n)
    r = chat(opencl_package, "hi", text, "/reset", text)
    assert r.returncode == 0 and r.stderr == "(dropped the oldest turn to fit the context window)\n", r.stderr
    lines = r.stdout.splitlines()
    i = lines.index("(conversation reset)")
    assert lines[0] == reply and lines[1:i] == lines[i + 1:]  # the reply it gets with the history cleared by /reset


def test_package_chat_itself(opencl_package):
    r = run_package(opencl_package, "chat", "--max-tokens", "6", "--temperature", "0",
                    input=f"hi\n{LONG}\nhi\n/stats\n")
    assert r.returncode == 0 and r.stderr.count("error: ") == 1 and "Traceback" not in r.stderr
    assert r.stdout.splitlines()[:2] == chat(opencl_package, "hi", "hi").stdout.splitlines()


def test_run_prompt_longer_than_the_context_window(opencl_package):
    assert_one_line_error(cli("run", opencl_package, "--prompt", LONG), "context window is 128")
    assert_one_line_error(run_package(opencl_package, "run", "--prompt", LONG), "context window is 128")


# ---- bench / verify ------------------------------------------------------------------------------

def test_bench(opencl_package):
    r = cli("bench", opencl_package, "--prompt-len", "16", "--gen-len", "8", "--repeat", "2", "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    m = json.loads((opencl_package / "manifest.json").read_text())["memory"]
    assert b["prefill_tok_s"] > 0 and b["decode_tok_s"] > 0 and len(b["prefill_seconds"]) == 2
    assert b["peak_rss_bytes"] > 10 << 20
    assert b["device_memory"] == {"weights_bytes": m["weights_bytes"], "kv_cache_bytes": m["kv_cache_bytes"],
                                  "activation_bytes": m["activation_bytes"],
                                  "total_bytes": m["weights_bytes"] + m["kv_cache_bytes"] + m["activation_bytes"]}
    table = cli("bench", opencl_package, "--prompt-len", "16", "--gen-len", "8", "--repeat", "1")
    assert table.returncode == 0 and "decode" in table.stdout and "tok/s" in table.stdout
    itself = run_package(opencl_package, "bench", "--prompt-len", "8", "--gen-len", "4", "--repeat", "1", "--json")
    assert itself.returncode == 0 and json.loads(itself.stdout)["decode_tok_s"] > 0
    assert_one_line_error(cli("bench", opencl_package, "--prompt-len", "120", "--gen-len", "20"), "context window of 128")


def test_bench_profile(opencl_package):
    """--profile: every decode launch is timed on the device; the kernels listed account for all of them,
    as many per token as the bytecode's decode function launches."""
    r = cli("bench", opencl_package, "--prompt-len", "8", "--gen-len", "4", "--repeat", "1", "--profile", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["profile"]
    bytecode = json.loads((opencl_package / "bytecode.json").read_text())["functions"]["decode"]
    launches = sum(1 for i in bytecode["instructions"] if i.get("fn") == "vm.launch")
    assert p["launches_per_token"] == launches == sum(k["launches_per_token"] for k in p["kernels"])
    assert 0 < p["kernel_ms_per_token"] and 0 < p["host_ms_per_token"] and 0 < p["wall_ms_per_token"]
    assert abs(sum(k["share"] for k in p["kernels"]) - 1) < 1e-6
    table = cli("bench", opencl_package, "--prompt-len", "8", "--gen-len", "4", "--repeat", "1", "--profile")
    assert table.returncode == 0 and "decode step:" in table.stdout and "kv_copy" in table.stdout
    assert_one_line_error(cli("bench", opencl_package, "--prompt-len", "100", "--gen-len", "4", "--profile"),
                          "profiled decode steps")


def test_verify(package):
    r = cli("verify", package, "--steps", "3", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["passed"] and v["max_abs_diff"] <= v["tolerance"] == 1e-3
    assert v["against"] == "numpy" and v["reference"] == "the numpy reference of q0f32"
    assert [(s["prompt_len"], s["step"]) for s in v["steps"]] == [(n, s) for n in (1, 7, 33) for s in ("prefill", 1, 2, 3)]
    assert all(s["argmax_match"] for s in v["steps"])
    table = cli("verify", package, "--steps", "1")
    assert table.returncode == 0 and "ok: against the numpy reference of q0f32: " in table.stdout
    assert "within largest |logit difference| <= 0.001" in table.stdout
    if v["max_abs_diff"] > 0:
        strict = cli("verify", package, "--steps", "3", "--tolerance", "0", "--json")
        assert_one_line_error(strict, "exceeds the tolerance 0")
        assert json.loads(strict.stdout)["passed"] is False


def test_verify_chunked_prefill(model_dir, tmp_path):
    """prefill_chunk 16: the 19-token prompt runs as two chunks."""
    needs("opencl")
    assert cli("compile", model_dir, "-o", tmp_path / "pkg", "--override", "prefill_chunk=16").returncode == 0
    r = cli("verify", tmp_path / "pkg", "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert {s["prompt_len"] for s in json.loads(r.stdout)["steps"]} == {1, 7, 19}


def test_verify_with_the_wrong_source(opencl_package):
    r = cli("verify", opencl_package, "--source", make_tiny("mistral-gqa2"))
    assert_one_line_error(r, "is --source the model this package was compiled from?")


# ---- devices / inspect ---------------------------------------------------------------------------

def test_devices():
    from deploycc import presets
    from deploycc.runtime.devices import available

    r = cli("devices", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    usable = {x["kind"] for x in available() if x.get("name")}
    assert {x["kind"] for x in d["devices"]} == {"opencl", "webgpu", "cuda", "cpu", "host"}
    assert [p["name"] for p in d["presets"]] == presets.names()
    for p in d["presets"]:
        assert p["runnable"] == (p["backend"] in usable)
        assert p["runnable"] or p["reason"]
    table = cli("devices")
    assert table.returncode == 0 and "cpu-opencl" in table.stdout and "presets" in table.stdout


def test_inspect_vm_is_the_package_bytecode(opencl_package, model_dir):
    from deploycc.vm import disassemble

    r = cli("inspect", model_dir, "--stage", "vm", "--device", "cpu-opencl")
    assert r.returncode == 0, r.stderr
    assert r.stdout == disassemble(json.loads((opencl_package / "bytecode.json").read_text()))
    assert "function decode(input_ids, cache)" in r.stdout and "vm.launch(@" in r.stdout
    assert_one_line_error(cli("inspect", model_dir, "--stage", "vm"), "--stage vm needs --device")


def test_inspect_is_what_compile_ships(model_dir, tmp_path):
    """On the integer cpu target (quantized, activation bits calibrated, weights interleaved where the CPU has
    AVX2), `inspect --device cpu` runs compile's own export: its bytecode is the package's, its kernels are the
    package's kernels, its memory figures the manifest's."""
    require_cc()
    from deploycc.vm import disassemble

    pkg = tmp_path / "pkg"
    r = cli("compile", model_dir, "--device", "cpu", "--quantization", "q4f16_2", "-o", pkg)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((pkg / "manifest.json").read_text())
    args = (model_dir, "--device", "cpu", "--quantization", "q4f16_2")
    vm = cli("inspect", *args, "--stage", "vm")
    assert vm.returncode == 0, vm.stderr
    assert vm.stdout == disassemble(json.loads((pkg / "bytecode.json").read_text()))
    kernels = json.loads(cli("inspect", *args, "--kernels", "--json").stdout)
    assert {k["name"] for k in kernels["kernels"]} == set(manifest["kernels"]["entries"])
    assert any("dequantize" in k["name"] for k in kernels["kernels"])  # the quantized model, not the float one
    decode = json.loads((pkg / "bytecode.json").read_text())["functions"]["decode"]["instructions"]
    assert kernels["decode_launches"] == sum(i.get("fn") == "vm.launch" for i in decode) > 0
    memory = json.loads(cli("inspect", *args, "--memory", "--json").stdout)
    for key in ("weights_bytes", "kv_cache_bytes", "activation_bytes"):
        assert memory[key] == manifest["memory"][key], key
    assert memory["context_window"] == manifest["bounds"]["context_window"]


@pytest.mark.parametrize("preset", ["cpu-opencl", "cpu-webgpu"])
def test_inspect_source_is_the_packages_kernel_text(compiled, model_dir, preset):
    """`inspect --source KERNEL` prints the kernel as the package's kernel file holds it."""
    pkg, _ = compiled(preset)
    entries = json.loads((pkg / "manifest.json").read_text())["kernels"]["entries"]
    name = next(n for n in sorted(entries) if n.startswith("fused_"))
    r = cli("inspect", model_dir, "--device", preset, "--source", name)
    assert r.returncode == 0, r.stderr
    assert entries[name]["entry"] in r.stdout and len(r.stdout.splitlines()) > 3
    assert r.stdout in (pkg / entries[name]["file"]).read_text()
    assert_one_line_error(cli("inspect", model_dir, "--device", preset, "--source", "no_such_kernel"),
                          "no kernel 'no_such_kernel'", "--kernels")


@pytest.mark.parametrize("device", [None, "cpu-opencl", "h100"])
def test_inspect_memory(model_dir, device):
    """The memory plan, weights and KV cache; h100's float16 cache half cpu-opencl's float32 one."""
    extra = ("--device", device) if device else ()
    kv = 32768 if device == "h100" else 65536
    r = cli("inspect", model_dir, "--memory", "--json", *extra)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert [(a["function"], a["seq_len"]) for a in m["activations"]] == [
        ("prefill", 128), ("prefill", 256), ("prefill", 512), ("decode", 1)]
    assert all(0 < a["planned_bytes"] <= a["unplanned_bytes"] for a in m["activations"])
    assert m["context_window"] == 128 and m["kv_cache_bytes"] == kv and m["weights_bytes"] > 0
    assert m.get("kv_cache_dtype") == {None: None, "cpu-opencl": "float32", "h100": "float16"}[device]
    table = cli("inspect", model_dir, "--memory", *extra)
    assert table.returncode == 0 and "decode" in table.stdout
    assert f"KV cache {kv / 1000:.1f} KB" + (f" ({m['kv_cache_dtype']})" if device else ",") in table.stdout


# ---- bad input ---------------------------------------------------------------------------------

def test_unknown_model_path(tmp_path):
    assert_one_line_error(cli("compile", tmp_path / "nope", "-o", tmp_path / "out"), "does not exist")
    assert_one_line_error(cli("run", tmp_path / "nope", "--device", "cpu-opencl", "--prompt", "hi"), "does not exist")
    assert not (tmp_path / "out").exists()


def test_unknown_preset(model_dir, tmp_path):
    assert_one_line_error(cli("compile", model_dir, "--device", "cpu-opencll", "-o", tmp_path / "o"),
                          "unknown device preset 'cpu-opencll'", "did you mean 'cpu-opencl'?")


def test_invalid_yaml_preset(model_dir, tmp_path):
    (tmp_path / "p.yaml").write_text("name: x\ntarget: {kind: opencl\n")
    assert_one_line_error(cli("compile", model_dir, "--device", tmp_path / "p.yaml", "-o", tmp_path / "o"),
                          "is not valid YAML at line")


def test_preset_with_an_unknown_key(model_dir, tmp_path):
    (tmp_path / "p.yaml").write_text("name: x\ntarget:\n  kind: opencl\n  threads_per_blok: 64\n")
    assert_one_line_error(cli("compile", model_dir, "--device", tmp_path / "p.yaml", "-o", tmp_path / "o"),
                          "unknown key 'threads_per_blok'", "did you mean 'threads_per_block'?")


def test_bad_override(model_dir, tmp_path):
    assert_one_line_error(cli("compile", model_dir, "--override", "chunk=3", "-o", tmp_path / "o"), "unknown key 'chunk'")


def test_file_changed_after_compile(opencl_package, tmp_path):
    pkg = copy_package(opencl_package, tmp_path / "pkg")
    with open(pkg / "kernels" / "kernels.cl", "a") as f:
        f.write("\n// edited\n")
    assert_one_line_error(cli("run", pkg, "--prompt", "hi"), "kernels/kernels.cl", "changed after compile")
    assert_one_line_error(run_package(pkg, "run", "--prompt", "hi"), "kernels/kernels.cl", "changed after compile")


def test_truncated_params_shard(opencl_package, tmp_path):
    pkg = copy_package(opencl_package, tmp_path / "pkg")
    shard = pkg / "params" / "params-00000.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    assert_one_line_error(cli("run", pkg, "--prompt", "hi"), "params/params-00000.safetensors", "sha256 mismatch")
    rehash(pkg, "params/params-00000.safetensors")  # past the hash check, the safetensors reader notices
    assert_one_line_error(cli("run", pkg, "--prompt", "hi"), "params-00000.safetensors")
    assert_one_line_error(cli("bench", pkg), "params-00000.safetensors")


def test_newer_package_format(opencl_package, tmp_path):
    pkg = copy_package(opencl_package, tmp_path / "pkg")
    m = json.loads((pkg / "manifest.json").read_text())
    (pkg / "manifest.json").write_text(json.dumps({**m, "format_version": 99}))
    for r in (cli("run", pkg, "--prompt", "hi"), cli("chat", pkg), cli("verify", pkg), run_package(pkg, "run", "--prompt", "hi")):
        assert_one_line_error(r, "package format 99 is newer than this runtime supports")


def test_missing_manifest(opencl_package, tmp_path):
    pkg = copy_package(opencl_package, tmp_path / "pkg")
    (pkg / "manifest.json").unlink()
    assert_one_line_error(cli("run", pkg, "--prompt", "hi"), "no manifest.json")


def test_package_for_another_device(opencl_package):
    assert_one_line_error(cli("run", opencl_package, "--device", "cpu-webgpu", "--prompt", "hi"),
                          "compiled for cpu-opencl")


def test_output_that_is_not_a_package_is_refused(model_dir, tmp_path):
    out = tmp_path / "dist" / "mine"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("keep me")
    for force in ((), ("--force",)):  # never, --force or not: only a package deploycc wrote is replaced
        assert_one_line_error(cli("compile", model_dir, "-o", out, *force), "is not a deploycc package", "--force")
        assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
        assert [p.name for p in out.parent.iterdir()] == ["mine"]  # no temporary directory left beside it
    needs("opencl")
    (out / "notes.txt").unlink()
    assert cli("compile", model_dir, "-o", out).returncode == 0  # an empty directory is used
    assert_one_line_error(cli("compile", model_dir, "-o", out), "holds a deploycc package", "--force")
    assert cli("compile", model_dir, "-o", out, "--force").returncode == 0  # a package is replaced with --force


def test_no_runtime_for_the_backend(model_dir, tmp_path):
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    r = cli("compile", model_dir, "--device", "h100", "-o", tmp_path / "cuda")
    assert r.returncode == 0, r.stderr
    assert_one_line_error(cli("run", tmp_path / "cuda", "--prompt", "hi"), "no cuda runtime", "cupy")
    assert_one_line_error(run_package(tmp_path / "cuda", "chat"), "no cuda runtime", "cupy")


def test_interrupted_compile_leaves_no_package(model_dir, tmp_path, monkeypatch):
    import deploycc.package

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(deploycc.package, "_write_params", boom)
    dist = tmp_path / "dist"
    with pytest.raises(KeyboardInterrupt):
        deploycc.package.compile_model(str(model_dir), "cpu-opencl", out=str(dist / "pkg"))
    assert list(dist.iterdir()) == []
    monkeypatch.undo()
    deploycc.package.compile_model(str(model_dir), "cpu-opencl", out=str(dist / "pkg"))
    before = (dist / "pkg" / "manifest.json").read_text()
    monkeypatch.setattr(deploycc.package, "_write_params", boom)
    with pytest.raises(KeyboardInterrupt):  # an interrupted recompile keeps the old package intact
        deploycc.package.compile_model(str(model_dir), "cpu-opencl", out=str(dist / "pkg"), force=True)
    assert [p.name for p in dist.iterdir()] == ["pkg"] and (dist / "pkg" / "manifest.json").read_text() == before


def test_empty_prompt(opencl_package):
    assert_one_line_error(cli("run", opencl_package, "--prompt", "", "--no-chat"), "encodes to no tokens")
    assert_one_line_error(run_package(opencl_package, "run", "--prompt", "", "--no-chat"), "encodes to no tokens")


def test_model_without_a_chat_template(model_dir, tmp_path):
    needs("opencl")
    src = shutil.copytree(model_dir, tmp_path / "model")
    config = json.loads((src / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    assert cli("compile", src, "-o", tmp_path / "pkg").returncode == 0
    assert_one_line_error(cli("chat", tmp_path / "pkg"), "has no chat template", "--no-chat")
    assert_one_line_error(run_package(tmp_path / "pkg", "chat"), "has no chat template")
    r = cli("run", tmp_path / "pkg", "--prompt", "Hello", "--max-tokens", "4", "--json")  # plain text without a template
    assert r.returncode == 0 and json.loads(r.stdout)["prompt_ids"] == json.loads(
        cli("run", tmp_path / "pkg", "--prompt", "Hello", "--no-chat", "--max-tokens", "1", "--json").stdout)["prompt_ids"]
