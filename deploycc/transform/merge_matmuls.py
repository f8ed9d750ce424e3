"""Merge linears that read the same input (Q, K and V; gate and up) into one, on the graph level.

    q = linear(x, Wq); k = linear(x, Wk); v = linear(x, Wv)
 -> y = linear(x, W_qkv); q = strided_slice(y, 0, rq); k = strided_slice(y, rq, rq + rk); ...

One launch streams all the rows, and an input that the CPU kernels quantize to 8 bits is quantized
once (MLC-LLM's fused QKV and gate-up projections; Relax's CombineParallelMatmul). A weight is a
function parameter or a dequantize of parameters (quantization/base.py); the members of a group
share the input, the weight kind (float dtype or quantization scheme), the input width, whether
they have a bias and how their input is rounded (transform/absorb_rounding.py). Every scheme groups
along the input dimension, so the merged weight is the row concatenation of the members'
parameters, done at conversion time: the module's
`merged_params` attribute maps each new parameter to its parts (axis 0), and `module_params`
turns a model's (name, array) stream into the functions' parameters.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ..ir import annotation as A
from ..ir.expr import Binding, BindingBlock, Call, CallTIR, Function, SeqExpr, ShapeExpr, Var, with_body
from ..ir.module import IRModule
from .dce import dead_code_elimination, used_vars

ATTR = "merged_params"


def merge_matmuls(mod: IRModule) -> IRModule:
    out = mod.with_functions(mod.functions)
    out.attrs["_program_text"] = dict(mod.attrs.get("_program_text", {}))
    fns = out.graph_functions()
    plans = {name: _groups(fn, out) for name, fn in fns.items()}
    # A group is merged only if every function that reads its weights has it: the functions share one
    # parameter list (prefill, prefill_all and decode all read every weight).
    reads = {name: {p.name for p in fn.params} for name, fn in fns.items()}
    common = {k for plan in plans.values() for k in plan
              if all(k in plans[f] for f in fns if reads[f] & {n for part in k for n in part})}
    if not common:
        return mod
    merged: dict[str, list[str]] = dict(mod.attrs.get(ATTR, {}))
    new_vars: dict[str, Var] = {}
    for name, fn in fns.items():
        out.functions[name] = _rewrite(fn, out, {k: v for k, v in plans[name].items() if k in common},
                                       merged, new_vars)
    out.attrs[ATTR] = merged
    out = dead_code_elimination(out)
    for name, fn in out.graph_functions().items():
        out.functions[name] = _replace_params(fn, merged, new_vars)
    return out


def _weight(fn: Function, defs: dict, w, mod: IRModule):
    """(kind, cols, parameter vars) of a linear's weight, or None: a parameter, or a dequantize
    program (attrs op=dequantize) of parameters."""
    params = set(fn.params)
    if w in params:
        if len(w.ann.shape) != 2 or not all(d.is_const for d in w.ann.shape):
            return None
        return ("float", w.ann.dtype), w.ann.shape[1].value, (w,)
    v = defs.get(w)
    if isinstance(v, CallTIR) and all(a in params for a in v.args):
        attrs = mod[v.program].attrs
        if attrs.get("op") == "dequantize" and _concatenable(attrs["scheme"], attrs["rows"], attrs["cols"]):
            return ("scheme", attrs["scheme"]), attrs["cols"], tuple(v.args)
    return None


def _concatenable(scheme_name: str, rows: int, cols: int) -> bool:
    """Every packed parameter's first dimension grows with the rows and the others do not: rows (or
    interleaved groups of rows) concatenate."""
    from ..quantization import scheme_by_name

    shapes = scheme_by_name(scheme_name).param_shapes(rows, cols)
    twice = scheme_by_name(scheme_name).param_shapes(2 * rows, cols)
    return all(twice[k][0][0] == 2 * s[0] and tuple(twice[k][0][1:]) == tuple(s[1:])
               for k, (s, _) in shapes.items())


def _groups(fn: Function, mod: IRModule) -> dict[tuple, list[Binding]]:
    """Groups of two or more linears of one block with one input: key (part names per member)."""
    defs = {b.var: b.value for block in fn.body.blocks for b in block.bindings if isinstance(b, Binding)}
    found: dict[tuple, list[Binding]] = {}
    for block in fn.body.blocks:
        if not block.dataflow:
            continue
        by_input: dict[tuple, list[Binding]] = {}
        for b in block.bindings:
            v = b.value
            if not (isinstance(b, Binding) and isinstance(v, Call) and v.op == "linear"):
                continue
            w = _weight(fn, defs, v.args[1], mod)
            bias = v.args[2] if len(v.args) == 3 else None
            if w is None or (bias is not None and bias not in set(fn.params)):
                continue
            kind, cols, _ = w
            by_input.setdefault((v.args[0], kind, cols, bias is None, v.attrs.get("activations")), []).append(b)
        for members in by_input.values():
            if len(members) > 1:
                key = tuple(tuple(p.name for p in _parts(fn, defs, m, mod)) for m in members)
                found[key] = members
    return found


def _parts(fn, defs, b: Binding, mod) -> tuple[Var, ...]:
    v = b.value
    parts = _weight(fn, defs, v.args[1], mod)[2]
    return parts + ((v.args[2],) if len(v.args) == 3 else ())


def merged_name(names: list[str]) -> str:
    """`a.b.q_proj.q_weight` + `a.b.k_proj.q_weight` -> `a.b.q_proj_k_proj.q_weight`."""
    split = [n.rsplit(".", 2) if n.count(".") >= 2 else ["", *n.rsplit(".", 1)] for n in names]
    parent, suffix = split[0][0], split[0][-1]
    if any(s[0] != parent or s[-1] != suffix for s in split):
        return "+".join(names)
    joined = "_".join(s[1] for s in split)
    return f"{parent}.{joined}.{suffix}" if parent else f"{joined}.{suffix}"


def _rewrite(fn: Function, mod: IRModule, groups: dict, merged: dict, new_vars: dict) -> Function:
    from ..quantization import scheme_by_name

    defs = {b.var: b.value for block in fn.body.blocks for b in block.bindings if isinstance(b, Binding)}
    first: dict[Binding, tuple] = {}
    dropped: set[Binding] = set()
    for key, members in groups.items():
        first[members[0]] = (key, members)
        dropped.update(members[1:])
    blocks = []
    for block in fn.body.blocks:
        bindings = []
        for b in block.bindings:
            if b in dropped:
                continue
            if b not in first:
                bindings.append(b)
                continue
            key, members = first[b]
            rows = [m.var.ann.shape[-1].value for m in members]
            total = sum(rows)
            x = b.value.args[0]
            # The merged parameters, one per part position (q_weight, q_scale, ..., bias).
            mvars = []
            member_parts = [_parts(fn, defs, m, mod) for m in members]
            for pos in range(len(key[0])):
                names = [k[pos] for k in key]
                name = merged_name(names)
                merged[name] = names
                if name not in new_vars:
                    parts = [p[pos] for p in member_parts]
                    dim0 = sum(p.ann.shape[0].value for p in parts)  # rows, or interleaved groups of rows
                    new_vars[name] = Var(name, A.Tensor((dim0, *parts[0].ann.shape[1:]), parts[0].ann.dtype))
                mvars.append(new_vars[name])
            has_bias = len(b.value.args) == 3
            wparts = mvars[:-1] if has_bias else mvars
            w0 = b.value.args[1]
            if w0 in fn.params:
                w = wparts[0]
            else:
                prog = mod[defs[w0].program]
                scheme = scheme_by_name(prog.attrs["scheme"])
                cols = prog.attrs["cols"]
                wname = mod.add_program(scheme.program(total, cols))
                w = Var(f"{b.var.name}_w", A.Tensor((total, cols), "float32"), True)
                bindings.append(Binding(w, CallTIR(wname, tuple(wparts), w.ann)))
            lead = b.var.ann.shape[:-1]
            y = Var(f"{b.var.name}_merged", A.Tensor((*lead, total), b.var.ann.dtype), True)
            args = (x, w, mvars[-1]) if has_bias else (x, w)
            bindings.append(Binding(y, Call("linear", args, dict(b.value.attrs), y.ann)))
            start = 0
            for m, r in zip(members, rows):
                sl = Call("strided_slice", (y, ShapeExpr((start, start + r))), {"axis": len(lead)}, m.var.ann)
                bindings.append(Binding(m.var, sl))
                start += r
        blocks.append(BindingBlock(tuple(bindings), block.dataflow))
    return with_body(fn, SeqExpr(tuple(blocks), fn.body.result))


def _replace_params(fn: Function, merged: dict, new_vars: dict) -> Function:
    """The merged parameter where its first part stood; parts nothing reads any more leave."""
    used = used_vars(fn)
    part_of = {p: m for m, parts in merged.items() for p in parts}
    params, placed = [], set()
    for p in fn.params:
        m = part_of.get(p.name)
        if m is not None and m in new_vars and m not in placed:
            params.append(new_vars[m])
            placed.add(m)
        if m is None or used.get(p, 0):
            params.append(p)
    return with_body(fn, fn.body, params=tuple(params))


def module_params(mod: IRModule, named: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    """A model's (name, array) stream as the parameters of `mod` (see merge_params)."""
    return merge_params(mod.attrs.get(ATTR, {}), named)


