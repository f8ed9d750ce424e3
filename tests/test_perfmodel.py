"""The performance model of CUDA packages (deploycc/perfmodel.py; `deploycc inspect PKG --kernels`).

On a tiny h100 package: every launch of the decode and prefill steps is found (as many as the bytecode makes), with
the manifest's threads, the weights' bytes, FLOPs at least those of the matmuls, registers from ptxas where the CUDA
toolkit is; occupancy and the roofline terms on hand-made launches (registers limit the blocks per multiprocessor,
a 9-block launch is latency bound, a full one bandwidth bound); the presets' hardware figures checked on load.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from bad_inputs.common import assert_one_line_error, cli

from deploycc import presets
from deploycc.errors import DeployError
from deploycc.ir.sym import evaluate
from deploycc.perfmodel import (
    ARRIVAL_BARRIERS,
    ARRIVAL_TRIPS,
    CODES_PRODUCTS,
    FMA_INSTRUCTIONS_PER_FLOP,
    GRAPH_HOST_US,
    GRAPH_INT_US,
    GRAPH_LAUNCH_US,
    HOST_US,
    IN_FLIGHT,
    INSTRUCTIONS_PER_FLOP,
    ISSUE_EFFICIENCY,
    LATENCY_US,
    LAUNCH_US,
    PHASE_US,
    TENSOR_INSTRUCTIONS_PER_MAC,
    TF32_PRODUCTS,
    Launch,
    _time,
    predict,
    rows,
    summary,
)
from deploycc.runtime.validate import nbytes
from deploycc.schedule.attention import SPLIT_ROWS
from deploycc.schedule.dispatch import SMALL
from deploycc.schedule.gemv import MANY
from fixtures import make_tiny

H100 = presets.load("h100").hardware


def linear_program(k: int, n: int):
    """A float linear of `seq_len` rows, legalized: y[seq_len, n] = x[seq_len, k] w[n, k]^T."""
    from deploycc import op  # noqa: F401  (op registers the ops)
    from deploycc.ir import BlockBuilder, Tensor, Var, sym
    from deploycc.transform import legalize

    bb = BlockBuilder()
    args = [Var("x", Tensor((sym.var("n"), k))), Var("w", Tensor((n, k)))]
    with bb.function("main", args, auto_dataflow=True):
        bb.finish(bb.call("linear", *args))
    return legalize(bb.module)["linear"]


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    from deploycc.package import compile_model

    return compile_model(str(make_tiny("qwen3-x32")), "h100", quantization="q4f16_1", context_window=64,
                         out=str(tmp_path_factory.mktemp("perf") / "pkg"))


def launch_sites(package, fname: str, rows: int) -> tuple[int, set]:
    """(the launches a step of `rows` rows makes, the dispatched kernels): its launch instructions, of a dispatched
    schedule's alternatives the one the rows choose: the one-row GEMV (`_one`) at one row, the few-row GEMV in chunks
    of SMALL rows (`_rows4`) up to SMALL, in chunks of FEW (`_rows`) up to MANY rows, else the tiles; a page
    pool's attention split over blocks (`_part`, `_merge`) up to SPLIT_ROWS queries, else one block a row."""
    m = json.loads((package / "manifest.json").read_text())
    doc = json.loads((package / m["kernels"]["programs"]).read_text())
    paired = {k["name"] for p in doc["programs"] if p["schedule"].get("dispatched") for k in p["schedule"]["kernels"]}
    bc = json.loads((package / "bytecode.json").read_text())
    names = [ins["args"][0]["k"] for ins in bc["functions"][fname]["instructions"] if ins.get("fn") == "vm.launch"]

    def runs(name: str) -> bool:
        if name.endswith(("_part", "_merge")):
            return rows <= SPLIT_ROWS
        if name.startswith("attention"):
            return rows > SPLIT_ROWS
        if name.endswith("_one"):
            return rows == 1
        if name.endswith(f"_rows{SMALL}"):
            return 1 < rows <= SMALL
        if name.endswith("_rows"):
            return SMALL < rows <= MANY
        return rows > MANY
    return sum(n not in paired or runs(n) for n in names), paired


