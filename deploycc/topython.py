"""Graph functions as Python on torch, at any pipeline stage: read them, edit them, run them.

`module_to_python(mod)` prints a module's graph functions as the methods of one class, a
deploycc.pymodule.BasePyModule: high-level ops become torch / torch.nn.functional calls, `call_tir`
and library calls go through the module (`self.call_tir("fused_linear_add", [x, w], (1, seq_len, 576),
"float32")`), the KV-cache builtins become calls of a `TorchKVCache` (deploycc.pymodule), and symbolic shapes are bound
from tensor shapes (`seq_len = input_ids.shape[1]`) and checked where the IR has a match_cast.

    source = module_to_python(mod)       # e.g. the exported or the fused module of a model
    py = load_python(source, mod, "host")  # TorchKVCache, torch_weights: deploycc.pymodule
    logits = py.prefill(torch.tensor([ids], dtype=torch.int32), TorchKVCache.for_model(model),
                        *torch_weights(model, mod))

Edit `source` (insert `print(...)`, change an op) before loading it to inspect a real model as one
would a PyTorch one. Printing needs no torch; running does.
"""
from __future__ import annotations

import builtins
import keyword
import linecache
import re
from collections.abc import Callable, Iterable

import numpy as np

from .ir import annotation as A
from .ir import sym
from .ir.expr import (
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
from .ir.module import IRModule
from .transform.dce import children, count_uses

CLASS_NAME = "Module"

TORCH_DTYPES = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16",
                "int32": "torch.int32", "int64": "torch.int64", "uint8": "torch.uint8", "int8": "torch.int8",
                "uint32": "torch.uint32", "bool": "torch.bool"}

# Helpers the printed module defines when it uses them: plain torch, meant to be read and edited.
HELPERS = {
    "apply_rope": '''\
def apply_rope(x, inv_freq, offset):
    """Rotary embedding, rotate-half form, of x [..., seq, heads, head_dim] at positions offset, offset + 1, ..."""
    n, d = x.shape[-3], x.shape[-1]
    pos = torch.arange(offset, offset + n, dtype=torch.float32)
    angle = torch.outer(pos, inv_freq)[:, None, :]  # [seq, 1, head_dim / 2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
''',
    "rope_table": '''\
def rope_table(inv_freq, offset, n, scale=1.0):
    """[n, head_dim / 2, 2]: cos and sin of the rotary angles of positions offset .. offset + n - 1 (times scale)."""
    angle = torch.outer(torch.arange(offset, offset + n, dtype=torch.float32), inv_freq)
    table = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)
    return table if scale == 1.0 else table * scale
''',
    "apply_rope_table": '''\
def apply_rope_table(x, table):
    """Rotary embedding, rotate-half form, of x [..., seq, heads, head_dim] with a rope_table; the first
    2 * table.shape[1] dimensions rotate, the rest pass through (partial rotary)."""
    r = 2 * table.shape[1]
    cos, sin = table[:, None, :, 0], table[:, None, :, 1]
    x1, x2 = x[..., : r // 2], x[..., r // 2: r]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], dim=-1)
''',
    "round_activations": '''\
def round_activations(x, bits):
    """x rounded to `bits` per block of 32 along the last axis, as integer kernels round a linear's input:
    scale max|x| / (2^(bits-1) - 1) per block, codes rounded half to even (deploycc/op/linalg.py)."""
    b = x.reshape(-1, 32)
    d = b.abs().amax(dim=1, keepdim=True) / float(2 ** (bits - 1) - 1)
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    return (torch.round(b * inv) * d).reshape(x.shape)
''',
    "causal_attention": '''\
def causal_attention(q, k, v, scale, window=0, softcap=0.0, total=None):
    """q [seq_len, heads, head_dim], k and v [total_len, kv_heads, head_dim] (grouped-query heads):
    query i sees keys j <= i + total_len - seq_len (the cache holds total_len - seq_len earlier tokens),
    and with a sliding window only the last `window` of them; softcap > 0 caps scores at softcap * tanh(s / softcap).
    total: k and v are a ring cache holding position j at row j % len(k)."""
    if total is not None:
        rows = torch.arange(total) % k.shape[0]
        k, v = k[rows], v[rows]
    seq_len, total_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,thd->hnt", q, k) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    visible = torch.ones(seq_len, total_len, dtype=torch.bool).tril(total_len - seq_len)
    if window:
        visible &= ~torch.ones(seq_len, total_len, dtype=torch.bool).tril(total_len - seq_len - window)
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hnt,thd->nhd", probs, v)
''',
}

