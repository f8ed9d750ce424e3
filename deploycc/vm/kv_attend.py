"""A decode step's rope-and-append joined to the attention after it: one launch a layer fewer (GPU presets).

vm/kv_fuse.py makes a layer's kv.append and the programs that make its queries, keys and values one launch, and the
attention launch after it reads those queries and the cache back. In a decode step (one query) the attention's split
form can do the append's work itself (schedule/attention_append.py): here the two become one program, op
"attention_append", whose loop-level meaning is the append's blocks (the queries into an intermediate, the key and
value into the cache at row `offset`) followed by the attention over the cache's first `total` rows (offset + 1 where
the lowering launches it: `total` sizes the split's workspace, and a size must grow with total_len, which offset,
total_len - 1, does not say to the package's checks). It is what `verify --kernels` checks the kernel against, and
its cache writes take `offset` as the append's do, so the package's checks (runtime/dryrun.py) see which row it
writes: one, without an `n`.

Taken when it is plainly the same computation: the bindings from the append to the attention are the cache's key and
value views of that layer, the attention reads the append's one other output (the queries)
as its query and nothing else reads it, the attention's schedule is the split form with one query and room for the
queries in shared memory (attention_append.takes), and every block of the append has the form the prologue takes
(the token, then a head, then constant iterators). The append's inputs are now read at the attention: `reads` tells
the memory plan so (plan_memory's `reads`), and the lowering checks that neither the attention's output nor its
workspace took the storage of one of them.
"""
from __future__ import annotations

from ..ir import sym
from ..ir.expr import Binding, Call, CallTIR, MatchCast, Var
from ..ir.module import IRModule
from ..ir.tir import Alloc, Block, Buffer, Seq, TensorProgram
from ..ir.tir_rewrite import Substitute
from ..transform.dce import used_vars
from . import kv_fuse


def attention_after(bindings: list, at: int, run: list, mod: IRModule, uses: dict, target) -> Binding | None:
    """The attention binding that may take the append bindings[at] and its members `run`, or None."""
    from ..schedule import attention_append

    append = bindings[at].value
    layer = append.attrs["layer"]
    outputs = [m for m in run if m.var not in append.args[1:3]]
    if len(append.args) != 3 or len(outputs) != 1 or uses.get(outputs[0].var) != 1:
        return None
    views = {bindings[at].var: None}  # a var -> "kv.keys" | "kv.values" (the cache itself: None)
    for b in bindings[at + 1:]:
        v = b.value
        if isinstance(v, Call) and v.op in ("kv.keys", "kv.values") and v.args[0] in views \
                and v.attrs.get("layer") == layer:
            views[b.var] = v.op
        elif isinstance(b, MatchCast) or isinstance(v, Var):
            if v not in views:
                return None
            views[b.var] = views[v]
        elif isinstance(b, Binding) and isinstance(v, CallTIR):
            prog = mod[v.program]
            if (prog.attrs.get("op") != "attention" or len(v.args) != 3 or v.args[0] is not outputs[0].var
                    or views.get(v.args[1]) != "kv.keys" or views.get(v.args[2]) != "kv.values"
                    or (v.sym_args and not prog.attrs.get("ring"))  # a ring's key count: total, here
                    or not attention_append.takes(prog, target)):
                return None
            return b
        else:
            return None
    return None


def program(fused: kv_fuse.Fused, attn: TensorProgram) -> TensorProgram | None:
    """The attention_append program of the append `fused` (kv_fuse.fuse, one output: the queries) and the attention
    program `attn`, or None where a block is not of the form the schedule takes."""
    from ..schedule import attention_append

    fp = fused.prog
    ins = fp.params[:len(fused.inputs)]
    (q_out,) = fp.params[len(fused.inputs):-2]
    k_cache, v_cache = fp.params[-2:]
    Q, K, V, O = attn.params
    if q_out.shape != Q.shape or any(sym.as_expr(d).free_vars() for b in ins for d in b.shape):
        return None
    q = Buffer("q", Q.shape, Q.dtype, "local")
    o = Buffer("o", O.shape, O.dtype)
    blocks = [Substitute({q_out: q}, {fused.n: sym.as_expr(1)}).stmt(b) for b in fp.body.stmts]
    heads = {q: Q.shape[1], k_cache: K.shape[1], v_cache: V.shape[1]}
    for b in blocks:
        st = b.body
        if not (isinstance(b, Block) and len(b.iters) >= 3 and st.buffer in heads and len(st.indices) == 3
                and all(it.binding is None and it.kind == "spatial" for it in b.iters)
                and sym.as_expr(b.iters[0].extent).is_const and sym.as_expr(b.iters[0].extent).value == 1
                and isinstance(st.indices[1], sym.Expr) and st.indices[1].as_var is b.iters[1].var
                and sym.prove_eq(sym.as_expr(b.iters[1].extent), sym.as_expr(heads[st.buffer]))
                and all(sym.as_expr(it.extent).is_const for it in b.iters[2:])
                and (st.buffer is not q or (isinstance(st.indices[0], sym.Expr)
                                            and st.indices[0].as_var is b.iters[0].var))):
            return None
    t = attn.sym_params[0] if attn.attrs.get("ring") else K.shape[0].as_var
    if t is None:
        return None
    total = sym.SymVar("total")  # the keys: offset + 1 (the workspace's size grows with it; offset's is t - 1)
    body = Substitute({Q: q, K: k_cache, V: v_cache, O: o}, {t: sym.as_expr(total)}).stmt(attn.body)
    attrs = {k: v for k, v in attn.attrs.items() if k not in ("schedule", "pattern")}
    attrs.update(op=attention_append.OP, blocks=len(blocks))
    return TensorProgram(attention_append.OP, (*ins, o, k_cache, v_cache), Alloc(q, Seq((*blocks, body))),
                         (fused.offset, total), 3, attrs)


def reads(fn, mod: IRModule, target) -> dict:
    """For the memory plan: each attention binding that may take the append before it -> the vars the append's
    members read (read at the attention once it does)."""
    flat = [b for block in fn.body.blocks for b in block.bindings]
    uses = used_vars(fn)
    out: dict = {}
    for i, b in enumerate(flat):
        if not (isinstance(b, Binding) and isinstance(b.value, Call) and b.value.op == "kv.append"):
            continue
        run = kv_fuse.members_of(flat, i, mod, uses, lambda v: set())
        attn = run and attention_after(flat, i, run, mod, uses, target)
        if attn:
            out[attn.var] = tuple(x for m in run for x in m.value.args if isinstance(x, Var))
    return out


def unread_views(bindings: list, at: int, attn: Binding, uses: dict, params) -> list:
    """The bindings between the append bindings[at] and `attn` (the cache's views and their match_casts) that only
    lead to the attention, which takes the cache itself once it appends: nothing to lower, on every step. A
    match_cast that would bind a shape variable first stays (and so does what it matches)."""
    between = bindings[at + 1:bindings.index(attn)]
    bound = {v for p in params for v in p.ann.free_vars()}
    for b in bindings[:at]:
        if isinstance(b, MatchCast):
            bound |= b.ann.free_vars()
    if any(uses.get(b.var) != 1 or (isinstance(b, MatchCast) and not b.ann.free_vars() <= bound) for b in between):
        return []
    return between
