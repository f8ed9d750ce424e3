"""C for the CPU (gcc, clang or `zig cc`): the C-style base with C99 spellings.

A kernel becomes `void NAME(T* restrict b0, ..., int s0, ..., int lo, int hi)`: the work-group loop
runs the groups lo..hi-1 (a worker thread's share, runtime/native.py splits them), the thread loop
of a group is an ordinary serial loop. That is only right when the threads of a group never wait
for each other, so a kernel with a barrier must have one thread per group (the cpu presets use
threads_per_block 1, where shared memory is simply the group's local array). Half is a storage
type (`_Float16`, converted with F16C where the ISA has it); arithmetic is float.

The module also gets, per kernel, `NAME__launch(void* const* b, const int* s, int groups)`: the
kernel over `groups` groups on the package's thread pool, for launch-by-launch execution (tests,
`bench --profile`); the whole-step functions (deploycc/vm/capture.py) call the kernels directly.
"""
from __future__ import annotations

from deploycc.ir.kernel import Kernel
from deploycc.ir.tir import Barrier, For, Intrin, walk

from .c_intrin import INTRINSICS
from .c_pool import POOL_SOURCE
from .c_stored import STORED_INTRINSICS
from .c_x16 import X16
from .c_x16_q8 import X16_Q8
from .cstyle import CStyleRenderer, ident

PREAMBLE = """#include <math.h>
#include <stdint.h>
#include <stdbool.h>
typedef _Float16 half;
typedef uint32_t uint;
typedef uint8_t uchar;
static inline int min(int a, int b) { return a < b ? a : b; }  /* OpenCL's and CUDA's int min/max */
static inline int max(int a, int b) { return a > b ? a : b; }
/* float max/min as selects: fmaxf/fminf are libm calls unless -ffinite-math-only, and never vectorise */
static inline float dcc_maxf(float a, float b) { return a > b ? a : b; }
static inline float dcc_minf(float a, float b) { return a < b ? a : b; }
/* exp(x) = 2^n e^r with n = round(x / ln 2), r reduced in two fused steps (Cody-Waite; fmaf keeps
   -fassociative-math from merging them), e^r by Cephes' degree-6 polynomial: within 1.3 ulp of exp
   on [-87, 88] (measured against double exp), 0 below. Branch-free, so a loop of it vectorises
   (glibc's expf does not without -ffast-math). */
static inline float dcc_expf(float x) {
  float c = x < -87.0f ? -87.0f : x;
  c = c > 88.0f ? 88.0f : c;
  float n = floorf(c * 1.44269504088896341f + 0.5f);
  float r = __builtin_fmaf(n, -0.693359375f, c);
  r = __builtin_fmaf(n, 2.12194440e-4f, r);
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  union { int32_t i; float f; } two_n = { ((int32_t)n + 127) << 23 };
  return x < -87.0f ? 0.0f : y * two_n.f;
}
/* tanh(x): the odd Taylor series to x^13 where |x| < 0.4 (truncation below 4e-9 relative), else
   sign(x) (1 - 2 / (e^(2|x|) + 1)) with |x| clamped at 10 (tanh(10) rounds to 1). Both are computed and one
   selected, so a loop of it vectorises (glibc's tanhf is a scalar call): GeGLU and soft-capping. */
static inline float dcc_tanhf(float x) {
  float a = x < 0.0f ? -x : x;
  float x2 = x * x;
  float p = 3.592128036e-3f;
  p = p * x2 - 8.863235529e-3f;
  p = p * x2 + 2.186948854e-2f;
  p = p * x2 - 5.396825397e-2f;
  p = p * x2 + 1.333333333e-1f;
  p = p * x2 - 3.333333333e-1f;
  float small = x + x * x2 * p;
  float e = dcc_expf(2.0f * (a > 10.0f ? 10.0f : a));
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.4f ? small : big;
}
"""


