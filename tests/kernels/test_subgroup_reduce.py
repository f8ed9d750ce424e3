"""Warp-level reductions (ir/tir.py SubgroupReduce): the decode GEMV and the row-per-block norms and softmax reduce
across threads with the target's subgroup operations where it has them and a shared-memory tree where not
(ir/subgroup.py), and every path computes what the loop-level interpreter computes.

Paths: CUDA's warp shuffles under the emulation (runtime/devices/cuda_emu.py) in forward and shuffled thread orders;
the same kernels lowered to the tree, also under the emulation (its shuffled orders and poisoned shared memory are
what catch a missing barrier); WGSL's subgroup shuffles on lavapipe (subgroups of 8 lanes, so the reduction of 32
also crosses subgroups through work-group memory) and the variant for adapters without subgroups on the same adapter;
OpenCL's tree on PoCL with the adreno preset. Tolerance: atol 1e-4 + rtol 1e-5: float32 sums of up to 1,536 products
of standard normals in another order (outputs near 40, the sums of their magnitudes near 1,000: 1.3e-5 was seen).
"""
import numpy as np
import pytest
from conftest import require_cxx, require_device

from deploycc import op, presets  # noqa: F401  (op registers the ops)
from deploycc.ir import BlockBuilder, Tensor, Var, sym, tir
from deploycc.ir.kernel import Kernel, Schedule
from deploycc.ir.subgroup import has_subgroup_reduce
from deploycc.ir.tir import Alloc, Block, Buffer, For, Store, SubgroupReduce, TensorProgram
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.schedule import schedule_program
from deploycc.transform import legalize

PATHS = ("cuda-shuffle-forward", "cuda-shuffle-shuffle", "cuda-tree-shuffle", "webgpu-subgroups", "webgpu-tree",
         "opencl-tree", "cuda-shuffle-gpu")  # the last on an NVIDIA GPU where there is one (benchmarks/gpu_check.sh)
PRESETS = {"cuda": "h100", "webgpu": "cpu-webgpu", "opencl": "adreno"}


@pytest.fixture(scope="module", params=PATHS)
def path(request):
    name = request.param
    patch = pytest.MonkeyPatch()
    kind, form, *order = name.split("-")
    if kind == "cuda" and order == ["gpu"]:
        device = require_device("cuda")
    elif kind == "cuda":
        require_cxx()
        from deploycc.runtime.devices import open_device

        device = open_device("cuda", emulate=order[0] if order else "shuffle")
        if form == "tree":  # the CUDA renderer without its shuffles: ir/subgroup.py's lowering, checked by the emulation
            from deploycc.targets.cuda import CUDARenderer

            patch.setattr(CUDARenderer, "subgroup_ops", False)
    elif kind == "webgpu":
        require_device("webgpu")
        from deploycc.runtime.devices.webgpu import WebGPUDevice

        device = WebGPUDevice(subgroups=form == "subgroups")
        if form == "subgroups" and not device.has_subgroups:
            pytest.skip(f"{device.name} has no subgroup feature")
        assert device.has_subgroups == (form == "subgroups")
    else:
        device = require_device("opencl")
    yield name, KernelRunner(device, presets.load(PRESETS[kind]).target)
    patch.undo()


def legalized(opname: str, shapes: dict, **attrs) -> TensorProgram:
    bb = BlockBuilder()
    args = [Var(n, Tensor(s)) for n, s in shapes.items()]
    with bb.function("main", args, auto_dataflow=True):
        bb.finish(bb.call(opname, *args, **attrs))
    return legalize(bb.module)[opname]


def check(runner: KernelRunner, prog: TensorProgram, rule: str, inputs: list, out_shape) -> str:
    prog = schedule_program(prog, runner.target)
    s = prog.attrs["schedule"]
    assert s.rule == rule and any(has_subgroup_reduce(k) for k in s.kernels), s.rule
    got = [*inputs, np.zeros(out_shape, np.float32)]
    want = [*inputs, np.zeros(out_shape, np.float32)]
    runner(prog, got, ())
    run_program(prog, want, ())
    np.testing.assert_allclose(got[-1], want[-1], atol=1e-4, rtol=1e-5)
    return runner.sources[prog.name]


RNG = np.random.default_rng(7)


