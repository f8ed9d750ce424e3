"""Dead code elimination: unused pure bindings, then functions and programs nothing calls."""
from __future__ import annotations

from ..ir.builder import is_pure
from ..ir.expr import (
    Binding,
    BindingBlock,
    Call,
    CallDPSLibrary,
    CallFunc,
    CallPyFunc,
    CallTIR,
    Expr,
    Function,
    If,
    SeqExpr,
    Tuple,
    TupleGetItem,
    Var,
    with_body,
)
from ..ir.module import IRModule


def children(e: Expr) -> list[Expr]:
    if isinstance(e, (Call, CallTIR, CallDPSLibrary, CallFunc, CallPyFunc)):
        return list(e.args)
    if isinstance(e, Tuple):
        return list(e.fields)
    if isinstance(e, TupleGetItem):
        return [e.tuple_value]
    if isinstance(e, If):
        return [e.cond]
    return []


def _uses_in(e: Expr, counts: dict) -> None:
    if isinstance(e, Var):
        counts[e] = counts.get(e, 0) + 1
        return
    for c in children(e):
        _uses_in(c, counts)
    if isinstance(e, If):
        for br in (e.then_branch, e.else_branch):
            count_uses(br, counts)


def count_uses(body: SeqExpr, counts: dict) -> None:
    """Add to `counts` how many times each variable is used in `body` (If branches included)."""
    for block in body.blocks:
        for b in block.bindings:
            _uses_in(b.value, counts)
    _uses_in(body.result, counts)


def used_vars(fn: Function) -> dict[Var, int]:
    """How many times each variable is used in the function."""
    counts: dict[Var, int] = {}
    count_uses(fn.body, counts)
    return counts


def dead_code_elimination(mod: IRModule, entries: tuple[str, ...] | None = None) -> IRModule:
    out = mod.with_functions({})
    for name, f in mod.functions.items():
        out.functions[name] = _dce_function(f, mod) if isinstance(f, Function) else f
    roots = entries if entries is not None else tuple(
        n for n, f in out.functions.items() if isinstance(f, Function) and not f.attrs.get("primitive"))
    live: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in live or name not in out.functions:
            continue
        live.add(name)
        f = out.functions[name]
        if isinstance(f, Function):
            stack += _callees(f.body)
    out.functions = {n: f for n, f in out.functions.items() if n in live}
    return out


def _callees(body: SeqExpr) -> list[str]:
    names = []
    for block in body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, CallTIR):
                names.append(v.program)
            elif isinstance(v, CallFunc):
                names.append(v.func)
            elif isinstance(v, CallDPSLibrary):
                names.append(v.name)
            elif isinstance(v, CallPyFunc):
                names.append(v.func)
            elif isinstance(v, If):
                names += _callees(v.then_branch) + _callees(v.else_branch)
    return names


def _dce_function(fn: Function, mod: IRModule) -> Function:
    changed = True
    body = fn.body
    while changed:
        counts: dict = {}
        count_uses(body, counts)
        changed = False
        blocks = []
        for block in body.blocks:
            kept = []
            for b in block.bindings:
                if isinstance(b, Binding) and counts.get(b.var, 0) == 0 and is_pure(b.value, mod):
                    changed = True
                    continue
                kept.append(b)
            if kept:
                blocks.append(BindingBlock(tuple(kept), block.dataflow))
        body = SeqExpr(tuple(blocks), body.result)
    return with_body(fn, body)
