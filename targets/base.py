"""Target descriptions: what a kernel language and a device allow, read by schedules and renderers.

Presets in configs/*.yaml fill these in; the runtime side of presets comes with the VM.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields


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
    max_grid: int = 65535  # groups per grid dimension
    arch: str = ""  # CUDA: sm_90 ...
    # Shared-memory tiles for prefill matmuls. Off for CPU OpenCL: PoCL runs work-group barriers
    # slowly and its caches already serve one row per work-item well (FACTS.md).
    tiled_matmul: bool = True
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

    def __post_init__(self):
        if self.kind not in ("opencl", "cuda", "webgpu"):
            raise ValueError(f"unknown target kind {self.kind!r}; choose opencl, cuda or webgpu")
        if self.threads_per_block > self.max_threads_per_block:
            raise ValueError(f"threads_per_block {self.threads_per_block} exceeds max_threads_per_block "
                             f"{self.max_threads_per_block}")

    @classmethod
    def from_dict(cls, d: dict) -> Target:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown target key {unknown[0]!r}; valid keys: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)
