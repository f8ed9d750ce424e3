"""Rule: a decode step's attention that makes its own queries and appends its own key and value (GPU presets).

A decode step's layer launched the rope-and-append kernel (vm/kv_fuse.py: the queries' rotary embedding, the new key
and value into the cache, a few hundred threads) and then the split attention, whose blocks read those queries and
that key and value back. vm/kv_attend.py joins the two into one program, op "attention_append", of three parts: the
append's blocks (the queries into an intermediate, the key and value into the cache at the step's row), then the
attention over the cache. This rule gives it the split form of schedule/attention.py (flash-decoding, the keys over S
blocks a kv head) with a prologue in every block:

- the block's G query heads computed from the append's inputs into shared memory (the expression of the queries'
  blocks, element by element over the block's threads: a few hundred multiply-adds, beside a tile of 2 T keys);
- in the one block whose split holds the new key (the last key the query sees), its key and value computed and
  stored into the cache, as the append kernel stored them (cast to the cache's type), and into the block's tile of
  keys and values as the tile would have loaded them (each element read back by the thread that stored it: the
  cache's value, widened to float); the tile's loads leave that row to it: the loads that would read it read the
  cache's next row instead (which nothing writes in the step) and store nothing (a load of the row racing with its
  store, its value unused, was still a data race: Oclgrind reported it, tests/devices/test_oclgrind.py);
- both between the tile's loads and the barrier after them: the barrier the tile had orders them, and the step takes
  no phase more (a barrier after the prologue, with the cache's row read back, cost the model ~1 us a layer).

No other block reads the new row: a block's keys are its split's, and the new key is only in the one that stores it.
One launch a layer fewer in a decode step; the server's batched step (several queries, whose new keys other
queries' blocks read) and the prefill keep the append kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import sym, tir
from ..ir.kernel import Schedule
from ..ir.tir import Alloc, Block, Buffer, For, IfThenElse, Seq, Stmt, Store, TensorProgram
from ..ir.tir_rewrite import Substitute
from . import attention

OP = "attention_append"


@dataclass(frozen=True)
class Append:
    """The parts of an attention_append program (vm/kv_attend.py makes it): the queries' intermediate `q`, the
    caches, the output; the append's blocks; the key count (the cache's rows up to the new one) and a key's row."""
    q: Buffer
    k: Buffer
    v: Buffer
    o: Buffer
    queries: tuple[Block, ...]  # store q[0, head, c]
    rows: tuple[Block, ...]  # store k or v [row, kv head, c]
    t: sym.Expr
    ring: int

    @property
    def buffers(self) -> tuple[Buffer, Buffer, Buffer, Buffer]:
        return self.q, self.k, self.v, self.o

    def row(self, j):
        return sym.mod(j, self.ring) if self.ring else j

    @classmethod
    def of(cls, prog: TensorProgram) -> Append:
        alloc = prog.body
        assert isinstance(alloc, Alloc) and isinstance(alloc.body, Seq), prog.name
        blocks = alloc.body.stmts[: prog.attrs["blocks"]]
        o, k, v = prog.outputs
        _, total = prog.sym_params
        return cls(alloc.buffer, k, v, o, tuple(b for b in blocks if b.body.buffer is alloc.buffer),
                   tuple(b for b in blocks if b.body.buffer is not alloc.buffer), sym.as_expr(total),
                   int(prog.attrs.get("ring", 0)))

    def prologue(self, kv, u, threads: int, group: int, sm_q: Buffer, holds: tir.V, tile) -> Stmt:
        """The block's queries (heads kv * group ...) into sm_q; where `holds`, the new key and value of kv head kv
        into the cache, and into the block's tile: `tile("k" | "v", c, value)` stores element c there (the value as
        the cache holds it, widened to float: read back from the cache by the thread that stored it, as no backend
        here rounds to float16 but in a store)."""
        d = self.o.shape[2].value
        qs = tuple(spread(b, group, u, threads, lambda a: kv * group + a,
                          lambda a, st: Store(sm_q, (a * d + st.indices[2],), st.value)) for b in self.queries)

        def row(a, st: Store) -> Stmt:  # the element read back: as the cache holds it (a thread sees its own store)
            which = "k" if st.buffer is self.k else "v"
            return Seq((st, tile(which, st.indices[2], tir.cast("float32", st.buffer[tuple(st.indices)]))))
        kvs = tuple(spread(b, 1, u, threads, lambda a: kv, row) for b in self.rows)
        return Seq((*qs, IfThenElse(holds, Seq(kvs))))


def spread(blk: Block, heads: int, u, threads: int, head_of, make) -> Stmt:
    """Block `blk` (iterators: the token, of extent 1, a head, then constant ones) for `heads` heads, head a being
    head_of(a), its elements over the block's threads: `make(a, store)` of each store, the iterators substituted."""
    first, head, *rest = blk.iters
    extents = [it.extent.value for it in rest]
    per = 1
    for x in extents:
        per *= x
    total = heads * per
    cc = sym.SymVar("cc")
    e = sym.as_expr(cc) * threads + u
    a, rem = sym.floordiv(e, per), sym.mod(e, per)
    mapping = {first.var: sym.as_expr(0), head.var: sym.as_expr(head_of(a))}
    for it, x in zip(reversed(rest), reversed(extents)):
        mapping[it.var] = sym.mod(rem, x)
        rem = sym.floordiv(rem, x)
    body = make(a, Substitute(syms=mapping, fresh=False).store(blk.body))
    if total % threads:
        body = IfThenElse(tir.index(e).cmp("lt", tir.index(total)), body)
    return For(cc, sym.as_expr(-(-total // threads)), body)


def takes(prog: TensorProgram, target) -> bool:
    """Whether a decode step's attention program `prog` (already scheduled) may make its queries and append its key
    and value (this rule's form): the split form with splits, and room in shared memory for the queries."""
    from ..ir.kernel import scheduled

    sched = scheduled(prog)
    Q, K = prog.params[:2]
    n, h, d = Q.shape
    if (sched is None or not sched.rule.startswith("attention-split") or sched.dispatched or len(prog.params) != 4
            or not (n.is_const and n.value == 1 and h.is_const and K.shape[1].is_const and d.is_const)):
        return False
    group = h.value // K.shape[1].value
    return attention.split_threads(target, d.value, group, group * d.value) >= 2


def rule(prog: TensorProgram, target) -> Schedule | None:
    if prog.attrs.get("op") != OP:
        return None
    kernels, workspace = attention._split_form(prog, target, True, Append.of(prog))
    return Schedule(kernels, workspace, "attention-append", zeroed=attention._zeroed(workspace))
