"""The cpu target end to end: C kernels compiled into PKG/kernels/kernels.so at compile time, each prefill and
decode step one native call (deploycc/vm/capture.py), the same package run launch by launch for comparison.

Packages are compiled from the tiny fixtures (llama-gqa1 in q4f16_1 with a byte-level BPE tokenizer, gpt2-odd in
q0f32) with `--device cpu` (-march=native) into tmp_path. Tolerances: `deploycc verify` against the numpy
reference at its default for the package (largest |logit difference| 1e-3, measured 1e-7; for decode on 8-bit
activations the relative RMS deploycc/verify.py sets, at most 0.1); native steps against the same package launch by launch, and
between thread counts, at 1e-6 (measured: 0, both run the same kernels on the same rows, only the barriers
between launches differ). Needs a C compiler (conftest.require_cc: `make test` installs gcc).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_cc
from test_package_cli import STATS, cli, run_package, with_tokenizer

from fixtures import make_tiny

ATOL = 1e-6  # native steps vs launch by launch, and thread counts: the same kernels on the same rows
FUNCTIONS = ("prefill", "prefill_all", "decode")  # the single-sequence engine's; packages also have step
# (fixture, quantization, overrides) of the packages the tests share, compiled once per module
PACKAGES = {"llama-q4": ("llama-gqa1", "q4f16_1", ()), "gpt2-f32": ("gpt2-odd", "q0f32", ()),
            "gpt2-chunk8": ("gpt2-odd", "q0f32", ("prefill_chunk=8",)),
            "llama-1thread": ("llama-gqa1", "q4f16_1", ("target.num_threads=1",)),
            "llama-3threads": ("llama-gqa1", "q4f16_1", ("target.num_threads=3",))}
# Nothing of the compiler side may load when a package runs.
FORBIDDEN = {"deploycc", "click", "rich", "yaml", "torch", "transformers"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """name of PACKAGES (or (name, preset)) -> package directory, compiled on first use."""
    require_cc()
    from deploycc.package import compile_model

    root = tmp_path_factory.mktemp("cpu-packages")
    llama = with_tokenizer(make_tiny("llama-gqa1"), root / "llama-gqa1")
    made: dict = {}

    def get(name: str, device: str = "cpu") -> Path:
        if (name, device) not in made:
            fixture, quant, overrides = PACKAGES[name]
            source = llama if fixture == "llama-gqa1" else make_tiny(fixture)
            out = root / f"{name}-{device}"
            made[name, device] = compile_model(str(source), device, quantization=quant, overrides=overrides, out=str(out))
        return made[name, device]
    return get


def manifest(pkg: Path) -> dict:
    return json.loads((pkg / "manifest.json").read_text())


def engines(pkg: Path):
    """(native, launch by launch) engines of one package."""
    from deploycc.runtime.engine import Engine

    native, stepwise = Engine.load(pkg), Engine.load(pkg, native_steps=False)
    assert native.native_steps is True and stepwise.native_steps is False
    assert all(native.vm.functions[f].native is not None for f in FUNCTIONS)
    assert all(stepwise.vm.functions[f].native is None for f in FUNCTIONS)
    return native, stepwise


def prompt(engine, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, engine.vocab_size, n).astype(np.int32)


def assert_same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.shape == b.shape and np.isfinite(a).all(), what
    diff = float(np.abs(a - b).max())
    assert diff <= ATOL, f"{what}: native and launch-by-launch logits differ by {diff:.3g} > {ATOL}"


def count_native_calls(engine) -> dict[str, int]:
    """Wrap each function's native call with a counter (the call itself still runs)."""
    counts = dict.fromkeys(FUNCTIONS, 0)
    for f in FUNCTIONS:
        prologue, epilogue, call, slots, values = engine.vm.functions[f].native

        def counted(call=call, f=f):
            counts[f] += 1
            call()
        engine.vm.functions[f].native = (prologue, epilogue, counted, slots, values)
    return counts


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


