"""OpenCL C 1.2. Without cl_khr_fp16 (PoCL), half is storage only: vload_half / vstore_half.

A reduction loop of kind "lanes" (schedule/lowering.py: one `acc = acc + value_c` per lane c) is
rendered as vector code: a floatN accumulator and one vector expression per iteration, built lane
by lane from the copies. A load whose index is consecutive across lanes becomes `vloadN` /
`vload_halfN`; a value equal in every lane stays scalar; anything else is a vector literal of the
lanes' scalar expressions (the kernel compiler folds repeated loads, e.g. the packed word that
eight 4-bit lanes share). PoCL does not vectorize across work-items when a kernel has inner loops,
so this is where its SIMD width gets used.
"""
from __future__ import annotations

from deploycc.ir import sym
from deploycc.ir.tir import For, Seq, Store, V

from .cstyle import CStyleRenderer

VECTOR_BINOPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "shr": ">>", "shl": "<<", "bitand": "&",
                 "bitor": "|"}
VECTOR_TYPES = {"float32": "float", "float16": "float", "uint32": "uint", "int32": "int"}


class OpenCLRenderer(CStyleRenderer):
    preamble = ""

    # PoCL has no cl_khr_fp16: half is a storage type, read with vload_half and written with vstore_half.
    def load(self, buf, indices) -> str:
        if buf.dtype == "float16" and buf.scope == "global":
            return f"vload_half({self.flat_index(buf, indices)}, {self.name(buf, buf.name)})"
        return super().load(buf, indices)

    def store(self, st) -> str:
        if st.buffer.dtype == "float16" and st.buffer.scope == "global":
            return (f"vstore_half({self.value(st.value)}, {self.flat_index(st.buffer, st.indices)}, "
                    f"{self.name(st.buffer, st.buffer.name)});")
        return super().store(st)

    def cast(self, dtype: str, inner: str) -> str:
        return f"(({'float' if dtype == 'float16' else self.ctype(dtype)})({inner}))"

    # ---- vectorized reduction loops -------------------------------------------------------------
    def stmt(self, st, depth: int) -> list[str]:
        if isinstance(st, For) and st.kind in ("lanes", "vector"):
            lines = self.lanes_loop(st, depth) if st.kind == "lanes" else self.vector_loop(st, depth)
            if lines is not None:
                return lines
        return super().stmt(st, depth)

    def vector_loop(self, st: For, depth: int) -> list[str] | None:
        """A loop of kind "vector": n stores per iteration to consecutive elements of one float32
        buffer, written as one vstoreN of the vector of their values."""
        stores = st.body.stmts if isinstance(st.body, Seq) else (st.body,)
        n = len(stores)
        if n not in (4, 8, 16) or not all(isinstance(x, Store) and x.buffer is stores[0].buffer for x in stores):
            return None
        buf = stores[0].buffer
        idx = [self.sym_flat(buf, x.indices) for x in stores]
        if buf.dtype != "float32" or any(i is None for i in idx) or not all(
                sym.prove_eq(i - idx[0], sym.as_expr(c)) for c, i in enumerate(idx)):
            return None
        try:
            vec, is_vec = self.vector([x.value for x in stores])
        except _NotVectorizable:
            return None
        ind = self.indent * depth
        value = vec if is_vec else f"(float{n})({vec})"
        return [ind + self.for_loop(self.sv(st.var), self.int_expr(st.extent)),
                f"{ind}{self.indent}vstore{n}({value}, 0, {self.name(buf, buf.name)} + {self.int_expr(idx[0])});",
                ind + "}"]

    def lanes_loop(self, st: For, depth: int) -> list[str] | None:
        stores = st.body.stmts if isinstance(st.body, Seq) else (st.body,)
        if not all(isinstance(x, Store) for x in stores):
            return None
        groups: dict = {}
        for x in stores:  # accumulator -> its lane values (a register tile has several accumulators)
            v = x.value
            if (x.buffer.dtype != "float32" or v.op != "add" or v.src[0].op != "load"
                    or v.src[0].arg[0] is not x.buffer):
                return None
            groups.setdefault(x.buffer, []).append(v.src[1])
        n = len(stores) // len(groups)
        if n not in (4, 8, 16) or any(len(vs) != n for vs in groups.values()):
            return None
        if any(acc in _buffers(v) for vs in groups.values() for v in vs for acc in groups):
            return None
        try:
            vecs = [self.vector(vs) for vs in groups.values()]
        except _NotVectorizable:
            return None
        ind, inner = self.indent * depth, self.indent * (depth + 1)
        names = [(self.name(acc, acc.name), self.fresh(f"v{self.name(acc, acc.name)}")) for acc in groups]
        lines = [f"{ind}{{"] + [f"{inner}float{n} {va} = (float{n})(0.0f);" for _, va in names]
        lines.append(f"{inner}{self.for_loop(self.sv(st.var), self.int_expr(st.extent))}")
        for (_, va), (vec, is_vec) in zip(names, vecs):
            lines.append(f"{inner}{self.indent}{va} += {vec if is_vec else f'(float{n})({vec})'};")
        lines.append(f"{inner}}}")
        for a, va in names:  # horizontal sum: halve the vector until four lanes are left
            cur, width = va, n
            while width > 4:
                width //= 2
                nxt = self.fresh(f"h{a}_{width}")
                lines.append(f"{inner}float{width} {nxt} = {cur}.lo + {cur}.hi;")
                cur = nxt
            lines.append(f"{inner}{a}[0] = ({a}[0] + (({cur}.x + {cur}.y) + ({cur}.z + {cur}.w)));")
        return lines + [f"{ind}}}"]

    def vector(self, lanes: list[V]) -> tuple[str, bool]:
        """(expression, is_vector) of the per-lane scalar values `lanes` (same tree shape expected)."""
        n = len(lanes)
        scalars = [self.value(v) for v in lanes]
        if all(s == scalars[0] for s in scalars):
            return scalars[0], False
        v0 = lanes[0]
        vt = VECTOR_TYPES.get(v0.dtype)
        same = all(v.op == v0.op and v.dtype == v0.dtype and len(v.src) == len(v0.src) for v in lanes)

        def literal() -> tuple[str, bool]:
            if vt is None:
                raise _NotVectorizable
            return f"(({vt}{n})({', '.join(scalars)}))", True

        if not same or vt is None:
            return literal()
        if v0.op == "load" and all(v.arg[0] is v0.arg[0] for v in lanes):
            buf = v0.arg[0]
            idx = [self.sym_flat(buf, v.arg[1]) for v in lanes]
            if all(i is not None for i in idx) and all(
                    sym.prove_eq(i - idx[0], sym.as_expr(c)) for c, i in enumerate(idx)):
                name = self.name(buf, buf.name)
                start = self.int_expr(idx[0])
                if buf.dtype == "float16" and buf.scope == "global":
                    return f"vload_half{n}(0, {name} + {start})", True
                return f"vload{n}(0, {name} + {start})", True
            return literal()
        if v0.op == "cast" and v0.dtype in VECTOR_TYPES:
            inner, is_vec = self.vector([v.src[0] for v in lanes])
            if not is_vec:
                return self.cast(v0.dtype, inner), False
            return f"convert_{vt}{n}({inner})", True
        if v0.op in VECTOR_BINOPS:
            (a, av), (b, bv) = (self.vector([v.src[k] for v in lanes]) for k in (0, 1))
            a = a if av else f"(({vt}{n})({a}))"
            b = b if bv or v0.op not in ("shr", "shl") else f"(({vt}{n})({b}))"
            return f"({a} {VECTOR_BINOPS[v0.op]} {b})", True
        if v0.op == "neg":
            a, _ = self.vector([v.src[0] for v in lanes])
            return f"(-({vt}{n})({a}))", True
        if v0.op in self.unary and vt == "float":
            a, av = self.vector([v.src[0] for v in lanes])
            return f"{self.unary[v0.op]}({a if av else f'(({vt}{n})({a}))'})", True
        return literal()

    def fresh(self, hint: str) -> str:
        """A new local name (its key object is kept alive so the Namer never sees its id again)."""
        key = object()
        self.__dict__.setdefault("_fresh_keys", []).append(key)
        return self.name(key, hint)

    def sym_flat(self, buf, indices) -> sym.Expr | None:
        """The row-major flat index as one symbolic expression (None when an index is a value)."""
        total, stride = sym.as_expr(0), sym.as_expr(1)
        for d, i in zip(reversed(buf.shape), reversed(indices)):
            if isinstance(i, V):
                return None
            total = total + i * stride
            stride = stride * d
        return total


class _NotVectorizable(Exception):
    pass


def _buffers(v: V) -> set:
    out = set()
    if v.op == "load":
        out.add(v.arg[0])
        for i in v.arg[1]:
            if isinstance(i, V):
                out |= _buffers(i)
    for s in v.src:
        out |= _buffers(s)
    return out


def render(kernels, target=None) -> str:
    return OpenCLRenderer().module(kernels)
