"""CUDA backend (pycuda) and offline CUDA C -> PTX compilation (nvcc, ptxas).

Kernel ABI: `extern "C" __global__ void NAME(T* __restrict__ b0, ..., int s0, ...)`, launched over
`grid` blocks of `block` threads on the legacy default stream, so copies and launches are ordered
and a download sees every earlier launch.

`compile_cuda` and `ptxas_check` need only the CUDA toolkit binaries, not a GPU: they let the
compiler check its CUDA output on machines without a driver.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .base import Buffer, Device, DeviceError, Kernel, first_lines

INSTALL_HINT = "pip install pycuda (the deploycc[cuda] extra; it builds against the CUDA toolkit and needs libcuda)"


def _pycuda():
    try:
        import pycuda.driver as drv
    except ImportError as e:
        raise DeviceError(f"the CUDA backend needs pycuda ({e}): {INSTALL_HINT}") from None
    return drv


def enumerate_devices() -> list[dict]:
    drv = _pycuda()
    try:
        drv.init()
        n = drv.Device.count()
    except drv.Error:  # no driver / no GPU
        return []
    out = []
    for i in range(n):
        d = drv.Device(i)
        cc = d.compute_capability()
        out.append({"kind": "cuda", "name": d.name(), "details": {
            "device_index": i, "arch": f"sm_{cc[0]}{cc[1]}", "total_memory": d.total_memory(), "default": i == 0}})
    return out


class CUDADevice(Device):
    kind = "cuda"

    def __init__(self, device: int = 0):
        drv = self._drv = _pycuda()
        try:
            drv.init()
            count = drv.Device.count()
        except drv.Error as e:
            raise DeviceError(f"CUDA driver unavailable: {first_lines(e, 1)}") from None
        if not 0 <= device < count:
            raise DeviceError(f"CUDA device index {device} out of range: {count} GPU(s) found")
        self.cu_device = drv.Device(device)
        self.context = self.cu_device.retain_primary_context()
        self.context.push()
        atexit.register(self._release)
        cc = self.cu_device.compute_capability()
        self.arch = f"sm_{cc[0]}{cc[1]}"
        self.name = f"{self.cu_device.name()} ({self.arch})"
        a = drv.device_attribute
        self.limits = {"max_threads_per_block": self.cu_device.get_attribute(a.MAX_THREADS_PER_BLOCK),
                       "max_shared_memory_per_block": self.cu_device.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK),
                       "warp_size": self.cu_device.get_attribute(a.WARP_SIZE),
                       "total_memory": self.cu_device.total_memory()}
        self.has_f16 = cc >= (5, 3)
        self._modules: dict[tuple[str, tuple[str, ...]], object] = {}

    def _release(self) -> None:
        if self.context is not None:
            self.context.pop()
            self.context = None

    # -- memory ----------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        nbytes = self._check_alloc(nbytes)
        drv = self._drv
        try:
            h = drv.mem_alloc(max(4, nbytes))
            drv.memset_d8(h, 0, max(4, nbytes))
        except drv.Error as e:
            raise DeviceError(f"CUDA allocation of {nbytes} bytes failed: {first_lines(e, 1)}") from None
        return Buffer(h, nbytes, self)

    def upload(self, array: np.ndarray) -> Buffer:
        array = np.ascontiguousarray(array)
        buf = self.alloc(array.nbytes)
        if array.nbytes:
            self._drv.memcpy_htod(buf.handle, array)
        return buf

    def write(self, buf: Buffer, array: np.ndarray) -> None:
        array = self._host_bytes(buf, array)
        if array.nbytes:
            self._drv.memcpy_htod(buf.handle, array)

    def download(self, buf: Buffer, shape, dtype) -> np.ndarray:
        n = self._read_size(buf, shape, dtype)
        out = np.empty(shape, dtype)
        if n:
            self._drv.memcpy_dtoh(out, buf.handle)
        return out

    # -- kernels ---------------------------------------------------------------------------------------
    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        from pycuda.compiler import SourceModule

        options = dict(options or {})
        flags = ("-O3",) + (("--use_fast_math",) if options.pop("fast_math", False) else ())
        if options:
            raise DeviceError(f"unknown CUDA build option(s): {', '.join(sorted(options))} (known: fast_math)")
        key = (hashlib.sha256(source.encode()).hexdigest(), flags)
        module = self._modules.get(key)
        if module is None:
            try:
                module = SourceModule(source, options=list(flags), arch=self.arch, no_extern_c=True,
                                      include_dirs=[d for d in [cuda_include_dir()] if d])
            except self._drv.CompileError as e:
                raise DeviceError(f"CUDA build failed for {self.arch}: {first_lines(e.stderr or e.msg)}") from None
            self._modules[key] = module
        kernels = {}
        for name in names:
            try:
                kernels[name] = Kernel(name, module.get_function(name), self, {"format": None})
            except self._drv.Error:
                raise DeviceError(f"CUDA module has no kernel {name!r} (is it declared extern \"C\"?)") from None
        return kernels

    def launch(self, kernel: Kernel, args: list, grid, block) -> None:
        bufs, ints = self._split_args(kernel, args)
        grid, block = self._dims(kernel, grid, block)
        if 0 in grid:
            return
        if block[0] * block[1] * block[2] > self.limits["max_threads_per_block"]:
            raise DeviceError(f"{kernel.name}: block {block} exceeds {self.limits['max_threads_per_block']} threads")
        fmt = "P" * len(bufs) + "i" * len(ints)
        if kernel.meta["format"] != fmt:  # prepare once per argument pattern
            kernel.handle.prepare(fmt)
            kernel.meta["format"] = fmt
        try:
            kernel.handle.prepared_async_call(grid, block, None, *[int(b.handle) for b in bufs], *ints)
        except self._drv.Error as e:
            raise DeviceError(f"CUDA launch of {kernel.name} (grid {grid}, block {block}) failed: "
                              f"{first_lines(e, 1)}") from None

    def synchronize(self) -> None:
        self._drv.Context.synchronize()


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
