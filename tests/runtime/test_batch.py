"""Continuous batching (runtime/batch.py) over a package's page pool, on real kernels.

Packages of tiny models (tests/fixtures.py) with small pools and prefill chunks, so that steps mix decodes
with chunked prompts, pages run out and sequences are preempted:

- batch invariance: every sequence of a concurrent batch gets bit for bit the logits it gets alone (a batch of
  one), whatever shares its steps, on the native cpu target; on PoCL and lavapipe too, within float noise of
  the single-sequence engine (1e-4, q0f32);
- a prompt longer than the step budget is prefilled in chunks between other sequences' decodes, and no step
  holds more tokens than the prefill chunk or more sequences than the pool serves;
- preemption: when the pool is full, the sequence admitted last gives its pages back and is recomputed
  later, with the same logits; every page is back in the pool at the end;
- generation: per-request sampling (temperature, top-p, seed) in one batch equals each request alone;
- refusals: an engine of a package without a pool, a batch bound past the compiled one.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import missing, require_cc, require_cxx, require_device

from deploycc.package import compile_model
from deploycc.runtime.batch import Batcher
from deploycc.runtime.engine import Engine
from deploycc.runtime.package import PackageError
from deploycc.runtime.vm import VMError
from fixtures import make_tiny

X32 = "qwen3-x32"  # every matmul on the integer kernels (tests/fixtures.py)
PRESETS = {"cpu": "cpu", "opencl": "cpu-opencl", "webgpu": "cpu-webgpu", "cuda-emu": "h100"}


def compiled(tmp_path_factory, model: str, preset: str, quant: str = "q0f32", pool: int = 64, chunk: int = 16):
    """ctx 64, steps of `chunk` tokens, a pool of `pool` tokens (pages of 16) for up to 4 sequences."""
    out = tmp_path_factory.mktemp(f"{model}-{preset}") / "pkg"
    return compile_model(str(make_tiny(model)), preset, quant, context_window=64, out=str(out),
                         overrides=(f"prefill_chunk={chunk}", "max_num_sequences=4", f"kv_pool_tokens={pool}"))


def prompts(vocab: int, lengths=(5, 21, 1, 12), seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in lengths]


def greedy(session, ids: list[int], steps: int, prefilled: threading.Barrier | None = None) -> list[np.ndarray]:
    """Logits of the prompt, then of `steps` greedy tokens (after every thread's prefill, given a barrier)."""
    out = [session.prefill(ids)]
    if prefilled is not None:
        prefilled.wait(timeout=300)
    for _ in range(steps):
        out.append(session.decode(int(np.argmax(out[-1]))))
    return out


def concurrently(batcher: Batcher, work: list, steps: int, overlap: bool = False) -> list:
    """Each prompt greedy in a thread of its own; with `overlap`, no sequence decodes before all have prefilled
    (so all of them hold pages at once, whatever the threads' timing)."""
    results: list = [None] * len(work)
    prefilled = threading.Barrier(len(work)) if overlap else None

    def run(i):
        s = batcher.session()
        try:
            results[i] = greedy(s, work[i], steps, prefilled)
        finally:
            s.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def alone(batcher: Batcher, work: list, steps: int) -> list:
    out = []
    for ids in work:
        s = batcher.session()
        out.append(greedy(s, ids, steps))
        s.close()
    return out


@pytest.mark.parametrize("preset", ["cpu", "cpu-avx2"])
def test_a_batch_gives_each_sequence_its_own_logits_bit_for_bit(tmp_path_factory, preset):
    """Four sequences (prompts of 5, 21, 1 and 12 tokens; 21 > the 16-token step) with 6 greedy decodes each,
    run at once and one by one on the native cpu target (4-bit weights: every matmul on the integer kernels
    with 8-bit activations, a row's arithmetic the same whatever rows share its tile; with this machine's
    ISA, interleaved weights where it has AVX-512 VNNI, and the AVX2 kernels): equal bits. Against the
    single-sequence engine (contiguous cache, another attention kernel) within 2e-2 (the 8-bit activations).
    The float row tiles of q0f32 and the OpenCL/WGSL kernels are not batch invariant to the bit (the C
    compiler reassociates): they agree within float noise (test_batched_steps_match...)."""
    require_cc()
    if preset == "cpu-avx2":
        from deploycc.runtime import native

        if not set(native.isa_flags("x86-64-v3")) <= (native.cpu_flags() or set()):
            missing("this CPU lacks AVX2")
    pkg = compiled(tmp_path_factory, X32, preset, "q4f16_2", pool=256)
    engine = Engine.load(pkg, paged=True)
    batcher = Batcher(engine)
    work = prompts(engine.vocab_size)
    together, solo = concurrently(batcher, work, 6), alone(batcher, work, 6)
    for i, (a, b) in enumerate(zip(together, solo)):
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), f"sequence {i} differs in a batch"
    assert batcher.stats["steps"] > 0 and engine.cache.pages_in_use == 0
    single = Engine.load(pkg)
    for ids, got in zip(work, solo):
        single.reset()
        want = [single.prefill(ids)] + [single.decode(int(np.argmax(x))) for x in got[:-1]]
        assert max(float(np.abs(x - y).max()) for x, y in zip(want, got)) < 2e-2


