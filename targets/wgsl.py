"""WGSL for WebGPU: the C-style renderer with WGSL's spellings.

ABI: buffer i is `@group(0) @binding(i) var<storage, read|read_write>`; the kernel's int arguments
are the fields of a uniform struct at binding N (N = number of buffers). Indices are i32.

float16 buffers (weights and scales of the f16 quantizations) are storage only: values are computed in
f32. Natively they are `array<f16>` under `enable f16;`, which needs the adapter feature `shader-f16`
(absent from SwiftShader and from lavapipe through ANGLE). The packed variant (packed_f16=True) declares
them `array<u32>`, two halves per word in memory order, and reads element i as
`unpack2x16float(w[u32(i) >> 1u])[u32(i) & 1u]` (WGSL core), so the same buffer bytes serve both.
A packed kernel that writes f16 (a float16 KV cache's appends) declares the buffer `array<atomic<u32>>` and stores
element i as two atomics on its word: `atomicAnd` clears its half's 16 bits, `atomicOr` sets them to the value's
half. Each touches only its own half, so the invocation writing the word's other half at the same time (a plain
read-modify-write of the word would lose one of the two) leaves it as it finds it. Such a kernel reads the buffer
with `atomicLoad` of the word (a decode step's attention reads back the key it appended).

Every f16 store rounds through `half_bits` (HALF_BITS): to nearest, ties to even, in integer operations on the
float's bits. WGSL leaves the rounding of f32 -> f16 (`f16()`, `pack2x16float`) to the implementation: SwiftShader's
rounds subnormals otherwise (230 of tests/kernels/test_wgsl_f16_packed.py's 10,864 values: a float16 KV cache
then rounds as neither CUDA's `__float2half`, OpenCL's `vstore_half` nor numpy's reference does).
"""
from __future__ import annotations

import math

from deploycc.ir import subgroup
from deploycc.ir.printer import Namer
from deploycc.ir.tir import Alloc, Buffer, Store, V, walk

from .cstyle import CStyleRenderer, elements

ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4, "uint32": 4}
OFFSET_ALIGN = 256  # the largest minStorageBufferOffsetAlignment WebGPU allows (and Chrome's)


