"""Weight quantization: each scheme is a module swap, a weight-name map and a per-tensor converter.

    scheme = QUANTIZATION["q4f16_1"]
    qmodel = quantize(load_model(path), "q4f16_1")   # .build() -> swapped nn module, .params() -> packed

A quantized `nn.Linear` / `nn.Embedding` keeps its packed weight and scales as Parameters
(`<name>.q_weight`, `<name>.q_scale`, `<name>.q_min`) and, in its forward, emits a hand-written
dequantize tensor program through `call_tir` (no graph-level op) followed by the ordinary
`linear` / `take`; fuse_ops and fuse_tensor fold the dequantize into that consumer as a prologue,
so the kernels read packed weights directly (Relax paper, Figure 9). Schemes follow MLC-LLM
(`quantization/group_quantization.py`): group along the input (last) dimension.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..errors import DeployError
from .base import Scheme, mark_activations, quantized_modules, swap_modules
from .gguf_blocks import BLOCK_SCHEMES, INTERLEAVED_K, INTERLEAVED_Q5, GGUFBlockScheme, GGUFModel, keep_blocks
from .group import GroupScheme, InterleavedScheme
from .none import NoQuantize, StoreHalf
from .schemes import INTERLEAVED, QUANTIZATION


def scheme_by_name(name: str) -> Scheme:
    """A scheme by its `name` (what a dequantize program's attrs record): ours or a GGUF block format."""
    for s in (*QUANTIZATION.values(), *INTERLEAVED.values(), *BLOCK_SCHEMES.values(), *INTERLEAVED_Q5.values(),
              *INTERLEAVED_K.values()):
        if s.name == name:
            return s
    raise KeyError(f"no quantization scheme named {name}")


def get(name: str) -> Scheme:
    if name not in QUANTIZATION:
        raise DeployError(f"unknown quantization {name}; supported: {', '.join(QUANTIZATION)}")
    return QUANTIZATION[name]


@dataclass
class QuantizedModel:
    """A LoadedModel seen through a scheme: `build()` is the swapped module, `params()` yields the
    converted tensors one checkpoint tensor at a time (in the swapped module's export order). Every
    other attribute (config, path, hf_config, architecture, ...) is the base model's."""

    base: object
    scheme: Scheme
    head: Scheme | None = None  # embeddings and the output head (None: `scheme`)
    interleave: bool = False  # linears whose shapes allow it in INTERLEAVED's layout
    activations: int | dict | None = None  # rounded activations (base.mark_activations)
    _module: object = field(default=None, repr=False)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def build(self):
        if self._module is None:
            wide = INTERLEAVED if self.interleave else None
            self._module = swap_modules(self.base.arch.Model(self.base.config), self.scheme, self.head, wide)
            mark_activations(self._module, self.activations)
        return self._module

    def quantized_names(self) -> dict[str, Scheme]:
        """Our names of the float weights the swap replaced (`<module>.weight`), with their schemes."""
        return {f"{name}.weight": mod.scheme for name, mod in quantized_modules(self.build())}

    def params(self) -> Iterator[tuple[str, np.ndarray]]:
        names = self.quantized_names()
        for name, arr in self.base.params():
            if name in names:
                prefix = name[: -len(".weight")]
                for suffix, packed in names[name].quantize(np.asarray(arr, np.float32)).items():
                    yield f"{prefix}.{suffix}", packed
            else:
                yield name, arr


def quantize(model, name: str | None, head: str | None = None, interleave: bool = False, groups: bool = False,
             activations: int | dict | None = None):
    """`model` (a LoadedModel) under scheme `name`, its embeddings and output head under `head`
    (None: the same scheme); q0f32 (or None) with no other head returns the model itself. interleave:
    the linears, the embeddings and the head in the cpu target's interleaved layout of their scheme where it has
    one and their shape fits. groups:
    a GGUF kept as stored ("gguf") has its Q4_0/Q4_1/Q8_0 tensors moved, value for value, into
    q4f16_1/q4f16_2/q8f16_0 (what the cpu target's integer kernels read). activations: the weights whose linears
    round their input, and to how many bits (base.mark_activations: every one the integer kernels take, or a
    package's record)."""
    head_scheme = get(head) if head else None
    if (name is None or name == "q0f32") and head_scheme is None:
        get(name or "q0f32")
        return model
    if name == "gguf":  # a .gguf file's Q4_0/Q4_1/Q8_0 tensors kept as stored (quantization/gguf_blocks.py)
        if head_scheme is not None:
            raise DeployError("--head-quantization does not apply to a GGUF kept as stored; "
                              "give --quantization too to re-quantize it")
        return keep_blocks(model, groups, interleave, activations)
    return QuantizedModel(model, get(name or "q0f32"), head_scheme, interleave, activations)


__all__ = ["QUANTIZATION", "BLOCK_SCHEMES", "GGUFBlockScheme", "GGUFModel", "Scheme", "GroupScheme",
           "InterleavedScheme", "INTERLEAVED", "NoQuantize", "StoreHalf", "QuantizedModel", "get", "quantize",
           "scheme_by_name"]