def merge_params(merged: dict[str, list[str]], named: Iterable[tuple[str, np.ndarray]]
                 ) -> Iterator[tuple[str, np.ndarray]]:
    """A model's (name, array) stream with `merged` applied: each merged parameter is the row
    concatenation of its parts, yielded once its last part has arrived (parts are adjacent in
    export order, so at most one group is held), parts that were merged do not appear."""
    part_of = {p: m for m, parts in merged.items() for p in parts}
    held: dict[str, dict[str, np.ndarray]] = {}
    for name, arr in named:
        m = part_of.get(name)
        if m is None:
            yield name, arr
            continue
        got = held.setdefault(m, {})
        got[name] = np.asarray(arr)
        if len(got) == len(merged[m]):
            del held[m]
            yield m, np.concatenate([got[p] for p in merged[m]], axis=0)
    if held:
        missing = sorted(p for m, got in held.items() for p in merged[m] if p not in got)
        raise KeyError(f"the model has no tensor {missing[0]} to merge")


def function_params(mod: IRModule, named: Iterable[tuple[str, np.ndarray]], fn: str = "decode") -> list[np.ndarray]:
    """The arrays of graph function `fn`'s weight parameters (after its inputs), in order, from a
    model's (name, array) stream: what the interpreter takes positionally."""
    f = mod[fn]
    have = dict(module_params(mod, named))
    names = [p.name for p in f.params[f.attrs.get("num_inputs", 0):]]
    missing = [n for n in names if n not in have]
    if missing:
        raise KeyError(f"the model has no tensor {missing[0]}")
    return [have[n] for n in names]