@pytest.mark.parametrize("backend", sorted(PRESETS))
def test_batched_steps_match_the_single_sequence_engine(tmp_path_factory, monkeypatch, backend):
    """On every backend (native C, PoCL, lavapipe, the CUDA emulation of an h100 package), q0f32: each sequence of a
    concurrent batch within 1e-4 (1e-3 with the CUDA presets' float16 cache, below) of the single-sequence engine's
    logits for the same tokens. The GPU presets' steps
    of up to 8 rows take the few-row GEMVs, those with the 17-token prompt the tiles (schedule/dispatch.py); their
    attention, up to 16 rows, the keys split over blocks and a combine, above, a block a row (steps of 32 tokens, so
    that both run; checked on the emulation by the kernels launched)."""
    launched: set = set()
    if backend == "cpu":
        require_cc()
    elif backend == "cuda-emu":
        require_cxx()
        monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "shuffle")
        from deploycc.runtime.devices.cuda import CUDADevice

        def spy(self, kernel, launcher=CUDADevice.launcher):
            site = launcher(self, kernel)

            def launch(*args):
                launched.add(kernel.name)
                return site(*args)
            return launch
        monkeypatch.setattr(CUDADevice, "launcher", spy)
    else:
        require_device(backend)
    pkg = compiled(tmp_path_factory, "qwen3-gqa2-headdim-window", PRESETS[backend], pool=256, chunk=32)
    engine = Engine.load(pkg, paged=True)
    batcher = Batcher(engine)
    work = prompts(engine.vocab_size, (9, 3, 17))
    together = concurrently(batcher, work, 5)
    if backend == "cuda-emu":
        attention = {k for k in launched if k.startswith("attention")}
        # the split form up to SPLIT_ROWS rows, one launch (its last block to arrive combines: no _merge on CUDA)
        assert {k for k in attention if k.endswith("_part")} and not {k for k in attention if k.endswith("_merge")}
        assert {k for k in attention if not k.endswith(("_part", "_merge"))}, attention
        # the final norm of the sequences' last tokens: one kernel, a block a row (tests/transform/test_fuse_gathers.py)
        assert [k for k in launched if "take_rms_norm" in k] == ["fused_reshape_reshape_take_rms_norm"], launched
    single = Engine.load(pkg)
    # the GPU presets' float16 cache: a key or value within the two engines' float32 difference (the batched step's
    # tiles against the single engine's GEMVs) of a tie between two halves rounds to either in each, which moves the
    # fixture's logits by up to about 2e-4 (measured 1.6e-4)
    tol = 1e-3 if engine.manifest["kv_cache"]["dtype"] == "float16" else 1e-4
    for ids, got in zip(work, together):
        single.reset()
        want = [single.prefill(ids)] + [single.decode(int(np.argmax(x))) for x in got[:-1]]
        assert max(float(np.abs(x - y).max()) for x, y in zip(want, got)) < tol
    assert engine.cache.pages_in_use == 0


