"""Kernels: what a scheduled tensor program launches.

A kernel body is loop-level IR with two thread loops at the top: `For(g, groups, thread="group")`
(the linear work-group index; runtimes launch a 2-D grid when it exceeds a dimension's limit) and
`For(t, threads, thread="local")`. Inside: serial loops, guards, thread-local arrays and stores,
with block iterators already replaced by their values, so renderers see plain C-like code.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..runtime.vm import DTYPE_BYTES
from . import sym
from .tir import (
    Alloc,
    Barrier,
    Buffer,
    For,
    IfThenElse,
    Intrin,
    Seq,
    Stmt,
    Store,
    SubgroupReduce,
    TensorProgram,
    V,
    loads,
    vector_lanes,
    walk,
)


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    buffers: tuple[Buffer, ...]  # global buffers, in argument order
    scalars: tuple[sym.SymVar, ...]  # int32 arguments after the buffers
    body: Stmt
    groups: sym.Expr  # number of work-groups (symbolic)
    threads: int  # threads per work-group
    written: frozenset = frozenset()  # buffers the kernel stores to (the rest are read-only)
    # the tensor-core tiles' kind (perfmodel.TENSOR_KINDS: "tf32", "codes", "codes3"; "" for none), which the
    # schedule that makes them knows (schedule/mma.py) and programs.json records for the performance model
    tensor: str = ""
    # the round trips to memory its last work-group makes after every other has arrived (schedule/attention.py's
    # combine in the last block), in its sizes, which programs.json records for the performance model; None: none
    tail: sym.Expr | None = None


@dataclass(frozen=True, eq=False)
class Schedule:
    """The kernels of one program, in launch order, and the global intermediates they share. `dispatched`: the
    kernels are alternatives, each making the whole program for some shapes and zero work-groups for the others
    (schedule/dispatch.py), so one of them runs per launch of the program."""

    kernels: tuple[Kernel, ...]
    workspace: tuple[Buffer, ...] = ()
    rule: str = ""
    dispatched: bool = False
    rounded: Buffer | None = None  # the input its kernels round to codes, where no quantize intrinsic says so (dp4a)
    # workspace buffers that must hold zeros when the kernels start and that they leave zero (a count of work-groups
    # arrived, which the last to arrive resets: schedule/attention.py): the VM gives them a storage of their own,
    # allocated zeroed once and never shared with other tensors (vm/lower.py)
    zeroed: tuple[Buffer, ...] = ()


def scheduled(prog: TensorProgram) -> Schedule | None:
    return prog.attrs.get("schedule")


def barriers(stmt: Stmt, last: dict | None = None) -> sym.Expr:
    """The barriers one thread of a kernel passes, in the kernel's sizes: of its last block where a loop's trips
    depend on the block (a causal prefill's last queries see the most keys), the larger branch of an `if`; a
    SubgroupReduce as none (where a target lowers it to a shared-memory tree its barriers come on top). The blocks'
    steps one after another, each waiting for its loads before the barrier: the performance model's serial term."""
    last = {} if last is None else last  # a thread loop's variable: its last value
    if isinstance(stmt, Barrier):
        return sym.as_expr(1)
    if isinstance(stmt, Seq):
        total = sym.as_expr(0)
        for s in stmt.stmts:
            total = total + barriers(s, last)
        return total
    if isinstance(stmt, For):
        if stmt.kind == "thread":
            return barriers(stmt.body, {**last, stmt.var: sym.as_expr(stmt.extent) - 1})
        trips = sym.substitute(stmt.extent, last)
        inner = barriers(stmt.body, {**last, stmt.var: trips - 1})  # a trip's count, at its last (an upper bound)
        return inner if inner.is_const and inner.value == 0 else trips * inner
    if isinstance(stmt, Alloc):
        return barriers(stmt.body, last)
    if isinstance(stmt, IfThenElse):
        then = barriers(stmt.then_body, last)
        other = barriers(stmt.else_body, last) if stmt.else_body is not None else sym.as_expr(0)
        return then if other.is_const and other.value == 0 else sym.smax(then, other)
    return sym.as_expr(0)


def loads_in_flight(stmt: Stmt) -> int:
    """The bytes of device-memory loads one thread of a kernel has waiting together where its schedule says so: the
    largest unrolled loop whose trips only load into registers (schedule/lowering.py: batched_copy, a batch of trips'
    loads before any store), its global loads over all its trips; 0 where there is none. The performance model's
    latency term (a thread's bytes over those in flight, a round trip each)."""
    best = 0
    for s in walk(stmt):
        if not (isinstance(s, For) and s.kind == "unroll" and sym.as_expr(s.extent).is_const):
            continue
        inner = list(walk(s.body))
        if not all(isinstance(x, (Seq, Store)) for x in inner):
            continue
        n = 0
        for x in inner:
            if isinstance(x, Store) and x.buffer.scope == "local":
                for load in loads(x.value):
                    if load.arg[0].scope == "global":
                        base, lanes = vector_lanes(load.dtype) or (load.dtype, 1)
                        n += DTYPE_BYTES.get(base, 4) * lanes
        best = max(best, n * sym.as_expr(s.extent).value)
    return best


def allocs_of(stmt: Stmt) -> list[Buffer]:
    return [s.buffer for s in walk(stmt) if isinstance(s, Alloc)]


def strip_allocs(stmt: Stmt) -> list[Stmt]:
    """The program's statements with Alloc wrappers removed (in order)."""
    if isinstance(stmt, Alloc):
        return strip_allocs(stmt.body)
    if isinstance(stmt, Seq):
        return [x for s in stmt.stmts for x in strip_allocs(s)]
    return [stmt]


def free_syms(stmt: Stmt) -> list[sym.SymVar]:
    """Symbolic variables a kernel body uses but does not bind with its own loops (its int args)."""
    bound: set[sym.SymVar] = set()
    used: list[sym.SymVar] = []

    def add(e):
        if isinstance(e, V):
            for x in _value_syms(e):
                add(x)
            return
        for v in sorted(sym.as_expr(e).free_vars(), key=lambda v: v.name):
            if v not in bound and v not in used:
                used.append(v)

    def visit(st):
        if isinstance(st, For):
            add(st.extent)
            bound.add(st.var)
            visit(st.body)
        elif isinstance(st, Seq):
            for s in st.stmts:
                visit(s)
        elif isinstance(st, SubgroupReduce):
            for s in st.stores:
                visit(s)
        elif isinstance(st, Alloc):
            for d in st.buffer.shape:
                add(d)
            visit(st.body)
        elif isinstance(st, IfThenElse):
            add(st.cond)
            visit(st.then_body)
            if st.else_body is not None:
                visit(st.else_body)
        elif isinstance(st, Store):
            for d in st.buffer.shape:
                add(d)
            for i in st.indices:
                add(i)
            add(st.value)
        elif isinstance(st, Intrin):
            for b in st.buffers:
                for d in b.shape:
                    add(d)
            for i in st.ints:
                add(i)
    visit(stmt)
    return used


def _value_syms(v: V):
    if v.op == "index":
        yield v.arg
    if v.op == "load":
        buf, idx = v.arg
        yield from buf.shape
        yield from idx
    for s in v.src:
        yield from _value_syms(s)


def global_buffers(stmt: Stmt, order: list[Buffer]) -> tuple[tuple[Buffer, ...], frozenset]:
    """Global buffers a kernel body touches, in the program's parameter order, and those it writes."""
    used, written = set(), set()
    for s in walk(stmt):
        if isinstance(s, Store):
            if s.buffer.scope == "global":
                used.add(s.buffer)
                written.add(s.buffer)
            for ld in loads(s.value):
                used.add(ld.arg[0])
            for i in s.indices:
                if isinstance(i, V):
                    used |= {ld.arg[0] for ld in loads(i)}
        elif isinstance(s, IfThenElse):
            used |= {ld.arg[0] for ld in loads(s.cond)}
        elif isinstance(s, Intrin):
            used |= set(s.buffers)
            written |= {b for b in s.writes if b.scope == "global"}
    bufs = tuple(b for b in order if b in used and b.scope == "global")
    return bufs, frozenset(written)