class CRenderer(CStyleRenderer):
    types = {**CStyleRenderer.types, "int8": "int8_t", "int16": "int16_t", "int64": "int64_t"}
    index_type = "int64_t"
    unary = {**CStyleRenderer.unary, "exp": "dcc_expf", "log": "logf", "sqrt": "sqrtf", "tanh": "dcc_tanhf", "sin": "sinf",
             "cos": "cosf", "abs": "fabsf", "erf": "erff", "rint": "rintf"}
    float_max, float_min = "dcc_maxf", "dcc_minf"
    kernel_prefix = "static void"
    barrier = ""  # one thread per group: nothing to wait for
    shared_qualifier = ""
    preamble = PREAMBLE

    def __init__(self):
        super().__init__()
        self.threads = 1

    def value(self, v) -> str:
        if v.op == "rsqrt":
            return f"(1.0f / sqrtf({self.value(v.src[0])}))"
        if v.op == "pow":
            return f"powf({self.value(v.src[0])}, {self.value(v.src[1])})"
        return super().value(v)

    def load(self, buf, indices) -> str:
        text = super().load(buf, indices)
        return f"((float){text})" if buf.dtype == "float16" else text

    def cast(self, dtype: str, inner: str) -> str:
        return f"(({'float' if dtype == 'float16' else self.ctype(dtype)})({inner}))"

    def sigmoid(self, x: str) -> str:
        return f"(1.0f / (1.0f + dcc_expf(-({x}))))"

    def buffer_param(self, buf, written: bool) -> str:
        const = "" if written else "const "
        return f"{const}{self.ctype(buf.dtype)}* restrict {self.name(buf, buf.name)}"

    def shared_decl(self, buf) -> str:
        return self.local_decl(buf)

    def stmt(self, st, depth: int) -> list[str]:
        if isinstance(st, For) and st.kind == "thread":
            ind, v = self.indent * depth, self.sv(st.var)
            head = (f"for (int {v} = dcc_lo; {v} < dcc_hi; ++{v}) {{" if st.thread == "group"
                    else self.for_loop(v, self.int_expr(st.extent)))
            return [ind + head] + self.stmt(st.body, depth + 1) + [ind + "}"]
        if isinstance(st, Barrier):
            return []
        if isinstance(st, Intrin):  # a tensorized block: the intrinsic table (c_intrin.py) has its code
            args = [self.name(b, b.name) for b in st.buffers] + [self.int_expr(i) for i in st.ints]
            return [f"{self.indent * depth}dcc_{st.name}({', '.join(args)});"]
        return super().stmt(st, depth)

    def signature(self, k: Kernel) -> str:
        return super().signature(k)[:-1] + ", int dcc_lo, int dcc_hi)"

    def kernel(self, k: Kernel) -> str:
        if k.threads > 1 and any(isinstance(s, Barrier) for s in walk(k.body)):
            raise ValueError(f"kernel {k.name} synchronises {k.threads} threads of a group; the cpu target runs a "
                             f"group's threads one after another and needs threads_per_block 1")
        return super().kernel(k)

    def launcher(self, k: Kernel) -> str:
        """`NAME__launch(b, s, groups)`: the kernel on every pool thread, each on its share of the groups."""
        name = ident(k.name)
        args = [f"({'' if b in k.written else 'const '}{self.ctype(b.dtype)}*)c->b[{i}]"
                for i, b in enumerate(k.buffers)]
        args += [f"c->s[{i}]" for i in range(len(k.scalars))]
        return (f"static void {name}__part(void* ctx, int tid, int nt) {{\n"
                f"  const dcc_launch* c = (const dcc_launch*)ctx;\n"
                f"  {name}({', '.join(args + ['dcc_share(c->groups, tid, nt, 0)', 'dcc_share(c->groups, tid, nt, 1)'])});\n"
                f"}}\n"
                f"DCC_EXPORT void {name}__launch(void* const* b, const int* s, int groups) {{\n"
                f"  dcc_launch c = {{b, s, groups}};\n"
                f"  dcc_parallel({name}__part, &c);\n"
                f"}}\n")

    def module(self, kernels) -> str:
        body = "\n".join(self.kernel(k) for k in kernels)
        launchers = "\n".join(self.launcher(k) for k in kernels)
        return self.preamble + INTRINSICS + X16 + X16_Q8 + STORED_INTRINSICS + POOL_SOURCE + body + "\n" + launchers


def render(kernels, target=None) -> str:
    return CRenderer().module(kernels)
