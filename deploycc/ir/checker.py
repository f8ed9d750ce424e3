"""Well-formedness checker for an IRModule, both levels (in the spirit of tinygrad's `type_verify`).

Tests run it before and after every pass: a pass that produces ill-formed IR fails at the pass, not
three stages later in a kernel. `problems(mod)` lists every violation, one line each, naming the
function (or tensor program) and the variable or buffer; `check(mod)` raises them together.

Graph-level invariants (`Function`):
  * scoping: a `Var` is used only after it is bound (or is a param), and is bound once; a dataflow var
    (`Var.dataflow`) is bound inside a dataflow block and used only inside that block;
  * annotations: a binding's annotation is a base of its value's (for op and graph calls, the value's
    annotation is recomputed by the op rule / callee signature, so stale annotations are caught); the
    function's declared result annotation is a base of its result's;
  * purity: dataflow blocks contain pure calls only;
  * symbolic variables: every variable in a binding annotation, a shape expression, call_tir sym_args or
    an out annotation is defined. Params define the dims that are exactly a variable; a match_cast defines
    those of its annotation after the binding (its other dims must be computable from defined ones, as
    the interpreter evaluates them). Declared bounds define nothing;
  * cross-level calls: call_tir names a tensor program whose inputs, outputs and sym params agree with
    the call in count, dtype, rank and shape; call_dps_library outputs are tensors of known shape;
    call_py_func names a Python function (`PyFunc`) of the module.

Loop-level invariants (`TensorProgram`):
  * every buffer loaded or stored is a param or allocated by an enclosing `Alloc`, indexed with as many
    indices as its rank; every output is stored somewhere;
  * every symbolic variable in indices, extents, iterator bindings and shapes is a loop var of an
    enclosing `For`, an iterator of the enclosing `Block`, a program shape var or a sym param;
  * a block with reduce iterators has an init and a body `X[s] = combine(X[s], rhs)` whose store
    indices `s` do not use the reduce iterators (what the vectorised interpreter and fusion rely on).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import annotation as A
from . import sym
from .builder import _param_defined_syms, deduce, is_pure
from .expr import (
    Binding,
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
from .module import ExternFunc, IRModule, PyFunc
from .tir import Alloc, Barrier, Block, Buffer, For, IfThenElse, Seq, Store, TensorProgram, V
from .tir_interp import ProgramError, reduction_parts


class WellFormedError(ValueError):
    """The module breaks IR invariants; the message lists every problem, one per line."""


def check(mod: IRModule) -> None:
    found = problems(mod)
    if found:
        raise WellFormedError(f"{len(found)} well-formedness problem(s):\n" + "\n".join(found))


def problems(mod: IRModule) -> list[str]:
    out: list[str] = []
    for name, f in mod.functions.items():
        if isinstance(f, Function):
            out += _FunctionChecker(mod, name).run(f)
        elif isinstance(f, TensorProgram):
            out += _ProgramChecker(name, f).run()
        elif not isinstance(f, (ExternFunc, PyFunc)):
            out.append(f"{name}: not a Function, TensorProgram, ExternFunc or PyFunc but {type(f).__name__}")
    return out


def _tensor_fields(ann: A.Annotation) -> list[A.TensorAnn] | None:
    """The tensors of a DPS output annotation (a tensor or a tuple of tensors), else None."""
    fields = list(ann.fields) if isinstance(ann, A.TupleAnn) else [ann]
    return fields if all(isinstance(f, A.TensorAnn) for f in fields) else None


def _dims(shape) -> str:
    return "(" + ", ".join(sym.to_python(d) for d in shape) + ")"


# ---- graph level ---------------------------------------------------------------------------------

@dataclass
class _Scope:
    vars: set[Var] = field(default_factory=set)
    syms: set[sym.SymVar] = field(default_factory=set)

    def copy(self) -> _Scope:
        return _Scope(set(self.vars), set(self.syms))


class _FunctionChecker:
    def __init__(self, mod: IRModule, name: str):
        self.mod, self.name = mod, name
        self.out: list[str] = []
        self.bound: set[Var] = set()
        self.expired: set[Var] = set()  # dataflow vars whose block has ended
        self.reported: set = set()  # each undefined var / symbol is reported at its first use only

    def report(self, msg: str) -> None:
        self.out.append(f"function {self.name}: {msg}")

    def run(self, fn: Function) -> list[str]:
        scope = _Scope(set(fn.params))
        for p in fn.params:
            scope.syms |= _param_defined_syms(p.ann)
            if p.dataflow:
                self.report(f"param {p} is marked as a dataflow var")
        for p in fn.params:
            self.syms(p.ann.free_vars(), scope, f"the annotation of param {p}")
        self.bound |= set(fn.params)
        self.seq(fn.body, scope)
        if not A.is_base_of(fn.ret_ann, fn.body.result.ann):
            self.report(f"declared result {A.to_text(fn.ret_ann)} is not a base of the result's "
                        f"{A.to_text(fn.body.result.ann)}")
        return self.out

    def seq(self, body: SeqExpr, scope: _Scope) -> None:
        for block in body.blocks:
            self.block(block, scope)
        self.expr(body.result, scope, "the result")

    def block(self, block: BindingBlock, scope: _Scope) -> None:
        for b in block.bindings:
            self.binding(b, block.dataflow, scope)
        if block.dataflow:
            local = {b.var for b in block.bindings if b.var.dataflow}
            scope.vars -= local
            self.expired |= local

    def binding(self, b: Binding | MatchCast, dataflow: bool, scope: _Scope) -> None:
        where = f"binding of {b.var}"
        self.expr(b.value, scope, where)
        if b.var in self.bound:
            self.report(f"{b.var} is bound more than once")
        if b.var.dataflow and not dataflow:
            self.report(f"dataflow var {b.var} is bound outside a dataflow block")
        if dataflow and not is_pure(b.value, self.mod):
            callee = getattr(b.value, "op", None) or getattr(b.value, "func", "?")
            self.report(f"impure call {callee} inside a dataflow block ({where})")
        if isinstance(b, MatchCast):
            new = _param_defined_syms(b.ann)
            self.syms(b.ann.free_vars() - new, scope, f"match_cast of {b.var}")
            scope.syms |= new
            if not A.is_base_of(b.var.ann, b.ann):
                self.report(f"{b.var} is annotated {A.to_text(b.var.ann)} but match_casts to {A.to_text(b.ann)}")
        else:
            self.syms(b.var.ann.free_vars(), scope, f"the annotation of {b.var}")
            self.annotation(b)
        scope.vars.add(b.var)
        self.bound.add(b.var)

    def annotation(self, b: Binding) -> None:
        value = b.value
        if isinstance(value, (Call, CallFunc)):
            try:
                actual = deduce(value, self.mod)
            except (TypeError, ValueError, KeyError) as e:
                self.report(f"{b.var}: {e.args[0] if e.args else e}")
                return
        else:
            actual = value.ann
        if actual is None:
            self.report(f"the value bound to {b.var} has no annotation")
        elif not A.is_base_of(b.var.ann, actual):
            self.report(f"annotation mismatch: {b.var} is declared {A.to_text(b.var.ann)} "
                        f"but its value is {A.to_text(actual)}")

    def syms(self, vs: set[sym.SymVar], scope: _Scope, where: str) -> None:
        for v in sorted(vs - scope.syms, key=lambda v: v.name):
            if v not in self.reported:
                self.reported.add(v)
                self.report(f"symbolic variable {v.name} is not defined ({where})")

    def expr(self, e: Expr, scope: _Scope, where: str) -> None:
        if isinstance(e, Var):
            if e not in scope.vars and e not in self.reported:
                self.reported.add(e)
                if e in self.expired:
                    self.report(f"dataflow var {e} used outside its dataflow block ({where})")
                else:
                    self.report(f"{e} used before it is bound ({where})")
        elif isinstance(e, ShapeExpr):
            self.syms(set().union(*(v.free_vars() for v in e.values)), scope, where)
        elif isinstance(e, Tuple):
            for f in e.fields:
                self.expr(f, scope, where)
        elif isinstance(e, TupleGetItem):
            self.expr(e.tuple_value, scope, where)
        elif isinstance(e, (Call, CallFunc, CallTIR, CallDPSLibrary, CallPyFunc)):
            for a in e.args:
                self.expr(a, scope, where)
            if isinstance(e, CallTIR):
                self.call_tir(e, scope, where)
            elif isinstance(e, CallDPSLibrary):
                self.call_dps_library(e, scope, where)
            elif isinstance(e, CallPyFunc):
                self.call_py_func(e, scope, where)
        elif isinstance(e, If):
            self.expr(e.cond, scope, where)
            self.seq(e.then_branch, scope.copy())
            self.seq(e.else_branch, scope.copy())
        elif isinstance(e, SeqExpr):
            self.seq(e, scope.copy())
        elif not isinstance(e, Constant):
            self.report(f"unknown expression {type(e).__name__} ({where})")

    def call_tir(self, e: CallTIR, scope: _Scope, where: str) -> None:
        free = set().union(*(s.free_vars() for s in e.sym_args)) | e.out_ann.free_vars()
        self.syms(free, scope, where)
        prog = self.mod.functions.get(e.program)
        if not isinstance(prog, TensorProgram):
            what = "unknown" if prog is None else f"non-program ({type(prog).__name__})"
            self.report(f"call_tir of {what} {e.program} ({where})")
            return
        head = f"call_tir({e.program}) ({where})"
        tensors = [a.ann for a in e.args if not isinstance(a.ann, A.ShapeAnn)]
        outs = _tensor_fields(e.out_ann)
        ok = True
        if len(tensors) != len(prog.inputs):
            ok = False
            self.report(f"{head} passes {len(tensors)} tensor args, the program takes {len(prog.inputs)} inputs")
        if len(e.sym_args) != len(prog.sym_params):
            ok = False
            self.report(f"{head} passes {len(e.sym_args)} sym_args, the program takes {len(prog.sym_params)}")
        if outs is None or len(outs) != len(prog.outputs):
            ok = False
            self.report(f"{head} out annotation {A.to_text(e.out_ann)} does not match the program's "
                        f"{len(prog.outputs)} output buffer(s)")
        if not ok:
            return
        pairs = list(zip(prog.params, tensors + outs))
        for buf, ann in pairs:
            if not isinstance(ann, A.TensorAnn) or ann.dtype != buf.dtype or ann.ndim != len(buf.shape):
                ok = False
                self.report(f"{head} buffer {buf.name} is {buf.dtype} with {len(buf.shape)} dims, "
                            f"but gets {A.to_text(ann)}")
        if ok and all(ann.shape is not None for _, ann in pairs):
            self.call_tir_shapes(head, prog, e, pairs)

    def call_tir_shapes(self, head: str, prog: TensorProgram, e: CallTIR, pairs) -> None:
        """Bind the program's variables from the call (sym_args, then bare dims) and compare shapes."""
        mapping: dict[sym.SymVar, sym.Expr] = dict(zip(prog.sym_params, e.sym_args))
        for buf, ann in pairs:
            for d, a in zip(buf.shape, ann.shape):
                if d.as_var is not None:
                    mapping.setdefault(d.as_var, a)
        for buf, ann in pairs:
            want = tuple(sym.substitute(d, mapping) for d in buf.shape)
            if not all(sym.prove_eq(w, a) for w, a in zip(want, ann.shape)):
                self.report(f"{head} buffer {buf.name} has shape {_dims(want)} in the caller's terms, "
                            f"but gets {_dims(ann.shape)}")

    def call_dps_library(self, e: CallDPSLibrary, scope: _Scope, where: str) -> None:
        self.syms(e.out_ann.free_vars(), scope, where)
        f = self.mod.functions.get(e.name)
        if f is not None and not isinstance(f, ExternFunc):
            self.report(f"call_dps_library({e.name}) names a {type(f).__name__}, not an extern function ({where})")
        outs = _tensor_fields(e.out_ann)
        if outs is None or any(o.shape is None for o in outs):
            self.report(f"call_dps_library({e.name}) needs tensor outputs of known shape, "
                        f"got {A.to_text(e.out_ann)} ({where})")


    def call_py_func(self, e: CallPyFunc, scope: _Scope, where: str) -> None:
        self.syms(e.out_ann.free_vars(), scope, where)
        f = self.mod.functions.get(e.func)
        if not isinstance(f, PyFunc):
            what = "an unknown function" if f is None else f"a {type(f).__name__}"
            self.report(f"call_py_func({e.func}) names {what}, not a Python function of the module ({where})")


