"""WGSL for WebGPU: the C-style renderer with WGSL's spellings.

ABI: buffer i is `@group(0) @binding(i) var<storage, read|read_write>`; the kernel's int arguments
are the fields of a uniform struct at binding N (N = number of buffers). Indices are i32. f16 is
used only when the device has the `shader-f16` feature (`enable f16;`); the fp32 path never needs it.
"""
from __future__ import annotations

import math

from deploycc.ir.printer import Namer
from deploycc.ir.tir import Alloc, Buffer, V, walk

from .cstyle import CStyleRenderer

ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4, "uint32": 4}


def split_plan(k, max_binding: int) -> dict[int, tuple[int, int]]:
    """Buffers larger than one binding allows (WebGPU's maxStorageBufferBindingSize) are bound as
    several ranges: buffer index -> (elements per range, number of ranges). Ranges are multiples of
    64 elements (256 bytes for f32), which every adapter's offset alignment divides."""
    plan = {}
    for i, b in enumerate(k.buffers):
        if not all(d.is_const for d in b.shape):
            continue  # activations are bounded by the memory plan; weights are what gets large
        elems = 1
        for d in b.shape:
            elems *= d.value
        size = ITEMSIZE[b.dtype]
        if elems * size > max_binding:
            if b in k.written:
                raise ValueError(f"{k.name}: output {b.name} ({elems * size} bytes) exceeds one storage binding "
                                 f"({max_binding} bytes)")
            chunk = max(64, (max_binding // size) // 64 * 64)
            plan[i] = (chunk, -(-elems // chunk))
    return plan


class WGSLRenderer(CStyleRenderer):
    types = {"float32": "f32", "float16": "f16", "int32": "i32", "uint32": "u32", "bool": "bool"}
    unary = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "inverseSqrt", "tanh": "tanh", "sin": "sin",
             "cos": "cos", "abs": "abs"}
    float_max = float_min = int_max = int_min = ""
    indent = "  "

    def __init__(self, max_binding: int = 1 << 31, max_buffers: int = 1 << 30):
        super().__init__()
        self.max_binding, self.max_buffers = max_binding, max_buffers
        self.split: dict = {}

    def literal(self, v: V) -> str:
        x = v.arg
        if v.dtype == "bool":
            return "true" if x else "false"
        if v.dtype.startswith("int"):
            return f"{int(x)}i"
        if v.dtype.startswith("uint"):
            return f"{int(x)}u"
        x = float(x)
        if math.isinf(x):
            return "bitcast<f32>(0x7f800000u)" if x > 0 else "bitcast<f32>(0xff800000u)"
        return f"{x!r}" if v.dtype == "float32" else f"{x!r}h"

    def cast(self, dtype: str, inner: str) -> str:
        return f"{self.ctype(dtype)}({inner})"

    def select(self, c: str, a: str, b: str) -> str:
        return f"select({b}, {a}, {c})"

    def sigmoid(self, x: str) -> str:
        return f"(1.0 / (1.0 + exp(-({x}))))"

    def value(self, v: V) -> str:
        if v.op in ("shr", "shl"):  # WGSL shifts take a u32 amount
            return f"({self.value(v.src[0])} {'>>' if v.op == 'shr' else '<<'} u32({self.value(v.src[1])}))"
        if v.op == "load" and v.dtype == "float16":  # computed in f32; f16 is storage (shader-f16)
            return f"f32({super().value(v)})"
        if v.op in ("max", "min"):
            return f"{v.op}({self.value(v.src[0])}, {self.value(v.src[1])})"
        if v.op == "erf":
            raise NotImplementedError("WGSL has no erf; use gelu_tanh")
        return super().value(v)

    def local_decl(self, buf: Buffer) -> str:
        size = 1
        for d in buf.shape:
            size *= d.value
        return f"var {self.name(buf, buf.name)}: array<{self.ctype(buf.dtype)}, {size}>;"

    barrier = "workgroupBarrier();"

    def shared_decl(self, buf: Buffer) -> str:
        return ""  # declared at module scope (WGSL's rule), see kernel()

    def for_loop(self, var: str, extent: str) -> str:
        return f"for (var {var}: i32 = 0; {var} < {extent}; {var}++) {{"

    def thread_var(self, st) -> str:
        expr = "i32(wid.y * nwg.x + wid.x)" if st.thread == "group" else "i32(lid.x)"
        return f"let {self.sv(st.var)} = {expr};"

    def load(self, buf, indices) -> str:
        if buf in self.split:
            return f"ld_{self.name(buf, buf.name)}({self.flat_index(buf, indices)})"
        return super().load(buf, indices)

    def store(self, st) -> str:
        if st.buffer.dtype == "float16":
            return (f"{self.name(st.buffer, st.buffer.name)}[{self.flat_index(st.buffer, st.indices)}] = "
                    f"f16({self.value(st.value)});")
        return f"{self.name(st.buffer, st.buffer.name)}[{self.flat_index(st.buffer, st.indices)}] = {self.value(st.value)};"

    def flat_index(self, buf, indices) -> str:
        # Data-dependent indices are loaded values: make sure they are i32.
        return super().flat_index(buf, tuple(i if not isinstance(i, V) or i.dtype == "int32" else
                                             V("cast", "int32", (i,)) for i in indices))

    def kernel(self, k) -> str:
        self.names = Namer()
        entry = self.name(k, k.name)  # first, so the entry point keeps the kernel's name
        decls = []
        plan = split_plan(k, self.max_binding)
        self.split = {k.buffers[i]: v for i, v in plan.items()}
        binding = 0
        for i, b in enumerate(k.buffers):
            access = "read_write" if b in k.written else "read"
            name, ty = self.name(b, b.name), self.ctype(b.dtype)
            if i not in plan:
                decls.append(f"@group(0) @binding({binding}) var<storage, {access}> {name}: array<{ty}>;")
                binding += 1
                continue
            chunk, parts = plan[i]
            for p in range(parts):
                decls.append(f"@group(0) @binding({binding}) var<storage, read> {name}_{p}: array<{ty}>;")
                binding += 1
            body = "".join(f"  if (c == {p}) {{ return {name}_{p}[o]; }}\n" for p in range(parts - 1))
            decls.append(f"fn ld_{name}(i: i32) -> {ty} {{\n  let c = i / {chunk};\n  let o = i - c * {chunk};\n"
                         f"{body}  return {name}_{parts - 1}[o];\n}}")
        if binding > self.max_buffers:
            raise ValueError(f"{k.name} needs {binding} storage bindings, more than the target's "
                             f"{self.max_buffers} (maxStorageBuffersPerShaderStage)")
        for v in k.scalars:
            self.sv(v)
        for st in walk(k.body):
            if isinstance(st, Alloc) and st.buffer.scope == "shared":
                b = st.buffer
                size = 1
                for d in b.shape:
                    size *= d.value
                decls.append(f"var<workgroup> {self.name(b, b.name)}: array<{self.ctype(b.dtype)}, {size}>;")
        if k.scalars:
            fields = "".join(f"  {self.sv(v)}: i32,\n" for v in k.scalars)
            decls.append(f"struct Params {{\n{fields}}}")
            decls.append(f"@group(0) @binding({binding}) var<uniform> params: Params;")
        unpack = [f"  let {self.sv(v)} = params.{self.sv(v)};" for v in k.scalars]
        head = (f"@compute @workgroup_size({k.threads})\n"
                f"fn {entry}(@builtin(workgroup_id) wid: vec3<u32>, "
                f"@builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{")
        body = self.stmt(k.body, 1)
        return "\n".join(decls + [head] + unpack + body + ["}"]) + "\n"

    def module(self, kernels) -> str:
        needs_f16 = any(b.dtype == "float16" for k in kernels for b in k.buffers)
        return ("enable f16;\n" if needs_f16 else "") + "\n".join(self.kernel(k) for k in kernels)


def render(kernels, target=None) -> str:
    if target is None:
        return WGSLRenderer().module(kernels)
    return WGSLRenderer(target.max_storage_binding, target.max_storage_buffers).module(kernels)
