"""CUDA backend (CuPy: NVRTC and the CUDA driver) and offline CUDA C -> PTX compilation (nvcc, ptxas).

Kernel ABI: `extern "C" __global__ void NAME(T* __restrict__ b0, ..., int s0, ...)`, launched over
`grid` blocks of `block` threads on CuPy's current stream (the legacy default stream unless the caller
set another), so copies and launches are ordered and a download sees every earlier launch.

CuPy's wheels (cupy-cuda12x, cupy-cuda13x) are binary: no toolkit build, only the driver. Kernels are
compiled at load by NVRTC, with the toolkit's include directory when one is found (cuda_fp16.h).

`compile_cuda` and `ptxas_check` need only the CUDA toolkit binaries, not a GPU: they let the
compiler check its CUDA output on machines without a driver.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .base import Buffer, Device, DeviceError, Kernel, first_lines

INSTALL_HINT = ("pip install cupy-cuda12x (the deploycc[cuda] extra; cupy-cuda13x for a CUDA 13 driver): "
                "binary wheels that need an NVIDIA driver")


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise DeviceError(f"the CUDA backend needs CuPy ({e}): {INSTALL_HINT}") from None
    return cupy


def _count(cupy) -> int:
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver, no GPU, or a driver older than the wheel's CUDA
        return 0


def enumerate_devices() -> list[dict]:
    cupy = _cupy()
    out = []
    for i in range(_count(cupy)):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        out.append({"kind": "cuda", "name": _text(props["name"]), "details": {
            "device_index": i, "arch": f"sm_{props['major']}{props['minor']}", "total_memory": props["totalGlobalMem"],
            "default": i == 0}})
    return out


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


class CUDADevice(Device):
    kind = "cuda"

    def __init__(self, device: int = 0):
        cupy = self._cupy = _cupy()
        count = _count(cupy)
        if count == 0:
            raise DeviceError("CUDA driver unavailable or no NVIDIA GPU found (CuPy sees 0 devices)")
        if not 0 <= device < count:
            raise DeviceError(f"CUDA device index {device} out of range: {count} GPU(s) found")
        self.cu_device = cupy.cuda.Device(device)
        self.cu_device.use()
        props = cupy.cuda.runtime.getDeviceProperties(device)
        self.arch = f"sm_{props['major']}{props['minor']}"
        self.name = f"{_text(props['name'])} ({self.arch})"
        self.limits = {"max_threads_per_block": props["maxThreadsPerBlock"],
                       "max_shared_memory_per_block": props["sharedMemPerBlock"],
                       "warp_size": props["warpSize"], "total_memory": props["totalGlobalMem"],
                       "multiprocessors": props["multiProcessorCount"]}
        self.has_f16 = (props["major"], props["minor"]) >= (5, 3)
        self._modules: dict[tuple[str, tuple[str, ...]], object] = {}
        self.events: list | None = None  # (kernel, start event, end event, weight bytes) of each launch while profiling
        self.weight_ids: set[int] = set()  # the weights' buffers (the engine says which): bytes a launch streams
        self.launch_errors: tuple = (cupy.cuda.driver.CUDADriverError,)  # what a failed launch raises

    # -- memory ----------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        nbytes = self._check_alloc(nbytes)
        cupy = self._cupy
        try:
            with self.cu_device:
                h = cupy.zeros(max(4, nbytes), dtype=cupy.uint8)
        except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as e:
            raise DeviceError(f"CUDA allocation of {nbytes} bytes failed: {first_lines(e, 1)}") from None
        return Buffer(h, nbytes, self)

    def upload(self, array: np.ndarray) -> Buffer:
        array = np.ascontiguousarray(array)
        buf = self.alloc(array.nbytes)
        if array.nbytes:
            buf.handle[:array.nbytes].set(array.reshape(-1).view(np.uint8))
        return buf

    def write(self, buf: Buffer, array: np.ndarray) -> None:
        array = self._host_bytes(buf, array)
        if array.nbytes:
            buf.handle[:array.nbytes].set(array.reshape(-1).view(np.uint8))

    def download(self, buf: Buffer, shape, dtype) -> np.ndarray:
        n = self._read_size(buf, shape, dtype)
        if not n:
            return np.empty(shape, dtype)
        return buf.handle[:n].get().view(dtype).reshape(shape)

    # -- kernels ---------------------------------------------------------------------------------------
    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        cupy = self._cupy
        options = dict(options or {})
        flags = ("--std=c++17",) + (("--use_fast_math",) if options.pop("fast_math", False) else ())
        if options:
            raise DeviceError(f"unknown CUDA build option(s): {', '.join(sorted(options))} (known: fast_math)")
        inc = cuda_include_dir()
        flags += (f"-I{inc}",) if inc else ()
        key = (hashlib.sha256(source.encode()).hexdigest(), flags)
        module = self._modules.get(key)
        kernels = {}
        try:
            with self.cu_device:
                if module is None:
                    module = cupy.RawModule(code=source, options=flags, backend="nvrtc")
                    module.compile()
                    self._modules[key] = module
                for name in names:
                    kernels[name] = Kernel(name, module.get_function(name), self)
        except cupy.cuda.compiler.CompileException as e:
            raise DeviceError(f"CUDA build failed for {self.arch}: {first_lines(str(e))}") from None
        except cupy.cuda.driver.CUDADriverError as e:
            raise DeviceError(f"CUDA module load failed for {self.arch}: {first_lines(str(e), 1)} "
                              f"(is every kernel in {names} declared extern \"C\"?)") from None
        return kernels

    def launch(self, kernel: Kernel, args: list, grid, block) -> None:
        bufs, ints = self._split_args(kernel, args)
        grid, block = self._dims(kernel, grid, block)
        if 0 in grid:
            return
        if block[0] * block[1] * block[2] > self.limits["max_threads_per_block"]:
            raise DeviceError(f"{kernel.name}: block {block} exceeds {self.limits['max_threads_per_block']} threads")
        args = (*[b.handle for b in bufs], *[np.int32(i) for i in ints])
        try:
            if self.events is None:
                kernel.handle(grid, block, args)
                return
            start, end = self._cupy.cuda.Event(), self._cupy.cuda.Event()
            start.record()
            kernel.handle(grid, block, args)
            end.record()
            self.events.append((kernel.name, start, end, sum(b.nbytes for b in bufs if id(b) in self.weight_ids)))
        except self.launch_errors as e:
            raise _launch_failed(kernel, grid, block, e) from None

    def launcher(self, kernel: Kernel):
        """A launch site of the bytecode: its first launch goes through launch() and its checks (the ABI's order,
        int32 scalars, the block limit); later ones, with buffers of this device in the same places, call the kernel
        straight (the checks cost as much host time as the launch: a decode step is hundreds of launches)."""
        fn, checked, np_int = kernel.handle, [], np.int32

        def site(bufs, ints, grid, block):
            if not checked or self.events is not None:
                self.launch(kernel, [*bufs, *ints], grid, block)
                checked[:] = [True]
                return
            try:
                args = (*[b.handle for b in bufs], *[np_int(i) for i in ints])
            except OverflowError:  # a scalar past int32: launch() says which
                self.launch(kernel, [*bufs, *ints], grid, block)
                return
            try:
                fn(grid, block, args)
            except self.launch_errors as e:
                raise _launch_failed(kernel, grid, block, e) from None
        return site

    # -- bench --profile / --roofline -----------------------------------------------------------------
    def start_profile(self) -> None:
        """From now on every launch is timed by a pair of CUDA events around it."""
        self.synchronize()
        self.events = []

    def take_profile(self) -> list[tuple[str, float, int]]:
        """(kernel name, device seconds, weight bytes) of the launches since start_profile (waits for them)."""
        self.synchronize()
        get = self._cupy.cuda.get_elapsed_time
        out = [(name, get(start, end) * 1e-3, streamed) for name, start, end, streamed in self.events or []]
        self.events = None
        return out

    # -- CUDA graphs (runtime/graphs.py) ---------------------------------------------------------------
    def graph_kernels(self, kernels: list[Kernel]) -> dict[str, Kernel]:
        """{name: the kernel's graph variant (graph_source: its int arguments read from a device table)} for kernels
        built from a source of this device (their meta["source"]), one build per source."""
        by_source: dict[int, list[Kernel]] = {}
        for k in kernels:
            by_source.setdefault(id(k.meta["source"]), []).append(k)
        out = {}
        for ks in by_source.values():
            names = [k.name for k in ks]
            built = self.build(graph_source(ks[0].meta["source"], names), [n + GRAPH_SUFFIX for n in names])
            out |= {n: built[n + GRAPH_SUFFIX] for n in names}
        for k in out.values():  # loaded now, not inside a capture (CUDA loads a module's kernels lazily)
            getattr(k.handle, "num_regs", None)
        return out

    def capture(self, calls: list) -> object:
        """A CUDA graph of `calls` ((kernel handle, grid, block, args), in order), captured on a stream of its own
        (nothing runs while it is captured); returns `launch()`, which enqueues the whole graph on CuPy's current
        stream, the one every copy and launch of this device goes to, so it is ordered after every earlier one and
        before every later one, as a launch is."""
        cupy = self._cupy
        with self.cu_device:
            stream = cupy.cuda.Stream(non_blocking=True)
            stream.begin_capture()
            try:
                for fn, grid, block, args in calls:
                    fn(grid, block, args, stream=stream)
            finally:
                graph = stream.end_capture()
        return graph.launch

    def gate(self):
        """Nothing to hold back: launches are asynchronous and the GPU shares no cores with the host, so the host's
        own time to run a step's bytecode is what the caller measures anyway."""
        return lambda: None

    def read_probe(self, nbytes: int = 1 << 30, tries: int = 5) -> float:
        """Device memory read bandwidth, GB/s: best of `tries` passes of 16-byte loads over `nbytes` (XORed, so
        the loads cannot be dropped), timed with events."""
        cupy = self._cupy
        fn = self.build(_PROBE, ["dcc_read_probe"])["dcc_read_probe"].handle
        words = nbytes // 16
        data, sink = cupy.ones(words * 4, dtype=cupy.uint32), cupy.zeros(1, dtype=cupy.uint32)
        blocks = 16 * self.limits["multiprocessors"]
        best = float("inf")
        for _ in range(tries + 1):  # the first pass warms up
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            fn((blocks, 1, 1), (512, 1, 1), (data, np.uint64(words), sink))
            end.record()
            end.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, end) * 1e-3)
        return words * 16 / best / 1e9

    def synchronize(self) -> None:
        try:
            self.cu_device.synchronize()
        except self._cupy.cuda.runtime.CUDARuntimeError as e:
            raise DeviceError(f"CUDA synchronize failed (a kernel faulted?): {first_lines(str(e), 1)}") from None