# ---- loop level ----------------------------------------------------------------------------------

class _ProgramChecker:
    def __init__(self, name: str, prog: TensorProgram):
        self.name, self.prog = name, prog
        self.out: list[str] = []
        self.stored: set[Buffer] = set()
        self.reported: set = set()  # each stray variable / buffer is reported at its first use only

    def report(self, msg: str) -> None:
        self.out.append(f"program {self.name}: {msg}")

    def run(self) -> list[str]:
        prog = self.prog
        syms = frozenset(prog.shape_vars()) | frozenset(prog.sym_params)
        for b in prog.params:
            for d in b.shape:
                self.idx(d, syms, f"the shape of param {b.name}")
        self.stmt(prog.body, syms, frozenset(prog.params))
        for b in prog.outputs:
            if b not in self.stored:
                self.report(f"output {b.name} is never stored")
        return self.out

    def idx(self, e: sym.Expr, syms: frozenset, where: str) -> None:
        for v in sorted(e.free_vars() - syms, key=lambda v: v.name):
            if v not in self.reported:
                self.reported.add(v)
                self.report(f"symbolic variable {v.name} in {where} is not bound by an enclosing loop, "
                            f"block, program shape or sym param")

    def stmt(self, st, syms: frozenset, bufs: frozenset) -> None:
        if isinstance(st, Seq):
            for s in st.stmts:
                self.stmt(s, syms, bufs)
        elif isinstance(st, For):
            self.idx(st.extent, syms, f"the extent of loop {st.var.name}")
            self.stmt(st.body, syms | {st.var}, bufs)
        elif isinstance(st, Alloc):
            for d in st.buffer.shape:
                self.idx(d, syms, f"the shape of alloc {st.buffer.name}")
            self.stmt(st.body, syms, bufs | {st.buffer})
        elif isinstance(st, Block):
            self.block(st, syms, bufs)
        elif isinstance(st, Store):
            self.store(st, syms, bufs)
        elif isinstance(st, IfThenElse):
            self.value(st.cond, syms, bufs)
            self.stmt(st.then_body, syms, bufs)
            if st.else_body is not None:
                self.stmt(st.else_body, syms, bufs)
        elif not isinstance(st, Barrier):
            self.report(f"unknown statement {type(st).__name__}")

    def block(self, blk: Block, syms: frozenset, bufs: frozenset) -> None:
        for it in blk.iters:
            self.idx(it.extent, syms, f"the extent of {it.var.name} in block {blk.name}")
            if it.binding is not None:
                self.idx(it.binding, syms, f"the binding of {it.var.name} in block {blk.name}")
        inner = syms | {it.var for it in blk.iters}
        stores = [blk.body] + ([blk.init] if blk.init is not None else [])
        for st in stores:
            self.store(st, inner, bufs)
        reduce = {it.var for it in blk.reduce}
        if not reduce:
            return
        if blk.init is None:
            self.report(f"reduction block {blk.name} has no init")
        try:
            reduction_parts(blk)
        except ProgramError as e:
            self.report(str(e))
        used = set().union(*(i.free_vars() for st in stores for i in st.indices if isinstance(i, sym.Expr))) & reduce
        if used:
            names = ", ".join(sorted(v.name for v in used))
            self.report(f"block {blk.name} stores {blk.body.buffer.name} indexed by reduce iterator(s) {names}")

    def store(self, st: Store, syms: frozenset, bufs: frozenset) -> None:
        self.stored.add(st.buffer)
        self.access(st.buffer, st.indices, syms, bufs, "stored")
        self.value(st.value, syms, bufs)

    def access(self, buf: Buffer, indices, syms: frozenset, bufs: frozenset, verb: str) -> None:
        if buf not in bufs and buf not in self.reported:
            self.reported.add(buf)
            self.report(f"buffer {buf.name} is {verb} but is neither a param nor allocated by an enclosing alloc")
        if len(indices) != len(buf.shape):
            self.report(f"buffer {buf.name} has {len(buf.shape)} dims but is {verb} with {len(indices)} indices")
        for i in indices:
            if isinstance(i, V):
                self.value(i, syms, bufs)
            else:
                self.idx(i, syms, f"an index of {buf.name}")

    def value(self, v: V, syms: frozenset, bufs: frozenset) -> None:
        if v.op == "load":
            buf, indices = v.arg
            self.access(buf, indices, syms, bufs, "loaded")
        elif v.op == "index":
            self.idx(v.arg, syms, "an index value")
        for s in v.src:
            self.value(s, syms, bufs)