@pytest.mark.parametrize("backend", ["cuda-emu", "webgpu", "opencl"])
def test_a_step_of_one_token_runs_step_one(tmp_path_factory, monkeypatch, backend):
    """The CUDA presets' packages have step_one (deploycc/export.py: one_token_step), the step of one token, so of one
    sequence decoding (a server with one client): its shapes are constants, so its linears are the decode GEMVs with
    the norms and the gated product folded in, where step's rows are known only at run time. A prompt of 21 tokens
    in chunks, 6 steps of its sequence alone, 3 beside a second sequence, 3 alone again: the steps of one token run
    step_one, the others step, and every logit is within the tolerance above of the single-sequence engine's for the
    same tokens (the sliding-window fixture: a ring of window rows in decode, the page pool here); with
    DEPLOYCC_STEP_ONE=0 a step of one token runs step, to the same logits. The other presets'
    packages (cpu-webgpu, cpu-opencl) have no step_one (deploycc/package.py: one_token_step): their steps are what
    they were."""
    if backend == "cuda-emu":
        require_cxx()
        monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "shuffle")
    else:
        require_device(backend)
    pkg = compiled(tmp_path_factory, "qwen3-gqa2-headdim-window", PRESETS[backend], pool=256, chunk=16)
    engine = Engine.load(pkg, paged=True)
    if backend != "cuda-emu":
        assert "step_one" not in engine.vm.functions and engine.step_function(1) == "step"
        return
    ran = []
    run = engine.vm.run
    engine.vm.run = lambda fn, *a, **k: (ran.append(fn), run(fn, *a, **k))[1]
    cache, rng = engine.cache, np.random.default_rng(2)
    tables = [cache.take(cache.pages_for(40)) for _ in range(2)]
    first, second = ([int(t) for t in rng.integers(0, engine.vocab_size, n)] for n in (21, 5))
    got = [engine.step(first[at:at + 16], [tables[0]], [at], [len(first[at:at + 16])]) for at in (0, 16)]
    other = engine.step(second, [tables[1]], [0], [5])
    mine, theirs, at = [got[-1][0]], [other[0]], [21, 5]
    for both in [False] * 6 + [True] * 3 + [False] * 3:
        ids = [int(np.argmax(mine[-1]))] + ([int(np.argmax(theirs[-1]))] if both else [])
        logits = engine.step(ids, tables[:len(ids)], at[:len(ids)], [1] * len(ids))
        mine.append(logits[0])
        if both:
            theirs.append(logits[1])
        at = [a + 1 for a in at[:len(ids)]] + at[len(ids):]
    assert ran == ["step"] * 3 + ["step_one"] * 6 + ["step"] * 3 + ["step_one"] * 3, ran
    single = Engine.load(pkg)
    tol = 1e-3 if engine.manifest["kv_cache"]["dtype"] == "float16" else 1e-4
    for ids, logits in ((first, mine), (second, theirs)):
        single.reset()
        want = [single.prefill(ids)] + [single.decode(int(np.argmax(x))) for x in logits[:-1]]
        assert len(want) == len(logits) and max(float(np.abs(x - y).max()) for x, y in zip(want, logits)) < tol
    monkeypatch.setenv("DEPLOYCC_STEP_ONE", "0")  # a lease's A/B: the step of one token as step
    again = engine.step([int(np.argmax(mine[-1]))], tables[:1], at[:1], [1])
    assert ran[-1] == "step" and engine.step_function(1) == "step"
    single.reset()
    single.prefill(first + [int(np.argmax(x)) for x in mine[:-1]])
    assert float(np.abs(single.decode(int(np.argmax(mine[-1]))) - again[0]).max()) < tol
    for table in tables:
        cache.give(table)


