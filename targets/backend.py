"""One backend per target kind: everything the compiler does differently for a kernel language, in one place.

A `Backend` names its renderer module (targets/<module>.py, a `render(kernels, target)` function), the file a
package's kernels are written into, and the manifest's language name; it builds kernels for a device (the kernel
tests' KernelRunner), writes a package's kernels/ (the entries the runtime checks every launch against) and
finishes the package after the kernels (the cpu kind's shared object, WebGPU's adapter limits). deploycc/kernel_runner.py
and deploycc/package.py ask `backend(kind)` and never test the kind themselves. Adding a kind is a renderer module,
its Backend in BACKENDS, its Kind in runtime/kinds.py (what its packages hold, how the runtime loads them), a device
in runtime/devices/ and presets (docs/adding-a-target.md).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from deploycc.runtime.kinds import KINDS
from deploycc.runtime.validate import entry_name


@dataclass(frozen=True)
class Backend:
    kind: str
    module: str  # the renderer: targets/<module>.py
    kernel_file: str  # every kernel of a package in this one file of kernels/
    # the kernels are C loop nests that a pool of the CPU's cores runs (a group is one loop iteration on a core: no
    # work-items, barriers or shared memory within it), not launches of work-groups of threads
    core_loops: bool = False
    # the renderer turns a reduction's `lanes` loop of the target's vector width into vector types (OpenCL)
    vector_lanes: bool = False
    # a work-group may count its arrival at a device-scope atomic counter after a fence (CUDA's __threadfence and
    # atomicAdd), so the last of a launch's groups to arrive can finish the work of all (schedule/attention.py's
    # combine of the split decode attention); OpenCL 1.2 and WebGPU promise no such ordering across work-groups
    grid_arrivals: bool = False

    @property
    def language(self) -> str:
        return KINDS[self.kind].language

    def render(self, kernels: list, target) -> str:
        return importlib.import_module(f"deploycc.targets.{self.module}").render(kernels, target)

    def build_options(self, target) -> dict:
        return {"fast_math": target.fast_math}

    def split(self, kernel, target) -> dict[int, tuple[int, int]]:
        """Buffer argument index -> (bytes per range, ranges) for buffers bound as several ranges (none here)."""
        return {}

    def build(self, device, kernels: list, target) -> tuple[dict, list[str]]:
        """(entry name -> handle, the sources built) of `kernels` built on `device`, here as one module."""
        source = self.render(kernels, target)
        return device.build(source, [entry_name(k.name) for k in kernels], self.build_options(target)), [source]

    def write_kernels(self, kdir: Path, kernels: list, target) -> dict[str, dict]:
        """Write the package's kernel sources into `kdir`; {kernel name: manifest entry (file, entry, threads)}."""
        (kdir / self.kernel_file).write_text(self.render(kernels, target))
        return {k.name: {"file": f"kernels/{self.kernel_file}", "entry": entry_name(k.name), "threads": k.threads}
                for k in kernels}

    def finish(self, tmp: Path, lowered, kernel_files: dict, preset, context: dict) -> None:
        """After the kernels: add to the manifest's `kernels` object (`kernel_files`) what this kind needs.
        `context` (deploycc/package.py): kv_cache, bounds, exported (the module before the pipeline) and progress
        (compile's progress callback)."""


@dataclass(frozen=True)
class CpuBackend(Backend):
    def build_options(self, target) -> dict:
        return {**super().build_options(target), "isa": target.isa}  # the instruction set the C compiler may use

    def finish(self, tmp, lowered, kernel_files, preset, context) -> None:
        """The step functions appended to kernels.c, and the whole module compiled into kernels/kernels.so for the
        preset's ISA (deploycc/vm/capture.py, runtime/native.py)."""
        from deploycc.errors import DeployError
        from deploycc.ir.tir import Intrin, walk
        from deploycc.runtime import native
        from deploycc.transform.absorb_rounding import rounded_linears
        from deploycc.vm.capture import NativeLoweringError, lower_native

        context["progress"]("native")
        try:
            steps, info = lower_native(lowered.bytecode, kernel_files["entries"])
        except NativeLoweringError as e:
            raise DeployError(f"the cpu target cannot run this model's steps natively: {e}") from None
        src = tmp / "kernels" / self.kernel_file
        source = src.read_text() + "\n" + steps
        src.write_text(source)
        isa = preset.target.isa
        try:  # the compiler works in tmp/kernels/.cc-XXXX: removed when done, or with the staging if killed
            native.build_package_library(source, tmp / "kernels" / "kernels.so", isa, preset.target.fast_math,
                                         tmp / "kernels")
        except native.NativeError as e:
            raise DeployError(str(e)) from None
        intrins = [s.name for k in lowered.kernels.values() for s in walk(k.body) if isinstance(s, Intrin)]
        # the layout transform of the 4-bit weights (quantization/group.py InterleavedScheme) the kernels read
        layout = "interleaved16" if any("_x16" in n for n in intrins) else "plain"
        kernel_files["native"] = {
            "library": "kernels/kernels.so", "isa": isa, "cpu_flags": native.isa_flags(isa),
            "compiler": " ".join(native.compiler()), "integer_activations": bool(intrins), "weight_layout": layout,
            # the weights whose linears round their input, and to how many bits: what `verify` rounds alike
            "activations": rounded_linears(context["exported"]), **info}


