"""Python functions in IR modules (the "Python module" design of Relax), and modules run from torch.

A module class subclasses `BasePyModule`. Its class attributes may be tensor programs, graph
functions, extern functions or whole IRModules (built with deploycc.ir); its methods decorated with
`@py_func` are Python functions on torch tensors. `cls.ir_module()` is the IRModule: every py_func
becomes a `PyFunc` node (its source text and the callable), printed with the rest of the module.

    class Example(BasePyModule):
        matmul = matmul_program              # a TensorProgram
        main = main_function                 # a graph Function; may call_py_func("relu", ...)

        @py_func
        def relu(self, x):
            y = self.call_tir("matmul", [x, x], (4, 4), "float32")
            return torch.relu(self.main(y))

    m = Example(device="opencl")             # schedules the tensor programs for that device
    m.main(torch.randn(4, 4))                # every function is a method taking torch tensors

Graph functions run in the reference interpreter (deploycc.interp), whose call_tir runs the
programs on the device: the loop-level interpreter on "host", compiled kernels through
deploycc.kernel_runner.KernelRunner on "opencl", "webgpu" and "cuda". `call_py_func` calls back into the
instance's Python methods.

Tensors cross between torch and numpy by DLPack, without a copy, where both sides can share the
memory: a CPU tensor that is contiguous (and a writable numpy array) is shared. Otherwise it is
copied: a non-contiguous tensor (kernels and the VM need dense row-major buffers), a tensor on another
torch device, and a read-only array (DLPack cannot mark a tensor read-only). Device buffers are always
copies: KernelRunner uploads the inputs of each tensor program and downloads its outputs into the
numpy arrays that the torch tensors then share.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .dlpack import to_numpy, to_torch
from .interp import LIBRARY, Interpreter
from .ir import annotation as A
from .ir import op as op_registry
from .ir import sym
from .ir.expr import Function
from .ir.module import ExternFunc, IRModule, PyFunc
from .ir.tir import TensorProgram
from .ir.tir_interp import NP_DTYPES

# Device kind -> the preset whose target its tensor programs are scheduled for (override with preset=).
DEFAULT_PRESETS = {"opencl": "cpu-opencl", "webgpu": "cpu-webgpu", "cuda": "h100"}

_PY_FUNC = "__deploycc_py_func__"


def py_func(fn: Callable) -> Callable:
    """Mark a method of a BasePyModule subclass as a Python function of its IRModule."""
    setattr(fn, _PY_FUNC, True)
    return fn


# ---- module classes --------------------------------------------------------------------------

def py_func_source(fn: Callable) -> str:
    """The function's source, dedented, from its `def` line on (decorators are printed by the IR)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return f"def {fn.__name__}(...):\n    ...  # source unavailable\n"
    try:
        node = ast.parse(src).body[0]
        return "\n".join(src.splitlines()[node.lineno - 1:]) + "\n"
    except (SyntaxError, IndexError):
        return src


def _named(value, name: str):
    if isinstance(value, Function) and value.name != name:
        return Function(name, value.params, value.body, value.ret_ann, value.attrs, value.bounds)
    if isinstance(value, TensorProgram) and value.name != name:
        return TensorProgram(name, value.params, value.body, value.sym_params, value.num_outputs, value.attrs)
    return value


