"""The cpu backend: buffers are host memory, kernels are C compiled into a shared object (runtime/native.py).

A launch calls the kernel's `NAME__launch(buffers, ints, groups)` through ctypes, which runs the
groups on the module's thread pool and returns when they are done (launches are synchronous). This
is the launch-by-launch path (kernel tests, `bench --profile`); a package runs a whole step with
one native call instead (runtime/engine.py).
"""
from __future__ import annotations

import ctypes
import platform
import time

import numpy as np

from .. import native
from .base import Buffer, DeviceError, Kernel
from .host import HostDevice

ALIGN = 64


def enumerate_devices() -> list[dict]:
    try:
        cc = " ".join(native.compiler())
    except native.NativeError as e:
        cc = f"none ({e})"
    flags = native.cpu_flags() or set()
    isa = "x86-64-v4" if set(native.X86_64_V4) <= flags else "x86-64-v3" if set(native.X86_64_V3) <= flags else "generic"
    return [{"kind": "cpu", "name": CPUDevice.name, "details": {
        "machine": platform.machine(), "cores": native.physical_cores(), "isa": isa,
        "vnni": "avx512_vnni" in flags or "avx_vnni" in flags, "compiler": cc, "default": True}}]


def aligned_zeros(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + nbytes]


class CPUDevice(HostDevice):
    kind = "cpu"
    name = f"{native.cpu_model()} (native C)"

    def __init__(self, threads: int = 0):
        super().__init__()
        self.threads = threads
        self.libs: list = []  # keep every loaded module alive
        self.profile: list | None = None  # (kernel, seconds, weight bytes) of each launch while profiling
        self.weight_ids: set[int] = set()  # the weights' buffers (the engine says which): bytes a launch streams

    def alloc(self, nbytes: int) -> Buffer:
        """Host memory as HostDevice's, but 64-byte aligned (vector loads of whole cache lines)."""
        nbytes = self._check_alloc(nbytes)
        return Buffer(aligned_zeros(max(4, nbytes)), nbytes, self)

    @staticmethod
    def pointer(buf: Buffer) -> int:
        return buf.handle.ctypes.data

    # ---- kernels ---------------------------------------------------------------------------------------
    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        options = options or {}
        try:
            path = native.build_cached(source, options.get("isa") or "native", bool(options.get("fast_math")))
            lib = native.load(path, native.isa_flags(options.get("isa") or "native"), self.threads)
        except native.NativeError as e:
            raise DeviceError(str(e)) from None
        return self.kernels_of(lib, names)

    def kernels_of(self, lib, names: list[str]) -> dict[str, Kernel]:
        self.libs.append(lib)
        out = {}
        for n in names:
            try:
                fn = getattr(lib, f"{n}__launch")
            except AttributeError:
                raise DeviceError(f"the native module has no kernel {n}; recompile the package") from None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            fn.restype = None
            out[n] = Kernel(n, fn, self)
        return out

    def launch(self, kernel: Kernel, args: list, grid, block) -> None:
        bufs, ints = self._split_args(kernel, args)
        g, b = self._dims(kernel, grid, block)
        self.launcher(kernel)(bufs, ints, g, b)

    def launcher(self, kernel: Kernel):
        fn = kernel.handle
        state: dict = {}

        def site(bufs, ints, grid, block):
            groups = grid[0] * grid[1] * grid[2]
            if state.get("n") != (len(bufs), len(ints)):
                state["n"] = (len(bufs), len(ints))
                state["b"] = (ctypes.c_void_p * max(1, len(bufs)))()
                state["s"] = (ctypes.c_int * max(1, len(ints)))()
            pb, ps = state["b"], state["s"]
            for i, b in enumerate(bufs):
                pb[i] = b.handle.ctypes.data
            for i, v in enumerate(ints):
                ps[i] = v
            if self.profile is None:
                fn(pb, ps, groups)
                return
            t = time.perf_counter()
            fn(pb, ps, groups)
            dt = time.perf_counter() - t
            self.profile.append((kernel.name, dt, sum(b.nbytes for b in bufs if id(b) in self.weight_ids)))
        return site

    def start_profile(self) -> None:
        """Time every launch from now on (launches are synchronous: the wall time of the call is the kernel's)."""
        self.profile = []

    def take_profile(self) -> list[tuple[str, float, int]]:
        out, self.profile = self.profile or [], None
        return out