# Names the printed code uses itself; IR names that clash get a suffix.
RESERVED = {"self", "torch", "F", "BasePyModule", "print", "min", "max", "int", "float", "tuple", "len", "range",
            "bool", "super", *HELPERS}


# ---- printing --------------------------------------------------------------------------------

def module_to_python(mod: IRModule, functions: Iterable[str] | None = None) -> str:
    """A Python module defining `class Module(BasePyModule)` with one method per graph function
    (all, or those named in `functions`, in module order)."""
    graph = mod.graph_functions()
    names = list(graph) if functions is None else list(functions)
    for n in names:
        if n not in graph:
            raise KeyError(f"{n!r} is not a graph function of the module (have: {', '.join(graph)})")
    consts = constant_names(mod)
    methods = [_FunctionPrinter(graph[n], n, consts).lines() for n in names]
    body = "\n".join(methods)
    helpers = [src for name, src in HELPERS.items() if re.search(rf"\b{name}\(", body)]
    what = f"{mod.attrs['model']} " if "model" in mod.attrs else ""
    head = [f"# The graph functions of the {what}module as Python on torch (deploycc.topython).",
            "# Edit freely (print intermediate tensors, change an op); run with",
            "# deploycc.topython.load_python(source, module, device).",
            "import torch",
            "import torch.nn.functional as F",
            "",
            "from deploycc.pymodule import BasePyModule",
            ""]
    out = "\n".join(head) + "\n" + "".join(f"\n{h}\n" for h in helpers)
    big = [f"#   self.{name}: {list(arr.shape)} {arr.dtype}" for name, arr in _big_constants(mod, consts)
           if re.search(rf"self\.{name}\b", body)]
    out += f"\nclass {CLASS_NAME}(BasePyModule):\n"
    if big:
        out += "    # Constants of the module, set by load_python:\n" + "\n".join(f"    {b}" for b in big) + "\n\n"
    return out + body


def function_to_python(fn: Function, name: str | None = None, mod: IRModule | None = None) -> str:
    """One graph function as a method (`def name(self, ...)`), dedented to the top level."""
    consts = constant_names(mod) if mod is not None else {}
    lines = _FunctionPrinter(fn, name or fn.name, consts).lines()
    return "\n".join(line[4:] if line.startswith("    ") else line for line in lines.splitlines()) + "\n"


INLINE_CONSTANT_SIZE = 1  # larger constants are attributes of the module (self.const0, ...)


def constant_names(mod: IRModule | None) -> dict[int, str]:
    """id(array) -> attribute name (const0, const1, ...) for every larger constant of the module's graph
    functions, in module order, so that printing a subset of functions keeps the names."""
    names: dict[int, str] = {}
    seen: dict[tuple, str] = {}
    if mod is None:
        return names
    for e in _constants(mod):
        v = e.value
        if v.size <= INLINE_CONSTANT_SIZE or id(v) in names:
            continue
        key = (v.dtype.str, v.shape, v.tobytes())
        if key not in seen:
            seen[key] = f"const{len(seen)}"
        names[id(v)] = seen[key]
    return names


def _constants(mod: IRModule):
    def expr(e):
        if isinstance(e, Constant):
            yield e
        for c in children(e):
            yield from expr(c)
        if isinstance(e, If):
            yield from seq(e.then_branch)
            yield from seq(e.else_branch)

    def seq(body: SeqExpr):
        for block in body.blocks:
            for b in block.bindings:
                yield from expr(b.value)
        yield from expr(body.result)

    for fn in mod.graph_functions().values():
        yield from seq(fn.body)


def _big_constants(mod: IRModule, names: dict[int, str]) -> list[tuple[str, np.ndarray]]:
    out: dict[str, np.ndarray] = {}
    for e in _constants(mod):
        if id(e.value) in names:
            out.setdefault(names[id(e.value)], e.value)
    return list(out.items())


_IDENT = re.compile(r"[^0-9A-Za-z_]")


class _Namer:
    """Unique Python identifiers per object (a second `n` prints as `n_1`), avoiding reserved names."""

    def __init__(self):
        self.names: dict[int, str] = {}
        self.used: set[str] = set(RESERVED)

    def __call__(self, obj, hint: str) -> str:
        key = id(obj)
        if key not in self.names:
            hint = _IDENT.sub("_", hint) or "v"
            if hint[0].isdigit() or keyword.iskeyword(hint):
                hint = f"v_{hint}"
            name, i = hint, 1
            while name in self.used:
                name, i = f"{hint}_{i}", i + 1
            self.used.add(name)
            self.names[key] = name
        return self.names[key]


