"""CUDA's split decode attention in one launch: each block, its partials stored, counts itself in at its row's counter
(a fence, an atomic add), and the last block of a (kv head, query) row combines the row's partials and sets the
counter back to zero (schedule/attention.py, targets/cuda.py grid_arrive).

Run under the CUDA emulation in every block order (forward: the highest block arrives last; reverse: block 0;
shuffled), several launches one after another on the same counter and workspace, as a package's layers and steps
use them, with key counts that give 1, 2, 6 and 11 blocks a row: every output within 1e-5 of attention_reference,
and the counter zero after each launch. Negative controls: the counter not reset (the next launch's last block is
never found: its outputs are what the previous launch left), and the last block taken one arrival early (it combines
a partial not yet stored). What the emulation cannot show (its blocks run one after another): a fence or the barrier
before the arrival left out, which only a GPU's concurrent blocks would expose; the "gpu" case runs the same launches
on a CUDA GPU where there is one (benchmarks/gpu_check.sh's lease), and skips, saying so, where there is none.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import require_cxx, require_device

from deploycc import presets
from deploycc.kernel_runner import render
from deploycc.op.attention import attention_reference
from deploycc.runtime.devices import open_device
from deploycc.runtime.validate import entry_name
from deploycc.schedule import schedule_program
from kernels.test_cpu_attention import attention_program

H, KVH, D, SCALE = 4, 2, 32, 0.125
TOTALS = (1300, 129, 700, 1, 255)  # keys: 11, 2, 6, 1 and 2 blocks a kv head (128 keys a block on h100 here)


@pytest.fixture(autouse=True)
def cxx():
    require_cxx()


def kernel_source():
    target = presets.load("h100").target
    sched = schedule_program(attention_program(1, H, KVH, D, SCALE), target).attrs["schedule"]
    assert len(sched.kernels) == 1 and [w.name for w in sched.zeroed] == ["arrived"]
    k = sched.kernels[0]
    return k, render([k], target)


def run_launches(order: str, source: str, k) -> list[tuple[float, np.ndarray]]:
    """The launches of TOTALS on one device (the emulation in `order`, or "gpu": a CUDA GPU, whose blocks run at once),
    one counter and one workspace: (the largest output error, the counter after the launch) each."""
    dev = require_device("cuda") if order == "gpu" else open_device("cuda", emulate=order)
    handle = dev.build(source, [entry_name(k.name)])[entry_name(k.name)]
    rng = np.random.default_rng(5)
    most = max(TOTALS)
    kk = rng.standard_normal((most, KVH, D)).astype(np.float32)
    vv = rng.standard_normal((most, KVH, D)).astype(np.float32)
    keys = 128
    bufs = {"k": dev.upload(kk), "v": dev.upload(vv), "o": dev.alloc(H * D * 4),
            "part": dev.alloc(H * -(-most // keys) * (D + 2) * 4), "arrived": dev.alloc(KVH * 4)}
    out = []
    for total in TOTALS:
        q = (rng.standard_normal((1, H, D)) * 3).astype(np.float32)
        bufs["q"] = dev.upload(q)
        groups = KVH * -(-total // keys)
        dev.launch(handle, [bufs[b.name] for b in k.buffers] + [total], (groups, 1, 1), (k.threads, 1, 1))
        got = dev.download(bufs["o"], (1, H, D), np.float32)
        want = attention_reference(q, kk[:total], vv[:total], SCALE)
        out.append((float(np.abs(got - want).max()), dev.download(bufs["arrived"], (KVH,), np.int32)))
    return out


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle", "gpu"])
def test_the_last_block_combines_and_leaves_the_counter_zero(order):
    k, source = kernel_source()
    assert "atomicAdd(&arrived[" in source and source.count("__threadfence();") == 2
    for total, (err, counter) in zip(TOTALS, run_launches(order, source, k)):
        assert err < 1e-5, (order, total, err)
        assert not counter.any(), (order, total, counter)


@pytest.mark.parametrize("mutation", ["counter not reset", "last block one arrival early"])
def test_a_broken_arrival_fails(mutation):
    k, source = kernel_source()
    if mutation == "counter not reset":
        assert source.count("  arrived[") == 1
        broken = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith("arrived["))
    else:
        assert source.count(") == (") + source.count(" - 1;") >= 1
        head, sep, rest = source.partition("atomicAdd(&arrived[")
        broken = head + sep + rest.replace(" - 1;", " - 2;", 1)
    assert broken != source
    results = run_launches("forward", broken, k)
    worst = max(err for err, _ in results)
    stuck = [c.tolist() for _, c in results if c.any()]
    assert worst > 1e-2 or np.isnan(worst), (mutation, worst)
    assert stuck, "a counter left other than zero"


def test_the_counters_have_a_storage_no_tensor_shares(tmp_path):
    """A package's counters (Schedule.zeroed): every attention launch of every step function allocates them from one
    storage, which no other vm.alloc names (a tensor written there would leave a counter other than zero, and the
    next launch's last block would not be found), sized for the largest (the server's step: a row for each of up to
    SPLIT_ROWS queries and kv heads)."""
    import json

    from deploycc.package import compile_model
    from deploycc.schedule.attention import SPLIT_ROWS
    from fixtures import make_tiny

    pkg = compile_model(str(make_tiny("qwen3-x32")), "h100", quantization="q4f16_1", context_window=64,
                        out=str(tmp_path / "pkg"))
    m = json.loads((pkg / "manifest.json").read_text())
    bc = json.loads((pkg / "bytecode.json").read_text())
    counters, others = set(), set()
    for fn in bc["functions"].values():
        allocs = {}
        for ins in fn["instructions"]:
            if ins.get("fn") == "vm.alloc":
                allocs[ins["dst"]] = (ins["args"][0]["i"], ins["args"][1]["str"])
            if ins.get("fn") == "vm.launch" and ins["args"][0]["k"].endswith("_part"):  # the counters: its last buffer
                sep = next(i for i, a in enumerate(ins["args"]) if a.get("str") == "|")
                last = m["kernels"]["entries"][ins["args"][0]["k"]]["args"]["buffers"][-1]
                assert last["dtype"] == "int32" and last["written"]
                counters.add(allocs[ins["args"][sep - 1]["r"]])
        others |= {sid for sid, _ in allocs.values()}
    assert len(counters) == 1, counters
    (sid, dtype), = counters
    assert dtype == "int32"
    shared = [ins for fn in bc["functions"].values() for ins in fn["instructions"]
              if ins.get("fn") == "vm.alloc" and ins["args"][0]["i"] == sid]
    assert all(ins["args"][1]["str"] == "int32" and len(ins["args"]) == 3 for ins in shared), "counters only"
    assert m["storages"][sid]["bytes"] >= m["kv_cache"]["kv_heads"] * SPLIT_ROWS * 4
    assert others - {sid}, "the plan's storages are others"
