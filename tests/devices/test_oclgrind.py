"""The OpenCL kernels of the GPU-style presets under Oclgrind, an OpenCL device simulator that checks every
work-item's memory accesses: data races (within a work-group between barriers, and between work-groups),
barrier divergence and out-of-bounds reads and writes of buffers and local memory. PoCL on a CPU hides
these (its work-items of a group run in order, and an access past a buffer reads the heap).

Each tiny architecture is compiled for `adreno` (an OpenCL GPU preset: work-groups of 128, local-memory
tiles, barriers) with a 64-token window in chunks of 8, and run by oclgrind_worker.py under `oclgrind`,
which replaces the OpenCL library of the process, so the only platform is the simulator: a prompt of
10 tokens (a full chunk, then a partial one) and a decode step, within 1e-3 of the numpy reference (adreno's
float16 KV cache: 3e-3 of the largest logit, HALF_TOLERANCE); for
the architectures whose attention differs most (windows, soft-caps, local and global layers), also a
batched step of two sequences over the page pool (the paged attention kernels).
Oclgrind runs a process on about one core, so the cases run two at a time (the module's fixture starts
the selected ones; each test waits for its own).
The CUDA and WebGPU presets' schedules are rendered as OpenCL too (their preset with target.kind opencl:
the schedule rules read the target's parameters, not its kind) for one architecture each.

Checks: --data-races (and the out-of-bounds and barrier checks, always on); --check-api reports API misuse
(a launch with bad sizes or arguments). Kernel errors go to the --log file, which must stay empty; API
errors go to stderr, where only pyopencl's own probes are expected (a device query of a parameter OpenCL 1.2
lacks; a kernel named '_source' looked up by attribute access). Not used: --uninitialized, whose plugin in
Oclgrind 21.10 aborts on LLVM's `freeze` instruction, which its own compiler emits for our kernels.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from bad_inputs.common import reseal
from conftest import missing

from fixtures import TINY, make_tiny

WORKER = Path(__file__).with_name("oclgrind_worker.py")
SMALL = ("context_window=64", "prefill_chunk=8")
AS_OPENCL = ("target.kind=opencl", "backend=opencl", "web=false", "target.tensor_cores=false",
             "target.dp4a=false")  # CUDA's wmma and __dp4a are not OpenCL
TOLERANCE = 1e-3
# adreno's float16 KV cache (the reference's rounds alike): a key the simulator's and numpy's float32 sums put on
# either side of a tie between two halves rounds apart, and every later position moves (measured 3.2e-3 at a
# largest logit of 8.6, smollm3-nope-yarn): held as test_model_kernels.py holds PoCL's, of the largest logit
HALF_TOLERANCE = 3e-3
TIMEOUT_S = 300
LOCAL_MEM = 1 << 20  # see run_case
# (preset, tiny architecture, edit of the kernels): the CUDA and WebGPU presets' schedules rendered as OpenCL
# for one architecture each; a deleted barrier as the control that Oclgrind sees what it should
CASES = ([("adreno", name, None) for name in sorted(TINY)]
         + [("h100", "mistral-gqa2", None), ("chrome-webgpu", "qwen2-gqa5-tied", None)])
CONTROL = ("adreno", "llama-gqa1", "no-barrier")
STEP = ("llama-gqa1", "mistral-gqa4-window", "gemma2-gqa2-softcap", "gemma3-gqa4-local-global",
        "qwen3-gqa2-headdim-window", "phi3-longrope-partial-window")  # also run a batched step
# pyopencl's probes, reported by --check-api on every run
BENIGN = re.compile(r"Oclgrind - OpenCL runtime error detected\s+Function: (clGetDeviceInfo\s+Error:\s+"
                    r"CL_INVALID_VALUE\s+For argument 'param_name'|clCreateKernel\s+Error:\s+"
                    r"CL_INVALID_KERNEL_NAME\s+Kernel '_source' not found)\s*")
BARRIER = r"\n\s*barrier\(CLK_LOCAL_MEM_FENCE\);"


def case_id(case: tuple) -> str:
    return "-".join(c for c in case if c)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict:
    """case -> the future of its run under Oclgrind (run_case), for the cases this session selected, two at a
    time; each package is compiled here while earlier ones run."""
    oclgrind = shutil.which("oclgrind")
    if oclgrind is None:
        missing("oclgrind is not installed (apt-get install oclgrind; `make test` installs it)")
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    root = tmp_path_factory.mktemp("oclgrind")
    pool = ThreadPoolExecutor(2)
    futures = {}
    for case in dict.fromkeys(selected):
        pkg = compile_case(case, root / case_id(case))
        options = ("--step",) if case[0] == "adreno" and case[1] in STEP and not case[2] else ()
        futures[case] = pool.submit(run_case, oclgrind, pkg, make_tiny(case[1]), root / case_id(case) / "oclgrind.log",
                                    options)
    yield futures
    pool.shutdown(cancel_futures=True)


def compile_case(case: tuple, work: Path) -> Path:
    from deploycc import presets
    from deploycc.package import compile_model

    preset, name, edit = case
    overrides = SMALL + (AS_OPENCL if presets.load(preset).target.kind != "opencl" else ())
    if edit == "no-barrier":  # float weights (the GPU presets' default is 4-bit)
        overrides += ("quantization=q0f32",)
    pkg = compile_model(str(make_tiny(name)), preset, overrides=overrides, out=str(work / "pkg"))
    if edit == "no-barrier":  # adreno's few-row GEMV (the chunks of 8) without the second barrier of its lanes' tree
        cl = pkg / "kernels" / "kernels.cl"
        text = cl.read_text()
        tile_loop = re.search(rf"(__kernel void linear_rows\(.*?{BARRIER}.*?){BARRIER}", text, re.S)
        assert tile_loop, "adreno's linear_rows kernel has no second barrier: the schedule changed, update this control"
        cl.write_text(text[:tile_loop.end(1)] + text[tile_loop.end():])
        reseal(pkg)
    return pkg


def run_case(oclgrind: str, pkg: Path, source: Path, log: Path, options: tuple[str, ...]) -> dict:
    """The worker under Oclgrind: {"errors": Oclgrind's kernel errors and any API error but pyopencl's probes,
    "returncode", "stdout", "stderr"}."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # --local-mem-size: Oclgrind 21.10 gives every launch the __local arrays of every kernel in the program (they are
    # module globals to it), so a program whose kernels each fit in 32 KiB can exceed it together
    r = subprocess.run([oclgrind, "--data-races", "--check-api", "--max-errors", "20", "--local-mem-size", str(LOCAL_MEM),
                        "--log", str(log),
                        sys.executable, str(WORKER), str(pkg), str(source), *options],
                       capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    api = "\n".join(line for line in BENIGN.sub("", r.stderr).splitlines() if "Oclgrind" in line or "CL_" in line)
    errors = ((log.read_text() if log.exists() else "") + api).strip()
    return {"errors": errors, "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernels_under_oclgrind(runs, case):
    r = runs[case].result()
    assert not r["errors"], r["errors"][:4000]
    assert r["returncode"] == 0, r["stderr"][-3000:]
    report = json.loads(r["stdout"].strip().splitlines()[-1])
    assert "Oclgrind" in report["device"], report
    tol = HALF_TOLERANCE * max(1.0, report["largest_logit"]) if report["kv_cache"] == "float16" else TOLERANCE
    assert report["max_abs_diff"] <= tol, report


@pytest.mark.parametrize("case", [CONTROL], ids=case_id)
def test_oclgrind_reports_a_missing_barrier(runs, case):
    """The check checks: adreno's few-row GEMV (schedule/dispatch.py: the prefill chunks of 8 rows) with the second
    barrier of its lanes' shared-memory tree deleted (a halving reads sums the last one has not written) is a data
    race Oclgrind reports."""
    errors = runs[case].result()["errors"]
    assert "data race" in errors and "Kernel: linear" in errors, errors[:3000]
