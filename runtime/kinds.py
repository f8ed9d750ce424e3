"""What a package of each target kind holds and how its kernels load, declared once (the runtime's side of the
compiler's targets/backend.py). The validator, the loader, the engine and the devices read this table instead of
comparing kind names; a new kind is one entry here, one device in runtime/devices/ and one backend in targets/.

    KINDS["webgpu"].binding_ranges    -> True: kernels may bind one buffer as several ranges (kernels.entries.split)
    KINDS["cpu"].loader               -> "native": one shared object (runtime/loaders.py)

Standard library only, and no runtime module imported: every other module may read it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    language: str  # manifest kernels.language
    loader: str = "sources"  # how the runtime loads the kernels (runtime/loaders.py LOADERS)
    native: bool = False  # kernels.native: a shared object whose step functions run prefill/decode in one call
    isa: bool = False  # target.isa names the instruction set the kernels were compiled for
    binding_ranges: bool = False  # a kernel may bind one buffer as several ranges (kernels.entries.split)
    f16_variants: bool = False  # kernels.entries.file_no_f16: variants for devices without f16
    adapter_limits: bool = False  # kernels.requires: the device limits the package needs, checked at load
    browser: bool = False  # a browser bundle (preset runtime web: true) can run these kernels (web/deploycc.js)
    max_threads: int = 4096  # the most threads a block may have (targets/base.py checks presets against it)
    install: str = ""  # how to get the device's runtime, for the error when there is none


KINDS = {k.name: k for k in (
    Kind("opencl", "opencl-c", install='pip install "pyopencl[pocl]" (or apt-get install pocl-opencl-icd for a CPU)'),
    Kind("cuda", "cuda-c", max_threads=1024, install="pip install cupy-cuda12x (or cupy-cuda13x; needs an NVIDIA GPU and driver)"),
    Kind("webgpu", "wgsl", binding_ranges=True, f16_variants=True, adapter_limits=True, browser=True, max_threads=1024,
         install="pip install wgpu (and apt-get install mesa-vulkan-drivers libvulkan1 for a CPU)"),
    Kind("cpu", "c", loader="native", native=True, isa=True),
)}