def split_plan(k, max_binding: int) -> dict[int, tuple[int, int]]:
    """Buffers larger than one binding allows (WebGPU's maxStorageBufferBindingSize) are bound as
    several ranges: buffer index -> (elements per range, number of ranges). Ranges are multiples of
    256 bytes (64 f32, 128 f16: an even count, so a packed f16 range starts on a word), which every
    adapter's offset alignment divides."""
    plan = {}
    for i, b in enumerate(k.buffers):
        elems = elements(b)
        if not elems:
            continue  # activations (symbolic) are bounded by the memory plan; weights are what gets large
        size = ITEMSIZE[b.dtype]
        if elems * size > max_binding:
            if b in k.written:
                raise ValueError(f"{k.name}: output {b.name} ({elems * size} bytes) exceeds one storage binding "
                                 f"({max_binding} bytes)")
            align = OFFSET_ALIGN // size
            chunk = max(align, (max_binding // size) // align * align)
            plan[i] = (chunk, -(-elems // chunk))
    return plan


def split_bytes(k, max_binding: int) -> dict[int, tuple[int, int]]:
    """split_plan in bytes, as the runtime binds ranges: buffer index -> (bytes per range, ranges)."""
    return {i: (chunk * ITEMSIZE[k.buffers[i].dtype], parts) for i, (chunk, parts) in split_plan(k, max_binding).items()}


# x's nearest f16, ties to even, as the low 16 bits: NaN quiet, from 65,520 (halfway past the largest, 65,504) inf,
# below 2^-14 a subnormal (|x| 2^24 to the nearest integer: WGSL's round() takes ties to even), else the 13 bits
# dropped rounded into the rest (a carry moves the exponent) and the exponent's bias moved from 127 to 15
HALF_BITS = """fn half_bits(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let a = b & 0x7fffffffu;
  var h = (a + 0xfffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u;
  if (a > 0x7f800000u) { h = 0x7e00u; } else if (a >= 0x477ff000u) { h = 0x7c00u; }
  else if (a < 0x38800000u) { h = u32(round(bitcast<f32>(a) * 16777216.0)); }
  return ((b >> 16u) & 0x8000u) | h;
}
"""


class WGSLRenderer(CStyleRenderer):
    types = {"float32": "f32", "float16": "f16", "int32": "i32", "uint32": "u32", "bool": "bool"}
    index_type = None  # WGSL has no 64-bit integers; a binding holds at most max_storage_binding bytes
    unary = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "inverseSqrt", "tanh": "tanh", "sin": "sin",
             "cos": "cos", "abs": "abs", "rint": "round"}  # WGSL round: ties to even
    float_max = float_min = int_max = int_min = ""
    indent = "  "

    def __init__(self, max_binding: int = 1 << 31, max_buffers: int = 1 << 30, packed_f16: bool = False,
                 subgroups: bool = False):
        super().__init__()
        self.max_binding, self.max_buffers, self.packed_f16 = max_binding, max_buffers, packed_f16
        self.subgroup_ops = subgroups
        self.in_loops: set = set()  # the kernel's SubgroupReduce statements inside serial loops
        self.scratch: list[str] = []  # module-scope arrays that subgroup_reduce declares
        self.threads = 0
        self.split: dict = {}
        self.atomic: set = set()
        self.kernel_name = ""

    def ctype(self, dtype: str) -> str:
        if dtype == "float16" and self.packed_f16:  # storage buffers are declared in kernel(); nothing else may be f16
            raise ValueError(f"{self.kernel_name} computes in float16, which the variant without shader-f16 "
                             "cannot express (it only reads f16 from storage)")
        return super().ctype(dtype)

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
        return f"{x!r}" if v.dtype == "float32" else f"{self.ctype('float16')}({x!r})"

    def cast(self, dtype: str, inner: str) -> str:
        return f"{self.ctype(dtype)}({inner})"

    def select(self, c: str, a: str, b: str) -> str:
        return f"select({b}, {a}, {c})"

    def sigmoid(self, x: str) -> str:
        return f"(1.0 / (1.0 + exp(-({x}))))"

    def value(self, v: V) -> str:
        if v.op in ("shr", "shl"):  # WGSL shifts take a u32 amount
            return f"({self.value(v.src[0])} {'>>' if v.op == 'shr' else '<<'} u32({self.value(v.src[1])}))"
        if v.op == "load" and v.dtype == "float16":  # computed in f32; f16 is storage
            return super().value(v) if self.packed_f16 else f"f32({super().value(v)})"
        if v.op in ("max", "min"):
            return f"{v.op}({self.value(v.src[0])}, {self.value(v.src[1])})"
        if v.op == "erf":
            raise NotImplementedError("WGSL has no erf; use gelu_tanh")
        if v.op in ("sin", "cos"):  # WGSL bounds sin/cos's error only on [-pi, pi] (2^-11 absolute), and a GPU's
            # hardware sine drifts with |x| (NVIDIA's Vulkan driver: 1.7e-5 at a rope angle of 45 rad): reduce modulo
            # 2 pi first, Cody-Waite with 2 pi split in three, the first two of 8 bits so that k * each is exact for
            # |k| < 2^16 (|x| < 411,000) whether or not the driver fuses; 1.5e-7 in a float32 model of every rounding
            x = self.value(v.src[0])
            k = f"round(({x}) * 0.15915494309189535)"
            return f"{v.op}(({x}) - {k} * 6.28125 - {k} * 0.00193023681640625 - {k} * 5.070363386039389e-06)"
        if v.op == "tanh":  # SwiftShader's tanh of a large argument is NaN (e^2x overflows in its quotient);
            # tanh(10) rounds to 1 in f32, so the clamp changes no value (Gemma's GeGLU on an outlier channel)
            return f"tanh(clamp({self.value(v.src[0])}, -10.0, 10.0))"
        return super().value(v)

    def subgroup_reduce(self, st, depth: int) -> list[str]:
        """The subgroup's size S is the adapter's (4 to 128), known only when the kernel runs. Each value is combined
        with its xor partners at distances width/2 ... 1 that are below S (a shuffle past S is made and its value
        ignored, so every invocation takes every shuffle: no control flow depends on S); where S < width, each
        subgroup's first invocation writes its result to a work-group array and, after a barrier (taken whatever S
        is: barriers stay in uniform control flow), each invocation combines the width/S results of its group.
        Subgroups are taken to be consecutive local invocations, S of them aligned on S (what every Vulkan, D3D12 and
        Metal driver does for a one-dimensional work-group; TVM's and WebLLM's WebGPU kernels take the same)."""
        ind, ind2 = self.indent * depth, self.indent * (depth + 1)
        n, width, T = len(st.stores), st.width, self.threads
        dtype = st.stores[0].value.dtype
        red = self.name(st, "sgred")
        self.scratch.append(f"var<workgroup> {red}: array<{self.ctype(dtype)}, {n * T}>;")
        acc = subgroup.in_place(st)
        if acc is not None:
            return self.subgroup_reduce_array(st, self.name(acc, acc.name), red, depth)
        regs = [self.name(x, "sg") for x in st.stores]
        lines = [f"{ind}var {r}: {self.ctype(dtype)} = {self.value(x.value)};" for r, x in zip(regs, st.stores)]
        o = width // 2
        while o >= 1:  # constant distances (Tint requires a uniform one), the partner's value ignored past S
            lines += [f"{ind}{r} = select({r}, {self.combine(st.combine, dtype, r, f'subgroupShuffleXor({r}, {o}u)')}, "
                      f"{o}u < sg_size);" for r in regs]
            o //= 2
        lines.append(f"{ind}if (i32(sg_size) < {width} && sg_id == 0u) {{")
        lines += [f"{ind2}{red}[{j * T} + i32(lid.x) / i32(sg_size)] = {r};" for j, r in enumerate(regs)]
        lines += [ind + "}", ind + self.barrier, f"{ind}if (i32(sg_size) < {width}) {{",
                  f"{ind2}let sg_first = (i32(lid.x) / {width}) * ({width} / i32(sg_size));"]
        for j, r in enumerate(regs):
            lines.append(f"{ind2}{r} = {red}[{j * T} + sg_first];")
            lines.append(f"{ind2}for (var sg_i: i32 = 1; sg_i < {width} / i32(sg_size); sg_i++) {{")
            lines.append(f"{ind2}{self.indent}{r} = {self.combine(st.combine, dtype, r, f'{red}[{j * T} + sg_first + sg_i]')};")
            lines.append(ind2 + "}")
        lines.append(ind + "}")
        lines += [ind + self.store(Store(x.buffer, x.indices, V("var", dtype, (), r))) for r, x in zip(regs, st.stores)]
        if st in self.in_loops:  # the next trip's writes wait for this trip's reads
            lines.append(ind + self.barrier)
        return lines

    def subgroup_reduce_array(self, st, acc: str, red: str, depth: int) -> list[str]:
        """subgroup_reduce() of a local array reduced in place (ir/subgroup.py's in_place): the same steps, each a
        loop over the array's elements instead of a copy per element."""
        ind, ind2, ind3 = (self.indent * (depth + i) for i in range(3))
        n, width, T = len(st.stores), st.width, self.threads
        dtype = st.stores[0].value.dtype
        r, j = self.name(st.stores[0], "sg"), self.name(st.stores[0].value, "sg_j")
        lines = [f"{ind}for (var {j}: i32 = 0; {j} < {n}; {j}++) {{", f"{ind2}var {r}: {self.ctype(dtype)} = {acc}[{j}];"]
        o = width // 2
        while o >= 1:
            lines.append(f"{ind2}{r} = select({r}, {self.combine(st.combine, dtype, r, f'subgroupShuffleXor({r}, {o}u)')}, "
                         f"{o}u < sg_size);")
            o //= 2
        lines += [f"{ind2}if (i32(sg_size) < {width} && sg_id == 0u) {{",
                  f"{ind3}{red}[{j} * {T} + i32(lid.x) / i32(sg_size)] = {r};", ind2 + "}",
                  f"{ind2}{acc}[{j}] = {r};", ind + "}", ind + self.barrier,
                  f"{ind}if (i32(sg_size) < {width}) {{",
                  f"{ind2}let sg_first = (i32(lid.x) / {width}) * ({width} / i32(sg_size));",
                  f"{ind2}for (var {j}: i32 = 0; {j} < {n}; {j}++) {{",
                  f"{ind3}var {r}: {self.ctype(dtype)} = {red}[{j} * {T} + sg_first];",
                  f"{ind3}for (var sg_i: i32 = 1; sg_i < {width} / i32(sg_size); sg_i++) {{",
                  f"{ind3}{self.indent}{r} = {self.combine(st.combine, dtype, r, f'{red}[{j} * {T} + sg_first + sg_i]')};",
                  ind3 + "}", f"{ind3}{acc}[{j}] = {r};", ind2 + "}", ind + "}"]
        if st in self.in_loops:
            lines.append(ind + self.barrier)
        return lines

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
        if buf in self.split or (self.packed_f16 and buf.dtype == "float16"):
            return f"ld_{self.name(buf, buf.name)}({self.flat_index(buf, indices)})"
        return super().load(buf, indices)

    def store(self, st) -> str:
        if st.buffer.dtype == "float16":  # rounded by half_bits from f32 (the value's cast to half is that)
            v = st.value
            if isinstance(v, V) and v.op == "cast" and v.dtype == "float16":
                v = v.src[0]
            name, at = self.name(st.buffer, st.buffer.name), self.flat_index(st.buffer, st.indices)
            if self.packed_f16:
                return f"st_{name}({at}, {self.value(v)});"
            return f"{name}[{at}] = f16(unpack2x16float(half_bits({self.value(v)})).x);"
        return f"{self.name(st.buffer, st.buffer.name)}[{self.flat_index(st.buffer, st.indices)}] = {self.value(st.value)};"

    def flat_index(self, buf, indices) -> str:
        # Data-dependent indices are loaded values: make sure they are i32.
        return super().flat_index(buf, tuple(i if not isinstance(i, V) or i.dtype == "int32" else
                                             V("cast", "int32", (i,)) for i in indices))

    def kernel(self, k) -> str:
        if not self.subgroup_ops:
            k = subgroup.lower(k)
        self.in_loops, self.scratch, self.threads = subgroup.in_loops(k), [], k.threads
        self.names = Namer()
        entry = self.name(k, k.name)  # first, so the entry point keeps the kernel's name
        decls = []
        plan = split_plan(k, self.max_binding)
        self.split = {k.buffers[i]: v for i, v in plan.items()}
        self.atomic = {b for b in k.written if self.packed_f16 and b.dtype == "float16"}  # array<atomic<u32>>
        self.kernel_name = k.name
        binding = 0
        for i, b in enumerate(k.buffers):
            access = "read_write" if b in k.written else "read"
            packed = self.packed_f16 and b.dtype == "float16"
            name, ty = self.name(b, b.name), "u32" if packed else self.ctype(b.dtype)
            if b in self.atomic:  # never split: split_plan refuses an output past one binding
                decls += [f"@group(0) @binding({binding}) var<storage, read_write> {name}: array<atomic<u32>>;",
                          self.store_fn(name)]
                binding += 1
                continue
            if i not in plan and not packed:
                decls.append(f"@group(0) @binding({binding}) var<storage, {access}> {name}: array<{ty}>;")
                binding += 1
                continue
            chunk, parts = plan.get(i, (0, 1))
            ranges = [name] if i not in plan else [f"{name}_{p}" for p in range(parts)]
            for r in ranges:
                decls.append(f"@group(0) @binding({binding}) var<storage, read> {r}: array<{ty}>;")
                binding += 1
            decls.append(self.load_fn(name, ty, ranges, chunk))
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
        body = self.stmt(k.body, 1)
        sg = (", @builtin(subgroup_invocation_id) sg_id: u32, @builtin(subgroup_size) sg_size: u32"
              if self.scratch else "")
        head = (f"@compute @workgroup_size({k.threads})\n"
                f"fn {entry}(@builtin(workgroup_id) wid: vec3<u32>, "
                f"@builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>{sg}) {{")
        return "\n".join(decls + self.scratch + [head] + unpack + body + ["}"]) + "\n"

    @staticmethod
    def load_fn(name: str, ty: str, ranges: list[str], chunk: int) -> str:
        """`ld_<name>(i)`: element i of a buffer of `ty` bound as `ranges` (consecutive, `chunk` elements each but
        the last); a u32 buffer here is packed f16, read as f32."""
        def get(r: str, i: str) -> str:
            return f"unpack2x16float({r}[u32({i}) >> 1u])[u32({i}) & 1u]" if ty == "u32" else f"{r}[{i}]"
        out = "f32" if ty == "u32" else ty
        if len(ranges) == 1:
            return f"fn ld_{name}(i: i32) -> {out} {{\n  return {get(ranges[0], 'i')};\n}}"
        body = "".join(f"  if (c == {p}) {{ return {get(r, 'o')}; }}\n" for p, r in enumerate(ranges[:-1]))
        return (f"fn ld_{name}(i: i32) -> {out} {{\n  let c = i / {chunk};\n  let o = i - c * {chunk};\n"
                f"{body}  return {get(ranges[-1], 'o')};\n}}")

    @staticmethod
    def store_fn(name: str) -> str:
        """`st_<name>(i, x)`: x rounded to f16 into element i of a packed buffer (module docstring); and
        `ld_<name>(i)`, element i read back as f32 (an atomic load of its word: the kernel may read what it wrote,
        as a decode step's attention reads the key it appended, schedule/attention_append.py)."""
        return (f"fn st_{name}(i: i32, x: f32) {{\n  let w = u32(i) >> 1u;\n  let sh = (u32(i) & 1u) * 16u;\n"
                f"  atomicAnd(&{name}[w], ~(0xffffu << sh));\n"
                f"  atomicOr(&{name}[w], half_bits(x) << sh);\n}}\n"
                f"fn ld_{name}(i: i32) -> f32 {{\n"
                f"  return unpack2x16float(atomicLoad(&{name}[u32(i) >> 1u]))[u32(i) & 1u];\n}}")

    def module(self, kernels) -> str:
        needs_f16 = not self.packed_f16 and any(b.dtype == "float16" for k in kernels for b in k.buffers)
        needs_subgroups = self.subgroup_ops and any(subgroup.has_subgroup_reduce(k) for k in kernels)
        stores_f16 = any(b.dtype == "float16" for k in kernels for b in k.written)
        return ("enable f16;\n" if needs_f16 else "") + ("enable subgroups;\n" if needs_subgroups else "") + \
            (HALF_BITS if stores_f16 else "") + "\n".join(self.kernel(k) for k in kernels)


def render(kernels, target=None, packed_f16: bool = False, subgroups: bool = False) -> str:
    """packed_f16: the variant for adapters without shader-f16 (float16 buffers as packed u32 words); subgroups: the
    variant for adapters with the `subgroups` feature (SubgroupReduce as subgroup shuffles, else a shared tree)."""
    if target is None:
        return WGSLRenderer(packed_f16=packed_f16, subgroups=subgroups).module(kernels)
    return WGSLRenderer(target.max_storage_binding, target.max_storage_buffers, packed_f16, subgroups).module(kernels)