def test_every_launch_of_both_steps_is_modelled(package):
    """Every launch the step makes, and of a dispatched pair (schedule/dispatch.py) the one its rows choose: at 40
    rows (past MANY) the tiles, not the few-row GEMV."""
    pred = predict(package, context=48, prefill=40)
    m = json.loads((package / "manifest.json").read_text())
    for fname, tokens in (("decode", 1), ("prefill", 40)):
        step = pred["steps"][fname]
        launches, paired = launch_sites(package, fname, tokens)
        assert len(step.launches) == launches and step.tokens == tokens
        assert not any(x.kernel.endswith("_rows") for x in step.launches) and paired
        for x in step.launches:
            assert x.threads == m["kernels"]["entries"][x.kernel]["threads"] and x.blocks >= 1 and x.bytes > 0
            assert x.seconds >= LAUNCH_US * 1e-6 and x.bound in ("bandwidth", "latency", "arithmetic", "serial")
            if shutil.which("ptxas"):
                assert x.registers and x.registers > 0
    decode = pred["steps"]["decode"]
    weights = sum(nbytes(p["shape"], p["dtype"]) for p in m["params"])
    embedding = next(x for x in decode.launches if x.kernel.startswith("take"))  # one row of the table is read
    assert 0 < embedding.weight_bytes < weights / 10
    assert sum(x.weight_bytes for x in decode.launches) <= weights + embedding.weight_bytes  # tied: the head too
    head = max(decode.launches, key=lambda x: x.weight_bytes)  # the output head: vocab x hidden
    assert head.flops >= 2 * 128 * 64
    assert pred["steps"]["prefill"].flops > 10 * decode.flops
    f = summary(pred)
    assert f["decode_launches"] == len(decode.launches) and f["context"] == 48
    assert 0 < f["decode_roofline_fraction"] < 1 and f["decode_tok_s"] < f["roofline_tok_s"]
    assert sorted(r["kernel"] for r in rows(decode)) == sorted({x.kernel for x in decode.launches})


def test_prefill_matmuls_on_the_tensor_cores_are_timed_at_their_peak(package):
    """h100's prefill linears run on the tensor cores (schedule/mma.py), its 4-bit ones as products of their codes
    (mma.codes_rule): each is timed by its matmul's multiply-adds (M x N x K, not the program's FLOPs, which count
    the dequantization) at the slower of the fp16 tensor peak over the two products a multiply-add takes and the
    instructions its tiles issue (counted in their SASS), not at the fp32 peak; 3xTF32's tiles at the tf32 peak over
    three products, or their instructions, 2.9x the codes'."""
    pred = predict(package, context=48, prefill=64)
    prefill = pred["steps"]["prefill"].launches
    tensor = [x for x in prefill if x.tensor and x.tensor != "attention"]
    assert tensor and all(x.kernel.startswith("fused_dequantize") or "linear" in x.kernel for x in tensor)
    # the attention over h100's float16 cache too (schedule/attention_mma.py): QK^T and PV, each M x N x K
    attention = [x for x in prefill if x.tensor == "attention"]
    assert attention and all(x.kernel.startswith("attention") and x.macs > 0 for x in attention)
    assert {x.tensor for x in tensor} == {"codes"}  # q4f16_1: every linear's weights are codes
    # as the schedule recorded it (programs.json), not read from the kernels' text
    m = json.loads((package / "manifest.json").read_text())
    doc = json.loads((package / m["kernels"]["programs"]).read_text())
    recorded = {k["name"]: k["tensor"] for p in doc["programs"] for k in p["schedule"]["kernels"] if "tensor" in k}
    assert {x.kernel for x in tensor} <= set(recorded) and set(recorded.values()) == {"codes", "attention"}
    assert not any(x.tensor for x in pred["steps"]["decode"].launches)  # decode: the GEMVs
    issue = H100["fp32_tflops"] * 1e12 * FMA_INSTRUCTIONS_PER_FLOP * ISSUE_EFFICIENCY  # instructions a second
    for x in tensor:
        # q4f16_1's program: x * (q - 8) * scale, summed (4 FLOPs a multiply-add), then an epilogue's few (a residual)
        assert 4 * x.macs <= x.flops <= 4.1 * x.macs, x
        floor = max(2 * x.macs / (H100["fp16_tensor_tflops"] * 1e12 / CODES_PRODUCTS),
                    x.macs * TENSOR_INSTRUCTIONS_PER_MAC["codes"] / issue)
        assert x.seconds >= floor + LAUNCH_US * 1e-6 - 1e-12
        if x.bound in ("arithmetic", "issue"):
            assert x.seconds == pytest.approx(floor + LAUNCH_US * 1e-6)
    same = Launch("linear", blocks=1024, threads=128, bytes=1 << 20, flops=1 << 37, macs=1 << 35, tensor="tf32")
    codes = Launch("linear", blocks=1024, threads=128, bytes=1 << 20, flops=1 << 37, macs=1 << 35, tensor="codes")
    _time(same, H100)
    _time(codes, H100)
    minimum = Launch("linear", blocks=1024, threads=128, bytes=1 << 20, flops=1 << 37, macs=1 << 35, tensor="codes3")
    _time(minimum, H100)
    assert same.bound == codes.bound == minimum.bound == "issue"
    assert minimum.seconds > codes.seconds  # a minimum's sums or a half weight's parts: 464 a 32 of K, 387
    launch = LAUNCH_US * 1e-6
    assert (same.seconds - launch) / (codes.seconds - launch) == pytest.approx(1189 / (774 / 2))
    assert TF32_PRODUCTS == 3 and same.seconds > 2 * (1 << 35) / (H100["tf32_tensor_tflops"] * 1e12 / TF32_PRODUCTS)


