"""CUDA C (compiled with NVRTC/nvcc): the C-style base with CUDA's spellings."""
from __future__ import annotations

from deploycc.ir import subgroup
from deploycc.ir.tir import Store, V

from .cstyle import CStyleRenderer

# Every buffer a launch passes is an allocation of its own, which cudaMalloc (CuPy's pool) aligns to 256 bytes, as
# the emulation does (runtime/devices/cuda_emu.py): a kernel takes each pointer as aligned to 16 bytes
# (__builtin_assume_aligned), so nvcc may merge a thread's loads of four consecutive floats, where the index proves
# them aligned, into one 16-byte load (a decode GEMV's activations: 8 scalar loads -> 2 LDG.E.128).
ALIGN = 16


class CUDARenderer(CStyleRenderer):
    types = {**CStyleRenderer.types, "float16": "half", "bfloat16": "__nv_bfloat16", "uint32": "unsigned int",
             "uint8": "unsigned char", "int8": "signed char", "int64": "long long"}
    index_type = "long long"
    unary = {**CStyleRenderer.unary, "rsqrt": "rsqrtf", "abs": "fabsf", "exp": "expf", "log": "logf",
             "sqrt": "sqrtf", "tanh": "tanhf", "sin": "sinf", "cos": "cosf", "erf": "erff", "rint": "rintf"}
    float_max, float_min = "fmaxf", "fminf"
    kernel_prefix = 'extern "C" __global__ void'
    barrier = "__syncthreads();"
    unroll_pragma = "#pragma unroll"
    shared_qualifier = "__shared__"
    group_id = "(int)(blockIdx.y * gridDim.x + blockIdx.x)"
    local_id = "(int)threadIdx.x"
    preamble = "#include <cuda_fp16.h>\n#include <math_constants.h>\n#define INFINITY CUDART_INF_F\n\n"

    def buffer_param(self, buf, written: bool) -> str:
        """`<name>_arg`, which the body's first line of it (self.aligned) makes `<name>`, aligned to ALIGN bytes."""
        ptr = f"{'' if written else 'const '}{self.ctype(buf.dtype)}*"
        name = self.name(buf, buf.name)
        self.args.append(object())  # the argument's key in the Namer: kept alive while the kernel renders
        arg = self.name(self.args[-1], name + "_arg")
        self.aligned.append(f"  {ptr} __restrict__ {name} = ({ptr})__builtin_assume_aligned({arg}, {ALIGN});")
        return f"{ptr} __restrict__ {arg}"

    STORAGE = {"float16": ("__half2float", "__float2half"), "bfloat16": ("__bfloat162float", "__float2bfloat16")}

    def load(self, buf, indices) -> str:
        if buf.dtype in self.STORAGE:  # computed in float; half and bfloat16 are storage
            return f"{self.STORAGE[buf.dtype][0]}({super().load(buf, indices)})"
        return super().load(buf, indices)

    def store(self, st) -> str:
        if st.buffer.dtype in self.STORAGE:
            return (f"{self.name(st.buffer, st.buffer.name)}[{self.flat_index(st.buffer, st.indices)}] = "
                    f"{self.STORAGE[st.buffer.dtype][1]}({self.value(st.value)});")
        return super().store(st)

    def cast(self, dtype: str, inner: str) -> str:
        if dtype == "bfloat16":  # the float rounded to bfloat16 (schedule/mma.py's split of an operand)
            return f"__bfloat162float(__float2bfloat16({inner}))"
        return f"(({'float' if dtype == 'float16' else self.ctype(dtype)})({inner}))"

    def shared_decl(self, buf) -> str:
        """Aligned to 256 bits, as the warp matrix API's loads and stores need their pointers (schedule/mma.py)."""
        return f"__shared__ __align__(32) {self.local_decl(buf)}"

    def sigmoid(self, x: str) -> str:
        return f"(1.0f / (1.0f + expf(-({x}))))"

    def value(self, v: V) -> str:
        if v.op == "dp4a":  # schedule/dp4a.py: four signed byte products summed
            return f"__dp4a({', '.join(self.value(s) for s in v.src)})"
        return super().value(v)

    subgroup_ops = True  # warps of 32 lanes, __shfl_xor_sync

    def subgroup_reduce(self, st, depth: int) -> list[str]:
        """Each value in a register, combined with its xor partners at distances width/2 ... 1 (every lane gets the
        group's result: a butterfly), then stored."""
        ind = self.indent * depth
        regs = [self.name(x, "sg") for x in st.stores]
        dtypes = [x.value.dtype for x in st.stores]
        lines = [f"{ind}{self.ctype(d)} {r} = {self.value(x.value)};" for r, d, x in zip(regs, dtypes, st.stores)]
        lines.append(f"{ind}for (int sg_o = {st.width // 2}; sg_o > 0; sg_o >>= 1) {{")
        lines += [f"{ind}{self.indent}{r} = "
                  f"{self.combine(st.combine, d, r, f'__shfl_xor_sync(0xffffffffu, {r}, sg_o, {st.width})')};"
                  for r, d in zip(regs, dtypes)]
        lines.append(ind + "}")
        return lines + [ind + self.store(Store(x.buffer, x.indices, V("var", d, (), r)))
                        for r, d, x in zip(regs, dtypes, st.stores)]

    # the warp matrix API's fragments (schedule/mma.py): tf32 inputs, float accumulators, m16n16k8; and m16n16k16 with
    # bfloat16 or half inputs (mma.codes_rule)
    FRAGMENTS = {"wmma.matrix_a": "wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major",
                 "wmma.matrix_b": "wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major",
                 "wmma.accumulator": "wmma::accumulator, 16, 16, 8, float",
                 "wmma.matrix_a.bf16": "wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major",
                 "wmma.matrix_a.f16": "wmma::matrix_a, 16, 16, 16, half, wmma::row_major",
                 "wmma.matrix_b.bf16": "wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major",
                 "wmma.matrix_b.f16": "wmma::matrix_b, 16, 16, 16, half, wmma::col_major",
                 "wmma.matrix_b.f16.row": "wmma::matrix_b, 16, 16, 16, half, wmma::row_major",  # attention's V
                 "wmma.accumulator.k16": "wmma::accumulator, 16, 16, 16, float"}

    def alloc_decl(self, buf) -> str:
        if buf.scope in self.FRAGMENTS:
            return f"wmma::fragment<{self.FRAGMENTS[buf.scope]}> {self.name(buf, buf.name)}[{buf.shape[0].value}];"
        return super().alloc_decl(buf)

    def intrin(self, st) -> list[str]:
        """schedule/mma.py's calls: fill, load (split into tf32 hi and lo), the three products, store; and
        codes_rule's load, product, scaled add."""
        n = [self.name(b, b.name) for b in st.buffers]
        i = [self.int_expr(x) for x in st.ints]
        if st.name == "wmma.fill":
            return [f"wmma::fill_fragment({n[0]}[{i[0]}], 0.0f);"]
        if st.name == "wmma.load_split":
            hi, lo = f"{n[0]}[{i[0]}]", f"{n[1]}[{i[0]}]"
            return [f"wmma::load_matrix_sync({hi}, {n[2]} + {i[1]}, {i[2]});",
                    f"for (int e = 0; e < {hi}.num_elements; e++) {{",
                    f"  float v = {hi}.x[e];",
                    f"  {hi}.x[e] = wmma::__float_to_tf32(v);",
                    f"  {lo}.x[e] = wmma::__float_to_tf32(v - {hi}.x[e]);",
                    "}"]
        if st.name == "wmma.mma3":  # lo x hi + hi x lo into the small terms' accumulator, hi x hi into the other
            acc, small = f"{n[0]}[{i[0]}]", f"{n[1]}[{i[0]}]"
            a_hi, a_lo, b_hi, b_lo = (f"{b}[{x}]" for b, x in zip(n[2:], (i[1], i[1], i[2], i[2])))
            return [f"wmma::mma_sync({small}, {a_lo}, {b_hi}, {small});",
                    f"wmma::mma_sync({small}, {a_hi}, {b_lo}, {small});", f"wmma::mma_sync({acc}, {a_hi}, {b_hi}, {acc});"]
        if st.name == "wmma.add":  # fragments of one type share their layout: elementwise
            a, b = f"{n[0]}[{i[0]}]", f"{n[1]}[{i[0]}]"
            return [f"for (int e = 0; e < {a}.num_elements; e++) {a}.x[e] += {b}.x[e];"]
        if st.name == "wmma.load":  # a fragment of inputs from shared memory, as its type's layout says
            return [f"wmma::load_matrix_sync({n[0]}[{i[0]}], {n[1]} + {i[1]}, {i[2]});"]
        if st.name == "wmma.load_acc":  # an accumulator's values, row-major
            return [f"wmma::load_matrix_sync({n[0]}[{i[0]}], {n[1]} + {i[1]}, {i[2]}, wmma::mem_row_major);"]
        if st.name == "wmma.mma":  # d += a x b
            d, a, b = (f"{x}[{y}]" for x, y in zip(n, i))
            return [f"wmma::mma_sync({d}, {a}, {b}, {d});"]
        if st.name == "wmma.scale_add":  # acc += scale x part, elementwise (accumulators of one shape share a layout)
            acc, sc, part = (f"{x}[{y}]" for x, y in zip(n, i))
            return [f"for (int e = 0; e < {acc}.num_elements; e++) {acc}.x[e] += {sc}.x[e] * {part}.x[e];"]
        if st.name == "wmma.rescale_add":  # acc = scale x acc + part, elementwise (attention_mma's O = alpha O + PV)
            acc, sc, part = (f"{x}[{y}]" for x, y in zip(n, i))
            return [f"for (int e = 0; e < {acc}.num_elements; e++) {acc}.x[e] = {sc}.x[e] * {acc}.x[e] + {part}.x[e];"]
        if st.name == "warp.sync":  # the warp's lanes meet: shared stores before it are seen after it
            return ["__syncwarp();"]
        if st.name == "grid.arrive":  # schedule/attention.py: the block's arrival at counter[row] of `count` blocks
            return self.grid_arrive(n[0], n[1], i[0], i[1])
        if st.name == "wmma.store":
            return [f"wmma::store_matrix_sync({n[0]} + {i[1]}, {n[1]}[{i[0]}], {i[2]}, wmma::mem_row_major);"]
        return super().intrin(st)

    @staticmethod
    def grid_arrive(counter: str, last: str, row: str, count: str) -> list[str]:
        """One thread of a block whose threads stored their results before a barrier counts the block in: a fence
        (every store the block made, seen through the barrier, is seen by the device before the count is), the
        atomic add, and for the last of `count` blocks a zeroed counter (for the next launch) and a fence before the
        block reads the others' results (the CUDA programming guide's last-block pattern; cooperative groups' grid
        sync orders a block's stores the same way). `last` (shared) tells the block's threads after a barrier."""
        return ["__threadfence();",
                f"{last}[0] = atomicAdd(&{counter}[{row}], 1) == {count} - 1;",
                f"if ({last}[0]) {{",
                f"  {counter}[{row}] = 0;",
                "  __threadfence();",
                "}"]

    def module(self, kernels) -> str:
        text = super().module(kernels)
        if "wmma::" in text:  # the warp matrix API (NVRTC and nvcc find mma.h beside cuda_fp16.h)
            bf16 = "#include <cuda_bf16.h>\n" if "__nv_bfloat16" in text else ""
            wmma = self.preamble.replace("\n\n", f"\n{bf16}#include <mma.h>\nusing namespace nvcuda;\n\n", 1)
            text = text.replace(self.preamble, wmma, 1)
        return text

    def kernel(self, k) -> str:
        if k.threads % 32:  # a block that is not whole warps (a preset of few threads): the shuffles need all 32 lanes
            k = subgroup.lower(k)
        self.args, self.aligned = [], []
        text = super().kernel(k)
        lines = "".join(f"{x}\n" for x in self.aligned)
        return text.replace(" {\n", f" {{\n  // launch: {k.threads} threads per block\n{lines}", 1)


def render(kernels, target=None) -> str:
    return CUDARenderer().module(kernels)
