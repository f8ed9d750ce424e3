"""One text form for the whole module, both levels. Stable: tests compare against expected text.

Names are made unique per function (a second variable called `n` prints as `n_1`), so the text
identifies objects the way the IR does, by identity.
"""
from __future__ import annotations

import numpy as np

from . import annotation as A
from . import sym
from .callables import ExternFunc, PyFunc
from .expr import (
    BindingBlock,
    Call,
    CallDPSLibrary,
    CallFunc,
    CallPyFunc,
    CallTIR,
    Constant,
    Expr,
    Function,
    If,
    MatchCast,
    SeqExpr,
    ShapeExpr,
    Tuple,
    TupleGetItem,
    Var,
)
from .kernel import Schedule
from .tir import (
    Alloc,
    Barrier,
    Block,
    For,
    IfThenElse,
    Intrin,
    LanesReduce,
    Seq,
    Store,
    SubgroupReduce,
    TensorProgram,
    V,
    VectorStore,
)

BIN_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
           "eq": "==", "ne": "!=", "and": "and", "or": "or", "shr": ">>", "shl": "<<", "bitand": "&", "bitor": "|"}


class Namer:
    def __init__(self):
        self.names: dict[int, str] = {}
        self.used: set[str] = set()

    def __call__(self, obj, hint: str) -> str:
        key = id(obj)
        if key not in self.names:
            name, i = hint, 1
            while name in self.used:
                name, i = f"{hint}_{i}", i + 1
            self.used.add(name)
            self.names[key] = name
        return self.names[key]


