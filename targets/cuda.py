"""CUDA C (compiled with NVRTC/nvcc): the C-style base with CUDA's spellings."""
from __future__ import annotations

from deploycc.ir.tir import Store, V

from .cstyle import CStyleRenderer


class CUDARenderer(CStyleRenderer):
    types = {**CStyleRenderer.types, "float16": "half", "uint32": "unsigned int", "uint8": "unsigned char",
             "int8": "signed char", "int64": "long long"}
    index_type = "long long"
    unary = {**CStyleRenderer.unary, "rsqrt": "rsqrtf", "abs": "fabsf", "exp": "expf", "log": "logf",
             "sqrt": "sqrtf", "tanh": "tanhf", "sin": "sinf", "cos": "cosf", "erf": "erff"}
    float_max, float_min = "fmaxf", "fminf"
    kernel_prefix = 'extern "C" __global__ void'
    barrier = "__syncthreads();"
    shared_qualifier = "__shared__"
    group_id = "(int)(blockIdx.y * gridDim.x + blockIdx.x)"
    local_id = "(int)threadIdx.x"
    preamble = "#include <cuda_fp16.h>\n#include <math_constants.h>\n#define INFINITY CUDART_INF_F\n\n"

    def buffer_param(self, buf, written: bool) -> str:
        const = "" if written else "const "
        return f"{const}{self.ctype(buf.dtype)}* __restrict__ {self.name(buf, buf.name)}"

    def load(self, buf, indices) -> str:
        if buf.dtype == "float16":  # computed in float; half is storage
            return f"__half2float({super().load(buf, indices)})"
        return super().load(buf, indices)

    def store(self, st) -> str:
        if st.buffer.dtype == "float16":
            return (f"{self.name(st.buffer, st.buffer.name)}[{self.flat_index(st.buffer, st.indices)}] = "
                    f"__float2half({self.value(st.value)});")
        return super().store(st)

    def cast(self, dtype: str, inner: str) -> str:
        return f"(({'float' if dtype == 'float16' else self.ctype(dtype)})({inner}))"

    def sigmoid(self, x: str) -> str:
        return f"(1.0f / (1.0f + expf(-({x}))))"

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

    def kernel(self, k) -> str:
        text = super().kernel(k)
        return text.replace(" {\n", f" {{\n  // launch: {k.threads} threads per block\n", 1)


def render(kernels, target=None) -> str:
    return CUDARenderer().module(kernels)
