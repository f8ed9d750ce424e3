"""OpenCL C 1.2. Without cl_khr_fp16 (PoCL), half is storage only: vload_half / vstore_half.

The vectors a kernel uses are decided by the schedule (schedule/vectorize.py: explicit vector values, a
VectorStore, a LanesReduce kept in a floatN register); this renderer only spells them: `vloadN` /
`vload_halfN`, a cast `(floatN)(x)` for a broadcast scalar, `(floatN)(a, b, ...)` for a vector of lanes,
`convert_T` for a cast, `.lo + .hi` halvings for a horizontal sum.
"""
from __future__ import annotations

from deploycc.ir.tir import LanesReduce, V, VectorStore, vector_lanes

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

    # ---- explicit vectors (schedule/vectorize.py) ----------------------------------------------------------------
    def stmt(self, st, depth: int) -> list[str]:
        ind = self.indent * depth
        if isinstance(st, VectorStore):
            n = vector_lanes(st.value.dtype)[1]
            return [f"{ind}vstore{n}({self.vector_operand(st.value)}, 0, {self.name(st.buffer, st.buffer.name)} + "
                    f"{self.int_expr(st.start)});"]
        if isinstance(st, LanesReduce):
            return self.lanes_reduce(st, depth)
        return super().stmt(st, depth)

    def lanes_reduce(self, st: LanesReduce, depth: int) -> list[str]:
        n = vector_lanes(st.values[0].dtype)[1]
        values = [self.vector_operand(v) for v in st.values]
        ind, inner = self.indent * depth, self.indent * (depth + 1)
        names = [(self.name(acc, acc.name), self.fresh(f"v{self.name(acc, acc.name)}")) for acc in st.accs]
        lines = [f"{ind}{{"] + [f"{inner}float{n} {va} = (float{n})(0.0f);" for _, va in names]
        lines.append(f"{inner}{self.for_loop(self.sv(st.var), self.int_expr(st.extent))}")
        lines += [f"{inner}{self.indent}{va} += {value};" for (_, va), value in zip(names, values)]
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

    def vector_operand(self, v: V) -> str:
        """A vector statement's operand: a broadcast scalar as a bare cast."""
        if v.op == "broadcast":
            return f"({self.vector_type(v.dtype)})({self.value(v.src[0])})"
        return self.value(v)

    def vector_type(self, dtype: str) -> str:
        base, n = vector_lanes(dtype)
        return f"{VECTOR_TYPES[base]}{n}"

    def value(self, v: V) -> str:
        if vector_lanes(v.dtype) is None:
            return super().value(v)
        vt = self.vector_type(v.dtype)
        if v.op == "vload":
            buf, start = v.arg
            half = "_half" if buf.dtype == "float16" and buf.scope == "global" else ""
            return f"vload{half}{vector_lanes(v.dtype)[1]}(0, {self.name(buf, buf.name)} + {self.int_expr(start)})"
        if v.op == "broadcast":
            return f"(({vt})({self.value(v.src[0])}))"
        if v.op == "vec":
            return f"(({vt})({', '.join(self.value(x) for x in v.src)}))"
        if v.op == "cast":
            return f"convert_{vt}({self.value(v.src[0])})"
        if v.op in VECTOR_BINOPS:
            return f"({self.value(v.src[0])} {VECTOR_BINOPS[v.op]} {self.value(v.src[1])})"
        if v.op == "neg":
            return f"(-({vt})({self.value(v.src[0])}))"
        if v.op in self.unary:
            return f"{self.unary[v.op]}({self.value(v.src[0])})"
        raise NotImplementedError(f"OpenCL: vector op {v.op}")

    def fresh(self, hint: str) -> str:
        """A new local name (its key object is kept alive so the Namer never sees its id again)."""
        key = object()
        self.__dict__.setdefault("_fresh_keys", []).append(key)
        return self.name(key, hint)


def render(kernels, target=None) -> str:
    return OpenCLRenderer().module(kernels)
