"""CUDA C executed on the CPU: a CUDA device for machines without an NVIDIA GPU (this project's, CI's).

The exact text of a CUDA package's kernels is compiled as C++ (g++ or clang++) against cuda_emu.h, which stands in
for cuda_fp16.h and the CUDA built-ins, and cuda_emu_run.inc's scheduler runs a launch: every CUDA thread a fiber,
`__syncthreads()` a true barrier, shared memory poisoned before each block, blocks one after another, threads (and
blocks) in the order asked for: forward, reverse or shuffled. A barrier not every thread of a block reaches, or
reaches at another line, fails the launch; so does a store past either end of a buffer (each buffer has guard bytes
on both sides, checked after every launch). The guard bytes are 0xFF, so a read past either end gives NaN (float,
half, bfloat16) or -1, which a result shows where a product with zero would hide another value.

CUDAEmulator is a CUDADevice: the runtime's own CUDA launch path (the ABI's order of buffers then int32 scalars, the
grid and block, the block limit, the launch sites of the bytecode) drives it as it drives a GPU. It is opened with
`open_device("cuda", emulate="forward" | "reverse" | "shuffle")`, or for any CUDA package (`run`, `verify`, ...) with
DEPLOYCC_CUDA_EMULATE set to one of those orders. It proves indexing, launch geometry, barriers, shared memory and
the numerics up to the CPU's libm; it says nothing of speed, occupancy or the GPU's weak memory model.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

import numpy as np

from .base import Buffer, DeviceError, Kernel, first_lines
from .cuda import CUDADevice

ORDERS = {"forward": 0, "reverse": 1, "shuffle": 2}
# the bytes on each side of a buffer: as many as the buffer has, 64 to 1 MiB, so that a store shifted by up to that
# lands in them (and not on another allocation); the CHECKED nearest are checked. 0xFF: a read there is NaN or -1
# (a store of 0xFF bytes there goes unseen: a NaN or -1 written past the end, which a read of it then shows)
GUARD_BYTE = 0xFF
CHECKED = 256
ALIGN = 256  # a buffer's first byte, as cudaMalloc's
# the headers a CUDA package's source includes, here
STUBS = {"cuda_fp16.h": '#include "cuda_emu.h"\n', "cuda_bf16.h": '#include "cuda_emu.h"\n', "mma.h": '#include "cuda_emu.h"\n',
         "math_constants.h": "#define CUDART_INF_F __builtin_inff()\n#define CUDART_NAN_F __builtin_nanf(\"\")\n"}
KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')


class EmulationError(DeviceError):
    """A launch the emulation refused: a divergent barrier, a thread that returned before one, a store out of bounds."""


def _compiler() -> str:
    for cc in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if cc and shutil.which(cc):
            return cc
    raise DeviceError("the CUDA emulation needs a C++ compiler (g++ or clang++; apt-get install g++)")


def _cache_dir() -> Path:
    root = Path(os.environ.get("DEPLOYCC_HOME") or Path.home() / ".cache" / "deploycc").expanduser()
    return root / "cuda-emu"


def entry_wrappers(source: str, names: list[str]) -> tuple[str, dict[str, list[str]]]:
    """C++ that calls each kernel from an array of argument pointers (`dcc_entry_NAME(void** a)`), and each kernel's
    parameters as "buffer" or "int"."""
    found = {m[1]: m[2] for m in KERNEL.finditer(source)}
    out, kinds = [], {}
    for name in names:
        if name not in found:
            raise DeviceError(f"CUDA build: no kernel {name!r} in the source (is it declared extern \"C\" __global__?)")
        params = [p.strip() for p in found[name].split(",") if p.strip()]
        args, kinds[name] = [], []
        for k, p in enumerate(params):
            if "*" in p:
                ctype = p[:p.rindex("*") + 1].replace("__restrict__", "").strip()
                args.append(f"({ctype})a[{k}]")
                kinds[name].append("buffer")
            elif re.fullmatch(r"(const\s+)?int\s+\w+", p):
                args.append(f"*(const int*)a[{k}]")
                kinds[name].append("int")
            else:
                raise DeviceError(f"CUDA build: kernel {name} has a parameter {p!r} outside the ABI (T* buffers, int)")
        out.append(f'extern "C" void dcc_entry_{name}(void** a) {{ {name}({", ".join(args)}); }}')
    return "\n".join(out) + "\n", kinds


class Guarded(np.ndarray):
    """A buffer's bytes with `guard` bytes of GUARD_BYTE on each side."""

    guard = 0

    def __array_finalize__(self, obj):
        self.guard = getattr(obj, "guard", 0)

    def data_bytes(self, n: int) -> np.ndarray:
        return self.view(np.ndarray)[self.guard:self.guard + n]