class _FunctionPrinter:
    def __init__(self, fn: Function, name: str, consts: dict[int, str]):
        self.fn, self.name, self.consts = fn, name, consts
        self.namer = _Namer()
        self.defined: set[sym.SymVar] = set()
        self.uses: dict[Var, int] = {}
        count_uses(fn.body, self.uses)
        # A match_cast of a value used nowhere else prints the value straight into the cast variable.
        self.target: dict[Var, MatchCast] = {}
        self.folded: set[MatchCast] = set()
        self.begun: set[MatchCast] = set()  # kv.begin folds: `total_len = cache.begin(seq_len)`

    # ---- names, symbols, annotations -----------------------------------------------------------
    def var(self, v: Var) -> str:
        return self.namer(v, v.name)

    def sv(self, v: sym.SymVar) -> str:
        return self.namer(v, v.name)

    def s(self, e) -> str:
        return sym.to_python(e, self.sv)

    def shape(self, dims) -> str:
        return "(" + ", ".join(self.s(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"

    def comment(self, ann: A.Annotation) -> str:
        if isinstance(ann, A.TensorAnn) and ann.shape is not None:
            return f"  # {self.shape(ann.shape)} {ann.dtype}"
        return ""

    # ---- function --------------------------------------------------------------------------------
    def lines(self) -> str:
        fn = self.fn
        params = [self.var(p) for p in fn.params]
        out: list[str] = []
        if len(params) <= 4:
            out.append(f"    def {self.name}(self{''.join(', ' + p for p in params)}):")
        else:
            out.append(f"    def {self.name}(")
            out.append("        self,")
            for p, name in zip(fn.params, params):
                out.append(f"        {name},{self.param_comment(p.ann)}")
            out.append("    ):")
        bounds = [f"{self.sv(v)} <= {self.s(hi)}" for v, hi in fn.bounds.upper.items()]
        if bounds:
            out.append(f"        # bounds: {', '.join(bounds)}")
        for p in fn.params:
            out += self.bind_syms(self.var(p), p.ann, "        ")
        out += self.seq(fn.body, "        ", None)
        return "\n".join(out) + "\n"

    def param_comment(self, ann: A.Annotation) -> str:
        if isinstance(ann, A.ObjectAnn):
            return "  # KV cache (deploycc.pymodule.TorchKVCache)"
        return self.comment(ann)

    def bind_syms(self, name: str, ann: A.Annotation, indent: str) -> list[str]:
        """Define the variables of `ann` that are a whole dimension of the value `name` and new."""
        dims = ann.shape if isinstance(ann, A.TensorAnn) else ann.values if isinstance(ann, A.ShapeAnn) else None
        out = []
        for k, d in enumerate(dims or ()):
            v = d.as_var
            if v is not None and v not in self.defined:
                self.defined.add(v)
                where = f"{name}.shape[{k}]" if isinstance(ann, A.TensorAnn) else f"{name}[{k}]"
                out.append(f"{indent}{self.sv(v)} = {where}")
        return out

    def seq(self, body: SeqExpr, indent: str, target: str | None) -> list[str]:
        """Statements of a body; its result is returned, or assigned to `target` (an If branch)."""
        self.plan_folds(body)
        out: list[str] = []
        for block in body.blocks:
            for b in block.bindings:
                out += self.binding(b, indent)
        if isinstance(body.result, If):
            out += self.if_(body.result, indent, target)
        elif target is None:
            out.append(f"{indent}return {self.expr(body.result)}")
        else:
            out.append(f"{indent}{target} = {self.expr(body.result)}")
        return out

    def plan_folds(self, body: SeqExpr) -> None:
        bound: set[Var] = set()
        for block in body.blocks:
            for b in block.bindings:
                if isinstance(b, MatchCast):
                    if isinstance(b.value, Var) and b.value in bound and self.uses.get(b.value) == 1:
                        self.target[b.value] = b
                elif not isinstance(b.value, If):
                    bound.add(b.var)

    def binding(self, b, indent: str) -> list[str]:
        if isinstance(b, MatchCast):
            return self.match_cast(b, indent)
        v = b.value
        cast = self.target.get(b.var)
        if cast is not None and self.begin_fold(v, cast):
            # kv.begin returns the new total length as a shape; its match_cast names the length.
            length = cast.ann.values[0].as_var
            self.defined.add(length)
            self.begun.add(cast)
            return [f"{indent}{self.sv(length)} = {_a(self, v)}.begin({self.values(v.args[1])[0]})"]
        name = self.var(cast.var if cast is not None else b.var)
        if cast is not None:
            self.folded.add(cast)
        if isinstance(v, If):
            return self.if_(v, indent, name)
        note = "" if isinstance(v, (CallTIR, CallDPSLibrary)) else self.comment(b.var.ann)  # DPS calls say it
        return [f"{indent}{name} = {self.expr(v)}{note}"]

    def begin_fold(self, value: Expr, cast: MatchCast) -> bool:
        ann = cast.ann
        return (isinstance(value, Call) and value.op == "kv.begin" and isinstance(ann, A.ShapeAnn)
                and ann.values is not None and len(ann.values) == 1 and ann.values[0].as_var is not None
                and ann.values[0].as_var not in self.defined and not self.uses.get(cast.var))

    def match_cast(self, b: MatchCast, indent: str) -> list[str]:
        """Bind the new variables of the annotation from the value's shape, and check the rest."""
        if b in self.begun:
            return []
        if b in self.folded:  # the value was printed straight into the cast's variable
            return self.checks(self.var(b.var), b.ann, indent)
        if isinstance(b.value, Var) and not self.uses.get(b.var):
            return self.checks(self.expr(b.value), b.ann, indent)
        name = self.var(b.var)
        return [f"{indent}{name} = {self.expr(b.value)}"] + self.checks(name, b.ann, indent)

    def checks(self, name: str, ann: A.Annotation, indent: str) -> list[str]:
        dims = ann.shape if isinstance(ann, A.TensorAnn) else ann.values if isinstance(ann, A.ShapeAnn) else None
        if dims is None:
            return []
        new = {d.as_var for d in dims if d.as_var is not None and d.as_var not in self.defined}
        out = self.bind_syms(name, ann, indent)
        if any(d.as_var not in new for d in dims):
            have = f"{name}.shape" if isinstance(ann, A.TensorAnn) else name
            out.append(f"{indent}assert {have} == {self.shape(dims)}, {have}")
        return out

    def if_(self, e: If, indent: str, target: str | None) -> list[str]:
        before = set(self.defined)  # variables a branch defines are not defined in the other or after
        out = [f"{indent}if bool({self.expr(e.cond)}):"]
        out += self.seq(e.then_branch, indent + "    ", target)
        self.defined = set(before)
        out.append(f"{indent}else:")
        out += self.seq(e.else_branch, indent + "    ", target)
        self.defined = before
        return out

    # ---- expressions -----------------------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Constant):
            return self.constant(e.value)
        if isinstance(e, ShapeExpr):
            return self.shape(e.values)
        if isinstance(e, Tuple):
            return "(" + ", ".join(self.expr(f) for f in e.fields) + ("," if len(e.fields) == 1 else "") + ")"
        if isinstance(e, TupleGetItem):
            return f"{self.expr(e.tuple_value)}[{e.index}]"
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, CallTIR):
            extra = f", sym_args=[{', '.join(self.s(s) for s in e.sym_args)}]" if e.sym_args else ""
            return f'self.call_tir("{e.program}", {self.args(e.args)}, {self.out(e.out_ann)}{extra})'
        if isinstance(e, CallDPSLibrary):
            return f'self.call_dps_library("{e.name}", {self.args(e.args)}, {self.out(e.out_ann)})'
        if isinstance(e, (CallFunc, CallPyFunc)):
            return f"self.{e.func}({', '.join(self.expr(a) for a in e.args)})"
        raise TypeError(f"topython: cannot print {type(e).__name__}")

    def args(self, args) -> str:
        return "[" + ", ".join(self.expr(a) for a in args) + "]"

    def out(self, ann: A.Annotation) -> str:
        """`shape, "dtype"` of a DPS output, or `[shapes], dtype(s)` for a tuple of them."""
        fields = list(ann.fields) if isinstance(ann, A.TupleAnn) else [ann]
        if not all(isinstance(f, A.TensorAnn) and f.shape is not None for f in fields):
            raise TypeError(f"topython: a DPS output needs known shapes, got {A.to_text(ann)}")
        dtypes = [f.dtype for f in fields]
        if not isinstance(ann, A.TupleAnn):
            return f'{self.shape(fields[0].shape)}, "{dtypes[0]}"'
        dt = f'"{dtypes[0]}"' if len(set(dtypes)) == 1 else "[" + ", ".join(f'"{d}"' for d in dtypes) + "]"
        return "[" + ", ".join(self.shape(f.shape) for f in fields) + f"], {dt}"

    def constant(self, v: np.ndarray) -> str:
        if id(v) in self.consts:
            return f"self.{self.consts[id(v)]}"
        if v.size > INLINE_CONSTANT_SIZE:
            raise ValueError("topython: a constant larger than a literal needs the module (function_to_python(mod=...))")
        return f"torch.tensor({_literal(v)}, dtype={TORCH_DTYPES[str(v.dtype)]})"

    def values(self, e: Expr) -> list[str]:
        """The values of a shape argument, each as Python."""
        if isinstance(e, ShapeExpr):
            return [self.s(d) for d in e.values]
        name = self.expr(e)
        n = e.ann.ndim if isinstance(e.ann, A.ShapeAnn) else -1
        if n < 0:
            raise TypeError(f"topython: a shape of unknown length ({A.to_text(e.ann)})")
        return [f"{name}[{k}]" for k in range(n)]

    def call(self, c: Call) -> str:
        rule = OPS.get(c.op)
        if rule is not None:
            return rule(self, c)
        # No torch spelling (yet): the op's numpy reference, through the module.
        attrs = "".join(f", {k}={_py(v, self.s)}" for k, v in sorted(c.attrs.items()))
        return f'self.call_op("{c.op}"{"".join(", " + self.expr(a) for a in c.args)}{attrs})'


def _literal(v: np.ndarray):
    if v.ndim == 0:
        return repr(v.item())
    return repr(v.tolist())


def _cached(x: str, c) -> str:
    """A key or value as a float16 cache holds it (rounded to half, ties to even), read back as float."""
    return f"{x}.to(torch.float16).float()" if c.attrs.get("dtype") == "float16" else x


def _rows(c) -> str:
    """kv ops of a ring cache layer: the ring's row count."""
    return f", rows={c.attrs['rows']}" if c.attrs.get("rows") else ""


def _float(v: float) -> str:
    """The shortest text of a float32 attribute (1e-05, not 9.999999747378752e-06); kernels and
    references use it as float32 either way."""
    v = float(v)
    return str(np.float32(v)) if float(np.float32(v)) == v else repr(v)


def _py(v, s: Callable) -> str:
    if isinstance(v, sym.Expr):
        return s(v)
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_py(x, s) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


# ---- op -> torch -----------------------------------------------------------------------------

def _a(p: _FunctionPrinter, c: Call, i: int = 0) -> str:
    return p.expr(c.args[i])


def _binary(symbol):
    return lambda p, c: f"{_a(p, c)} {symbol} {_a(p, c, 1)}"


def _fn(name):
    return lambda p, c: f"{name}({', '.join(p.expr(a) for a in c.args)})"


def _axis(c: Call, default: int = 0) -> int:
    axis = c.attrs.get("axis", default)
    ann = c.args[0].ann
    return axis % ann.ndim if axis < 0 and isinstance(ann, A.TensorAnn) and ann.ndim > 0 else axis


def _strided_slice(p, c):
    x, axis = _a(p, c), _axis(c)
    b, e = p.values(c.args[1])
    if isinstance(c.args[1], ShapeExpr):
        return f"{x}[{':, ' * axis}{b}:{e}]"
    return f"{x}.narrow({axis}, {b}, {e} - {b})"


def _kv_begin(p, c):
    (n,) = p.values(c.args[1])
    return f"({_a(p, c)}.begin({n}),)"


OPS: dict[str, Callable[[_FunctionPrinter, Call], str]] = {
    "add": _binary("+"),
    "subtract": _binary("-"),
    "multiply": _binary("*"),
    "divide": _binary("/"),
    "maximum": _fn("torch.maximum"),
    "minimum": _fn("torch.minimum"),
    "silu": _fn("F.silu"),
    "gelu_tanh": lambda p, c: f'F.gelu({_a(p, c)}, approximate="tanh")',
    "exp": _fn("torch.exp"),
    "sqrt": _fn("torch.sqrt"),
    "rsqrt": _fn("torch.rsqrt"),
    "tanh": _fn("torch.tanh"),
    "sigmoid": _fn("torch.sigmoid"),
    "negative": lambda p, c: f"-{_a(p, c)}",
    "astype": lambda p, c: f"{_a(p, c)}.to({TORCH_DTYPES[c.attrs['dtype']]})",
    "take": lambda p, c: f"F.embedding({_a(p, c, 1)}, {_a(p, c)})",
    "linear": _fn("F.linear"),
    "round_activations": lambda p, c: f"round_activations({_a(p, c)}, {c.attrs['bits']})",
    "matmul": _fn("torch.matmul"),
    "rms_norm": lambda p, c: f"F.rms_norm({_a(p, c)}, {_a(p, c, 1)}.shape, {_a(p, c, 1)}, eps={_float(c.attrs['eps'])})",
    "layer_norm": lambda p, c: (f"F.layer_norm({_a(p, c)}, {_a(p, c, 1)}.shape, {_a(p, c, 1)}, {_a(p, c, 2)}, "
                                f"eps={_float(c.attrs['eps'])})"),
    "softmax": lambda p, c: f"torch.softmax({_a(p, c)}, dim={c.attrs.get('axis', -1)})",
    "rope": lambda p, c: f"apply_rope({_a(p, c)}, {_a(p, c, 1)}, {p.values(c.args[2])[0]})",
    "rope_table": lambda p, c: (f"rope_table({_a(p, c)}, {', '.join(p.values(c.args[1]))}"
                                + (f", scale={_float(c.attrs['scale'])})" if c.attrs.get("scale", 1.0) != 1.0 else ")")),
    "rope_apply": lambda p, c: f"apply_rope_table({_a(p, c)}, {_a(p, c, 1)})",
    "attention": lambda p, c: (f"causal_attention({_a(p, c)}, {_a(p, c, 1)}, {_a(p, c, 2)}, scale={_float(c.attrs['scale'])}"
                               + "".join(f", {k}={_float(c.attrs[k]) if k == 'softcap' else c.attrs[k]}"
                                         for k in ("window", "softcap") if c.attrs.get(k))
                               + (f", total={p.values(c.args[3])[0]}" if len(c.args) == 4 else "") + ")"),
    "reshape": lambda p, c: f"{_a(p, c)}.reshape({', '.join(p.values(c.args[1]))})",
    "permute_dims": lambda p, c: f"{_a(p, c)}.permute({', '.join(str(a) for a in c.attrs['axes'])})",
    "concat": lambda p, c: f"torch.cat([{', '.join(p.expr(a) for a in c.args)}], dim={c.attrs.get('axis', 0)})",
    "split": lambda p, c: f"torch.split({_a(p, c)}, {list(c.attrs['sizes'])}, dim={c.attrs.get('axis', 0)})",
    "strided_slice": _strided_slice,
    "arange": lambda p, c: (f"torch.arange({', '.join(p.values(c.args[0]))}, "
                            f"dtype={TORCH_DTYPES[c.attrs.get('dtype', 'int32')]})"),
    "kv.begin": _kv_begin,
    "kv.append": lambda p, c: (f"{_a(p, c)}.append({c.attrs['layer']}, {_cached(_a(p, c, 1), c)}, "
                               f"{_cached(_a(p, c, 2), c)}{_rows(c)})"),
    "kv.keys": lambda p, c: f"{_a(p, c)}.keys({c.attrs['layer']}{_rows(c)})",
    "kv.values": lambda p, c: f"{_a(p, c)}.values({c.attrs['layer']}{_rows(c)})",
}


# ---- loading ---------------------------------------------------------------------------------

def load_python(source: str, mod: IRModule, device: str = "host", **options):
    """Execute printed (and possibly edited) Python and instantiate its module class on `device`,
    with `mod`'s tensor programs behind `self.call_tir` and its constants as attributes.

    The source is executed as is: pass only code you trust, such as your own printed module."""
    from .pymodule import BasePyModule, to_torch

    filename = f"<deploycc-python-{abs(hash(source)):x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show lines
    namespace: dict = {"__name__": "deploycc_python", "__builtins__": builtins}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - trusted: the caller's own printed code
    classes = [v for v in namespace.values()
               if isinstance(v, type) and issubclass(v, BasePyModule) and v is not BasePyModule]
    if not classes:
        raise ValueError("the source defines no BasePyModule subclass")
    cls = namespace.get(CLASS_NAME, classes[-1])
    obj = cls(device=device, module=mod, **options)
    for name, arr in _big_constants(mod, constant_names(mod)):
        setattr(obj, name, to_torch(np.array(arr)))
    return obj
