"""absorb_rounding: a linear of rounded activations becomes one linear that says so (cpu integer targets).

    y = round_activations(x, bits=8); z = linear(y, W)   ->   z = linear(x, W) {activations: 8}

The integer kernels round their input themselves, as they quantize it to codes and scales (schedule/qgemv.py):
the attribute reaches the linear's tensor program (op/linalg.py), fusion keeps it (fuse_tensor), and only an
integer schedule may take a program that has it (schedule checks that one did). Relay's view of quantization as
a rewrite: the graph states the arithmetic (the reference interpreter runs round_activations as written), the
target's kernels implement it. A rounding whose result anything but a linear's input reads stays, and has no
kernel (legalize says so).
"""
from __future__ import annotations

from collections.abc import Callable

from ..ir.expr import Binding, BindingBlock, Call, CallTIR, Function, SeqExpr, Var, with_body
from ..ir.module import IRModule
from .dce import dead_code_elimination

PACKED = ".q_weight"  # the packed codes of a quantized weight (quantization/group.py, gguf_blocks.py)


def absorb_rounding(mod: IRModule, takes: Callable[[int | None, int, int], bool] | None = None) -> IRModule:
    """Every linear of rounded activations, or those `takes(rows, k, bits)` accepts (rows: the constant count of
    the input's rows, None where symbolic; cuda's decode GEMV, schedule/dp4a.py), reads the unrounded input and
    says so. A rounding that stays (cuda's prefill) becomes one per input and width: the linears that read it can
    then merge (transform/merge_matmuls.py) as they do where it is absorbed."""
    out = mod.with_functions(mod.functions)
    for name, fn in mod.graph_functions().items():
        out.functions[name] = _absorb(fn, takes)
    return dead_code_elimination(out)


def rounded_linears(mod: IRModule) -> dict[str, int]:
    """{module name: bits} of the quantized weights that linears of rounded activations read, in an exported
    module: what a package records (manifest kernels.native.activations) and `verify` rounds alike. An embedding
    appears where it serves as a tied output head."""
    out = {}
    for fn in mod.graph_functions().values():
        bindings = [b for block in fn.body.blocks for b in block.bindings if isinstance(b, Binding)]
        defs = {b.var: b.value for b in bindings}
        for b in bindings:
            v = b.value
            if isinstance(v, Call) and v.op == "linear" and isinstance(defs.get(v.args[0]), Call) \
                    and defs[v.args[0]].op == "round_activations":
                w = defs.get(v.args[1])
                packed = [a.name for a in (w.args if isinstance(w, CallTIR) else ()) if a.name.endswith(PACKED)]
                if len(packed) != 1:
                    raise ValueError(f"{fn.name}: a linear of rounded activations whose weight is not one quantized "
                                     f"tensor")
                out[packed[0].removesuffix(PACKED)] = defs[v.args[0]].attrs["bits"]
    return out


def _absorb(fn: Function, takes) -> Function:
    rounded: dict[Var, tuple] = {}  # y -> (x, bits)
    first: dict[tuple, Var] = {}  # (x, bits) -> the first rounding of x to bits
    blocks = []
    for block in fn.body.blocks:
        bindings = []
        for b in block.bindings:
            v = b.value
            if isinstance(b, Binding) and isinstance(v, Call):
                if v.op == "round_activations":
                    rounded[b.var] = (v.args[0], v.attrs["bits"])
                    first.setdefault(rounded[b.var], b.var)
                elif v.op == "linear" and v.args[0] in rounded:
                    x, bits = rounded[v.args[0]]
                    if takes is None or takes(_rows(x), x.ann.shape[-1].value, bits):
                        b = Binding(b.var, Call("linear", (x, *v.args[1:]), {**v.attrs, "activations": bits}, v.ann))
                    else:
                        b = Binding(b.var, Call("linear", (first[x, bits], *v.args[1:]), v.attrs, v.ann))
            bindings.append(b)
        blocks.append(BindingBlock(tuple(bindings), block.dataflow))
    return with_body(fn, SeqExpr(tuple(blocks), fn.body.result))


def _rows(x: Var) -> int | None:
    """The product of x's dimensions but the last, where they are constants."""
    rows = 1
    for d in x.ann.shape[:-1]:
        if not d.is_const:
            return None
        rows *= d.value
    return rows
