"""Every CUDA kernel emitted for the h100 (sm_90) and rtx4090 (sm_89) presets, for every tiny
architecture, compiles with nvcc and assembles with ptxas (no GPU needed), with the KV-cache copies, the
sliding-window layers' ring caches of a 16-token prefill chunk, and the batched step over a page pool (its
paged attention, per-token rotary tables and slot copies). They run on the CPU under the emulation of CUDA's
thread model in tests/kernels/test_model_kernels.py and tests/devices/test_cuda_emulator.py, and on a GPU where one
is lent (benchmarks/gpu_check.sh)."""
import pytest
from conftest import require_nvcc

import deploycc
from deploycc import presets
from deploycc.export import Pool, export
from deploycc.ir.kernel import scheduled
from deploycc.kernel_runner import render
from deploycc.pipeline import run as run_pipeline
from deploycc.runtime.devices.cuda import compile_cuda, ptxas_check
from deploycc.schedule import schedule_program
from deploycc.vm.lower import kv_copy_paged_program, kv_copy_program


@pytest.fixture(autouse=True)
def toolkit():
    require_nvcc()


@pytest.mark.parametrize("preset", ["h100", "rtx4090"])
def test_cuda_kernels_compile_and_assemble(tiny_path, preset):
    p = presets.load(preset)
    model = deploycc.load_model(str(tiny_path))
    mod = run_pipeline(export(model, 64, 16, Pool(pages=8, sequences=4)), p.target, "scheduled")
    assert any("page_size" in prog.attrs for prog in mod.programs().values())  # the paged attention is here
    copies = [schedule_program(kv_copy_program(ring), p.target) for ring in (False, True)]
    copies.append(schedule_program(kv_copy_paged_program(), p.target))
    kernels = [k for prog in [*mod.programs().values(), *copies] for k in scheduled(prog).kernels]
    source = render(kernels, p.target)
    # prefill of this float model on the tensor cores where the preset has them and takes float weights there
    # (schedule/mma.py: h100's 3xTF32; rtx4090's tensor cores take 4-, 8- and 16-bit weights only)
    assert ("wmma::mma_sync" in source and "#include <mma.h>" in source) == (p.target.tensor_cores and
                                                                          p.target.tf32_tiles)
    ptx = compile_cuda(source, p.target.arch)
    usage = ptxas_check(ptx, p.target.arch)
    from deploycc.targets.cstyle import ident

    assert {ident(k.name) for k in kernels} <= set(usage), "every kernel is in the PTX"
    spills = {name: u for name, u in usage.items() if u["spill_stores"]}
    assert not spills, f"register spills: {spills}"


def test_buffers_come_aligned_and_the_gemv_loads_its_inputs_16_bytes_at_a_time():
    """Every buffer a launch passes is an allocation of its own (256-byte aligned, as the emulation's), so each kernel
    takes its pointers as 16-byte aligned (targets/cuda.py: `<name>_arg` through __builtin_assume_aligned), and nvcc
    loads a decode GEMV lane's 8 consecutive activations as two 16-byte vectors (ld.global.nc.v4.f32): in the SASS
    of an 8B's widths 5.25 instructions a 4-bit weight instead of 5.50 (benchmarks/gemv_sass.py). Without the
    alignment, the negative control, its PTX has no vector load."""
    from deploycc.quantization import quantize
    from fixtures import make_tiny

    target = presets.load("h100").target
    model = quantize(deploycc.load_model(str(make_tiny("llama-gqa1"))), "q4f16_1", None, False)
    mod = run_pipeline(export(model, 64), target, "scheduled")
    gemvs = [k for prog in mod.programs().values() if scheduled(prog).rule.startswith("gemv")
             for k in scheduled(prog).kernels]
    assert gemvs
    source = render(gemvs, target)
    for k in gemvs:
        for b in k.buffers:
            assert f"__builtin_assume_aligned({b.name}_arg, 16);" in source, b.name
    assert ".v4.f32" in compile_cuda(source, target.arch)
    unaligned = source.replace(", 16);", ", 4);")
    assert ".v4.f32" not in compile_cuda(unaligned, target.arch)