class BasePyModule:
    """Base of module classes mixing tensor programs, graph functions and Python functions."""

    @classmethod
    def ir_module(cls) -> IRModule:
        """The class's IRModule: IRModule attributes merged in, then programs, graph, extern and
        Python functions under their attribute names (subclasses override their bases)."""
        mod = IRModule()
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, IRModule):
                    mod.functions.update(value.functions)
                    mod.attrs.update({k: v for k, v in value.attrs.items() if not k.startswith("_")})
                elif isinstance(value, (Function, TensorProgram, ExternFunc)):
                    mod.functions[name] = _named(value, name)
                elif callable(value) and getattr(value, _PY_FUNC, False):
                    mod.functions[name] = PyFunc(name, py_func_source(value), value)
        return mod

    def __init__(self, device: str = "host", *, preset: str | None = None, module: IRModule | None = None,
                 library: Mapping[str, Callable] | None = None):
        """Compile the module for `device` ("host", "opencl", "webgpu" or "cuda"): each tensor program is
        scheduled for the target of `preset` (default DEFAULT_PRESETS[device]); on "host" programs run in
        the loop-level interpreter. `module` adds the functions of an IRModule (e.g. a model's module at
        some pipeline stage) to the class's; `library` adds call_dps_library functions (numpy, DPS)."""
        mod = type(self).ir_module()
        if module is not None:
            mod = IRModule({**module.functions, **mod.functions}, {**module.attrs, **mod.attrs})
        self.device_kind = device
        self.library = dict(LIBRARY, **(library or {}))
        self.module, self.run_program, self.target = _compile(mod, device, preset)
        self.interp = Interpreter(self.module, self.library, run_program=lambda p, a, s: self.run_program(p, a, s),
                                  call_py_func=self._call_py_func)
        for name in self.module.graph_functions():
            if name in _RESERVED:
                raise ValueError(f"graph function {name!r} would hide BasePyModule.{name}; rename it")
            if not callable(getattr(type(self), name, None)):  # a Python method of that name wins
                setattr(self, name, self._graph_method(name))

    def _graph_method(self, name: str) -> Callable:
        def run(*args):
            return to_torch(self.interp.run(name, *to_numpy(args)))

        run.__name__ = run.__qualname__ = name
        run.__doc__ = f"Graph function {name} of the module, on torch tensors (runs in the interpreter)."
        return run

    def _call_py_func(self, name: str, args: list) -> Any:
        return to_numpy(getattr(self, name)(*to_torch(tuple(args))))

    # ---- cross-level calls from Python ----------------------------------------------------------
    def call_tir(self, program: str, args: Sequence, out, dtype: str | Sequence[str] = "float32",
                 sym_args: Sequence[int] = ()):
        """Run the tensor program `program` on `args` (torch tensors) into new outputs and return them.

        `out` is an output shape (with `dtype`), a list of shapes for several outputs (`dtype` one
        string or one per output), or an annotation with constant dimensions. Shape arguments (tuples
        of ints) among `args` are skipped, as in the graph-level call_tir."""
        prog = self.module.functions.get(program)
        if not isinstance(prog, TensorProgram):
            raise KeyError(f"call_tir: {program!r} is not a tensor program of the module")
        specs, many = _out_specs(out, dtype)
        ins = [to_numpy(a) for a in args if not _is_shape(a)]
        outs = [np.zeros(shape, NP_DTYPES[dt]) for shape, dt in specs]
        self.run_program(prog, ins + outs, [int(s) for s in sym_args])
        res = [to_torch(o) for o in outs]
        return tuple(res) if many else res[0]

    def call_dps_library(self, name: str, args: Sequence, out, dtype: str | Sequence[str] = "float32"):
        """Run the library function `name` (numpy, destination-passing) on `args` into new outputs."""
        if name not in self.library:
            raise KeyError(f"library function {name!r} is not available; pass it with library={{...}}")
        specs, many = _out_specs(out, dtype)
        outs = [np.zeros(shape, NP_DTYPES[dt]) for shape, dt in specs]
        self.library[name](*(to_numpy(a) for a in args), *outs)
        res = [to_torch(o) for o in outs]
        return tuple(res) if many else res[0]

    def call_op(self, op: str, *args, **attrs):
        """Run a registered high-level op by its numpy reference (the printer's form for an op that has
        no torch spelling)."""
        return to_torch(op_registry.get(op).reference(*to_numpy(args), **attrs))


_RESERVED = frozenset(n for n in dir(BasePyModule) if not n.startswith("__")) | {
    "device_kind", "library", "module", "run_program", "target", "interp"}


def _compile(mod: IRModule, device: str, preset: str | None):
    """(module with programs scheduled for the device, run_program, target)."""
    from .ir.tir_interp import run_program

    if device == "host":
        return mod, run_program, None
    from . import presets
    from .ir.kernel import scheduled
    from .kernel_runner import KernelRunner
    from .runtime.devices import open_device
    from .schedule import schedule_program

    name = preset or DEFAULT_PRESETS.get(device)
    if name is None:
        raise ValueError(f"unknown device {device!r}; choose host, {', '.join(DEFAULT_PRESETS)}")
    target = presets.load(name).target
    if target.kind != device:
        raise ValueError(f"preset {name} targets {target.kind}, not {device}")
    compiled = mod.with_functions({n: f if not isinstance(f, TensorProgram) or scheduled(f) is not None
                                   else schedule_program(f, target) for n, f in mod.functions.items()})
    return compiled, KernelRunner(open_device(device), target), target