# (inputs, rows, the slices K is split in: gemv.slices, few rows' lane groups over K's steps of 256 inputs; 1000
# leaves the last slice's last step part past the end, 8192 x 40 takes eight slices where the work-group can hold
# them: 512 threads, over WebGPU's 256)
@pytest.mark.parametrize("k,n,split", [(576, 200, 1), (1536, 72, 2), (64, 9, 1), (1000, 24, 2), (8192, 40, 8)])
def test_decode_gemv(path, k, n, split):
    name, runner = path
    if split == 8 and runner.target.max_threads_per_block < 512:
        split = runner.target.max_threads_per_block // 64
    prog = legalized("linear", {"x": (1, k), "w": (n, k)})
    x, w = RNG.standard_normal((1, k), np.float32), RNG.standard_normal((n, k), np.float32)
    src = check(runner, prog, "gemv" if split == 1 else f"gemv-split{split}", [x, w], (1, n))
    if name.startswith("cuda-shuffle") and split == 1:  # the lanes meet without shared memory or a barrier
        assert "__shfl_xor_sync" in src and "__syncthreads" not in src and "__shared__" not in src
    if name.startswith("cuda-shuffle") and split > 1:  # the slices' sums meet in shared memory, after one barrier
        assert "__shfl_xor_sync" in src and src.count("__syncthreads") == 1 and "__shared__" in src
    if name == "webgpu-subgroups":
        assert "subgroupShuffleXor" in src and "enable subgroups;" in src
    if name.endswith("tree"):
        assert "shfl" not in src and "subgroup" not in src


@pytest.mark.parametrize("scheme,factored", [("q4f16_1", True), ("q8f16_0", True), ("q4f16_2", False)])
@pytest.mark.parametrize("k,n,split", [(576, 200, 1), (8192, 40, 8)])
def test_decode_gemv_multiplies_a_groups_scale_once(path, scheme, factored, k, n, split):
    """Quantized weights: a lane's V = 8 inputs of a step are in one group of 32, so the products share the group's
    scale, which the GEMV multiplies once into their sum (one store into each row's sum a step, not eight), and the
    codes' zero point (8, or 128 for 8 bits) is taken once off the inputs' sum (sum x (q - 8) = sum x q - 8 sum x: one
    8.0f a row, not eight); a scheme with a minimum added after the scale (q4f16_2) shares no factor and keeps a
    product each."""
    from deploycc.ir import tir as t_
    from deploycc.quantization import QUANTIZATION

    name, runner = path
    if split == 8 and runner.target.max_threads_per_block < 512:
        split = runner.target.max_threads_per_block // 64
    s = QUANTIZATION[scheme]
    bufs = s.buffers(n, k)
    X, Y = t_.Buffer("x", (1, k), "float32"), t_.Buffer("y", (1, n), "float32")
    its = t_.iters("m r c", (1, n, k), "SSR")
    m, r, c = (t_.v(i) for i in its)
    prog = TensorProgram("qgemv", (*bufs, X, Y), Block("gemv", its, Store(Y, (m, r), Y[m, r] + X[m, c] * s.value(bufs, r, c)),
                                                        init=Store(Y, (m, r), t_.const(0.0))))
    packed = s.quantize(RNG.standard_normal((n, k)).astype(np.float32))
    x = RNG.standard_normal((1, k)).astype(np.float32)
    src = check(runner, prog, "gemv" if split == 1 else f"gemv-split{split}", [*(packed[p] for p in s.param_shapes(n, k)), x],
                (1, n))
    if name.startswith("cuda"):
        assert src.count("acc[0] = (acc[0] +") == (1 if factored else 8), src
        if factored:  # the 4 rows of a lane group, the zero point once each
            assert src.count("8.0f") == 4, src


@pytest.mark.parametrize("k,n,split", [(576, 200, 1), (1000, 24, 2), (8192, 40, 8)])
def test_decode_gemv_with_its_norm_folded_in(path, k, n, split):
    """An RMS norm folded into the GEMV after it (transform/inline_prologue.py, GPU presets' decode): each lane sums
    its inputs' squares beside its rows' products, the sum crosses the lanes (and the slices) with them, and each row
    is scaled by rsqrt(sum / K + eps) once. x is 3 standard normals' scale, so a scale left out is off 3x."""
    from deploycc.transform.inline_prologue import _compose

    name, runner = path
    if split == 8 and runner.target.max_threads_per_block < 512:
        split = runner.target.max_threads_per_block // 64
    norm = legalized("rms_norm", {"x": (1, k), "w": (k,)}, eps=1e-5)
    prog = _compose(legalized("linear", {"y": (1, k), "w": (n, k)}), 0, norm, lambda p: True)
    x = 3 * RNG.standard_normal((1, k), np.float32)
    gamma, w = RNG.standard_normal((k,), np.float32), RNG.standard_normal((n, k), np.float32)
    src = check(runner, prog, "gemv-norm" if split == 1 else f"gemv-norm-split{split}", [x, gamma, w], (1, n))
    if name.startswith("cuda"):  # the factor once for each of a lane group's 4 rows, none in the loop over K
        assert src.count("rsqrtf") == 4 and "acc[4]" in src, src


