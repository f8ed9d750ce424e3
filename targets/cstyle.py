"""One C-style renderer for kernels; CUDA, OpenCL and WGSL override data tables and a few hooks.

Buffers are flat arrays indexed row-major (shapes may be symbolic: strides are int expressions of
the kernel's int arguments). Thread-local buffers become local arrays of constant size.
"""
from __future__ import annotations

import math

from deploycc.ir import subgroup, sym
from deploycc.ir.kernel import Kernel
from deploycc.ir.printer import Namer
from deploycc.ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Intrin, Seq, Stmt, Store, SubgroupReduce, V
from deploycc.runtime.validate import entry_name as ident

BINOPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
          "eq": "==", "ne": "!=", "and": "&&", "or": "||", "shr": ">>", "shl": "<<", "bitand": "&", "bitor": "|"}


WIDE = 1 << 30  # a kernel whose buffer holds this many elements or more computes its indices in 64 bits


def elements(buf: Buffer) -> int:
    """The number of elements of `buf` when its shape is constant; 0 when a dimension is symbolic (the activations
    and caches: a dimension bounded by the context window or the prefill chunk, far below 2^31 elements)."""
    n = 1
    for d in buf.shape:
        d = sym.as_expr(d)
        if not d.is_const:
            return 0
        n *= d.value
    return n


