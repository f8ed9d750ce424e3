"""The loop-level programs a package carries (kernels/programs.json), for `verify --kernels`.

Mirage's probabilistic equivalence check, shipped: runtime/kernel_check.py runs each program's kernels on the
package's own device and its loop-level program (the unscheduled body, the specification the schedule had to
keep) in runtime/loopir.py on the same random inputs. This module writes what that needs, as data (no code):

    program     the JSON form of runtime/loopir.py: buffers, params, body, shape variables
    schedule    the kernels in launch order, each with its buffers (params or workspace), int arguments and
                work-group count in the program's variables
    sites       per call site, the program's variables in the step function's (seq_len, total_len, batch,
                pages_len), whose bounds the manifest states: the sizes the check picks from
    rounded     the input the integer kernels round to 8 bits (the reference rounds it alike)
    domains     per int32 input, the values a meaningful input holds (an index below the extent it indexes;
                distinct rows where it addresses a store), found by `int_domains`
"""
from __future__ import annotations

import math

from ..ir import sym
from ..ir.kernel import barriers, loads_in_flight, scheduled
from ..ir.tir import COMPARE, Alloc, Barrier, Block, Buffer, For, IfThenElse, Intrin, Seq, Store, TensorProgram, V, walk
from .lower import sym_json

VERSION = 1
FILE = "kernels/programs.json"


class _Names:
    """Unique variable names and buffer ids within one program (two iterators called `i` stay two)."""

    def __init__(self):
        self.vars: dict[sym.SymVar, str] = {}
        self.bufs: dict[Buffer, int] = {}
        self.table: list[dict] = []

    def var(self, v: sym.SymVar) -> str:
        if v not in self.vars:
            taken = set(self.vars.values())
            name, i = v.name, 1
            while name in taken:
                name, i = f"{v.name}_{i}", i + 1
            self.vars[v] = name
        return self.vars[v]

    def sym(self, e) -> object:
        return sym_json(e, self.var)

    def buf(self, b: Buffer) -> int:
        if b not in self.bufs:
            self.bufs[b] = len(self.table)
            self.table.append({"name": b.name, "shape": [self.sym(d) for d in b.shape], "dtype": b.dtype,
                               "scope": b.scope})
        return self.bufs[b]


