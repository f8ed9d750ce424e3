"""What every scheme shares: the quantized modules, the module swap and the call_tir helper."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import nn
from ..ir import annotation as A
from ..ir import sym, tir
from ..ir.expr import CallTIR
from ..nn import op
from ..nn.core import Parameter, Tensor, as_tensor


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme. Subclasses give the packed parameter shapes, the numpy converter
    (float32 [rows, cols] -> packed tensors by suffix), the numpy dequantizer (the reference) and
    the dequantize tensor program (the same arithmetic at loop level)."""

    name: str

    def param_shapes(self, rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], str]]:
        raise NotImplementedError

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        raise NotImplementedError

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        """The dequantized weight at (r, c) read from the packed buffers, as a loop-level value."""
        raise NotImplementedError

    def buffers(self, rows: int, cols: int) -> list[tir.Buffer]:
        return [tir.Buffer(n, shape, dtype) for n, (shape, dtype) in self.param_shapes(rows, cols).items()]

    def program(self, rows: int, cols: int) -> tir.TensorProgram:
        """`w[r, c] = dequantized weight`: the prologue that fuse_ops folds into a linear."""
        bufs, out = self.buffers(rows, cols), tir.Buffer("w", (rows, cols), "float32")
        its = tir.iters("r c", (rows, cols))
        r, c = (tir.v(i) for i in its)
        body = tir.Block("dequantize", its, tir.Store(out, (r, c), self.value(bufs, r, c)))
        return tir.TensorProgram(f"dequantize_{self.name}", (*bufs, out), body, attrs={
            "op": "dequantize", "scheme": self.name, "rows": rows, "cols": cols})

    def take_program(self, rows: int, cols: int, ndim: int) -> tir.TensorProgram:
        """`out[..., c] = dequantized weight[ids[...], c]` for ids of rank `ndim`: the lookup reads
        packed rows directly. Written by hand, as MLC's fuse_dequantize_take does, because
        fuse_tensor does not inline a producer into a data-dependent (gather) index."""
        bufs = self.buffers(rows, cols)
        dims = [sym.var(f"n{k}") for k in range(ndim)]  # bound by the ids buffer at the call
        ids, out = tir.Buffer("ids", dims, "int32"), tir.Buffer("out", (*dims, cols), "float32")
        its = tir.iters(" ".join([f"i{k}" for k in range(ndim)] + ["c"]), (*dims, cols))
        *idx, c = (tir.v(it) for it in its)
        body = tir.Block("take", its, tir.Store(out, (*idx, c), self.value(bufs, ids[tuple(idx)], c)))
        return tir.TensorProgram(f"take_{self.name}", (*bufs, ids, out), body)

    @property
    def swaps(self) -> bool:
        return True

    def integer_activations(self, rows: int, cols: int) -> bool:
        """Whether the cpu target's integer kernels (schedule/qgemv.py) take a [rows, cols] weight of this scheme
        with rounded activations (op/linalg.py round_activations)."""
        return False


def call_program(prog: tir.TensorProgram, args: list[Tensor], out_shape, out_dtype: str = "float32") -> Tensor:
    """Emit `call_tir(prog, args)` into the function being traced (the program is added to the
    module, deduplicated by text): how nn code uses a tensor program that has no graph-level op."""
    tracer = args[0].tracer
    name = tracer.bb.module.add_program(prog)
    ann = A.Tensor(tuple(tracer.dim(d) for d in out_shape), out_dtype)
    return tracer.emit(CallTIR(name, tuple(a.var for a in args), ann), prog.name)


class DequantizedWeight(Parameter):
    """Stands where model code reads `layer.weight` directly (a tied or untied output head):
    each read of `.tensor` emits a fresh dequantize, so every consumer gets its own producer
    for fuse_ops to fold in (a shared producer with two consumers would stay unfused). A linear
    of it rounds its input to `activations` bits first (nn.op.linear), as its kernels do."""

    def __init__(self, owner):
        self.owner = owner
        self.shape = owner.shape
        self.dtype = "float32"
        self.activations = owner.activations
        self.site = owner.site

    @property
    def tensor(self) -> Tensor:
        return self.owner.dequantize()

    @tensor.setter
    def tensor(self, value):  # Module.export resets parameters; this one holds no state
        pass


