"""Target descriptions: what a kernel language and a device allow, read by schedules and renderers.

Presets in configs/*.yaml fill these in; the runtime side of presets comes with the VM. Every
numeric field has a range (RANGES): hardware limits of the kinds we target, and the sizes past which
a schedule stops making sense (a register tile of 100000 rows unrolls into a kernel that takes
minutes to compile and never fits in registers).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from deploycc.runtime.kinds import KINDS as RUNTIME_KINDS
from deploycc.runtime.validate import ISAS, TARGET_INTS

KINDS = tuple(RUNTIME_KINDS)  # the runtime's table (runtime/kinds.py): what each kind's packages hold
# The most threads a block may have, per kind (runtime/kinds.py): CUDA's 1024 on every architecture, WebGPU's largest
# maxComputeInvocationsPerWorkgroup (1024 on desktop adapters), OpenCL's largest on devices we know
# (PoCL on a CPU reports 4096).
MAX_THREADS = {k: v.max_threads for k, v in RUNTIME_KINDS.items()}
GiB = 1 << 30
# field -> (lowest, highest) allowed, inclusive; the runtime's table (runtime/validate.py TARGET_INTS), which checks
# a package's target with the same ranges. vector_width is checked against VECTOR_WIDTHS instead.
RANGES = {k: v for k, v in TARGET_INTS.items() if k != "vector_width"}
# The instruction sets a cpu-target package is built for (gcc/clang -march names; "native": the compiling
# machine's): runtime/validate.py ISAS. The runtime refuses a package whose ISA the CPU lacks (runtime/native.py).
VECTOR_WIDTHS = (1, 2, 4, 8, 16)
_ARCH = re.compile(r"^(sm_\d{2,3}[a-z]?)?$")  # passed to nvcc as -arch=: a name, never an option string


@dataclass(frozen=True)
class Target:
    kind: str  # "opencl" | "cuda" | "webgpu"
    max_threads_per_block: int = 256
    threads_per_block: int = 256  # what the schedules use (<= max)
    subgroup_size: int = 32  # warp / wavefront / subgroup size (1 when unknown)
    max_shared_memory: int = 48 * 1024  # bytes of local/shared/workgroup memory per block
    vector_width: int = 4  # widest float vector load worth using
    fp16_arithmetic: bool = False  # compute in half (else store half, compute float)
    max_storage_binding: int = 1 << 31  # bytes in one buffer binding (WebGPU: maxStorageBufferBindingSize)
    max_storage_buffers: int = 8  # storage bindings per shader stage (WebGPU: maxStorageBuffersPerShaderStage)
    # bytes in one buffer (WebGPU: maxBufferSize): every weight, KV-cache layer and planned storage is one buffer
    max_buffer_size: int = 1 << 48
    max_grid: int = 65535  # groups per grid dimension
    arch: str = ""  # CUDA: sm_90 ...
    # Shared-memory tiles for prefill matmuls. Off for CPU OpenCL: PoCL runs work-group barriers
    # slowly and its caches already serve one row per work-item well (FACTS.md).
    tiled_matmul: bool = True
    # Prefill matmuls on tensor cores (CUDA's warp matrix API, sm_80 and later: schedule/mma.py): 4- and 8-bit and
    # fp16 weights as products of their codes in bfloat16 and half (mma.codes_rule), and where tf32_tiles is on,
    # float32 weights in three tf32 products (3xTF32: a third of the tf32 rate, on a GeForce below its float32 cores')
    tensor_cores: bool = False
    tf32_tiles: bool = True
    # Decode GEMV with one work-group per output and a shared-memory tree reduction (coalesced
    # loads). Off for CPU OpenCL, where one row per work-item is faster.
    workgroup_gemv: bool = True
    # Relaxed floating point in the kernel compiler (OpenCL -cl-fast-relaxed-math): on PoCL it lets
    # LLVM vectorise the reductions, about 5x faster prefill and 1.8x decode on SmolLM2 here. Kernels
    # never rely on infinities (attention uses a finite -1e30), and the tests hold them to 1e-4.
    fast_math: bool = False
    # Register tiles of the one-row-per-thread rule: a thread computes `row_tile_m` rows of the
    # second-to-last output dimension (prefill tokens: each dequantized weight is reused that many
    # times) or, when that dimension is 1 (decode), `row_tile_n` outputs of the last one (the input
    # vector is loaded once for all of them). 1: off.
    row_tile_m: int = 1
    row_tile_n: int = 1
    # Device memory in bytes that weights, KV cache and activations must fit in; 0: the RAM of the
    # machine that compiles (CPU presets, where the package runs where it is built).
    memory_bytes: int = 0
    # cpu: the instruction set the C kernels are compiled for (ISAS) and the worker threads a package
    # runs (0: one per physical core of the machine that runs it).
    isa: str = ""
    num_threads: int = 0
    # cpu: matmuls on 4/8-bit weights as integer dot products with activations rounded to 8 bits per block
    # of 32 (deploycc/schedule/qgemv.py; what llama.cpp does for Q4_1), or float kernels (false: exact, slower)
    integer_matmuls: bool = True
    # cuda (sm_61 and later): decode's matmuls on 4/8-bit group weights as __dp4a integer dot products with
    # activations rounded to 8 bits per block of 32 (llama.cpp's MMVQ; deploycc/schedule/dp4a.py), when a compile
    # asks for them (--activations 8); the graph then rounds those activations, which prefill's float matmuls read
    # from a rounding program of their own
    dp4a: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown target kind {self.kind!r}; choose opencl, cuda, webgpu or cpu")
        for key, (lo, hi) in RANGES.items():
            if key == "max_threads_per_block":
                hi = MAX_THREADS[self.kind]
            _within(key, getattr(self, key), lo, hi, f" for {self.kind}" if key == "max_threads_per_block" else "")
        if self.vector_width not in VECTOR_WIDTHS:
            raise ValueError(f"'vector_width' is {self.vector_width!r}; choose one of {', '.join(map(str, VECTOR_WIDTHS))}")
        if self.threads_per_block > self.max_threads_per_block:
            raise ValueError(f"threads_per_block {self.threads_per_block} exceeds max_threads_per_block "
                             f"{self.max_threads_per_block}")
        if RUNTIME_KINDS[self.kind].isa and self.isa not in ISAS:
            raise ValueError(f"'isa' is {self.isa!r}; choose one of {', '.join(ISAS)}")
        if not RUNTIME_KINDS[self.kind].isa and self.isa:
            raise ValueError(f"'isa' is for the cpu target; remove it from this {self.kind} preset")
        if not isinstance(self.arch, str) or not _ARCH.match(self.arch):
            raise ValueError(f"'arch' is {self.arch!r}; give a CUDA architecture such as sm_90 (or leave it empty)")
        if self.tensor_cores and (self.kind != "cuda" or not self.arch or int(re.sub(r"\D", "", self.arch)) < 80):
            raise ValueError("'tensor_cores' needs a cuda target of arch sm_80 or later (tf32, bf16); set the arch or remove it")
        if self.dp4a and (self.kind != "cuda" or not self.arch or int(re.sub(r"\D", "", self.arch)) < 61):
            raise ValueError("'dp4a' needs a cuda target of arch sm_61 or later; set the arch or remove it")

    @property
    def integer_kernels(self) -> bool:
        """Whether matmuls on quantized weights become integer dot products on rounded activations (the cpu kind's
        kernels, deploycc/schedule/qgemv.py; cuda's decode GEMV with `dp4a`, deploycc/schedule/dp4a.py): the graph
        then rounds those activations as the kernels do."""
        return (self.core_loops and self.integer_matmuls) or self.dp4a

    @property
    def core_loops(self) -> bool:
        """The kind's kernels are loop nests run by a pool of CPU cores (targets/backend.py Backend.core_loops)."""
        from .backend import backend

        return backend(self.kind).core_loops

    @property
    def vector_lanes(self) -> bool:
        """The kind's renderer makes vector types of `lanes` loops (targets/backend.py Backend.vector_lanes)."""
        from .backend import backend

        return backend(self.kind).vector_lanes

    @property
    def grid_arrivals(self) -> bool:
        """The kind's kernels may count their work-groups' arrivals (targets/backend.py Backend.grid_arrivals)."""
        from .backend import backend

        return backend(self.kind).grid_arrivals

    @classmethod
    def from_dict(cls, d: dict) -> Target:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown target key {unknown[0]!r}; valid keys: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def _within(key: str, value, lo: int, hi: int, where: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"'{key}' must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"'{key}' is {value}, outside {lo}..{hi}{where}; choose a value in that range")
