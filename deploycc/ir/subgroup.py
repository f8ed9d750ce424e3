"""SubgroupReduce without subgroup operations: a shared-memory tree, for targets that have none (OpenCL, WebGPU
adapters without the `subgroups` feature).

Each reduction's values go to a work-group array `red[j, t]` (one row per store, one column per thread), then
log2(width) halving steps, each followed by a barrier, leave every group's result at its first thread's column,
which all of the group read. A reduction inside a serial loop ends with one more barrier, so that the next trip's
writes wait for this trip's reads. The arrays are declared at the top of the kernel, where OpenCL requires them.
A reduction of a whole local array in place (`in_place`: the GEMVs' accumulators, up to 32 of them) is written as
loops over the array's elements, not a copy of each step per element: the same operations, a text the software
drivers compile in a fraction of the time.
"""
from __future__ import annotations

from dataclasses import replace

from . import sym
from .kernel import Kernel
from .tir import Alloc, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store, SubgroupReduce, V, index, walk


def has_subgroup_reduce(k: Kernel) -> bool:
    return any(isinstance(s, SubgroupReduce) for s in walk(k.body))


def in_place(st: SubgroupReduce) -> Buffer | None:
    """The local array `st` reduces in place, every element in order (store j: `acc[j] = acc[j]`), when it has two
    elements or more; else None."""
    buf = st.stores[0].buffer
    if len(st.stores) < 2:
        return None
    size = sym.as_expr(buf.shape[0]) if len(buf.shape) == 1 else None
    if buf.scope != "local" or size is None or not size.is_const or size.value != len(st.stores):
        return None
    for j, x in enumerate(st.stores):
        v = x.value
        if x.buffer is not buf or not _at(x.indices, j) or v.op != "load" or v.arg[0] is not buf or not _at(v.arg[1], j):
            return None
    return buf


def _at(indices, j: int) -> bool:
    i = indices[0]
    return not isinstance(i, V) and sym.as_expr(i).is_const and sym.as_expr(i).value == j


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
    return replace(k, body=_replace_thread_body(k.body, body))


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
        acc = in_place(st)
        if acc is not None:
            return self.reduce_array(st, acc, red, lane)
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

    def reduce_array(self, st: SubgroupReduce, acc: Buffer, red: Buffer, lane: sym.Expr) -> Stmt:
        """reduce() of an array reduced in place, each step a loop over its n elements."""
        n, t = len(st.stores), self.t
        j = sym.SymVar("sg_j")
        J = sym.as_expr(j)

        def each(body: Stmt) -> For:
            return For(j, sym.as_expr(n), body)
        steps: list[Stmt] = [each(Store(red, (J, t), acc[J])), Barrier()]
        s = st.width // 2
        while s >= 1:
            steps.append(IfThenElse(index(lane).cmp("lt", index(s)),
                                    each(Store(red, (J, t), V(st.combine, red.dtype, (red[J, t], red[J, t + s]))))))
            steps.append(Barrier())
            s //= 2
        steps.append(each(Store(acc, (J,), red[J, t - lane])))
        if st in self.loops:
            steps.append(Barrier())
        return Seq(tuple(steps))