# ---- the package -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama-q4", "gpt2-f32"])
def test_compile_writes_a_native_package_that_verifies(compiled, name):
    """kernels.c and kernels.so in the package, hashed; the manifest says language c, target cpu, and names the
    flags the .so needs (this CPU's, for isa native); `deploycc verify` passes against numpy at 1e-3."""
    from deploycc.runtime import native

    pkg = compiled(name)
    m = manifest(pkg)
    assert m["target"]["kind"] == "cpu" and m["target"]["isa"] == "native" and m["preset"]["backend"] == "cpu"
    assert m["kernels"]["language"] == "c" and m["quantization"] == PACKAGES[name][1]
    so, c = pkg / "kernels" / "kernels.so", pkg / "kernels" / "kernels.c"
    assert so.read_bytes()[:4] == b"\x7fELF" and c.is_file()
    for f in (so, c):
        rel = str(f.relative_to(pkg))
        assert m["files"][rel] == hashlib.sha256(f.read_bytes()).hexdigest(), rel
    source = c.read_text()
    for e in m["kernels"]["entries"].values():
        assert e["file"] == "kernels/kernels.c" and f" {e['entry']}(" in source, e
    nat = m["kernels"]["native"]
    assert nat["library"] == "kernels/kernels.so" and nat["isa"] == "native"
    assert nat["cpu_flags"] == native.isa_flags("native") and set(nat["cpu_flags"]) <= (native.cpu_flags() or set())
    assert nat["compiler"] == " ".join(native.compiler())
    assert set(nat["weights"]) <= {p["name"] for p in m["params"]} and len(nat["weights"]) == len(set(nat["weights"]))
    assert set(nat["functions"]) == {*FUNCTIONS, "step", "step_all"}
    # the 4-bit weights' layout (InterleavedScheme where the CPU has AVX2 or AVX-512, 8- or 16-bit activations alike),
    # recorded for the reader
    from deploycc.runtime import native as nat_rt

    wide = (nat.get("integer_activations") and m["quantization"].startswith("q4")
            and nat_rt.weight_interleave(m["target"]["isa"]))
    assert nat["weight_layout"] == ("interleaved16" if wide else "plain")
    for f, info in nat["functions"].items():
        assert info["symbol"] == f"dcc_{f}" and f"void dcc_{f}(const dcc_ctx* c)" in source
        assert info["heap"] == ["seq_len", "total_len", "batch", "pages_len"] and info["prologue"] >= 1
    r = cli("verify", pkg, "--steps", "4", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    v = json.loads(r.stdout)
    # float kernels: largest |logit difference| 1e-3; integer kernels on 8- or 16-bit activations (recorded per weight as
    # kernels.native.activations, which verify rounds alike in its reference): the 90th percentile of the
    # positions' relative RMS difference, held to twice the reference's own spread when its rounding inputs move
    # (deploycc/verify.py); this tiny model measures below 1e-6
    if nat.get("integer_activations"):
        from deploycc.verify import FLOAT_FLOOR, NOISE_FACTOR, QUANTILE

        assert nat["activations"] and set(nat["activations"].values()) <= {8, 16}  # calibrate.py's choice
        assert v["metric"] == QUANTILE and v["tolerance"] == NOISE_FACTOR * v["noise"] + FLOAT_FLOOR
        assert v[QUANTILE] <= 1e-4
    else:
        assert (v["metric"], v["tolerance"]) == ("max_abs_diff", 1e-3)
    assert v["passed"] and v["backend"] == "cpu", v["failure"]
    assert v[v["metric"]] <= v["tolerance"] and v["top1_agreement"] >= 0.9


@pytest.mark.parametrize("name", ["llama-q4", "gpt2-f32"])
def test_native_steps_equal_launch_by_launch(compiled, name):
    """prefill of 17 tokens, prefill_all of the same, and 5 greedy decode steps: the native step functions
    give the logits of the bytecode run launch by launch (1e-6), and every step went through its native call."""
    native, stepwise = engines(compiled(name))
    counts = count_native_calls(native)
    ids = prompt(native, 17)
    a, b = native.prefill(ids), stepwise.prefill(ids)
    assert_same(a, b, "prefill")
    first = a
    for step in range(5):
        tok = int(np.argmax(b))
        a, b = native.decode(tok), stepwise.decode(tok)
        assert_same(a, b, f"decode {step}")
    assert native.cache.length == stepwise.cache.length == 22
    native.reset()
    stepwise.reset()
    rows_a, rows_b = native.prefill(ids, all_logits=True), stepwise.prefill(ids, all_logits=True)
    assert rows_a.shape == (17, native.vocab_size)
    assert_same(rows_a, rows_b, "prefill_all")
    assert counts == {"prefill": 1, "prefill_all": 1, "decode": 5}
    if not manifest(compiled(name))["kernels"]["native"].get("integer_activations"):
        # float kernels: prefill's one row of logits is prefill_all's last (a GEMV on 8-bit activations is not)
        assert_same(rows_a[-1], first, "prefill_all's last row vs prefill")


def test_two_native_engines_keep_their_own_caches(compiled):
    """Two engines of one package in one process share the loaded kernels.so but not its pointers: decodes of two
    prompts interleaved give each prompt's logits of a fresh engine that ran it alone (1e-6)."""
    from deploycc.runtime.engine import Engine

    pkg = compiled("llama-q4")
    first, second = Engine.load(pkg), Engine.load(pkg)
    assert first.lib._handle == second.lib._handle  # dlopen of one path: one module, one pool
    prompts = [prompt(first, 9, seed=1), prompt(first, 13, seed=2)]

    def alone(ids) -> list[np.ndarray]:
        e = Engine.load(pkg)
        out = [e.prefill(ids)]
        for _ in range(6):
            out.append(e.decode(int(np.argmax(out[-1]))))
        return out

    want = [alone(p) for p in prompts]
    assert float(np.abs(want[0][-1] - want[1][-1]).max()) > 1e-3  # the two prompts are told apart
    got = [[first.prefill(prompts[0])], [second.prefill(prompts[1])]]
    for _ in range(6):
        for e, out in zip((first, second), got):
            out.append(e.decode(int(np.argmax(out[-1]))))
    assert (first.cache.length, second.cache.length) == (15, 19)
    for i in range(2):
        for step, (g, w) in enumerate(zip(got[i], want[i])):
            assert_same(g, w, f"prompt {i} step {step}")


def test_prompt_longer_than_the_prefill_chunk(compiled):
    """prefill_chunk 8, context window 64: a 59-token prompt prefills in 8 native calls (7 full chunks and 3
    tokens) and 5 decodes fill the window exactly; every logit equals launch by launch (1e-6)."""
    pkg = compiled("gpt2-chunk8")
    m = manifest(pkg)
    assert m["bounds"] == {"context_window": 64, "prefill_chunk": 8}
    native, stepwise = engines(pkg)
    counts = count_native_calls(native)
    ids = prompt(native, 59, seed=3)
    a, b = native.prefill(ids), stepwise.prefill(ids)
    assert_same(a, b, "chunked prefill")
    assert counts["prefill"] == math.ceil(59 / 8) == 8
    for step in range(5):
        tok = int(np.argmax(b))
        a, b = native.decode(tok), stepwise.decode(tok)
        assert_same(a, b, f"decode {step} at position {59 + step}")
    assert native.cache.length == 64 == native.context_window
    native.reset()
    stepwise.reset()
    rows = native.prefill(ids, all_logits=True)
    assert rows.shape == (59, native.vocab_size) and counts["prefill_all"] == 8
    assert_same(rows, stepwise.prefill(ids, all_logits=True), "chunked prefill_all")
    # verify's longest prompt is prefill_chunk + 3 tokens: two native prefill calls against numpy at 1e-3
    r = cli("verify", pkg, "--steps", "2", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["passed"], r.stderr[-3000:]


def test_thread_count_changes_no_logit(compiled):
    """target.num_threads 1 and 3 (on any machine: 3 oversubscribes the 2-core one): each package's pool starts
    num_threads - 1 workers when its kernels.so loads, and the logits equal the default pool's (1e-6)."""
    from deploycc.runtime.engine import Engine

    base = Engine.load(compiled("llama-q4"))
    ids = prompt(base, 17, seed=4)
    want = [base.prefill(ids)]
    for _ in range(3):
        want.append(base.decode(int(np.argmax(want[-1]))))
    for name, threads in (("llama-1thread", 1), ("llama-3threads", 3)):
        pkg = compiled(name)
        assert manifest(pkg)["target"]["num_threads"] == threads
        before = threads_now()
        e = Engine.load(pkg)
        assert threads_now() - before == threads - 1, name
        got = [e.prefill(ids)]
        for _ in range(3):
            got.append(e.decode(int(np.argmax(got[-1]))))
        for step, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{name} step {step}")


@pytest.mark.parametrize("preset,isa", [("cpu-avx2", "x86-64-v3"), ("cpu-avx512", "x86-64-v4")])
def test_isa_presets(compiled, preset, isa):
    """A package for a named ISA records exactly that ISA's flags; on a CPU that has them it verifies (1e-3),
    on one that lacks them `run` is one line naming the missing flags."""
    from deploycc.runtime import native

    pkg = compiled("llama-q4", preset)
    m = manifest(pkg)
    assert m["target"]["isa"] == m["kernels"]["native"]["isa"] == isa
    assert m["kernels"]["native"]["cpu_flags"] == sorted(native.ISA_FLAGS[isa])
    lacking = sorted(set(native.ISA_FLAGS[isa]) - (native.cpu_flags() or set()))
    if lacking:
        r = cli("run", pkg, "--prompt", "hi")
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"lacks ({', '.join(lacking)})" in r.stderr and "compile it for this machine" in r.stderr
        return
    r = cli("verify", pkg, "--steps", "2", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["passed"], r.stderr[-3000:]


# ---- the command lines -------------------------------------------------------------------------

def test_package_runs_alone(compiled, tmp_path):
    """`python PKG run` with the runtime's dependencies only: deploycc not importable (-S, site-packages on
    PYTHONPATH without its .pth files), no C compiler on PATH; the text of `deploycc run --json`, and nothing of
    the compiler side imported."""
    import numpy

    pkg = compiled("llama-q4")
    ours = cli("run", pkg, "--prompt", "hi", "--max-tokens", "4", "--json")
    assert ours.returncode == 0, ours.stderr
    expected = json.loads(ours.stdout)
    assert len(expected["generated"]) == 4
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=str(bare), PYTHONPATH=str(Path(numpy.__file__).parents[1]))

    def alone(*args):
        return subprocess.run([sys.executable, "-S", *map(str, args)], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env=env)

    no = alone("-c", "import deploycc")
    assert no.returncode == 1 and "No module named 'deploycc'" in no.stderr
    r = alone("-X", "importtime", pkg, "run", "--prompt", "hi", "--max-tokens", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == expected["text"] + "\n"
    stats = [ln for ln in r.stderr.splitlines() if not ln.startswith("import time:")]
    assert len(stats) == 1 and STATS.match(stats[0]) and STATS.match(stats[0])[2] == "4", stats
    imported = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", r.stderr, re.M)}
    assert {"runtime", "numpy", "tokenizers", "ctypes"} <= imported
    assert not imported & FORBIDDEN, imported & FORBIDDEN
    itself = run_package(pkg, "run", "--prompt", "hi", "--max-tokens", "4", "--json")
    assert itself.returncode == 0 and json.loads(itself.stdout)["generated"] == expected["generated"]


def test_bench_profile(compiled):
    """bench --profile on a cpu package: the host's time outside the native decode call, and every decode launch
    timed running the same bytecode launch by launch (as many per token as the decode function launches)."""
    pkg = compiled("llama-q4")
    r = cli("bench", pkg, "--prompt-len", "8", "--gen-len", "4", "--repeat", "1", "--profile", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["preset"] == "cpu" and out["decode_tok_s"] > 0 and out["prefill_tok_s"] > 0
    p = out["profile"]
    for key in ("host_ms_per_token", "kernel_ms_per_token", "wall_ms_per_token"):
        assert math.isfinite(p[key]) and p[key] > 0, (key, p[key])
    decode = json.loads((pkg / "bytecode.json").read_text())["functions"]["decode"]
    launches = sum(1 for i in decode["instructions"] if i.get("fn") == "vm.launch")
    assert p["kernels"] and p["launches_per_token"] == launches == sum(k["launches_per_token"] for k in p["kernels"])
    entries = manifest(pkg)["kernels"]["entries"]
    assert all(k["kernel"] in entries and k["us_each"] > 0 for k in p["kernels"])
    assert abs(sum(k["share"] for k in p["kernels"]) - 1) < 1e-6


def test_bench_roofline(compiled):
    """bench --roofline: the package's own bandwidth probe before and after (one thread, all threads: finite,
    positive), the weight bytes a decode step streams (every quantized weight of the step but the embedding lookup's
    table, of which one row: the manifest's weights give the bound), KV bytes at the prompt's context, achieved GB/s
    consistent with the step time, and each kernel's weight bytes and GB/s; the integer dot probe (8- and 16-bit
    activations), and per matmul its operations per weight byte, Gop/s and share of the probe."""
    pkg = compiled("llama-q4")
    r = cli("bench", pkg, "--prompt-len", "8", "--gen-len", "4", "--repeat", "1", "--roofline", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    roof = out["roofline"]
    for probe in (roof["bandwidth_before"], roof["bandwidth_after"]):
        assert all(math.isfinite(probe[k]) and probe[k] > 0 for k in ("one_thread_gb_s", "all_threads_gb_s")), probe
    m = manifest(pkg)
    assert 0 < roof["weight_bytes_per_step"] <= m["memory"]["weights_bytes"]
    kv = m["kv_cache"]
    assert roof["kv_bytes_per_step"] == 2 * kv["layers"] * 8 * kv["kv_heads"] * kv["head_dim"] * 4
    step = (roof["weight_bytes_per_step"] + roof["kv_bytes_per_step"]) / (roof["step_ms"] / 1e3) / 1e9
    assert roof["achieved_gb_s"] == pytest.approx(step, rel=1e-6)
    linears = [k for k in out["profile"]["kernels"] if k["weight_mb_per_launch"] > 0]
    assert linears and all(k["gb_s"] > 0 for k in linears)
    # arithmetic: the dot probe, and each matmul's operations from the manifest's multiply-adds per row, which over a
    # decode step add up to the model's linears (attention, norms and the lookup are not matmuls of weights)
    peak = roof["bandwidth_before"]["dot_gops"]
    assert all(math.isfinite(peak[b]) and peak[b] > 0 for b in ("8", "16")), peak
    entries = m["kernels"]["entries"]
    matmuls = [k for k in out["profile"]["kernels"] if "macs_per_row" in entries[k["kernel"]]]
    c = m["model"]["hf_config"]
    h, q, kv = c["hidden_size"], c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * c["intermediate_size"]
    assert sum(entries[k["kernel"]]["macs_per_row"] * k["launches_per_token"] for k in matmuls) == \
        c["num_hidden_layers"] * per_layer + c["vocab_size"] * h
    for k in matmuls:
        w = entries[k["kernel"]]
        ops = 2 * w["macs_per_row"] * k["launches_per_token"]
        assert k["ops_per_byte"] == pytest.approx(ops / (k["weight_mb_per_launch"] * 1e6 * k["launches_per_token"]))
        assert k["gops"] == pytest.approx(ops / k["ms_per_token"] / 1e6)
        if "activation_bits" in w:  # an integer kernel, against the dot probe of its activations' width
            assert w["activation_bits"] in (8, 16) and k["compute_share"] > 0
    assert sum("compute_share" in k for k in matmuls) >= len(matmuls) - 1  # all but the down projection (K = 56)


def test_profile_gives_the_native_calls_back(compiled):
    """runtime/bench.py profile_decode swaps the decode call for a timed one, then runs launch by launch: afterwards
    every function runs natively again, and decodes equal a fresh engine's (1e-6)."""
    from deploycc.runtime.bench import profile_decode
    from deploycc.runtime.engine import Engine

    pkg = compiled("llama-q4")
    engine = Engine.load(pkg)
    before = {f: engine.vm.functions[f].native for f in FUNCTIONS}
    p = profile_decode(engine, prompt_len=8, steps=4)
    assert p["host_ms_per_token"] > 0 and p["kernels"]
    assert {f: engine.vm.functions[f].native for f in FUNCTIONS} == before
    counts = count_native_calls(engine)
    engine.reset()
    fresh = Engine.load(pkg)
    ids = prompt(engine, 5, seed=5)
    assert_same(engine.prefill(ids), fresh.prefill(ids), "prefill after profiling")
    assert_same(engine.decode(7), fresh.decode(7), "decode after profiling")
    assert counts == {"prefill": 1, "prefill_all": 0, "decode": 1}


def test_the_same_kernels_are_compiled_once(tmp_path, monkeypatch):
    """kernels.so goes through the native cache (runtime/native.py build_package_library): a second compile of the
    same model copies the library the first built (the C compiler, a wrapper that logs its runs, runs once); a
    damaged cache entry is built again and replaced; another compiler (the wrapper changed) builds anew."""
    require_cc()
    from deploycc.package import compile_model
    from deploycc.runtime import native

    cc, log = native.compiler(), tmp_path / "cc.log"
    wrapper = tmp_path / "cc"
    wrapper.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec {" ".join(cc)} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setenv("DEPLOYCC_HOME", str(tmp_path / "home"))
    src = make_tiny("gpt2-odd")

    def compile_to(name: str) -> bytes:
        out = compile_model(str(src), "cpu", quantization="q0f32", out=str(tmp_path / name))
        return (out / "kernels" / "kernels.so").read_bytes()

    def runs() -> int:
        return len(log.read_text().split())
    first = compile_to("a")
    assert runs() == 1
    assert compile_to("b") == first and runs() == 1
    [entry] = (tmp_path / "home" / "native").glob("*.so")
    assert entry.read_bytes() == first
    entry.write_bytes(first[:4096])  # truncated: not a whole shared object
    assert compile_to("c") == first and runs() == 2
    assert entry.read_bytes() == first
    wrapper.write_text(wrapper.read_text() + "\n")  # another compiler (size and time changed)
    assert compile_to("d") == first and runs() == 3
    assert [p.name for p in (tmp_path / "home" / "native").iterdir()
            if p.name.startswith(native.CC_WORK)] == []  # no work directory left in the cache