def test_a_launch_is_charged_what_its_program_touches(package):
    """A buffer costs at most the elements its loop-level program loads and stores: the prefill's final norm reads
    the hidden state of the last token only (the logits'), so 64 tokens' norm is charged one row and the norm's
    weight, not 64 rows (it was: 292 us predicted for SmolLM2's, a kernel of one block reading 2 KiB). The other
    launches keep their buffers whole (each of a GEMV's weights and inputs is read, many times)."""
    pred = predict(package, context=48, prefill=64)
    hidden = 64  # qwen3-x32
    x = [y for y in pred["steps"]["prefill"].launches if "norm" in y.kernel][-1]  # the final norm
    assert "strided_slice" in x.kernel and x.blocks == 1, x
    hidden_states, weight, out = x.buffers
    assert hidden_states[0] <= 3 * hidden * 4, x.buffers  # its row, loaded a few times (not 64 rows)
    assert weight[0] <= hidden * 4 and out[0] == hidden * 4, x.buffers
    assert x.bound == "latency" and x.seconds < 2 * LAUNCH_US * 1e-6
    decode = pred["steps"]["decode"]
    head = max(decode.launches, key=lambda y: y.weight_bytes)
    assert head.weight_bytes == sum(p[0] for p in head.buffers if p[1]) > 128 * hidden // 2  # 4-bit, whole