def test_step_one_on_every_architecture(tmp_path_factory, monkeypatch, tiny_name):
    """Every tiny architecture's h100 package (q0f32) under the CUDA emulation: a prompt of 6 tokens as a step, then
    3 steps of one token (step_one, traced with decode's folds: GPT-2's learned positions and layer norms, Gemma's
    softcaps and norms after the attention, sliding windows in a page pool, tied heads), each within 1e-3 of the
    single-sequence engine's decode (the preset's float16 cache, as above)."""
    require_cxx()
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "reverse")
    pkg = compiled(tmp_path_factory, tiny_name, "h100", pool=64, chunk=16)
    engine, single = Engine.load(pkg, paged=True), Engine.load(pkg)
    ran = []
    run = engine.vm.run
    engine.vm.run = lambda fn, *a, **k: (ran.append(fn), run(fn, *a, **k))[1]
    ids = [int(t) for t in np.random.default_rng(3).integers(0, engine.vocab_size, 6)]
    table = engine.cache.take(engine.cache.pages_for(10))
    got = [engine.step(ids, [table], [0], [6])[0]]
    for k in range(3):
        got.append(engine.step([int(np.argmax(got[-1]))], [table], [6 + k], [1])[0])
    engine.cache.give(table)
    assert ran == ["step", "step_one", "step_one", "step_one"], ran
    want = [single.prefill(ids)] + [single.decode(int(np.argmax(x))) for x in got[:-1]]
    assert max(float(np.abs(x - y).max()) for x, y in zip(want, got)) < 1e-3


def test_steps_respect_the_budget_and_prompts_are_chunked(tmp_path_factory):
    """A 40-token prompt arrives while three sequences decode: no step holds more than 16 tokens (the prefill
    chunk) or 4 sequences, the prompt is spread over several steps, and the decodes go on meanwhile. The steps' makeup
    does not hang on the threads' timing: each step gathers every sequence that holds pages (a long gather), and the
    first step of decodes alone waits for the long prompt to arrive (under a loaded CPU it once came after the
    decodes' last step)."""
    require_cc()
    pkg = compiled(tmp_path_factory, X32, "cpu", "q4f16_2", pool=512)
    engine = Engine.load(pkg, paged=True)
    steps = []
    step = engine.step

    arrived = []

    def recording(ids, tables, starts, counts):
        deadline = time.monotonic() + 60
        while max(counts) == 1 and not arrived and time.monotonic() < deadline:  # decodes alone: the long prompt first
            if any(len(q.ids) >= 40 for q in batcher.live):
                arrived.append(True)
            time.sleep(0.001)
        steps.append(list(counts))
        return step(ids, tables, starts, counts)

    engine.step = recording
    batcher = Batcher(engine, gather_seconds=30.0)
    work = prompts(engine.vocab_size, (3, 4, 5, 40))
    together = concurrently(batcher, work, 8)
    assert all(sum(c) <= 16 and len(c) <= 4 for c in steps)
    assert sum(1 for c in steps if max(c) > 1) >= 3  # the long prompt took several steps
    assert any(len(c) > 1 and 1 in c and max(c) > 1 for c in steps)  # a prompt chunk beside decodes
    solo = alone(batcher, work, 8)
    assert all(np.array_equal(x, y) for a, b in zip(together, solo) for x, y in zip(a, b))


def test_a_full_pool_preempts_and_recomputes(tmp_path_factory):
    """A pool of 64 tokens (4 pages) for three sequences that grow to 30 tokens each, all prefilled (3 pages)
    before any decodes, so that they need 6 pages at once: some are preempted (their pages taken back) and
    recomputed, with the same logits as alone; all pages come back."""
    require_cc()
    pkg = compiled(tmp_path_factory, X32, "cpu", "q4f16_2", pool=64)
    engine = Engine.load(pkg, paged=True)
    assert engine.cache.pages == 4
    batcher = Batcher(engine)
    work = prompts(engine.vocab_size, (14, 10, 12), seed=3)
    together = concurrently(batcher, work, 18, overlap=True)
    assert batcher.stats["preempted"] > 0
    solo = alone(batcher, work, 18)
    for a, b in zip(together, solo):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert engine.cache.pages_in_use == 0