class CUDAEmulator(CUDADevice):
    kind = "cuda"

    def __init__(self, order: str = "forward", seed: int = 0, arch: str = "sm_90"):
        if order not in ORDERS:
            raise DeviceError(f"unknown thread order {order!r} for the CUDA emulation; choose one of "
                              f"{', '.join(ORDERS)}")
        self.order, self.seed, self.arch = order, int(seed), arch
        self.name = f"CUDA emulation on the CPU ({order} thread order)"
        self.limits = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 48 * 1024, "warp_size": 32,
                       "total_memory": 1 << 40, "multiprocessors": 1}
        self.has_f16 = True
        self._modules: dict[str, tuple] = {}
        self.events = None
        self.weight_ids: set[int] = set()
        self.launch_errors = (EmulationError,)
        self.launches = 0

    # -- memory: host arrays with guard bytes on both sides ----------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        nbytes = self._check_alloc(nbytes)
        guard = -(-min(max(64, nbytes), 1 << 20) // 64) * 64
        whole = np.full(nbytes + 2 * guard + ALIGN, GUARD_BYTE, np.uint8)
        skip = -(whole.ctypes.data + guard) % ALIGN  # the buffer's first byte aligned as cudaMalloc aligns it
        raw = whole[skip:skip + nbytes + 2 * guard].view(Guarded)
        raw.guard = guard
        raw[guard:guard + nbytes] = 0
        return Buffer(raw, nbytes, self)

    def upload(self, array: np.ndarray) -> Buffer:
        array = np.ascontiguousarray(array)
        buf = self.alloc(array.nbytes)
        buf.handle.data_bytes(array.nbytes)[:] = array.reshape(-1).view(np.uint8)
        return buf

    def write(self, buf: Buffer, array: np.ndarray) -> None:
        array = self._host_bytes(buf, array)
        buf.handle.data_bytes(array.nbytes)[:] = array.reshape(-1).view(np.uint8)

    def download(self, buf: Buffer, shape, dtype) -> np.ndarray:
        n = self._read_size(buf, shape, dtype)
        return np.asarray(buf.handle.data_bytes(n)).copy().view(dtype).reshape(shape)

    # -- kernels ----------------------------------------------------------------------------------------
    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        options = dict(options or {})
        options.pop("fast_math", None)  # the CPU's libm either way
        if options:
            raise DeviceError(f"unknown CUDA build option(s): {', '.join(sorted(options))} (known: fast_math)")
        names = list(names)
        wrappers, kinds = entry_wrappers(source, names)
        here = files(__package__)
        header, runner = (here / "cuda_emu.h").read_text(), (here / "cuda_emu_run.inc").read_text()
        cc = _compiler()
        text = source + "\n" + wrappers + runner
        key = hashlib.sha256("\0".join([cc, header, text]).encode()).hexdigest()[:32]
        lib = self._modules.get(key)
        if lib is None:
            lib = self._modules[key] = self._compile(cc, key, header, text)
        kernels = {}
        for name in names:
            fn = ctypes.cast(getattr(lib, f"dcc_entry_{name}"), ctypes.c_void_p).value
            kernels[name] = Kernel(name, self._handle(lib, name, fn, kinds[name]), self, {"params": kinds[name]})
        return kernels

    def _compile(self, cc: str, key: str, header: str, text: str):
        out = _cache_dir() / f"{key}.so"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="deploycc-cuda-emu-") as tmp:
                inc = Path(tmp)
                (inc / "cuda_emu.h").write_text(header)
                for name, stub in STUBS.items():
                    (inc / name).write_text(stub)
                src = inc / "kernels.cpp"
                src.write_text(text)
                part = inc / "lib.so"
                cmd = [cc, "-std=c++17", "-O1", "-fPIC", "-shared", "-fno-strict-aliasing", "-w", f"-I{inc}",
                       "-include", "cuda_emu.h", str(src), "-o", str(part)]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode:
                    raise DeviceError(f"CUDA build (emulation, {cc}) failed: {first_lines(r.stderr + r.stdout)}")
                tmp_out = out.with_suffix(f".{os.getpid()}.part")
                shutil.copyfile(part, tmp_out)
                os.replace(tmp_out, out)
        lib = ctypes.CDLL(str(out))
        lib.dcc_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint),
                                ctypes.POINTER(ctypes.c_uint), ctypes.c_int, ctypes.c_ulonglong, ctypes.c_char_p,
                                ctypes.c_int]
        lib.dcc_run.restype = ctypes.c_int
        return lib

    def _handle(self, lib, name: str, fn: int, kinds: list[str]):
        """A callable as CuPy's kernels are called: (grid, block, args), args the buffers' handles then np.int32s."""
        err = ctypes.create_string_buffer(512)
        order = ORDERS[self.order]

        def call(grid, block, args):
            if len(args) != len(kinds):
                raise EmulationError(f"{name} takes {len(kinds)} arguments, got {len(args)}")
            ptrs = (ctypes.c_void_p * len(args))()
            ints, guarded = [], []
            for k, (kind, a) in enumerate(zip(kinds, args)):
                if kind == "buffer":
                    if not isinstance(a, Guarded):
                        raise EmulationError(f"{name}: argument {k} is a buffer parameter, got {type(a).__name__}")
                    ptrs[k] = a.ctypes.data + a.guard
                    guarded.append((k, a))
                else:
                    ints.append(ctypes.c_int(int(a)))
                    ptrs[k] = ctypes.cast(ctypes.pointer(ints[-1]), ctypes.c_void_p)
            g, b = (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block)
            self.launches += 1
            if lib.dcc_run(fn, ptrs, g, b, order, self.seed + self.launches, err, len(err)):
                raise EmulationError(f"{name}: {err.value.decode(errors='replace')}")
            for k, a in guarded:
                g, n = a.guard, a.size - 2 * a.guard
                before, after = a[max(0, g - CHECKED):g], a[g + n:g + n + CHECKED]
                if (before != GUARD_BYTE).any() or (after != GUARD_BYTE).any():
                    side = "before the start" if (before != GUARD_BYTE).any() else "past the end"
                    raise EmulationError(f"{name} (grid {tuple(grid)}, block {tuple(block)}) wrote {side} of its "
                                         f"buffer argument {k} ({n} bytes)")
        return call

    def capture(self, calls: list) -> object:
        """A graph as the emulation keeps one: the calls, each checked and run in order at every launch()."""
        calls = list(calls)

        def launch():
            for fn, grid, block, args in calls:
                fn(grid, block, args)
        return launch

    def start_profile(self) -> None:
        raise DeviceError("the CUDA emulation has no device timers: profile on a GPU")

    def read_probe(self, nbytes: int = 1 << 30, tries: int = 5) -> float:
        raise DeviceError("the CUDA emulation has no device memory bandwidth: probe on a GPU")

    def synchronize(self) -> None:
        pass  # every launch ran to its end before it returned