class _Printer:
    def __init__(self):
        self.namer = Namer()

    # ---- symbolic + annotations -----------------------------------------------------------
    def sv(self, v: sym.SymVar) -> str:
        return self.namer(v, v.name)

    def s(self, e) -> str:
        return sym.to_python(e, self.sv)

    def ann(self, a: A.Annotation) -> str:
        if isinstance(a, A.TensorAnn):
            dt = f'"{a.dtype}"'
            if a.shape is not None:
                dims = ", ".join(self.s(d) for d in a.shape) + ("," if len(a.shape) == 1 else "")
                return f"Tensor(({dims}), {dt})"
            return f"Tensor(ndim={a.ndim}, dtype={dt})"
        if isinstance(a, A.ShapeAnn):
            if a.values is not None:
                return f"Shape([{', '.join(self.s(d) for d in a.values)}])"
            return f"Shape(ndim={a.ndim})"
        if isinstance(a, A.TupleAnn):
            return f"Tuple[{', '.join(self.ann(f) for f in a.fields)}]"
        return A.to_text(a)

    # ---- graph level ----------------------------------------------------------------------
    def var(self, v: Var) -> str:
        return self.namer(v, v.name.replace(".", "_"))

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Constant):
            if e.value.size <= 4:
                return f"const({np.array2string(e.value, separator=', ')}, \"{e.value.dtype}\")"
            return f"const(<{e.value.dtype}{list(e.value.shape)}>)"
        if isinstance(e, ShapeExpr):
            return f"shape([{', '.join(self.s(v) for v in e.values)}])"
        if isinstance(e, Tuple):
            return f"({', '.join(self.expr(f) for f in e.fields)}{',' if len(e.fields) == 1 else ''})"
        if isinstance(e, TupleGetItem):
            return f"{self.expr(e.tuple_value)}[{e.index}]"
        if isinstance(e, Call):
            args = [self.expr(a) for a in e.args] + [f"{k}={self.attr(v)}" for k, v in sorted(e.attrs.items())]
            return f"{e.op}({', '.join(args)})"
        if isinstance(e, CallTIR):
            extra = f", sym_args=[{', '.join(self.s(s) for s in e.sym_args)}]" if e.sym_args else ""
            return (f"call_tir({e.program}, [{', '.join(self.expr(a) for a in e.args)}], "
                    f"{self.ann(e.out_ann)}{extra})")
        if isinstance(e, CallDPSLibrary):
            return f'call_dps_library("{e.name}", [{", ".join(self.expr(a) for a in e.args)}], {self.ann(e.out_ann)})'
        if isinstance(e, CallFunc):
            return f"{e.func}({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, CallPyFunc):
            return f'call_py_func("{e.func}", [{", ".join(self.expr(a) for a in e.args)}], {self.ann(e.out_ann)})'
        if isinstance(e, If):
            return f"if_({self.expr(e.cond)})"
        raise TypeError(f"cannot print {type(e).__name__}")

    def attr(self, v) -> str:
        if isinstance(v, sym.Expr):
            return self.s(v)
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "(" + ", ".join(self.attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
        if isinstance(v, str):
            return f'"{v}"'
        return repr(v)

    def seq(self, body: SeqExpr, indent: str) -> list[str]:
        lines: list[str] = []
        for block in body.blocks:
            lines += self.block(block, indent)
        if isinstance(body.result, If):
            lines += self.if_(body.result, indent)
        else:
            lines.append(f"{indent}return {self.expr(body.result)}")
        return lines

    def block(self, block: BindingBlock, indent: str) -> list[str]:
        inner = indent + "    " if block.dataflow else indent
        lines = [f"{indent}with dataflow():"] if block.dataflow else []
        for b in block.bindings:
            if isinstance(b, MatchCast):
                lines.append(f"{inner}{self.var(b.var)} = match_cast({self.expr(b.value)}, {self.ann(b.ann)})")
            elif isinstance(b.value, If):
                lines += self.if_(b.value, inner, target=b.var)
            else:
                lines.append(f"{inner}{self.var(b.var)}: {self.ann(b.var.ann)} = {self.expr(b.value)}")
        return lines

    def if_(self, e: If, indent: str, target: Var | None = None) -> list[str]:
        lines = [f"{indent}{self.var(target) + ' = ' if target else ''}if {self.expr(e.cond)}:"]
        lines += self.seq(e.then_branch, indent + "    ")
        lines.append(f"{indent}else:")
        lines += self.seq(e.else_branch, indent + "    ")
        return lines

    def function(self, name: str, fn: Function) -> list[str]:
        items = [f"{self.var(p)}: {self.ann(p.ann)}" for p in fn.params]
        # Models have hundreds of weight params: print one per line past a handful.
        params = ", ".join(items) if len(items) <= 4 else "\n" + "".join(f"    {i},\n" for i in items)
        lines = ["@graph"]
        attrs = {k: v for k, v in fn.attrs.items() if not k.startswith("_")}
        if attrs:
            lines.append(f"@attrs({', '.join(f'{k}={self.attr(v)}' for k, v in sorted(attrs.items()))})")
        bounds = [f"{self.sv(v)} <= {self.s(hi)}" for v, hi in fn.bounds.upper.items()]
        if bounds:
            lines.append(f"@bounds({', '.join(bounds)})")
        lines.append(f"def {name}({params}) -> {self.ann(fn.ret_ann)}:")
        lines += self.seq(fn.body, "    ")
        return lines

    # ---- loop level -----------------------------------------------------------------------
    def buf(self, b) -> str:
        return self.namer(b, b.name)

    def value(self, v: V) -> str:
        if v.op == "const":
            return repr(v.arg) if v.dtype in ("float32", "bool") or isinstance(v.arg, int) else f"{v.dtype}({v.arg!r})"
        if v.op == "index":
            return self.s(v.arg)
        if v.op == "load":
            buf, idx = v.arg
            return f"{self.buf(buf)}[{', '.join(self.idx(i) for i in idx)}]"
        if v.op == "vload":  # explicit vectors (schedule/vectorize.py)
            buf, start = v.arg
            return f"vload({self.buf(buf)}, {self.s(start)}, {v.dtype})"
        if v.op in ("broadcast", "vec"):
            lanes = [self.value(s) for s in v.src]
            if len(lanes) > 2 and sum(map(len, lanes)) > 160:  # a long literal: its first and last lanes
                lanes = [lanes[0], f"... {len(lanes) - 2} lanes ...", lanes[-1]]
            return f"{v.op}({', '.join(lanes)}, {v.dtype})"
        if v.op == "cast":
            return f"{v.dtype}({self.value(v.src[0])})"
        if v.op == "select":
            return f"select({', '.join(self.value(s) for s in v.src)})"
        if v.op in BIN_SYM:
            return f"({self.value(v.src[0])} {BIN_SYM[v.op]} {self.value(v.src[1])})"
        return f"{v.op}({', '.join(self.value(s) for s in v.src)})"

    def idx(self, i) -> str:
        return self.value(i) if isinstance(i, V) else self.s(i)

    def store(self, s: Store) -> str:
        return f"{self.buf(s.buffer)}[{', '.join(self.idx(i) for i in s.indices)}] = {self.value(s.value)}"

    def stmt(self, st, indent: str) -> list[str]:
        if isinstance(st, Seq):
            return [line for s in st.stmts for line in self.stmt(s, indent)]
        if isinstance(st, Store):
            return [indent + self.store(st)]
        if isinstance(st, For):
            kind = f", {st.kind}" + (f' "{st.thread}"' if st.thread else "") if st.kind != "serial" else ""
            return [f"{indent}for {self.sv(st.var)} in range({self.s(st.extent)}{kind}):"] + self.stmt(st.body, indent + "    ")
        if isinstance(st, Block):
            its = []
            for it in st.iters:
                k = "S" if it.kind == "spatial" else "R"
                bind = f" = {self.s(it.binding)}" if it.binding is not None else ""
                its.append(f"{self.sv(it.var)}: {k}[{self.s(it.extent)}]{bind}")
            lines = [f"{indent}block {st.name}({', '.join(its)}):"]
            if st.init is not None:
                lines.append(f"{indent}    init: {self.store(st.init)}")
            lines.append(f"{indent}    {self.store(st.body)}")
            return lines
        if isinstance(st, Alloc):
            return [indent + self.alloc_text(st.buffer)] + self.stmt(st.body, indent)
        if isinstance(st, IfThenElse):
            lines = [f"{indent}if {self.value(st.cond)}:"] + self.stmt(st.then_body, indent + "    ")
            if st.else_body is not None:
                lines += [f"{indent}else:"] + self.stmt(st.else_body, indent + "    ")
            return lines
        if isinstance(st, Barrier):
            return [f"{indent}barrier(\"{st.scope}\")"]
        if isinstance(st, VectorStore):
            return [f"{indent}vstore({self.buf(st.buffer)}, {self.s(st.start)}, {self.value(st.value)})"]
        if isinstance(st, SubgroupReduce):
            return [f"{indent}subgroup_reduce({st.combine!r}, width={st.width}):"] + \
                [f"{indent}    {self.store(x)}" for x in st.stores]
        if isinstance(st, LanesReduce):
            names = [self.buf(b) for b in st.accs]
            accs = ", ".join(names) if len(names) <= 4 else f"{names[0]} ... {names[-1]} ({len(names)} accumulators)"
            lines = [f"{indent}for {self.sv(st.var)} in range({self.s(st.extent)}, lanes_reduce into {accs}):"]
            return lines + [f"{indent}    {self.buf(b)} += {self.value(v)}" for b, v in zip(st.accs, st.values)]
        if isinstance(st, Intrin):  # a tensorized intrinsic, by name (the renderer's table has its code)
            args = [self.buf(b) for b in st.buffers] + [self.s(i) for i in st.ints]
            writes = f"  # writes {', '.join(self.buf(b) for b in st.writes)}" if st.writes else ""
            return [f"{indent}{st.name}({', '.join(args)}){writes}"]
        raise TypeError(f"cannot print {type(st).__name__}")

    def alloc_text(self, b) -> str:
        return f'{self.buf(b)} = alloc(({", ".join(self.s(d) for d in b.shape)}{"," if len(b.shape) == 1 else ""}), ' \
               f'"{b.dtype}", "{b.scope}")'

    def schedule(self, s: Schedule, indent: str) -> list[str]:
        """A schedule's kernels as loop nests under the program they implement: thread loops, lanes and vectors
        as For kinds, tensorized intrinsics by name."""
        lines = [f"{indent}# scheduled ({s.rule or 'no rule'}): {len(s.kernels)} kernel(s)"]
        lines += [f"{indent}{self.alloc_text(b)}" for b in s.workspace]
        for k in s.kernels:
            args = [self.buf(b) for b in k.buffers] + [f"{self.sv(v)}: int" for v in k.scalars]
            writes = f"  # writes {', '.join(self.buf(b) for b in k.buffers if b in k.written)}" if k.written else ""
            lines.append(f"{indent}kernel {k.name}({', '.join(args)}), groups={self.s(k.groups)}, "
                         f"threads={k.threads}:{writes}")
            lines += self.stmt(k.body, indent + "    ")
        return lines

    def program(self, name: str, p: TensorProgram) -> list[str]:
        params = ", ".join(
            f"{self.buf(b)}: Buffer(({', '.join(self.s(d) for d in b.shape)}{',' if len(b.shape) == 1 else ''}), \"{b.dtype}\")"
            for b in p.params)
        head = ["@tensor_program" + (f"(num_outputs={p.num_outputs})" if p.num_outputs != 1 else "")]
        attrs = {k: v for k, v in p.attrs.items() if not k.startswith("_") and not isinstance(v, Schedule)}
        if attrs:
            head.append(f"@attrs({', '.join(f'{k}={self.attr(v)}' for k, v in sorted(attrs.items()))})")
        sp = "".join(f", {self.sv(v)}: int" for v in p.sym_params)
        lines = head + [f"def {name}({params}{sp}):"] + self.stmt(p.body, "    ")
        for s in p.attrs.values():
            if isinstance(s, Schedule):
                lines += self.schedule(s, "    ")
        return lines


def module_text(mod) -> str:
    """The text of an IRModule: its functions in order."""
    chunks = []
    for name, f in mod.functions.items():
        pr = _Printer()
        if isinstance(f, Function):
            chunks.append("\n".join(pr.function(name, f)))
        elif isinstance(f, TensorProgram):
            chunks.append("\n".join(pr.program(name, f)))
        elif isinstance(f, ExternFunc):
            chunks.append(f'extern("{f.name}")')
        elif isinstance(f, PyFunc):
            chunks.append(py_func_text(f).rstrip("\n"))
        else:
            chunks.append(f"# {name}: {type(f).__name__}")
    return "\n\n".join(chunks) + "\n"


def function_text(fn: Function) -> str:
    return "\n".join(_Printer().function(fn.name, fn)) + "\n"


def program_text(p: TensorProgram, name: str | None = None) -> str:
    return "\n".join(_Printer().program(name or p.name, p)) + "\n"


def py_func_text(f: PyFunc) -> str:
    """A Python function prints as its source under a `@py_func` header."""
    return "@py_func\n" + f.source.rstrip("\n") + "\n"