def test_sampling_parameters_are_per_request(tmp_path_factory):
    """Requests with their own temperature, top-p, top-k and seed, batched together (the generation loop of
    runtime/generate.py in a thread each), sample what each samples alone."""
    require_cc()
    from tiny_package import compile_tiny_package

    from deploycc.runtime.generate import generate

    pkg = compile_tiny_package(tmp_path_factory.mktemp("sampling"), "cpu",
                               ("prefill_chunk=16", "max_num_sequences=4", "kv_pool_tokens=256"))
    engine = Engine.load(pkg, paged=True)
    batcher = Batcher(engine)
    options = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=0.8, top_p=0.9, seed=2),
               dict(temperature=1.0, seed=1, top_k=5)]
    texts = ["hello world", "the quick brown fox", "one two three", "hello world"]

    def tokens(i: int) -> list[int]:
        s = batcher.session()
        stats: dict = {}
        list(generate(s, engine.tokenizer, texts[i], max_tokens=12, chat=False, stats=stats, **options[i]))
        s.close()
        return stats["generated"]

    solo = [tokens(i) for i in range(4)]
    got: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, tokens(i))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == solo
    assert solo[0] != solo[3]  # the same prompt, greedy and sampled: temperature takes effect


def test_refusals(tmp_path_factory):
    require_cc()
    pkg = compiled(tmp_path_factory, X32, "cpu", "q4f16_2")
    engine = Engine.load(pkg, paged=True)
    with pytest.raises(ValueError, match="max_num_sequences must be 1..4"):
        Batcher(engine, 5)
    with pytest.raises(ValueError, match="paged=True"):
        Batcher(Engine.load(pkg))
    with pytest.raises(VMError, match="prefill and decode need the other"):
        engine.prefill([1, 2, 3])
    with pytest.raises(VMError, match="batched steps need the other"):
        Engine.load(pkg).step([1], [[0]], [0], [1])
    import json
    import shutil

    from bad_inputs.common import reseal

    old = tmp_path_factory.mktemp("old") / "pkg"  # as a package compiled before batching was
    shutil.copytree(pkg, old)
    for doc, edit in (("manifest.json", lambda m: m["kv_cache"].pop("pool")),
                      ("bytecode.json", lambda bc: [bc["functions"].pop(f) for f in ("step", "step_all")])):
        d = json.loads((old / doc).read_text())
        edit(d)
        (old / doc).write_text(json.dumps(d))
    native = json.loads((old / "manifest.json").read_text())
    for f in ("step", "step_all"):
        native["kernels"]["native"]["functions"].pop(f)
    (old / "manifest.json").write_text(json.dumps(native))
    reseal(old)
    with pytest.raises(PackageError, match="no batched step"):
        Engine.load(old, paged=True)
    assert Engine.load(old, paged="auto").paged is False  # run and chat fall back to the single-sequence engine


def test_a_shared_prefix_is_computed_once(tmp_path_factory):
    """Prefix caching: sequences whose prompts start with the same 40 tokens (two full pages of 16) share those
    pages: the later ones compute only the rest, with the logits (bit for bit) of a pool that never saw the
    prefix; the pages stay cached after their sequences end (not in use), and a pool that needs them takes
    them back."""
    require_cc()
    pkg = compiled(tmp_path_factory, X32, "cpu", "q4f16_2", pool=64)
    engine = Engine.load(pkg, paged=True)
    batcher = Batcher(engine)
    vocab = engine.vocab_size
    common = prompts(vocab, (40,), seed=7)[0]
    tails = prompts(vocab, (3, 7), seed=8)
    first = alone(batcher, [common + tails[0]], 4)[0]
    assert batcher.stats["prefix_tokens"] == 0 and engine.cache.pages_in_use == 0 and len(engine.cache.idle) >= 2
    second = alone(batcher, [common + tails[1]], 4)[0]
    assert batcher.stats["prefix_tokens"] == 32  # two full pages shared
    fresh = Batcher(Engine.load(pkg, paged=True))
    want = alone(fresh, [common + tails[1]], 4)[0]
    assert fresh.stats["prefix_tokens"] == 0
    assert all(np.array_equal(x, y) for x, y in zip(second, want))
    again = alone(batcher, [common + tails[0]], 4)[0]  # a prompt seen whole: all but its last page shared
    assert all(np.array_equal(x, y) for x, y in zip(again, first))
    work = prompts(vocab, (30, 30, 30), seed=9)  # 4 pages of pool for three new 34-token sequences: evictions
    assert all(np.array_equal(x, y) for a, b in zip(concurrently(batcher, work, 4), alone(fresh, work, 4))
               for x, y in zip(a, b))
    assert engine.cache.pages_in_use == 0