def _is_shape(a) -> bool:
    return isinstance(a, tuple) and all(isinstance(x, (int, np.integer)) for x in a)


def _out_specs(out, dtype) -> tuple[list[tuple[tuple[int, ...], str]], bool]:
    """Output (shape, dtype) pairs, and whether the call returns a tuple."""
    if isinstance(out, A.Annotation):
        fields = list(out.fields) if isinstance(out, A.TupleAnn) else [out]
        specs = []
        for f in fields:
            if not isinstance(f, A.TensorAnn) or f.shape is None or not all(d.is_const for d in f.shape):
                raise ValueError(f"an output annotation from Python needs constant dimensions, got {A.to_text(f)}; "
                                 f"pass the shape instead")
            specs.append((tuple(sym.as_expr(d).value for d in f.shape), f.dtype))
        return specs, isinstance(out, A.TupleAnn)
    many = isinstance(out, list) and len(out) > 0 and not isinstance(out[0], (int, np.integer))
    shapes = [tuple(int(d) for d in s) for s in out] if many else [tuple(int(d) for d in out)]
    dtypes = [dtype] * len(shapes) if isinstance(dtype, str) else list(dtype)
    if len(dtypes) != len(shapes):
        raise ValueError(f"{len(shapes)} outputs but {len(dtypes)} dtypes")
    return list(zip(shapes, dtypes)), many


# ---- the KV cache and weights a printed module runs with (deploycc.topython) ----------------------

class TorchKVCache:
    """The KV cache of printed Python: per layer, keys and values [capacity, kv_heads, head_dim] in torch
    (the contract of deploycc.op.attention.RefKVCache: `begin` reserves positions, `append` fills them)."""

    def __init__(self, layers: int, capacity: int, kv_heads: int, head_dim: int, dtype=None):
        import torch

        dtype = dtype or torch.float32
        self.capacity = capacity
        self.k = torch.zeros(layers, capacity, kv_heads, head_dim, dtype=dtype)
        self.v = torch.zeros(layers, capacity, kv_heads, head_dim, dtype=dtype)
        self.length = 0

    @classmethod
    def for_model(cls, model, capacity: int | None = None) -> TorchKVCache:
        """A cache for a deploycc.hub.LoadedModel, `capacity` tokens (default: its context window)."""
        cfg = model.config
        return cls(cfg.num_hidden_layers, capacity or cfg.context_window, cfg.num_key_value_heads, cfg.head_dim)

    def begin(self, n: int) -> int:
        """Reserve `n` new positions; return the new total length."""
        from .op.attention import ContextOverflow

        if self.length + n > self.capacity:
            raise ContextOverflow(f"{self.length} cached + {n} new tokens exceed the cache's {self.capacity}")
        self.length += int(n)
        return self.length

    def append(self, layer: int, k, v, rows: int = 0) -> TorchKVCache:
        """Write a layer's keys and values [n, kv_heads, head_dim] into the n reserved positions (in a ring
        of `rows` rows: position j at row j % rows)."""
        import torch

        at = torch.arange(self.length - k.shape[0], self.length)
        at = at % rows if rows else at
        self.k[layer, at] = k
        self.v[layer, at] = v
        return self

    def keys(self, layer: int, rows: int = 0):
        return self.k[layer, : rows or self.length]

    def values(self, layer: int, rows: int = 0):
        return self.v[layer, : rows or self.length]

    def reset(self) -> None:
        self.length = 0


def torch_weights(model, mod: IRModule | None = None) -> list:
    """A deploycc.hub.LoadedModel's weights as torch tensors, in the order of the graph functions'
    parameters after (input_ids, cache): those of `mod` when given (a module from the legalized stage on
    has merged linears, transform/merge_matmuls.py), else the exported module's. Read-only
    (memory-mapped) arrays are copied."""
    from .transform.merge_matmuls import function_params

    arrays = [a for _, a in model.params()] if mod is None else function_params(mod, model.params(), "prefill")
    return [to_torch(np.ascontiguousarray(a, np.float32)) for a in arrays]