def test_the_batched_step_reads_the_pages_its_tables_name(package):
    """The server's step over the page pool: one token for each of B sequences; the pool is read where the
    sequences' page tables point (B x pages x page size rows), not whole. One sequence's step is the package's
    step_one (the CUDA presets'; runtime/engine.py step_function), with decode's GEMVs."""
    pred = predict(package, context=48, sequences=(1, 4, 12))
    m = json.loads((package / "manifest.json").read_text())
    kv, pool = m["kv_cache"], m["kv_cache"]["pool"]
    row = kv["kv_heads"] * kv["head_dim"] * np.dtype(kv["dtype"]).itemsize  # the preset's float16 cache: 2 bytes
    for b in (1, 4):
        step = pred["steps"][f"step{b}"]
        fname = "step_one" if b == 1 else "step"
        launches, paired = launch_sites(package, fname, b)
        assert step.function == fname and len(step.launches) == launches and step.tokens == b
        # the keys split over blocks (a few queries): one kernel that reads the pages, whose last block to arrive at
        # a row combines its partials (CUDA: no _merge launch)
        attention = [x for x in step.launches if x.kernel.startswith("attention")]
        assert attention and all(x.kernel.endswith("_part") and x.tail >= 1 for x in attention)
        rows = min(b * -(-48 // pool["page_size"]) * pool["page_size"], pool["pages"] * pool["page_size"])
        read = rows * row * 2  # keys and values: the named pages, at most the pool
        assert all(read <= x.bytes < read + 4096 for x in attention), (read, [x.bytes for x in attention])
        assert all(x.flops > 0 for x in attention)  # the blocks do the work
    assert pred["steps"]["step1"].bytes < pred["steps"]["step4"].bytes
    # the linears of a few sequences' step are the few-row GEMVs, with their FLOPs (past MANY rows the tiles: the
    # prefill of 40 above); one sequence's step_one has decode's GEMVs (norms folded in), timed by their instructions
    one = [x for x in pred["steps"]["step1"].launches if x.flops > 0 and x.rule.startswith("gemv")]
    assert one and not any(x.kernel.endswith(("_one", "_rows", f"_rows{SMALL}")) for x in pred["steps"]["step1"].launches)
    assert {x.rule.split("|")[0] for x in one} == {x.rule for x in pred["steps"]["decode"].launches
                                                    if x.flops > 0 and x.rule.startswith("gemv")}
    for b in (4, 12):
        chosen = [x for x in pred["steps"][f"step{b}"].launches if x.kernel in paired and not x.kernel.startswith("attention")]
        assert chosen and all(x.kernel.endswith(f"_rows{SMALL}" if b <= SMALL else "_rows") and x.flops > 0
                              for x in chosen), b
        assert not any(x.rule.startswith("gemv") and x.rule != "gemv-rows" for x in chosen), b


def test_the_decode_step_runs_as_a_graph(package):
    """The decode step's host time as the runtime runs it (runtime/graphs.py): one graph launch and its int arguments
    evaluated, not a launch each; the batched step's alike; prefill launch by launch. graphs=False: all of them."""
    pred, direct = predict(package, context=48, sequences=(1,)), predict(package, context=48, sequences=(1,),
                                                                       graphs=False)
    d, d0 = pred["steps"]["decode"], direct["steps"]["decode"]
    assert d.graph and not d0.graph and d.int_args == d0.int_args > 0
    assert d.int_args < sum(1 for _ in d.launches) * 4  # a few ints a launch (sizes), some launches none
    assert d.host_s == pytest.approx((GRAPH_HOST_US + GRAPH_INT_US * d.int_args + GRAPH_LAUNCH_US) * 1e-6)
    assert d0.host_s == pytest.approx(len(d0.launches) * HOST_US * 1e-6) and d.host_s < d0.host_s / 5  # 21 launches
    assert d.device_s == d0.device_s  # the same kernels
    prefill, step, step0 = pred["steps"]["prefill"], pred["steps"]["step1"], direct["steps"]["step1"]
    assert not prefill.graph and prefill.host_s == pytest.approx(len(prefill.launches) * HOST_US * 1e-6)
    assert step.graph and not step0.graph  # the server's step too
    assert step.host_s == pytest.approx((GRAPH_HOST_US + GRAPH_INT_US * step.int_args + GRAPH_LAUNCH_US) * 1e-6)
    assert step0.host_s == pytest.approx(len(step0.launches) * HOST_US * 1e-6) and step.host_s < step0.host_s / 5


def test_inspect_prints_the_model(package):
    r = cli("inspect", package, "--kernels", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["preset"] == "h100" and doc["hardware"] == H100 and doc["decode"] and doc["prefill"]
    r = cli("inspect", package, "--kernels")
    assert r.returncode == 0 and "of the HBM roofline" in r.stdout and "prefill:" in r.stdout
    assert "host" in r.stdout and "(a CUDA graph)" in r.stdout and doc["summary"]["decode_graph"] is True


def test_occupancy_and_the_roofline_terms():
    few = Launch("attention", blocks=9, threads=128, bytes=3_000_000)
    _time(few, H100)
    assert few.bound == "latency" and few.occupancy == 1.0  # 16 blocks of 128 fit a multiprocessor
    resident = 9 * 128
    assert few.seconds == pytest.approx(3e6 / resident / IN_FLIGHT * LATENCY_US * 1e-6 + LAUNCH_US * 1e-6)
    many = Launch("gemv", blocks=20_000, threads=64, bytes=130_000_000)
    _time(many, H100)
    assert many.bound == "bandwidth" and many.seconds == pytest.approx(130e6 / 3350e9 + LAUNCH_US * 1e-6)
    heavy = Launch("gemv", blocks=1_000, threads=256, bytes=1_000, registers=64)
    _time(heavy, H100)
    assert heavy.occupancy == 0.5  # 65536 registers / (64 x 256) = 4 blocks: 1024 of 2048 threads
    tiles = Launch("matmul", blocks=10_000, threads=256, bytes=10_000_000, flops=10**12, shared=100_000)
    _time(tiles, H100)
    assert tiles.bound == "arithmetic" and tiles.occupancy == 2 * 256 / 2048  # shared memory: 2 blocks


def test_the_decode_gemvs_are_charged_the_instructions_they_issue():
    """The float decode GEMV issues 5.25 instructions a 4-bit weight (1.3125 a FLOP of its program), the dp4a GEMV 3 (0.75),
    counted in nvcc's SASS (benchmarks/gemv_sass.py); other kernels a multiply-add's 0.5. An 8B's gate and up
    projection (4,096 x 28,672 weights, 4 FLOPs each, 66 MB) on an H100: the float GEMV is bound by what its SMs
    issue, not by the HBM; the dp4a GEMV by the HBM."""
    weights = 4096 * 28672
    bytes_ = weights * 9 // 16  # 4 bits and an fp16 scale a 32
    times = {}
    for rule in ("gemv", "gemv-dp4a-q4_sym", "matmul"):
        x = Launch("linear", blocks=weights // 4096, threads=128, bytes=bytes_, flops=4 * weights, rule=rule)
        _time(x, H100)
        times[rule] = x
    issue = H100["fp32_tflops"] * 1e12 * FMA_INSTRUCTIONS_PER_FLOP * ISSUE_EFFICIENCY  # instructions a second
    assert INSTRUCTIONS_PER_FLOP == {"gemv": 5.25 / 4, "gemv-norm": 5.94 / 9, "gemv-dp4a": 0.75}
    assert times["gemv"].bound == "issue"
    assert times["gemv"].seconds == pytest.approx(5.25 * weights / issue + LAUNCH_US * 1e-6)
    assert times["gemv-dp4a-q4_sym"].bound == "bandwidth"
    assert times["gemv-dp4a-q4_sym"].seconds == pytest.approx(bytes_ / 3350e9 + LAUNCH_US * 1e-6)
    assert times["matmul"].bound == "bandwidth"  # 2 instructions a weight: below the HBM's rate
    assert times["gemv"].seconds > 1.3 * times["gemv-dp4a-q4_sym"].seconds


def test_a_blocks_barriers_run_one_after_another():
    """The serial term: the waves of blocks x the barriers a thread passes x PHASE_US. The tensor-core tiles of a
    16-row linear of SmolLM2's shape (576 outputs, 1,536 inputs: 9 blocks, 48 K steps of two barriers and one after
    them) are bound by it, as an H200 measured (105 us); the same bytes with no barriers by their loads' latency, half."""
    from deploycc.ir.kernel import barriers
    from deploycc.ir.sym import evaluate
    from deploycc.schedule import mma, schedule_program

    prog = schedule_program(linear_program(1536, 576), presets.load("h100").target)
    s = prog.attrs["schedule"]
    tiles = s.kernels[-1]
    assert s.rule.endswith("|gemv-rows|mma") and "rows" not in tiles.name
    passed = barriers(tiles.body)
    assert passed.is_const and passed.value == 2 * (1536 // mma.BK) + 1
    # the GEMVs: warp shuffles, and one barrier where their two slices of K meet
    assert [barriers(k.body).value for k in s.kernels[:3]] == [1, 1, 1] and s.kernels[1].threads == 128
    n = next(iter(prog.params[0].shape[0].free_vars()))
    blocks = int(evaluate(tiles.groups, {n: 40}))  # past MANY rows: the tiles
    bytes_ = 576 * 1536 * 9 // 16 + 40 * (1536 + 576) * 4
    x = Launch("tiles", blocks=blocks, threads=tiles.threads, bytes=bytes_, barriers=passed.value, tensor="tf32",
               flops=2 * 40 * 1536 * 576)
    _time(x, H100)
    assert x.bound == "serial" and x.seconds == pytest.approx((97 * PHASE_US + LAUNCH_US) * 1e-6)
    serial = x.seconds
    x.barriers = 0
    _time(x, H100)
    assert x.bound == "latency" and x.seconds < 0.5 * serial
    many = Launch("tiles", blocks=100 * 132 * 4, threads=128, bytes=0, barriers=10)  # 4 blocks an SM: 25 waves
    _time(many, H100)
    assert many.seconds == pytest.approx((25 * 10 * PHASE_US + LAUNCH_US) * 1e-6)


def test_the_last_block_to_arrive_adds_its_round_trips(package):
    """CUDA's split decode attention is one launch: its last block to arrive at a row combines the row's S partials
    (schedule/attention.py), 8 a round trip. programs.json records those trips ("tail"); the model adds them and
    ARRIVAL_TRIPS (the fences and the atomic add) after the rest, leaves the arrival's two barriers out of the serial
    term (their waits are those trips), and a decode step launches no combine of its own."""
    from kernels.test_cpu_attention import attention_program

    from deploycc.ir.kernel import barriers
    from deploycc.schedule import schedule_program

    m = json.loads((package / "manifest.json").read_text())
    doc = json.loads((package / m["kernels"]["programs"]).read_text())
    kernels = {k["name"]: k for p in doc["programs"] for k in p["schedule"]["kernels"]}
    assert [n for n, k in kernels.items() if "tail" in k] == [n for n in kernels if n.endswith("_part")]
    assert not any(n.endswith("_merge") for n in kernels)
    decode = predict(package, context=48)["steps"]["decode"]
    part = [x for x in decode.launches if x.kernel.endswith("_part")]
    assert part and all(x.tail == 1 for x in part)  # 48 keys: one block a row, one trip
    assert len(decode.launches) == launch_sites(package, "decode", 1)[0]
    k = schedule_program(attention_program(1, 9, 3, 64, 0.125), presets.load("h100").target).attrs["schedule"].kernels[0]
    t = next(iter(k.tail.free_vars()))
    assert [evaluate(k.tail, {t: keys}) for keys in (1, 64, 512, 513, 2048)] == [1, 1, 1, 2, 4]  # 64 keys a block
    x = Launch("attention_part", blocks=96, threads=96, bytes=1_000_000, in_flight=128, tail=4,
               barriers=evaluate(barriers(k.body), {t: 2048}))
    _time(x, H100)
    alone = Launch("attention_part", blocks=96, threads=96, bytes=1_000_000, in_flight=128,
                   barriers=x.barriers - ARRIVAL_BARRIERS)
    _time(alone, H100)
    assert x.bound == alone.bound and x.seconds == pytest.approx(alone.seconds + (ARRIVAL_TRIPS + 4) * LATENCY_US * 1e-6)


def test_packages_record_the_barriers_their_kernels_pass(package):
    """programs.json gives each kernel with barriers their count in its sizes (a causal prefill attention's at its
    last block, which sees the most keys); the model reads it for the launch's sizes."""
    m = json.loads((package / "manifest.json").read_text())
    doc = json.loads((package / m["kernels"]["programs"]).read_text())
    kernels = {k["name"]: k for p in doc["programs"] for k in p["schedule"]["kernels"]}
    assert any("barriers" in k for k in kernels.values())
    assert not any("barriers" in k for name, k in kernels.items() if name.endswith("_rows"))
    pred = predict(package, context=48, prefill=40)
    tiles = [x for x in pred["steps"]["prefill"].launches if x.tensor]
    assert tiles and all(x.barriers >= 2 for x in tiles)  # two a K step
    assert all(x.barriers == 0 for x in pred["steps"]["decode"].launches if x.rule == "gemv")


def test_batched_copies_keep_their_loads_in_flight(package):
    """The decode attention copies its key/value tiles COPY_BATCH trips at a time, two loads a trip (2 bytes each from
    the h100 preset's float16 cache), loaded into registers before any store (schedule/lowering.py: batched_copy):
    programs.json records those 64 bytes (128 from a float32 cache), and the
    model's latency term divides a thread's bytes by them rather than IN_FLIGHT (an H200 measured that kernel at 9.3
    us a layer of SmolLM2's shape; at IN_FLIGHT the model said 25). Kernels without such a copy record none."""
    from deploycc.schedule.attention import COPY_BATCH

    m = json.loads((package / "manifest.json").read_text())
    doc = json.loads((package / m["kernels"]["programs"]).read_text())
    kernels = {k["name"]: k for p in doc["programs"] for k in p["schedule"]["kernels"]}
    part = [k for name, k in kernels.items() if name.endswith("_part") and "pages" not in str(k["scalars"])]
    element = np.dtype(m["kv_cache"]["dtype"]).itemsize  # a key's and a value's element a trip: float16 on h100
    assert element == 2 and part and all(k["in_flight"] == COPY_BATCH * 2 * element for k in part)
    assert not any("in_flight" in k for name, k in kernels.items() if "linear" in name or "rms_norm" in name)
    pred = predict(package, context=48, prefill=40)
    for x in pred["steps"]["decode"].launches:
        assert x.in_flight == (COPY_BATCH * 2 * element if x.kernel.endswith("_part") else IN_FLIGHT)
    x = Launch("attention_part", blocks=9, threads=96, bytes=3_000_000, in_flight=COPY_BATCH * 8)
    _time(x, H100)
    assert x.bound == "latency"
    assert x.seconds == pytest.approx(3e6 / (9 * 96) / (COPY_BATCH * 8) * LATENCY_US * 1e-6 + LAUNCH_US * 1e-6)


def test_presets_state_their_hardware(tmp_path):
    assert presets.load("rtx4090").hardware["bandwidth_gb_s"] == 1008 and presets.load("cpu").hardware is None
    text = (presets.resources.files("deploycc.configs") / "h100.yaml").read_text()
    bad = {"missing": text.replace("  multiprocessors: 132\n", ""), "unknown": text.replace("multiprocessors:",
                                                                                               "multiprocesors:"),
           "range": text.replace("bandwidth_gb_s: 3350", "bandwidth_gb_s: -1")}
    for what, fragment in (("missing", "(missing: multiprocessors)"), ("unknown", "did you mean 'multiprocessors'"),
                           ("range", "'bandwidth_gb_s' is -1")):
        path = tmp_path / f"{what}.yaml"
        path.write_text(bad[what])
        with pytest.raises(DeployError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            presets.load(str(path))
        r = cli("inspect", make_tiny("qwen3-x32"), "--device", str(path), "--stage", "scheduled")
        assert_one_line_error(r, fragment)


def test_the_calibration_puts_a_profile_beside_the_model(package, tmp_path):
    """benchmarks/gpu_calibrate.py: a lease's profile of the decode step (CUDA events around each launch; the step also
    run as a graph, whose wall time is the GPU's) kernel by kernel beside the model's times, the events' gap between
    launches ((kernel time - wall time) / launches) taken off each measured launch; several results in one file."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_calibrate

    decode = predict(package, context=48)["steps"]["decode"]
    counts: dict = {}
    for x in decode.launches:
        counts[x.kernel] = counts.get(x.kernel, 0) + 1
    launches = len(decode.launches)
    true_us = {k: 10.0 + i for i, k in enumerate(counts)}
    wall_ms = sum(true_us[k] * c for k, c in counts.items()) / 1e3
    profile = {"wall_ms_per_token": wall_ms, "kernel_ms_per_token": wall_ms + launches * 5.0 / 1e3,
               "launches_per_token": launches,
               "kernels": [{"kernel": k, "launches_per_token": c, "us_each": true_us[k] + 5.0} for k, c in counts.items()]}
    results = [{"decode_tok_s": 1.0}, {"cuda_graphs": {"decode": {"captured": 1}}, "profile": profile}]
    path = tmp_path / "lease.json"
    path.write_text("\n".join(json.dumps(r, indent=1) for r in results))
    docs = gpu_calibrate.documents(path.read_text())
    assert docs == results
    out = gpu_calibrate.compare(str(package), docs[1], 48, None)
    assert out["event_gap_us"] == pytest.approx(5.0)
    assert out["measured_step_ms"] == pytest.approx(wall_ms) and out["measured_kernel_ms"] == pytest.approx(wall_ms)
    for row in out["kernels"]:
        assert row["measured_us"] == pytest.approx(true_us[row["kernel"]])
        mine = [x.seconds for x in decode.launches if x.kernel == row["kernel"]]
        assert row["model_us"] == pytest.approx(sum(mine) / len(mine) * 1e6) and row["model_launches"] == len(mine)
    assert out["model_step_ms"] == pytest.approx(decode.seconds * 1e3)