GRAPH_SUFFIX = "__g"  # a kernel's graph variant: NAME__g
_KERNEL_HEAD = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\) \{\n')


def graph_source(source: str, names: list[str]) -> str:
    """The CUDA C of a graph variant of each named kernel of `source` (as the CUDA renderer writes kernels: the
    header on one line, the body up to a closing brace at the line's start), NAME__g: the same body, with its
    buffer parameters and then `const int* dcc_ints, int dcc_at` in place of its int parameters, which it reads from
    dcc_ints[dcc_at], dcc_ints[dcc_at + 1], ... . A captured graph keeps its launches' arguments; a decode step's
    sizes (the tokens cached) change every step, so the graph's kernels read them from a table the host writes
    before each replay (runtime/graphs.py)."""
    heads = {m[1]: m for m in _KERNEL_HEAD.finditer(source)}
    preamble = source[:min((m.start() for m in heads.values()), default=len(source))]
    out = [preamble]
    for name in names:
        m = heads.get(name)
        if m is None:
            raise DeviceError(f"CUDA graphs: no kernel {name!r} in its source")
        end = source.index("\n}\n", m.end() - 2)
        params = [p.strip() for p in m[2].split(",") if p.strip()]
        ints = [p for p in params if "*" not in p]
        if not all(re.fullmatch(r"(const )?int \w+", p) for p in ints):
            raise DeviceError(f"CUDA graphs: kernel {name} has a parameter outside the ABI: {m[2]}")
        head = ", ".join([p for p in params if "*" in p] + ["const int* __restrict__ dcc_ints", "int dcc_at"])
        loads = "".join(f"  const int {p.split()[-1]} = dcc_ints[dcc_at + {i}];\n" for i, p in enumerate(ints))
        out.append(f'extern "C" __global__ void {name}{GRAPH_SUFFIX}({head}) {{\n{loads}'
                   f'{source[m.end():end + 3]}\n')
    return "".join(out)


def _launch_failed(kernel: Kernel, grid, block, e) -> DeviceError:
    return DeviceError(f"CUDA launch of {kernel.name} (grid {grid}, block {block}) failed: {first_lines(str(e), 1)}")


_PROBE = r"""
extern "C" __global__ void dcc_read_probe(const uint4* __restrict__ p, unsigned long long n, unsigned int* out) {
  uint4 acc = make_uint4(0u, 0u, 0u, 0u);
  unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    uint4 v = p[i];
    acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) out[0] = 1u;
}
"""


# -- offline compilation (toolkit binaries only) ----------------------------------------------------------

def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise DeviceError(f"{name} not found on PATH: install the CUDA toolkit (nvcc and ptxas)")
    return path


def cuda_include_dir() -> str | None:
    """The toolkit's include directory (cuda_fp16.h); nvcc on PATH may be a wrapper script, so look around."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
        try:  # a wrapper such as `exec /usr/local/cuda-13.0/bin/nvcc "$@"`
            m = re.search(r"(/\S+)/bin/nvcc\b", Path(nvcc).read_text(errors="ignore")[:4096])
            roots.append(m[1] if m else None)
        except OSError:
            pass
    roots.append("/usr/local/cuda")
    for root in filter(None, roots):
        for inc in (Path(root) / "include", Path(root) / "targets" / "x86_64-linux" / "include"):
            if (inc / "cuda_fp16.h").is_file():
                return str(inc)
    return None


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DeviceError(f"{what} could not run: {e}") from None
    if r.returncode != 0:
        raise DeviceError(f"{what} failed: {first_lines(r.stderr + r.stdout)}")
    return r


def compile_cuda(source: str, arch: str = "sm_90", options: list[str] | None = None) -> str:
    """CUDA C -> PTX text with `nvcc -ptx -O3 -arch=ARCH` (no GPU needed)."""
    nvcc = _tool("nvcc")
    inc = cuda_include_dir()
    with tempfile.TemporaryDirectory(prefix="deploycc-nvcc-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cmd = [nvcc, "-ptx", f"-arch={arch}", "-O3", *(["-I", inc] if inc else []), *(options or []), "-o", "-", str(src)]
        return _run(cmd, f"nvcc -arch={arch}").stdout


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_REGS = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_check(ptx: str, arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """Assemble PTX with `ptxas -v -arch=ARCH`; per entry: registers, shared bytes, spill stores/loads."""
    ptxas = _tool("ptxas")
    with tempfile.TemporaryDirectory(prefix="deploycc-ptxas-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        r = _run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "kernel.cubin")], f"ptxas -arch={arch}")
    usage: dict[str, dict[str, int]] = {}
    entry = None
    for line in (r.stdout + r.stderr).splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = usage.setdefault(m[1], {"registers": 0, "shared_bytes": 0, "spill_stores": 0, "spill_loads": 0})
        elif entry is not None and (m := _PTXAS_SPILL.search(line)):
            entry["spill_stores"], entry["spill_loads"] = int(m[1]), int(m[2])
        elif entry is not None and (m := _PTXAS_REGS.search(line)):
            entry["registers"], entry["shared_bytes"] = int(m[1]), int(m[2] or 0)
    return usage