class _Quantized(nn.Module):
    activations: int | None = None  # bits the integer kernels round a linear's input to (mark_activations)
    site = ""  # this module's name, which the rounding of its input carries (calibration reads it)

    def _init_params(self, scheme: Scheme, rows: int, cols: int):
        self.shape = (rows, cols)
        self.scheme = scheme
        for suffix, (shape, dtype) in scheme.param_shapes(rows, cols).items():
            setattr(self, suffix, Parameter(shape, dtype))

    def _packed(self) -> list[Parameter]:
        return [getattr(self, s) for s in self.scheme.param_shapes(*self.shape)]

    def dequantize(self) -> Tensor:
        prog = self.scheme.program(*self.shape)
        return call_program(prog, [as_tensor(p) for p in self._packed()], self.shape)

    @property
    def weight(self) -> DequantizedWeight:
        return DequantizedWeight(self)


class QuantizedLinear(_Quantized):
    def __init__(self, linear: nn.Linear, scheme: Scheme):
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._init_params(scheme, linear.out_features, linear.in_features)
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        return op.linear(x, self.weight, self.bias)


class QuantizedEmbedding(_Quantized):
    def __init__(self, emb: nn.Embedding, scheme: Scheme):
        self._init_params(scheme, *emb.weight.shape)

    def forward(self, ids: Tensor) -> Tensor:
        prog = self.scheme.take_program(*self.shape, ids.ndim)
        args = [as_tensor(p) for p in self._packed()] + [ids]
        return call_program(prog, args, (*ids.shape, self.shape[1]))


HEAD_LINEARS = ("lm_head",)


def quantized_modules(module: nn.Module, prefix: str = ""):
    """(name, module) of every quantized linear and embedding below `module`, in attribute order."""
    for name, value in vars(module).items():
        if isinstance(value, (QuantizedLinear, QuantizedEmbedding)):
            yield f"{prefix}{name}", value
        elif isinstance(value, nn.Module):
            yield from quantized_modules(value, f"{prefix}{name}.")


def mark_activations(module: nn.Module, activations: int | dict[str, int] | None) -> dict[str, int]:
    """Say which quantized weights are multiplied with rounded activations, and to how many bits: `activations`
    bits for every weight whose scheme and shape the integer kernels take, or exactly the {module name: bits} given
    (a package's record: its manifest). An embedding's bits apply where it serves as a tied output head. Returns
    what was marked: {module name: bits}."""
    marked = {}
    for name, m in quantized_modules(module):
        eligible = m.scheme.integer_activations(*m.shape)
        bits = activations.get(name) if isinstance(activations, dict) else activations if eligible else None
        if bits and not eligible:
            raise ValueError(f"{name}: integer kernels do not take a {m.scheme.name} weight of shape "
                             f"{list(m.shape)}; it cannot have rounded activations")
        m.activations = bits or None
        m.site = name
        if bits:
            marked[name] = bits
    if isinstance(activations, dict) and set(activations) - set(marked):
        raise ValueError(f"no quantized weight named {sorted(set(activations) - set(marked))[0]}")
    return marked


def swap_modules(module: nn.Module, scheme: Scheme, head: Scheme | None = None,
                 wide: dict[str, Scheme] | None = None, prefix: str = "") -> nn.Module:
    """Replace every nn.Linear / nn.Embedding below `module` (in place) with its quantized form.
    Embeddings (and with them a tied output head) and an untied `lm_head` take `head` when given
    (None: `scheme`); a `head` that does not swap (q0f32) leaves them in float. `wide` (scheme name -> the
    cpu target's interleaved layout of that scheme, quantization.INTERLEAVED): every weight whose scheme has one
    takes it where the shape allows (InterleavedScheme.fits); its kernels take 8- and 16-bit activations alike,
    and an embedding's lookup reads it too (a tied output head then runs the interleaved kernels)."""
    head = head or scheme

    def layout(s: Scheme, rows: int, cols: int) -> Scheme:
        w = (wide or {}).get(s.name)
        return w if w is not None and w.fits(rows, cols) else s

    for name, value in list(vars(module).items()):
        if isinstance(value, nn.Linear):
            s = layout(head if name in HEAD_LINEARS else scheme, value.out_features, value.in_features)
            if s.swaps:
                setattr(module, name, QuantizedLinear(value, s))
        elif isinstance(value, nn.Embedding):
            s = layout(head, *value.weight.shape)
            if s.swaps:
                setattr(module, name, QuantizedEmbedding(value, s))
        elif isinstance(value, nn.Module):
            swap_modules(value, scheme, head, wide, f"{prefix}{name}.")
    return module