class CStyleRenderer:
    types = {"float32": "float", "float16": "half", "int32": "int", "uint32": "uint", "int8": "char",
             "uint8": "uchar", "bool": "bool", "int64": "long"}
    unary = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh", "sin": "sin",
             "cos": "cos", "abs": "fabs", "erf": "erf", "rint": "rint"}
    float_max, float_min, int_max, int_min = "fmax", "fmin", "max", "min"
    kernel_prefix = "__kernel void"
    group_id = "(get_group_id(1) * get_num_groups(0) + get_group_id(0))"
    local_id = "get_local_id(0)"
    indent = "  "
    preamble = ""
    index_type: str | None = "long"  # 64-bit int for a wide kernel's index arithmetic (None: the language has none)
    # SubgroupReduce written with the language's subgroup operations (subgroup_reduce); else lowered to a
    # shared-memory tree before rendering (ir/subgroup.py)
    subgroup_ops = False

    def __init__(self):
        self.names = Namer()
        self.wide = False

    # ---- names and types ----------------------------------------------------------------------
    reserved = frozenset("""auto break case char const continue default do double else enum extern float for goto
        if int long register restrict return short signed sizeof static struct switch typedef union unsigned void
        volatile while half bool uint uchar global local kernel private constant private read_only write_only
        true false let var fn loop array ptr storage uniform workgroup function select min max exp sqrt""".split())

    def name(self, obj, hint: str) -> str:
        hint = ident(hint)
        return self.names(obj, hint + "_" if hint in self.reserved else hint)

    def ctype(self, dtype: str) -> str:
        return self.types[dtype]

    def sv(self, v: sym.SymVar) -> str:
        return self.name(v, v.name)

    def int_expr(self, e) -> str:
        # kept per kernel (its Namer): a kernel renders the same index expressions many times (a GEMV's lanes)
        if self.__dict__.get("_int_names") is not self.names:
            self._int_names, self._int_exprs = self.names, {}
        key = (e, self.wide)
        text = self._int_exprs.get(key)
        if text is None:
            if self.wide:  # every variable widened, so no product or sum of the expression is taken in 32 bits
                text = sym.to_c(e, lambda v: f"(({self.index_type}){self.sv(v)})")
            else:
                text = sym.to_c(e, self.sv)
            self._int_exprs[key] = text
        return text

    # ---- buffers --------------------------------------------------------------------------------
    def flat_index(self, buf: Buffer, indices) -> str:
        terms, stride = [], sym.as_expr(1)
        sym_terms: list[sym.Expr] = []
        value_terms: list[str] = []
        for d, i in zip(reversed(buf.shape), reversed(indices)):
            if isinstance(i, V):
                v = f"(({self.index_type})({self.value(i)}))" if self.wide else f"({self.value(i)})"
                value_terms.append(f"{v} * ({self.int_expr(stride)})" if not (stride.is_const and stride.value == 1) else v)
            else:
                sym_terms.append(i * stride)
            stride = stride * d
        total = sym.as_expr(0)
        for t in sym_terms:
            total = total + t
        terms = ([self.int_expr(total)] if sym_terms else []) + value_terms
        return " + ".join(terms) or "0"

    def load(self, buf: Buffer, indices) -> str:
        return f"{self.name(buf, buf.name)}[{self.flat_index(buf, indices)}]"

    def store(self, st: Store) -> str:
        return f"{self.name(st.buffer, st.buffer.name)}[{self.flat_index(st.buffer, st.indices)}] = {self.value(st.value)};"

    # ---- values ---------------------------------------------------------------------------------
    def literal(self, v: V) -> str:
        x = v.arg
        if v.dtype == "bool":
            return "true" if x else "false"
        if v.dtype.startswith(("int", "uint")):
            return str(int(x))
        x = float(x)
        if math.isinf(x):
            return "INFINITY" if x > 0 else "(-INFINITY)"
        return f"{x!r}f"

    def cast(self, dtype: str, inner: str) -> str:
        return f"(({self.ctype(dtype)})({inner}))"

    def select(self, c: str, a: str, b: str) -> str:
        return f"(({c}) ? ({a}) : ({b}))"

    def sigmoid(self, x: str) -> str:
        return f"(1.0f / (1.0f + exp(-({x}))))"

    def value(self, v: V) -> str:
        op = v.op
        if op == "const":
            return self.literal(v)
        if op == "var":  # a name the renderer declared (subgroup_reduce's registers)
            return v.arg
        if op == "index":
            return f"({self.int_expr(v.arg)})"
        if op == "load":
            return self.load(*v.arg)
        if op == "cast":
            return self.cast(v.dtype, self.value(v.src[0]))
        if op == "select":
            return self.select(*(self.value(s) for s in v.src))
        if op == "neg":
            return f"(-{self.value(v.src[0])})"
        if op == "sigmoid":
            return self.sigmoid(self.value(v.src[0]))
        if op in self.unary:
            return f"{self.unary[op]}({self.value(v.src[0])})"
        if op in ("max", "min"):
            a, b = v.src
            is_float = v.dtype.startswith(("float", "bfloat"))
            fn = (self.float_max if op == "max" else self.float_min) if is_float else (
                self.int_max if op == "max" else self.int_min)
            return f"{fn}({self.value(a)}, {self.value(b)})"
        if op == "pow":
            return f"pow({self.value(v.src[0])}, {self.value(v.src[1])})"
        if op in BINOPS:
            return f"({self.value(v.src[0])} {BINOPS[op]} {self.value(v.src[1])})"
        raise NotImplementedError(f"{type(self).__name__}: value op {op}")

    # ---- statements -----------------------------------------------------------------------------
    def local_decl(self, buf: Buffer) -> str:
        size = 1
        for d in buf.shape:
            size *= d.value
        return f"{self.ctype(buf.dtype)} {self.name(buf, buf.name)}[{size}];"

    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    shared_qualifier = "__local"

    def shared_decl(self, buf: Buffer) -> str:
        """Work-group memory (OpenCL requires it at kernel function scope: schedules put it there)."""
        return f"{self.shared_qualifier} {self.local_decl(buf)}"

    unroll_pragma = ""  # a loop of kind "unroll" written out by the compiler (CUDA: #pragma unroll)

    def for_loop(self, var: str, extent: str) -> str:
        return f"for (int {var} = 0; {var} < {extent}; ++{var}) {{"

    def thread_var(self, st: For) -> str:
        expr = self.group_id if st.thread == "group" else self.local_id
        return f"int {self.sv(st.var)} = {expr};"

    def stmt(self, st: Stmt, depth: int) -> list[str]:
        ind = self.indent * depth
        if isinstance(st, Seq):
            return [x for s in st.stmts for x in self.stmt(s, depth)]
        if isinstance(st, Store):
            return [ind + self.store(st)]
        if isinstance(st, For):
            if st.kind == "thread":
                return [ind + self.thread_var(st)] + self.stmt(st.body, depth)
            head = self.for_loop(self.sv(st.var), self.int_expr(st.extent))
            pragma = [ind + self.unroll_pragma] if st.kind == "unroll" and self.unroll_pragma else []
            return pragma + [ind + head] + self.stmt(st.body, depth + 1) + [ind + "}"]
        if isinstance(st, Alloc):
            decl = self.alloc_decl(st.buffer)
            return ([ind + decl] if decl else []) + self.stmt(st.body, depth)
        if isinstance(st, Intrin):
            return [ind + line for line in self.intrin(st)]
        if isinstance(st, Barrier):
            return [ind + self.barrier]
        if isinstance(st, SubgroupReduce):
            return self.subgroup_reduce(st, depth)
        if isinstance(st, IfThenElse):
            lines = [f"{ind}if ({self.value(st.cond)}) {{"] + self.stmt(st.then_body, depth + 1)
            if st.else_body is not None:
                lines += [f"{ind}}} else {{"] + self.stmt(st.else_body, depth + 1)
            return lines + [ind + "}"]
        raise NotImplementedError(f"{type(self).__name__}: statement {type(st).__name__}")

    # ---- kernels --------------------------------------------------------------------------------
    def buffer_param(self, buf: Buffer, written: bool) -> str:
        const = "" if written else "const "
        return f"__global {const}{self.ctype(buf.dtype)}* restrict {self.name(buf, buf.name)}"

    def scalar_param(self, v: sym.SymVar) -> str:
        return f"int {self.sv(v)}"

    def signature(self, k: Kernel) -> str:
        params = [self.buffer_param(b, b in k.written) for b in k.buffers] + [self.scalar_param(v) for v in k.scalars]
        return f"{self.kernel_prefix} {ident(k.name)}({', '.join(params)})"

    def alloc_decl(self, buf: Buffer) -> str:
        return self.shared_decl(buf) if buf.scope == "shared" else self.local_decl(buf)

    def intrin(self, st: Intrin) -> list[str]:
        """A target intrinsic's lines (the cpu renderer has its own table: targets/c.py)."""
        raise NotImplementedError(f"{type(self).__name__}: intrinsic {st.name}")

    def subgroup_reduce(self, st: SubgroupReduce, depth: int) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__}: subgroup operations")

    def combine(self, op: str, dtype: str, a: str, b: str) -> str:
        """a combined with b by a reduction's op (add, max, min)."""
        return self.value(V(op, dtype, (V("var", dtype, (), a), V("var", dtype, (), b))))

    def kernel(self, k: Kernel) -> str:
        if not self.subgroup_ops:
            k = subgroup.lower(k)
        self.names = Namer()
        self.wide = self.index_type is not None and any(elements(b) >= WIDE for b in k.buffers)
        for b in k.buffers:  # parameters get their names first
            self.name(b, b.name)
        for v in k.scalars:
            self.sv(v)
        head = self.signature(k)
        body = self.stmt(k.body, 1)
        return "\n".join([head + " {"] + body + ["}"]) + "\n"

    def module(self, kernels) -> str:
        return self.preamble + "\n".join(self.kernel(k) for k in kernels)


# Math and library functions of C, OpenCL C, CUDA and WGSL that a kernel of the same name would
# shadow or clash with (a program of op `exp` is named `exp`): kernel symbols get a trailing "_".