@dataclass(frozen=True)
class WebGPUBackend(Backend):
    """One WGSL module per kernel (bindings stay simple), each with a variant that reads f16 from u32 words for
    adapters without shader-f16; buffers larger than a binding bound as several ranges."""

    def split(self, kernel, target):
        from .wgsl import split_bytes

        return split_bytes(kernel, target.max_storage_binding)

    def build(self, device, kernels, target):
        from .wgsl import render

        packed = not getattr(device, "has_f16", True)  # f16 as packed words, as packages do there
        subgroups = getattr(device, "has_subgroups", False)
        handles, sources = {}, []
        for k in kernels:
            sources.append(render([k], target, packed_f16=packed, subgroups=subgroups))
            handles.update(device.build(sources[-1], [entry_name(k.name)]))
        return handles, sources

    def write_kernels(self, kdir, kernels, target):
        """Per kernel `file`; `file_no_f16` where it reads f16 (the variant for adapters without shader-f16); and
        where it has warp-level reductions, `file_subgroups` (and `file_no_f16_subgroups`) for adapters with the
        subgroup feature, `file` then having them as shared-memory trees (runtime/loaders.py variant)."""
        from deploycc.ir.subgroup import has_subgroup_reduce

        from .wgsl import render

        entries = {}
        for k in kernels:
            name = entry_name(k.name)
            source = render([k], target)
            (kdir / f"{name}.wgsl").write_text(source)
            e = entries[k.name] = {"file": f"kernels/{name}.wgsl", "entry": name, "threads": k.threads}
            variants = [("file", "", False, False)]
            if "enable f16;" in source:
                variants.append(("file_no_f16", ".nof16", True, False))
            if has_subgroup_reduce(k):
                variants += [(f"{key}_subgroups", f"{suffix}.sg", packed, True) for key, suffix, packed, _ in variants]
            for key, suffix, packed, subgroups in variants[1:]:
                try:
                    (kdir / f"{name}{suffix}.wgsl").write_text(render([k], target, packed_f16=packed, subgroups=subgroups))
                except ValueError as err:  # not a limit: a kernel the packed variant cannot express
                    from deploycc.errors import DeployError

                    raise DeployError(str(err)) from None
                e[key] = f"kernels/{name}{suffix}.wgsl"
            split = self.split(k, target)
            if split:  # bytes per range and number of ranges, by buffer argument index
                e["split"] = {str(i): [c, n] for i, (c, n) in split.items()}
        return entries

    def finish(self, tmp, lowered, kernel_files, preset, context) -> None:
        from . import webgpu_limits

        # what the adapter must allow, held to the target before the weights are written
        buffers = webgpu_limits.allocations(lowered.storages, context["kv_cache"], context["bounds"])
        kernel_files["requires"] = webgpu_limits.check(list(lowered.kernels.values()), preset.target, buffers)


BACKENDS = {b.kind: b for b in (Backend("opencl", "opencl", "kernels.cl", vector_lanes=True),
                                 Backend("cuda", "cuda", "kernels.cu", grid_arrivals=True), WebGPUBackend("webgpu", "wgsl", ""),
                                 CpuBackend("cpu", "c", "kernels.c", core_loops=True))}


def backend(kind: str) -> Backend:
    if kind not in BACKENDS:
        raise ValueError(f"no backend for target kind {kind!r}; the kinds are {', '.join(BACKENDS)}")
    return BACKENDS[kind]
