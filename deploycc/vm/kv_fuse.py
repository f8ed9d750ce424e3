"""kv.append with the programs that make its keys and values (GPU presets): one launch a layer instead of four.

A layer's attention takes the merged q/k/v projection apart with three small injective programs (the queries'
rotary embedding, the keys', the values' slice), and kv.append copies the new keys and values into the cache: four
launches, each a few hundred threads in a decode step, where a launch costs more than its work. Here the programs
that write the keys and values write straight into the cache instead (TVM's reverse_compute_inline of the copy:
each store `k[i, h, c] = ...` becomes `k_cache[row(i), h, c] = ...`, row(i) = offset + i, (offset + i) % rows for a
ring, or slot[i] in a page pool), and the programs just before them whose results are read only after the append
(the queries' rope) join them: one program of blocks side by side, which the fallback rule makes one kernel
(schedule/fallback.py). This is MLC's fused rope-and-append kernel, found rather than written. In a decode step the
attention after it may take that program too (vm/kv_attend.py): no launch of its own.

Taken only when it is plainly the same computation. Looking back from the kv.append over call_tir bindings until the
keys' and values' producers are found, members are the programs of spatial blocks alone (no reduction, no
intermediate) with one output: the keys' and values' producers, read by nothing else, and those whose result nothing
reads before the append. No member reads another's result, every block stores at its token iterator first, and
nothing allocated from the first member to the append takes the storage of what a member reads (its reads move to
the append). A program between them that is not a member stays where it is and launches before (Qwen3's norms of
the queries and keys: the ropes after them join the append; sink_producers moves the values' slice, made before the
norms, down to the append before the memory plan is made). The token count is the program's `n` and the first row
`offset`, as in kv_copy, so the package's checks (runtime/dryrun.py) see which rows it writes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import annotation as A
from ..ir import sym, tir
from ..ir.expr import Binding, BindingBlock, Call, CallTIR, SeqExpr, Var, with_body
from ..ir.kernel import allocs_of, strip_allocs
from ..ir.module import IRModule
from ..ir.tir import Block, Buffer, IterVar, Seq, Store, TensorProgram
from ..ir.tir_rewrite import Substitute
from ..transform.dce import children, used_vars
from ..transform.plan_memory import program_sym_map


@dataclass
class Fused:
    prog: TensorProgram  # params: the members' inputs, [slot], the other members' outputs, k_cache, v_cache
    inputs: list  # the graph values bound to the program's inputs, in order
    outputs: list[Binding]  # the members whose results the program writes as they would (the queries' rope)
    n: sym.SymVar
    offset: sym.SymVar | None  # None in a page pool
    rows: sym.SymVar  # the cache's rows (bound at the launch, as kv_pair's: a size no renderer takes as a constant)


def _spatial(prog: TensorProgram) -> bool:
    stmts = strip_allocs(prog.body)
    return (prog.num_outputs == 1 and not allocs_of(prog.body) and bool(stmts)
            and all(isinstance(s, Block) and not s.reduce and s.init is None for s in stmts))


def _reads(value, var: Var) -> bool:
    return any(c is var for c in children(value))


def members_of(bindings: list, at: int, mod: IRModule, uses: dict, storages) -> list[Binding] | None:
    """The bindings before `bindings[at]` (a kv.append) that can join it, or None. `storages(var)`: the storage ids
    the memory plan gave a binding's result and its workspace (their reads move to the append, so nothing allocated
    in between may take the storage of what they read)."""
    append: Call = bindings[at].value
    k, v = append.args[1], append.args[2]
    if k is v or not all(isinstance(x, Var) and uses.get(x) == 1 for x in (k, v)):
        return None
    run: list[Binding] = []
    window: list = []  # every binding from the first member to the append
    for b in reversed(bindings[:at]):
        found = k in {m.var for m in run} and v in {m.var for m in run}
        if not (isinstance(b, Binding) and isinstance(b.value, CallTIR)):
            break
        member = (not b.value.sym_args and isinstance(b.var.ann, A.TensorAnn) and _spatial(mod[b.value.program])
                  and (b.var in (k, v) or not any(_reads(x.value, b.var) for x in window)))
        if found and not member:  # past the producers, only a run of members
            break
        window.insert(0, b)
        if member:
            run.insert(0, b)
    if k not in {m.var for m in run} or v not in {m.var for m in run}:
        return None
    members = {m.var for m in run}
    if any(_reads(m.value, x) for m in run for x in members):
        return None
    # A tensor a member reads may have been freed at its last use in the plan and its storage given to what the
    # window defines after that; the member now reads it at the append.
    where = {id(b): i for i, b in enumerate(bindings)}
    last_use: dict = {}
    for i, b in enumerate(bindings):
        for x in children(b.value):
            if isinstance(x, Var):
                last_use[x] = i
    made = [b for b in window if b.var not in (k, v)]
    for x in {x for m in run for x in children(m.value) if isinstance(x, Var)}:
        if any(y.var is not x and where[id(y)] > last_use[x] and storages(y.var) & storages(x) for y in made):
            return None
    tokens = sym.as_expr(k.ann.shape[0])
    if not all(sym.prove_eq(sym.as_expr(b.var.ann.shape[0]), tokens) for b in run):
        return None
    return run


def fuse(run: list[Binding], append: Call, mod: IRModule, paged: bool) -> Fused | None:
    """The program of `run`'s blocks side by side, the keys' and values' stores into the cache (None if a block
    does not store at its token iterator first)."""
    k_var, v_var = append.args[1], append.args[2]
    n, offset = sym.SymVar("n"), None if paged else sym.SymVar("offset")
    cap = sym.SymVar("rows" if paged else "cap")
    inputs: list = []
    bufs: dict = {}

    def buf_of(x) -> Buffer:
        if x not in bufs:
            bufs[x] = Buffer(f"a{len(inputs)}", x.ann.shape, x.ann.dtype)
            inputs.append(x)
        return bufs[x]

    h, d = k_var.ann.shape[1:]
    dtype = append.attrs.get("dtype", "float32")  # the cache's: a float16 one rounds what it stores
    k_cache = Buffer("k_cache", (sym.as_expr(cap), h, d), dtype)
    v_cache = Buffer("v_cache", (sym.as_expr(cap), h, d), dtype)
    slot = buf_of(append.args[3]) if paged else None
    outputs = [b for b in run if b.var not in (k_var, v_var)]
    out_bufs = {b.var: Buffer(f"out{i}", b.var.ann.shape, b.var.ann.dtype) for i, b in enumerate(outputs)}
    tokens = sym.as_expr(k_var.ann.shape[0])
    blocks = []
    for b in run:
        call: CallTIR = b.value
        prog = mod[call.program]
        dst = out_bufs.get(b.var) or Buffer("k" if b.var is k_var else "v", b.var.ann.shape, b.var.ann.dtype)
        sub = Substitute(dict(zip(prog.params, [buf_of(a) for a in call.args] + [dst])), program_sym_map(prog, call))
        for blk in strip_allocs(sub.stmt(prog.body)):
            first = blk.iters[0]
            st = blk.body
            if not (st.buffer is dst and st.indices and isinstance(st.indices[0], sym.Expr)
                    and st.indices[0].as_var is first.var
                    and sym.prove_eq(sym.as_expr(first.extent), tokens)):
                return None
            its = (IterVar(first.var, sym.as_expr(n), first.kind, first.binding), *blk.iters[1:])
            if b.var in (k_var, v_var):
                cache = k_cache if b.var is k_var else v_cache
                i = sym.as_expr(first.var)
                row = slot[i] if paged else sym.mod(i + sym.as_expr(offset), sym.as_expr(cap)) if rows_ring(append) \
                    else i + sym.as_expr(offset)
                st = Store(cache, (row, *st.indices[1:]), tir.cast(dtype, st.value))
            blocks.append(Block(blk.name, its, st))
    params = tuple(bufs[x] for x in inputs) + tuple(out_bufs[b.var] for b in outputs) + (k_cache, v_cache)
    syms = (n,) if paged else (n, offset)
    prog = TensorProgram("kv_append", params, Seq(tuple(blocks)), syms, len(outputs) + 2, {"op": "kv_append"})
    return Fused(prog, inputs, outputs, n, offset, cap)


def rows_ring(append: Call) -> bool:
    return bool(append.attrs.get("rows", 0))


def shape_vars(prog: TensorProgram) -> list[sym.SymVar]:
    """The variables of a fused program's buffers: the function's own (seq_len) and the cache's rows."""
    seen: list[sym.SymVar] = []
    for b in prog.params:
        for d in b.shape:
            for v in sorted(sym.as_expr(d).free_vars(), key=lambda v: v.name):
                if v not in seen:
                    seen.append(v)
    return seen


def sink_producers(mod: IRModule, functions) -> IRModule:
    """Each kv.append's keys and values producers moved to the end of the dataflow block before it (nothing else
    reads them), so that they join it next to the programs beside them (members_of) and the memory plan, made
    after, keeps what they read alive until there. A reordering of pure bindings only: the module means the same."""
    out = mod.with_functions(mod.functions)
    for name in functions:
        fn = mod[name]
        uses = used_vars(fn)
        blocks = list(fn.body.blocks)
        for i in range(len(blocks) - 1):
            blk, nxt = blocks[i], blocks[i + 1]
            first = nxt.bindings[0] if nxt.bindings else None
            if not (blk.dataflow and isinstance(first, Binding) and isinstance(first.value, Call)
                    and first.value.op == "kv.append"):
                continue
            kv = [x for x in first.value.args[1:3] if isinstance(x, Var) and uses.get(x) == 1]
            move = [b for b in blk.bindings if isinstance(b, Binding) and b.var in kv and isinstance(b.value, CallTIR)]
            blocks[i] = BindingBlock(tuple(b for b in blk.bindings if b not in move) + tuple(move), True)
        out.functions[name] = with_body(fn, SeqExpr(tuple(blocks), fn.body.result))
    return out
