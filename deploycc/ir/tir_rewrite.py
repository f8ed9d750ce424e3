"""Rewriting tensor programs: substitute buffers and symbolic variables, rename iterators, inline.

Every function here is pure: it returns new statements and leaves its input alone.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from . import sym
from .tir import (
    Alloc,
    Barrier,
    Block,
    Buffer,
    For,
    IfThenElse,
    IterVar,
    LanesReduce,
    Seq,
    Stmt,
    Store,
    SubgroupReduce,
    V,
    VectorStore,
)


def map_value(v: V, fn: Callable[[V], V | None], memo: dict | None = None) -> V:
    """Bottom-up rewrite of a value: `fn` returns a replacement or None to keep the node. A node shared by several
    parents (a dequantized weight's scale read by each of its codes) is rewritten once (`memo`, by identity)."""
    memo = {} if memo is None else memo
    got = memo.get(id(v))
    if got is not None and got[0] is v:
        return got[1]
    node = v
    if v.op == "load":
        buf, idx = v.arg
        idx = tuple(map_value(i, fn, memo) if isinstance(i, V) else i for i in idx)
        node = V("load", v.dtype, (), (buf, idx))
    elif v.src:
        node = V(v.op, v.dtype, tuple(map_value(s, fn, memo) for s in v.src), v.arg)
    out = fn(node)
    out = node if out is None else out
    memo[id(v)] = (v, out)  # v kept alive with its id, so that no other node takes the id meanwhile
    return out


class Substitute:
    """Substitute buffers (by identity) and symbolic variables throughout a statement. Block
    iterators and loop variables are renamed to fresh variables (`fresh=True`), so that one
    program instantiated twice in a fused program never shares a variable between scopes."""

    def __init__(self, buffers: Mapping[Buffer, Buffer] | None = None, syms: Mapping[sym.SymVar, sym.Expr] | None = None,
                 fresh: bool = True):
        self.buffers = dict(buffers or {})
        self.syms: dict[sym.SymVar, sym.Expr] = dict(syms or {})
        self.fresh = fresh
        self._exprs: dict = {}  # index expression -> substituted, while syms stay as they are

    def expr(self, e):
        if isinstance(e, V):
            return self.value(e)
        if not self.syms:
            return e
        got = self._exprs.get(e)
        if got is None:
            got = self._exprs[e] = sym.substitute(e, self.syms)
        return got

    def buf(self, b: Buffer) -> Buffer:
        if b in self.buffers:
            return self.buffers[b]
        shape = tuple(self.expr(d) for d in b.shape)
        if shape != b.shape:
            nb = Buffer(b.name, shape, b.dtype, b.scope)
            self.buffers[b] = nb
            return nb
        return b

    def value(self, v: V) -> V:
        def fn(x: V):
            if x.op == "load":
                buf, idx = x.arg
                return V("load", x.dtype, (), (self.buf(buf), tuple(self.expr(i) for i in idx)))
            if x.op == "index":
                return V("index", x.dtype, (), self.expr(x.arg))
            if x.op == "vload":  # an explicit vector's consecutive elements (schedule/vectorize.py)
                buf, start = x.arg
                return V("vload", x.dtype, (), (self.buf(buf), self.expr(start)))
            return None
        return map_value(v, fn)

    def _rename(self, var: sym.SymVar) -> sym.SymVar:
        if not self.fresh:
            return var
        nv = sym.SymVar(var.name)
        self.syms[var] = sym.as_expr(nv)
        self._exprs.clear()
        return nv

    def store(self, s: Store) -> Store:
        return Store(self.buf(s.buffer), tuple(self.expr(i) for i in s.indices), self.value(s.value))

    def stmt(self, st: Stmt) -> Stmt:
        if isinstance(st, Seq):
            return Seq(tuple(self.stmt(s) for s in st.stmts))
        if isinstance(st, Store):
            return self.store(st)
        if isinstance(st, Block):
            its = []
            for it in st.iters:
                extent = self.expr(it.extent)
                binding = None if it.binding is None else self.expr(it.binding)
                its.append(IterVar(self._rename(it.var), extent, it.kind, binding))
            init = None if st.init is None else self.store(st.init)
            return Block(st.name, tuple(its), self.store(st.body), init)
        if isinstance(st, For):
            extent = self.expr(st.extent)
            return For(self._rename(st.var), extent, self.stmt(st.body), st.kind, st.thread)
        if isinstance(st, Alloc):
            return Alloc(self.buf(st.buffer), self.stmt(st.body))
        if isinstance(st, IfThenElse):
            return IfThenElse(self.value(st.cond), self.stmt(st.then_body),
                              None if st.else_body is None else self.stmt(st.else_body))
        if isinstance(st, Barrier):
            return st
        if isinstance(st, VectorStore):
            return VectorStore(self.buf(st.buffer), self.expr(st.start), self.value(st.value))
        if isinstance(st, SubgroupReduce):
            return SubgroupReduce(tuple(self.store(x) for x in st.stores), st.combine, st.width)
        if isinstance(st, LanesReduce):
            var, extent = self._rename(st.var), self.expr(st.extent)
            return LanesReduce(var, extent, tuple(self.buf(b) for b in st.accs), tuple(self.value(v) for v in st.values))
        raise TypeError(f"cannot rewrite {type(st).__name__}")


def inline_value(producer: Block, idx: tuple[sym.Expr, ...]) -> V:
    """The producer's stored value at `idx` (its store indices are exactly its iterators)."""
    mapping = {it.var: i for it, i in zip(producer.iters, idx)}
    return Substitute(syms=mapping, fresh=False).value(producer.body.value)


def replace_loads(st: Stmt, buf: Buffer, fn: Callable[[tuple], V]) -> Stmt:
    """Replace every load of `buf` (with its indices) by `fn(indices)`."""
    class _R(Substitute):
        def value(self, v: V) -> V:
            def f(x: V):
                if x.op == "load" and x.arg[0] is buf:
                    return fn(x.arg[1])
                return None
            return map_value(v, f)

    return _R(fresh=False).stmt(st)
