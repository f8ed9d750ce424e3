"""Run scheduled tensor programs on a real device (OpenCL, WebGPU, CUDA) from numpy arrays.

This is the bridge the kernel tests use: the reference interpreter runs the graph, and each
call_tir runs the program's kernels on the device (`Interpreter(mod, run_program=KernelRunner(...))`).
The VM runtime does the same without numpy round trips.
"""
from __future__ import annotations

import numpy as np

from .ir import sym
from .ir.kernel import Kernel, scheduled
from .ir.tir import TensorProgram
from .ir.tir_interp import NP_DTYPES, bind_shapes
from .runtime.validate import entry_name
from .targets.backend import backend


def render(kernels: list[Kernel], target) -> str:
    """The source of `kernels` in the target's language (its backend's renderer)."""
    return backend(target.kind).render(kernels, target)


def kernel_source(k: Kernel, target) -> str:
    """One kernel's source as the package's kernel file holds it, without what every kernel of the file shares
    (the target's types, intrinsics and thread pool: the part the file of no kernel has too)."""
    full, shared = render([k], target), render([], target)
    n = 0
    for a, b in zip(full.splitlines(keepends=True), shared.splitlines(keepends=True)):
        if a != b:
            break
        n += len(a)
    return full[n:].lstrip("\n")


def launch_grid(groups: int, max_grid: int) -> tuple[int, int, int]:
    """Linear group count -> a grid within each dimension's limit (kernels recombine the index)."""
    if groups <= max_grid:
        return (max(groups, 1), 1, 1)
    y = -(-groups // max_grid)
    return (max_grid, y, 1)


class KernelRunner:
    """Builds each program's kernels once per device and runs them on numpy inputs."""

    def __init__(self, device, target):
        self.device = device
        self.target = target
        # program (by identity: TensorProgram compares as an object, and the key keeps it alive) -> its kernels
        self.built: dict[TensorProgram, dict] = {}
        self.sources: dict[str, str] = {}
        self.launches = 0
        self.launched: list[str] = []  # the kernels launched, by name, in order

    def build(self, prog: TensorProgram) -> dict:
        key = prog
        if key not in self.built:
            self.built[key], sources = backend(self.target.kind).build(self.device, list(scheduled(prog).kernels),
                                                                       self.target)
            self.sources[prog.name] = "\n".join(sources)
        return self.built[key]

    def prebuild(self, progs) -> None:
        """Build the kernels of many programs at once, as one module where the target's backend builds one (a C++
        compile per program is most of the CUDA emulation's time); their names must differ, as a module's do."""
        todo = [p for p in progs if p not in self.built]
        if not todo:
            return
        kernels = [k for p in todo for k in scheduled(p).kernels]
        handles, sources = backend(self.target.kind).build(self.device, kernels, self.target)
        for p in todo:
            self.built[p] = {entry_name(k.name): handles[entry_name(k.name)] for k in scheduled(p).kernels}
            self.sources[p.name] = "\n".join(sources)

    def __call__(self, prog: TensorProgram, arrays: list[np.ndarray], sym_args) -> None:
        """Run `prog` with numpy arrays (outputs last), writing the outputs in place."""
        sched = scheduled(prog)
        handles = self.build(prog)
        env = bind_shapes(prog, arrays, sym_args)
        dev = self.device
        bufs = {b: dev.upload(np.ascontiguousarray(a)) for b, a in zip(prog.params, arrays)}
        for w in sched.workspace:
            shape = tuple(int(sym.evaluate(d, env)) for d in w.shape)
            bufs[w] = dev.alloc(int(np.prod(shape)) * np.dtype(NP_DTYPES[w.dtype]).itemsize)
        for k in sched.kernels:
            groups = int(sym.evaluate(k.groups, env))
            if groups == 0:
                continue
            args = expand_ranges([bufs[b] for b in k.buffers], self._split(k))
            args += [int(sym.evaluate(sym.as_expr(v), env)) for v in k.scalars]
            dev.launch(handles[entry_name(k.name)], args, launch_grid(groups, self.target.max_grid), (k.threads, 1, 1))
            self.launches += 1
            self.launched.append(k.name)
        for b, a in zip(prog.outputs, arrays[len(prog.inputs):]):
            a[...] = dev.download(bufs[b], a.shape, a.dtype)


    def _split(self, k: Kernel) -> dict:
        return backend(self.target.kind).split(k, self.target)


def expand_ranges(bufs: list, split: dict) -> list:
    """Bind each split buffer as its ranges (see targets/wgsl.split_plan): index -> (bytes, parts)."""
    if not split:
        return bufs
    from .runtime.devices import buffer_ranges

    out = []
    for i, b in enumerate(bufs):
        out += buffer_ranges(b, *split[i]) if i in split else [b]
    return out
