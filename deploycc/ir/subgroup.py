"""SubgroupReduce without subgroup operations: a shared-memory tree, for targets that have none (OpenCL, WebGPU
adapters without the `subgroups` feature).

Each reduction's values go to a work-group array `red[j, t]` (one row per store, one column per thread), then
log2(width) halving steps, each followed by a barrier, leave every group's result at its first thread's column,
which all of the group read. A reduction inside a serial loop ends with one more barrier, so that the next trip's
writes wait for this trip's reads. The arrays are declared at the top of the kernel, where OpenCL requires them.
"""
from __future__ import annotations

from . import sym
from .kernel import Kernel
from .tir import Alloc, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store, SubgroupReduce, V, index, walk


def has_subgroup_reduce(k: Kernel) -> bool:
    return any(isinstance(s, SubgroupReduce) for s in walk(k.body))


def in_loops(k: Kernel) -> set:
    """The kernel's SubgroupReduce statements that are inside a serial loop."""
    found: set = set()

    def visit(st: Stmt, loop: bool) -> None:
        if isinstance(st, SubgroupReduce) and loop:
            found.add(st)
        elif isinstance(st, Seq):
            for x in st.stmts:
                visit(x, loop)
        elif isinstance(st, For):
            visit(st.body, loop or st.kind != "thread")
        elif isinstance(st, Alloc):
            visit(st.body, loop)
        elif isinstance(st, IfThenElse):
            visit(st.then_body, loop)
            if st.else_body is not None:
                visit(st.else_body, loop)
    visit(k.body, False)
    return found


def lower(k: Kernel) -> Kernel:
    """`k` with every SubgroupReduce as a shared-memory tree (the kernel itself when it has none)."""
    if not has_subgroup_reduce(k):
        return k
    top = _thread_loop(k.body)
    arrays: list[Buffer] = []
    body = _Lower(sym.as_expr(top.var), k.threads, arrays, in_loops(k)).stmt(top.body)
    for buf in arrays:
        body = Alloc(buf, body)
    return Kernel(k.name, k.buffers, k.scalars, _replace_thread_body(k.body, body), k.groups, k.threads, k.written)


def _thread_loop(st: Stmt) -> For:
    while isinstance(st, For) and st.kind == "thread" and st.thread != "local":
        st = st.body
    if not (isinstance(st, For) and st.thread == "local"):
        raise ValueError("a kernel's body is its group loop, then its thread loop (ir/kernel.py)")
    return st


def _replace_thread_body(st: Stmt, body: Stmt) -> Stmt:
    if st.thread == "local":
        return For(st.var, st.extent, body, st.kind, st.thread)
    return For(st.var, st.extent, _replace_thread_body(st.body, body), st.kind, st.thread)


class _Lower:
    def __init__(self, t: sym.Expr, threads: int, arrays: list[Buffer], loops: set):
        self.t, self.threads, self.arrays, self.loops = t, threads, arrays, loops

    def stmt(self, st: Stmt) -> Stmt:
        if isinstance(st, SubgroupReduce):
            return self.reduce(st)
        if isinstance(st, Seq):
            return Seq(tuple(self.stmt(x) for x in st.stmts))
        if isinstance(st, For):
            return For(st.var, st.extent, self.stmt(st.body), st.kind, st.thread)
        if isinstance(st, Alloc):
            return Alloc(st.buffer, self.stmt(st.body))
        if isinstance(st, IfThenElse):
            return IfThenElse(st.cond, self.stmt(st.then_body), None if st.else_body is None else self.stmt(st.else_body))
        return st

    def reduce(self, st: SubgroupReduce) -> Stmt:
        n, width, t = len(st.stores), st.width, self.t
        red = Buffer(f"sgred{len(self.arrays)}", (n, self.threads), st.stores[0].value.dtype, "shared")
        self.arrays.append(red)
        lane = sym.mod(t, width)
        steps: list[Stmt] = [Store(red, (sym.as_expr(j), t), x.value) for j, x in enumerate(st.stores)]
        steps.append(Barrier())
        s = width // 2
        while s >= 1:
            steps.append(IfThenElse(index(lane).cmp("lt", index(s)), Seq(tuple(
                Store(red, (sym.as_expr(j), t), V(st.combine, red.dtype, (red[j, t], red[j, t + s])))
                for j in range(n)))))
            steps.append(Barrier())
            s //= 2
        steps += [Store(x.buffer, x.indices, red[j, t - lane]) for j, x in enumerate(st.stores)]
        if st in self.loops:
            steps.append(Barrier())
        return Seq(tuple(steps))