def test_bench_sequences(tmp_path_factory):
    """`deploycc bench PKG --sequences 1,3` and `python PKG bench --sequences ...`: the batched decode's aggregate
    tok/s and step time per count of sequences, as JSON; a count past the package's batch, or past what its
    pool holds, is one line."""
    import json
    import subprocess
    import sys

    require_cc()
    pkg = compiled(tmp_path_factory, X32, "cpu", "q4f16_2", pool=256)
    small = compiled(tmp_path_factory, X32, "cpu", "q4f16_2", pool=64)  # 4 pages
    for cmd in ([sys.executable, "-m", "deploycc", "bench", str(pkg)], [sys.executable, str(pkg), "bench"]):
        r = subprocess.run(cmd + ["--sequences", "1,3", "--prompt-len", "5", "--gen-len", "4", "--json"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = json.loads(r.stdout)["rows"]
        assert [row["sequences"] for row in rows] == [1, 3] and all(row["decode_tok_s"] > 0 for row in rows)
        assert [row["function"] for row in rows] == ["step", "step"]  # a cpu package has no step_one
        for bad, words in ((["--sequences", "5", "--prompt-len", "5", "--gen-len", "4"], "exceeds the 4 sequences"),
                           (["--sequences", "2", "--prompt-len", "30", "--gen-len", "10"], "KV pages")):
            r = subprocess.run([str(small) if a == str(pkg) else a for a in cmd] + bad, capture_output=True, text=True,
                               timeout=300)
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert r.returncode != 0 and len(lines) == 1 and words in lines[0], r.stderr[-2000:]


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_bench_sequences_profile(tmp_path_factory, backend):
    """`deploycc bench PKG --sequences 1,3 --profile`: the server's batched step of each count broken down like the
    decode step's profile: every launch of the step timed on the device (as many per step as the step function
    launches: the shape dispatch launches one of its alternatives), the host's time, the wall time; a prompt that leaves
    no room for the profiled steps is one line."""
    import json
    import re
    import subprocess
    import sys

    require_cc() if backend == "cpu" else require_device(backend)
    pkg = compiled(tmp_path_factory, "llama-gqa3-llama3rope", PRESETS[backend], pool=256)
    r = subprocess.run([sys.executable, "-m", "deploycc", "bench", str(pkg), "--sequences", "1,3", "--prompt-len", "5",
                        "--gen-len", "4", "--profile", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    code = json.loads((pkg / "bytecode.json").read_text())["functions"]["step"]["instructions"]
    entries = json.loads((pkg / "manifest.json").read_text())["kernels"]["entries"]
    paired = {k for k in entries if re.search(r"_(one|rows\d*)$", k)}  # the GEMVs beside their tiles: one runs
    launches = sum(1 for i in code if i.get("fn") == "vm.launch") - sum(
        1 for i in code if i.get("fn") == "vm.launch" and i["args"][0]["k"] in paired)
    assert [p["sequences"] for p in out["profiles"]] == [1, 3]
    for p in out["profiles"]:
        assert p["launches_per_token"] == sum(k["launches_per_token"] for k in p["kernels"]) == launches, p
        assert all(k["kernel"] in entries and k["us_each"] > 0 for k in p["kernels"])
        assert 0 < p["kernel_ms_per_token"] and 0 < p["host_ms_per_token"] and 0 < p["wall_ms_per_token"]
        assert abs(sum(k["share"] for k in p["kernels"]) - 1) < 1e-6
    r = subprocess.run([sys.executable, "-m", "deploycc", "bench", str(pkg), "--sequences", "1", "--prompt-len", "40",
                        "--gen-len", "4", "--profile"], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "profiled steps" in lines[0], r.stderr[-2000:]