@pytest.mark.parametrize("rows,length", [(1, 576), (3, 2048), (2, 40)])
def test_rms_norm_rows(path, rows, length):
    _, runner = path
    prog = legalized("rms_norm", {"x": (sym.var("n"), length), "w": (length,)}, eps=1e-5)
    x, w = RNG.standard_normal((rows, length), np.float32), RNG.standard_normal((length,), np.float32)
    check(runner, prog, "row_block", [x, w], (rows, length))


@pytest.mark.parametrize("rows,length", [(2, 300), (1, 33)])
def test_softmax_rows_max_then_sum(path, rows, length):
    _, runner = path
    prog = legalized("softmax", {"x": (sym.var("n"), length)})
    x = (RNG.standard_normal((rows, length)) * 8).astype(np.float32)
    check(runner, prog, "row_block", [x], (rows, length))


def looped(width: int, trips: int, threads: int, combine: str, values: int = 1) -> TensorProgram:
    """y[g, i, t] = combine of x[g, i, u] over the aligned group of `width` threads u holding t: a SubgroupReduce in a
    serial loop (each trip reuses the tree's work-group memory: the lowering must wait for the reads before the next
    trip's writes), scheduled by hand, with the same sum as a block program for the interpreter. With `values` > 1 the
    reduction is of a local array in place (the GEMVs' form, written as loops over the array: ir/subgroup.py's
    in_place), each element x, and y the mean of the first and last (exactly x's combination)."""
    G = sym.var("G")
    x, y = Buffer("x", (G, trips, threads)), Buffer("y", (G, trips, threads))
    g_, i_, t_, j_ = tir.iters("g i t j", (G, trips, threads, width), "SSSR")
    gv, iv, tv, jv = (tir.v(it) for it in (g_, i_, t_, j_))
    init = -3e38 if combine == "max" else 0.0
    ref = Block("y", (g_, i_, t_, j_), Store(y, (gv, iv, tv), tir.V(combine, "float32", (
        y[gv, iv, tv], x[gv, iv, sym.floordiv(tv, width) * width + jv]))), Store(y, (gv, iv, tv), tir.const(init)))
    g, t, i = sym.SymVar("g"), sym.SymVar("t"), sym.SymVar("i")
    G_, T_, I_ = (sym.as_expr(v) for v in (g, t, i))
    acc = Buffer("acc", (values,), "float32", "local")
    at = [(sym.as_expr(j),) for j in range(values)]
    out = acc[0] if values == 1 else (acc[0] + acc[values - 1]) * 0.5
    trip = tir.seq(*[Store(acc, a, x[G_, I_, T_]) for a in at],
                   SubgroupReduce(tuple(Store(acc, a, acc[a]) for a in at), combine, width), Store(y, (G_, I_, T_), out))
    body = For(g, G, For(t, sym.as_expr(threads), Alloc(acc, For(i, sym.as_expr(trips), trip)), "thread", "local"),
               "thread", "group")
    k = Kernel("looped", (x, y), (G.as_var,), body, G, threads, frozenset({y}))
    return TensorProgram("looped", (x, y), ref, (), 1, {"schedule": Schedule((k,), (), "by-hand")})


@pytest.mark.parametrize("width,combine,values", [(32, "add", 1), (8, "max", 1), (16, "min", 1), (32, "add", 4),
                                                 (8, "max", 2)])