def _const(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # "inf", "-inf", "nan": JSON has no such numbers
    return x


def _value(v: V, n: _Names) -> list:
    if v.op == "const":
        return ["const", v.dtype, _const(v.arg)]
    if v.op == "index":
        return ["index", n.sym(v.arg)]
    if v.op == "load":
        buf, idx = v.arg
        return ["load", n.buf(buf), [_index(i, n) for i in idx]]
    return [v.op, v.dtype, *(_value(s, n) for s in v.src)]


def _index(i, n: _Names):
    return {"v": _value(i, n)} if isinstance(i, V) else n.sym(i)


def _store(s: Store, n: _Names) -> list:
    return ["store", n.buf(s.buffer), [_index(i, n) for i in s.indices], _value(s.value, n)]


def _stmt(st, n: _Names) -> list:
    if isinstance(st, Seq):
        return ["seq", [_stmt(s, n) for s in st.stmts]]
    if isinstance(st, Store):
        return _store(st, n)
    if isinstance(st, Block):
        iters = [[n.var(it.var), n.sym(it.extent), "S" if it.kind == "spatial" else "R",
                  None if it.binding is None else n.sym(it.binding)] for it in st.iters]
        return ["block", st.name, iters, _store(st.body, n), None if st.init is None else _store(st.init, n)]
    if isinstance(st, For):  # any loop kind runs serially in the reference
        return ["for", n.var(st.var), n.sym(st.extent), _stmt(st.body, n)]
    if isinstance(st, Alloc):
        return ["alloc", n.buf(st.buffer), _stmt(st.body, n)]
    if isinstance(st, IfThenElse):
        return ["if", _value(st.cond, n), _stmt(st.then_body, n),
                None if st.else_body is None else _stmt(st.else_body, n)]
    if isinstance(st, Barrier):
        return ["barrier"]
    raise TypeError(f"a tensor program cannot hold a {type(st).__name__} (only kernels do)")


def program_json(prog: TensorProgram, sites: list[dict]) -> dict:
    """The program's JSON form, its schedule, its call sites (program variable -> sym in the step function's
    variables) and what the check must know about its inputs."""
    n = _Names()
    params = [n.buf(b) for b in prog.params]
    body = _stmt(prog.body, n)
    out = {"name": prog.name, "params": params, "num_outputs": prog.num_outputs,
           "sym_params": [n.var(v) for v in prog.sym_params], "body": body}
    out["schedule"] = _schedule(prog, n)
    out["sites"] = [{"function": s["function"], "vars": {n.var(v): e for v, e in s["vars"].items()}} for s in sites]
    rounded = rounded_input(prog)
    if rounded is not None:
        out["rounded"] = [prog.params.index(rounded), prog.attrs["activations"]]
    out["domains"] = {str(prog.params.index(b)): {"below": [n.sym(e) for e in his], "distinct": distinct}
                      for b, (his, distinct) in int_domains(prog).items()}
    out["buffers"] = n.table  # last: the schedule's workspace buffers were named above
    return out


def _schedule(prog: TensorProgram, n: _Names) -> dict:
    s = scheduled(prog)
    known = set(n.vars)
    kernels = []
    for k in s.kernels:
        stray = [v.name for v in k.scalars if v not in known]
        if stray:  # the check could not choose it: the kernel's int arguments must be the program's variables
            raise ValueError(f"kernel {k.name}: int argument {stray[0]} is not a variable of program {prog.name}")
        entry = {"name": k.name, "buffers": [n.buf(b) for b in k.buffers],
                 "scalars": [n.sym(v) for v in k.scalars], "groups": n.sym(k.groups), "threads": k.threads}
        passed = barriers(k.body)
        if not (passed.is_const and passed.value == 0):  # the performance model's serial term (perfmodel.py)
            entry["barriers"] = n.sym(passed)
        in_flight = loads_in_flight(k.body)
        if in_flight:  # the performance model's latency term
            entry["in_flight"] = in_flight
        if k.tail is not None:  # its last block's round trips after the others arrived (schedule/attention.py)
            entry["tail"] = n.sym(k.tail)
        if k.tensor:  # its tensor-core tiles' kind: the performance model's peak and instructions for them
            entry["tensor"] = k.tensor
        kernels.append(entry)
    out = {"rule": s.rule, "workspace": [n.buf(w) for w in s.workspace], "kernels": kernels}
    if s.dispatched:  # alternatives by shape (schedule/dispatch.py): each one does the program's whole work
        out["dispatched"] = True
    return out


def rounded_input(prog: TensorProgram) -> Buffer | None:
    """The input an integer schedule quantizes (the first buffer of its quantize intrinsic, or what the schedule
    names: schedule/dp4a.py), if any."""
    if scheduled(prog).rounded is not None:
        return scheduled(prog).rounded
    for k in scheduled(prog).kernels:
        for s in walk(k.body):
            if isinstance(s, Intrin) and s.name.startswith("quantize"):
                return s.buffers[0]
    return None


# ---- meaningful int32 inputs ---------------------------------------------------------------------------------

def int_domains(prog: TensorProgram) -> dict[Buffer, tuple[list, bool]]:
    """For each int32 input: upper bounds (exclusive, symbolic; the least applies) and whether its values must
    be distinct. Random int32 values would read out of range, so the check draws them in [0, bound): an input
    that indexes an axis directly (ids into an embedding table, `seq` into a page table) is below that axis's
    extent, one scaled by a constant (`pages[...] * 16 + r` into a page pool's rows) below extent // 16, one
    compared with an iterator (`j <= pos[i]`) below the iterator's extent. One that addresses a store (a KV
    cache's slots) holds distinct values, else two writes to one element race. Inputs none of these constrain
    (positions that only feed a rotary table) get the context window from the check."""
    ints = [b for b in prog.inputs if b.dtype == "int32"]
    if not ints:
        return {}
    found: dict[Buffer, tuple[list, bool]] = {b: ([], False) for b in ints}
    extents = {it.var: it.extent for s in walk(prog.body) if isinstance(s, Block) for it in s.iters}
    extents.update({s.var: s.extent for s in walk(prog.body) if isinstance(s, For)})

    def note(b: Buffer, hi, store: bool):
        if b in found:
            his, distinct = found[b]
            found[b] = (his + [hi] if hi is not None else his, distinct or store)

    def index(buf: Buffer, axis: int, i, store: bool):
        b, scale = _scaled_load(i)
        if b is not None:
            note(b, sym.floordiv(buf.shape[axis], scale), store)

    def value(v: V):
        if v.op == "load":
            buf, idx = v.arg
            for axis, i in enumerate(idx):
                if isinstance(i, V):
                    index(buf, axis, i, False)
                    value(i)
        if v.op in COMPARE:
            for a, b in ((v.src[0], v.src[1]), (v.src[1], v.src[0])):
                ld, scale = _scaled_load(a)
                var = b.arg.as_var if b.op == "index" else None
                if ld is not None and scale == 1 and var in extents:
                    note(ld, extents[var], False)
        for s in v.src:
            value(s)

    for s in walk(prog.body):
        if isinstance(s, Store):
            for axis, i in enumerate(s.indices):
                if isinstance(i, V):
                    index(s.buffer, axis, i, True)
                    value(i)
            value(s.value)
        elif isinstance(s, IfThenElse):
            value(s.cond)
    return found


def _scaled_load(i: V) -> tuple[Buffer | None, int]:
    """(B, c) when an index is B[...] (or a cast of it), B[...] * c or B[...] * c + r for a constant c."""
    while i.op == "cast":
        i = i.src[0]
    if i.op == "add":
        for a in i.src:
            b, c = _scaled_load(a)
            if b is not None:
                return b, c
    if i.op == "mul":
        for a, k in ((i.src[0], i.src[1]), (i.src[1], i.src[0])):
            if k.op == "const" and isinstance(k.arg, int) and k.arg > 0:
                b, c = _scaled_load(a)
                if b is not None:
                    return b, c * k.arg
    if i.op == "load":
        return i.arg[0], 1
    return None, 1


def write_programs(tmp, lowered) -> str:
    """kernels/programs.json of a package being written into `tmp`; returns its path in the package. A program
    this form cannot state is listed with the reason, and the check reports its kernels as not checked."""
    import json

    programs = []
    for name, prog in lowered.programs.items():
        try:
            programs.append(program_json(prog, lowered.sites[name]))
        except Exception as e:  # noqa: BLE001 - a program the form cannot state must not stop the compile
            programs.append({"name": name, "unchecked": f"{type(e).__name__}: {e}",
                             "kernels": [k.name for k in scheduled(prog).kernels]})
    (tmp / FILE).write_text(json.dumps({"version": VERSION, "programs": programs}, separators=(",", ":")))
    return FILE


def kernel_work(lowered) -> dict[str, dict]:
    """{kernel name: {"macs_per_row", "activation_bits"}} for the kernel that does each matmul's arithmetic (the last
    of its program's schedule: a prefill's activation quantization runs first): multiply-adds per row of the
    activations (N x K, the constant spatial extents times the reduction), and the bits the integer kernels round
    the activations to (absent: float). What `bench --roofline` turns into operations per byte and per second."""
    from ..schedule.lowering import split_matmul, split_stat_matmul

    out = {}
    for prog in lowered.programs.values():
        sched = scheduled(prog)
        if sched is None or not sched.kernels or prog.attrs.get("pattern") != "OUTPUT_EWISE_FUSIBLE":
            continue  # a matmul (fused with its epilogues) is OUTPUT_EWISE_FUSIBLE; a norm's sum of squares is not
        stat = split_stat_matmul(prog)  # a norm folded into a decode GEMV: its sum of squares comes first
        found = (stat[1],) if stat is not None else split_matmul(prog)
        if found is None:
            continue
        mm = found[0]
        extents = [sym.as_expr(it.extent) for it in mm.iters]
        if not extents[-1].is_const:  # the reduction
            continue
        macs = math.prod(e.value for e in extents if e.is_const)  # symbolic extents: the rows (tokens, batch)
        work = {"macs_per_row": int(macs)}
        if prog.attrs.get("activations"):
            work["activation_bits"] = int(prog.attrs["activations"])
        for k in sched.kernels if sched.dispatched else sched.kernels[-1:]:
            out[k.name] = work
    return out

