"""CUDA graphs of the decode step (runtime/graphs.py) on the CUDA emulation, and their kernels through nvcc.

A tiny Qwen3 (`qwen3-x32`) compiled for h100 and rtx4090 with 32 threads a block, so that the split decode
attention takes one more block a head every 64 keys: a 50-token prompt then 30 greedy decodes cross 64 keys, and
the step's launches change there (two graphs). Checked: the logits of the same steps launched kernel by kernel and
as graphs are the same bit for bit (both run the same kernels in the same order; the graph's read their int
arguments from a table), every decode step replays a graph, and each kernel runs as often either way; the
negative control: a table written only when its graph is captured (the ints of a later step never reach the
kernels) gives other logits. Both run on a CUDA GPU too where there is one (CuPy's capture; skipped here, with the
reason). Off with DEPLOYCC_CUDA_GRAPHS=0; a capture that fails is said once and the steps run launch by launch. The
graph variants of every kernel of the package compile with nvcc and assemble with ptxas.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import require_cxx, require_device, require_nvcc

from deploycc.package import compile_model
from deploycc.runtime.devices.cuda import GRAPH_SUFFIX, compile_cuda, graph_source, ptxas_check
from deploycc.runtime.engine import Engine
from deploycc.runtime.graphs import StepGraphs
from fixtures import make_tiny

PROMPT, DECODES = 50, 30


@pytest.fixture(scope="module", params=["h100", "rtx4090"])
def package(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"graphs-{request.param}") / "pkg"
    return compile_model(str(make_tiny("qwen3-x32")), request.param, "q4f16_1", out=str(out),
                         overrides=("target.threads_per_block=32", "prefill_chunk=64", "kv_pool_tokens=512"))


def greedy(engine: Engine) -> list[np.ndarray]:
    ids = [int(x) for x in np.random.default_rng(0).integers(0, engine.vocab_size, PROMPT)]
    out = [engine.prefill(ids)]
    for _ in range(DECODES):
        out.append(engine.decode(int(np.argmax(out[-1]))))
    return out


def load(package, monkeypatch, graphs: bool = True, order: str | None = "shuffle") -> Engine:
    """The package on the CUDA emulation (threads in `order`), or with order None on a CUDA GPU."""
    if order is None:
        require_device("cuda")
        monkeypatch.delenv("DEPLOYCC_CUDA_EMULATE", raising=False)
    else:
        require_cxx()
        monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", order)
    monkeypatch.setenv("DEPLOYCC_CUDA_GRAPHS", "1" if graphs else "0")
    return Engine.load(package)


ON = {"emulation": "shuffle", "gpu": None}  # the gpu cases run where there is one (benchmarks/gpu_check.sh)


@pytest.mark.parametrize("on", sorted(ON))
def test_graphs_give_the_launches_logits_bit_for_bit(package, monkeypatch, on):
    direct = load(package, monkeypatch, graphs=False, order=ON[on])
    assert direct.graphs == {} and "cuda_graphs" not in direct.variants
    want = greedy(direct)
    engine = load(package, monkeypatch, order=ON[on])
    got = greedy(engine)
    for step, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a, b), f"step {step}: {float(np.abs(a - b).max())}"
    stats = engine.variants["cuda_graphs"]["decode"]
    # 1 and 2 attention blocks a head: each step's launches the first time, captured the second, replayed after
    assert stats == {"captured": 2, "replayed": DECODES - 4, "kept": 2}
    if on == "emulation":
        assert engine.device.launches == direct.device.launches  # every kernel ran as often, none twice
    assert engine.vm.launches == direct.vm.launches


@pytest.mark.parametrize("on", sorted(ON))
def test_a_table_written_only_at_capture_is_wrong(package, monkeypatch, on):
    """The negative control: the ints of the step that captured a graph, kept for every replay."""
    want = greedy(load(package, monkeypatch, graphs=False, order=ON[on]))
    written: set = set()

    def once(self, table, ints, set_ints=StepGraphs.set_ints):
        if id(table) not in written:
            written.add(id(table))
            set_ints(self, table, ints)
    monkeypatch.setattr(StepGraphs, "set_ints", once)
    got = greedy(load(package, monkeypatch, order=ON[on]))
    assert all(np.array_equal(a, b) for a, b in zip(want[:3], got[:3]))  # the prefill, a step seen, the capture
    assert not all(np.array_equal(a, b) for a, b in zip(want, got))


def test_a_failed_capture_launches_as_before(package, monkeypatch, capsys):
    want = greedy(load(package, monkeypatch, graphs=False))
    engine = load(package, monkeypatch, order="reverse")

    def refuse(calls):
        raise RuntimeError("no graphs here")
    monkeypatch.setattr(engine.device, "capture", refuse)
    got = greedy(engine)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    stats = engine.variants["cuda_graphs"]["decode"]
    assert stats["captured"] == 0 and "no graphs here" in stats["failed"]
    err = capsys.readouterr().err
    assert err.count("CUDA graphs are off for decode") == 1 and "\n" == err[-1] and err.count("\n") == 1


def batched(engine: Engine) -> list[np.ndarray]:
    """The server's steps over the page pool: three prompts (20, 7 and 33 tokens, in chunks of the step), then 12 steps
    decoding all three (the same launches every step: one graph, captured at the second), then 6 steps of the first
    alone (step_one's: one graph of its own)."""
    cache, rng = engine.cache, np.random.default_rng(1)
    tables = [cache.take(cache.pages_for(33 + 12 + 6)) for _ in range(3)]
    out, tokens = [], []
    for table, n in zip(tables, (20, 7, 33)):
        ids = rng.integers(0, engine.vocab_size, n).tolist()
        for at in range(0, n, engine.prefill_chunk):
            chunk = ids[at:at + engine.prefill_chunk]
            out.append(engine.step(chunk, [table], [at], [len(chunk)]))
        tokens.append(int(np.argmax(out[-1][0])))
    for k in range(12):
        out.append(engine.step(tokens, tables, [20 + k, 7 + k, 33 + k], [1, 1, 1]))
        tokens = [int(t) for t in np.argmax(out[-1], axis=1)]
    for k in range(6):
        out.append(engine.step(tokens[:1], tables[:1], [32 + k], [1]))
        tokens = [int(np.argmax(out[-1][0]))]
    for table in tables:
        cache.give(table)
    return out


@pytest.mark.parametrize("on", sorted(ON))
def test_the_servers_steps_as_graphs(package, monkeypatch, on):
    """The batched step as graphs: the same logits bit for bit as launch by launch; the decode steps of three
    sequences replay graphs, and those of one (step_one) graphs of their own; a prompt's chunks (each shape seen
    once) launch kernel by kernel."""
    def paged(graphs):
        monkeypatch.setenv("DEPLOYCC_CUDA_GRAPHS", "1" if graphs else "0")
        return Engine.load(package, paged=True)
    load(package, monkeypatch, order=ON[on])  # the device's environment
    want, engine = batched(paged(False)), paged(True)
    got = batched(engine)
    for step, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a, b), f"step {step}: {float(np.abs(a - b).max())}"
    graphs = engine.variants["cuda_graphs"]
    assert graphs["step"] == {"captured": 1, "replayed": 10, "kept": 1}, graphs
    assert graphs["step_one"] == {"captured": 1, "replayed": 4, "kept": 1}, graphs
    assert set(engine.graphs) == {"step", "step_one"}


def test_the_graph_variants_compile_and_assemble(package):
    """Every kernel of the package with int arguments, as its graph variant, through nvcc and ptxas."""
    require_nvcc()
    m = json.loads((package / "manifest.json").read_text())
    entries = m["kernels"]["entries"]
    by_file: dict = {}
    for e in entries.values():
        by_file.setdefault(e["file"], []).append(e["entry"])
    arch = m["target"]["arch"]
    for f, names in by_file.items():
        text = graph_source((package / f).read_text(), names)
        usage = ptxas_check(compile_cuda(text, arch), arch)
        with_ints = {n for n in names if f"{n}{GRAPH_SUFFIX}(" in text}
        assert with_ints and {n + GRAPH_SUFFIX for n in with_ints} <= set(usage)
        assert "dcc_ints[dcc_at + 0]" in text