def test_in_a_loop_each_trip_waits_for_the_last(path, width, combine, values):
    name, runner = path
    prog = looped(width, 3, 64, combine, values)
    if values > 1:  # the in-place form: written as loops over the array, on every path that lowers or renders it
        from deploycc.ir.subgroup import in_place

        (k,) = prog.attrs["schedule"].kernels
        assert in_place(next(s for s in tir.walk(k.body) if isinstance(s, SubgroupReduce))) is not None
    x = RNG.standard_normal((5, 3, 64)).astype(np.float32)
    got, want = [x, np.zeros_like(x)], [x, np.zeros_like(x)]
    runner(prog, got, ())
    run_program(prog, want, ())
    np.testing.assert_allclose(got[1], want[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("values", [1, 4])
def test_the_tree_without_its_last_barrier_fails_in_a_loop(monkeypatch, values):
    """Negative control: the lowering's barrier after a looped reduction removed (of one value, and of an array in
    place), the emulation's forward order lets thread 0 overwrite its group's result with the next trip's value
    before the others read it."""
    require_cxx()
    from deploycc.ir import subgroup
    from deploycc.runtime.devices import open_device
    from deploycc.targets.cuda import CUDARenderer

    monkeypatch.setattr(CUDARenderer, "subgroup_ops", False)
    monkeypatch.setattr(subgroup, "in_loops", lambda k: set())
    runner = KernelRunner(open_device("cuda", emulate="forward"), presets.load("h100").target)
    prog = looped(32, 3, 64, "add", values)
    x = RNG.standard_normal((2, 3, 64)).astype(np.float32)
    got, want = [x, np.zeros_like(x)], [x, np.zeros_like(x)]
    runner(prog, got, ())
    run_program(prog, want, ())
    assert not np.allclose(got[1], want[1], atol=1e-3)


def test_a_split_gemv_without_its_barrier_fails(monkeypatch):
    """Negative control: the barrier between the slices' stores of their sums and slice 0's reads of them removed,
    the emulation's shuffled order and poisoned shared memory make the outputs wrong."""
    require_cxx()
    from deploycc.runtime.devices import open_device
    from deploycc.targets.cuda import CUDARenderer

    prog = legalized("linear", {"x": (1, 2048), "w": (40, 2048)})
    x, w = RNG.standard_normal((1, 2048), np.float32), RNG.standard_normal((40, 2048), np.float32)
    for barrier in (True, False):
        if not barrier:
            monkeypatch.setattr(CUDARenderer, "barrier", "")
        runner = KernelRunner(open_device("cuda", emulate="shuffle"), presets.load("h100").target)
        scheduled_prog = schedule_program(prog, runner.target)
        assert scheduled_prog.attrs["schedule"].rule == "gemv-split4"
        got = [x, w, np.zeros((1, 40), np.float32)]
        runner(scheduled_prog, got, ())
        assert np.allclose(got[-1], x @ w.T, atol=1e-3) == barrier


def test_cuda_blocks_of_part_of_a_warp_take_the_tree():
    """A CUDA preset of 16 threads a block: the GEMV's lane groups are 16 wide, and shuffles would name lanes the
    warp does not have; the renderer lowers them to the tree, which the emulation runs."""
    require_cxx()
    from dataclasses import replace

    from deploycc.runtime.devices import open_device

    target = replace(presets.load("h100").target, threads_per_block=16)
    runner = KernelRunner(open_device("cuda", emulate="forward"), target)
    prog = legalized("linear", {"x": (1, 64), "w": (9, 64)})
    x, w = RNG.standard_normal((1, 64), np.float32), RNG.standard_normal((9, 64), np.float32)
    src = check(runner, prog, "gemv", [x, w], (1, 9))
    assert "__shfl" not in src and "__syncthreads" in src


def test_webgpu_requirements_count_the_reductions_arrays():
    """A WebGPU package states the work-group memory its kernels need (kernels.requires, targets/webgpu_limits.py):
    for kernels with warp-level reductions that is the arrays of whichever variant has more, with or without
    subgroups, as rendered."""
    import re

    from deploycc.targets.webgpu_limits import _shared_bytes
    from deploycc.targets.wgsl import render

    target = presets.load("chrome-webgpu").target
    decl = re.compile(r"var<workgroup>\s+\w+\s*:\s*array<(\w+),\s*(\d+)>")
    progs = [legalized("linear", {"x": (1, 576), "w": (200, 576)}),
             legalized("rms_norm", {"x": (sym.var("n"), 2048), "w": (2048,)}, eps=1e-5)]
    for prog in progs:
        (k,) = schedule_program(prog, target).attrs["schedule"].kernels
        used = [sum(4 * int(n) for _, n in decl.findall(render([k], target, subgroups=sg))) for sg in (True, False)]
        assert 0 < max(used) <= _shared_bytes(k), (prog.name, used, _shared_bytes(k))
