"""llama.cpp's block formats kept as stored (no re-quantization): Q4_0, Q4_1, Q8_0 (below), and the formats of
LAYOUTS (StoredScheme, gguf_stored.py): Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.

Every block covers 32 consecutive values of a row (the input dimension), as our group schemes do:

    Q4_0  (18 bytes): f16 d, 16 bytes of nibbles;  w = (q - 8) * d
    Q4_1  (20 bytes): f16 d, f16 m, 16 bytes;      w = q * d + m
    Q8_0  (34 bytes): f16 d, 32 int8;              w = q * d

Value j of a 4-bit block is the low nibble of byte j for j < 16 and the high nibble of byte j - 16
otherwise. The stored blocks are split into parameters the kernels load directly: `q_weight`, the
code bytes of each row reinterpreted as little-endian uint32 words (4 words per Q4 block, 8 per Q8
block), `q_scale` (f16 d per block) and, for Q4_1, `q_min` (f16 m). The dequantize program does the
same float32 arithmetic as `gguf.quants.dequantize`, so both give identical values; Q8_0's signed
bytes are read as `b - 256 * (b >> 7)`.

`GGUFModel` is a LoadedModel from a GGUF file seen with its block-quantized tensors kept packed:
each nn.Linear / nn.Embedding whose GGUF tensor is in one of these formats is swapped for the
quantized module with that format's scheme (formats may differ tensor by tensor); everything else
(F32/F16/BF16 and formats without a scheme here) loads as float32, the q0 path.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..errors import DeployError
from ..ir import tir
from ..loaded import transformed
from .base import QuantizedEmbedding, QuantizedLinear, Scheme, mark_activations
from .gguf_stored import (
    INTERLEAVED_K,
    INTERLEAVED_Q5,
    LAYOUTS,
    PARAM_ORDER,
    QK_K,
    STORED,
    InterleavedK,
    InterleavedQ5,
    StoredScheme,
)
from .group import InterleavedScheme, pack_codes
from .schemes import INTERLEAVED, QUANTIZATION

__all__ = ["BLOCK_SCHEMES", "CONVERT_TO", "FLOAT_TYPES", "GGUFBlockScheme", "GGUFModel", "INTERLEAVED_K", "INTERLEAVED_Q5",
           "LAYOUTS", "PARAM_ORDER", "QK_K", "InterleavedK", "InterleavedQ5", "StoredScheme", "keep_blocks"]

BLOCK = 32


@dataclass(frozen=True)
class GGUFBlockScheme(Scheme):
    qtype: str = "Q4_0"  # the GGMLQuantizationType name

    @property
    def bits(self) -> int:
        return 8 if self.qtype == "Q8_0" else 4

    @property
    def words_per_block(self) -> int:
        return BLOCK * self.bits // 32

    @property
    def header(self) -> int:  # bytes of f16 values before the codes
        return 4 if self.qtype == "Q4_1" else 2

    @property
    def block_bytes(self) -> int:
        return self.header + BLOCK * self.bits // 8

    def _blocks(self, cols: int) -> int:
        if cols % BLOCK:
            raise DeployError(f"{self.qtype} needs rows of whole 32-value blocks, got {cols} columns")
        return cols // BLOCK

    def param_shapes(self, rows: int, cols: int):
        nb = self._blocks(cols)
        shapes = {"q_weight": ((rows, nb * self.words_per_block), "uint32"), "q_scale": ((rows, nb), "float16")}
        if self.qtype == "Q4_1":
            shapes["q_min"] = ((rows, nb), "float16")
        return shapes

    def from_blocks(self, raw: np.ndarray) -> dict[str, np.ndarray]:
        """The stored bytes (uint8 [rows, blocks * block_bytes]) split into the packed parameters."""
        rows = raw.shape[0]
        b = np.ascontiguousarray(raw, np.uint8).reshape(rows, -1, self.block_bytes)
        out = {"q_weight": np.ascontiguousarray(b[:, :, self.header:]).view("<u4").astype(np.uint32).reshape(rows, -1),
               "q_scale": np.ascontiguousarray(b[:, :, 0:2]).view(np.float16).reshape(rows, -1)}
        if self.qtype == "Q4_1":
            out["q_min"] = np.ascontiguousarray(b[:, :, 2:4]).view(np.float16).reshape(rows, -1)
        return out

    @property
    def group_scheme(self) -> str:
        """Our group scheme with exactly this format's values (GroupScheme: (code - 8) * d, code * d + m,
        (code - 128) * d with f16 d and m per 32): only the byte layout differs."""
        return {"Q4_0": "q4f16_1", "Q4_1": "q4f16_2", "Q8_0": "q8f16_0"}[self.qtype]

    def to_group(self, raw: np.ndarray) -> dict[str, np.ndarray]:
        """The stored bytes moved, value for value, into group_scheme's packed parameters."""
        rows = raw.shape[0]
        b = np.ascontiguousarray(raw, np.uint8).reshape(rows, -1, self.block_bytes)
        qs = b[:, :, self.header:]
        if self.bits == 8:
            codes = (qs.view(np.int8).astype(np.int16) + 128).astype(np.uint32)  # [rows, nb, 32]
        else:  # element j < 16: the low nibble of byte j; j >= 16: the high nibble of byte j - 16
            codes = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.uint32)
        out = {"q_weight": pack_codes(codes.reshape(rows, -1), self.bits),
               "q_scale": np.ascontiguousarray(b[:, :, 0:2]).view(np.float16).reshape(rows, -1)}
        if self.qtype == "Q4_1":
            out["q_min"] = np.ascontiguousarray(b[:, :, 2:4]).view(np.float16).reshape(rows, -1)
        return out

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """Float weights -> this format, with llama.cpp's rounding (`gguf.quants.quantize`)."""
        import gguf

        w = np.asarray(w, np.float32)
        self._blocks(w.shape[1])
        return self.from_blocks(gguf.quants.quantize(w, gguf.GGMLQuantizationType[self.qtype]))

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        words = packed["q_weight"]
        rows = words.shape[0]
        by = words.astype("<u4").view(np.uint8).reshape(rows, -1, BLOCK * self.bits // 8)
        d = packed["q_scale"].astype(np.float32)[:, :, None]
        if self.bits == 8:
            return (by.view(np.int8).astype(np.float32) * d).reshape(rows, -1)[:, :cols]
        q = np.concatenate([by & 15, by >> 4], axis=2).astype(np.float32)
        if self.qtype == "Q4_0":
            w = d * (q - 8)
        else:
            w = d * q + packed["q_min"].astype(np.float32)[:, :, None]
        return w.reshape(rows, -1)[:, :cols]

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        blk, j = c // BLOCK, c % BLOCK
        d = tir.cast("float32", bufs[1][r, blk])
        if self.bits == 8:
            word = bufs[0][r, blk * 8 + j // 4]
            b = tir.bitwise("bitand", tir.bitwise("shr", word, tir.cast("uint32", tir.index((j % 4) * 8))), 255)
            signed = tir.cast("float32", b) - tir.cast("float32", tir.bitwise("shr", b, 7)) * 256.0
            return signed * d
        byte = j % 16
        word = bufs[0][r, blk * 4 + byte // 4]
        shift = tir.cast("uint32", tir.index((byte % 4) * 8 + (j // 16) * 4))
        code = tir.cast("float32", tir.bitwise("bitand", tir.bitwise("shr", word, shift), 15))
        if self.qtype == "Q4_0":
            return d * (code - 8.0)
        return d * code + tir.cast("float32", bufs[2][r, blk])


FLOAT_TYPES = ("F32", "F16", "BF16", "F64")  # kept as float: F16 as halves (q0f16), the others as float32
CONVERT_TO = "Q8_0"  # a quantized type without kernels here (IQ2_*, IQ3_*, IQ1_*, TQ*, MXFP4) is re-quantized to it

BLOCK_SCHEMES: dict[str, Scheme] = {
    **{q: GGUFBlockScheme(f"gguf_{q.lower()}", qtype=q) for q in ("Q4_0", "Q4_1", "Q8_0")},
    **STORED,
}


@dataclass
class GGUFModel:
    """A GGUF LoadedModel with its Q4_0/Q4_1/Q8_0 tensors kept in their block formats, or, with `groups`,
    with exactly their values in our group schemes (the cpu target's integer kernels read those; with
    `interleave`, the linears whose shapes allow it in the interleaved layout)."""

    base: object
    groups: bool = False
    interleave: bool = False
    activations: int | dict | None = None  # rounded activations (base.mark_activations)
    _module: object = field(default=None, repr=False)
    _schemes: dict = field(default=None, repr=False)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def _scheme_of(self, ours: str, module=None) -> Scheme | None:
        hf, transform = self.base.checkpoint_name(ours)
        if transform is not None or hf not in self.base.weights:
            return None
        block = BLOCK_SCHEMES.get(self._stored_as(hf))
        if block is None:
            return QUANTIZATION["q0f16"] if self.base.weights.qtype(hf) == "F16" else None
        # a linear's rows, or an embedding's (a tied output head is a linear of its table: the interleaved layouts'
        # lookup splits a gathered row by shifts)
        shape = ((module.out_features, module.in_features) if isinstance(module, nn.Linear)
                 else tuple(module.weight.shape) if isinstance(module, nn.Embedding) else None)
        for table in (INTERLEAVED_Q5, INTERLEAVED_K):  # the file's bytes, 16 rows interleaved
            if self.interleave and shape and block.qtype in table and table[block.qtype].fits(*shape):
                return table[block.qtype]
        if not (self.groups and isinstance(block, GGUFBlockScheme)):
            return block
        name = block.group_scheme
        if self.interleave and shape and name in INTERLEAVED and INTERLEAVED[name].fits(*shape):
            return INTERLEAVED[name]
        return QUANTIZATION[name]

    def _stored_as(self, hf: str) -> str:
        """The block format a weight is kept in: its own, or for a quantized type without kernels here the
        conversion rule's (CONVERT_TO: re-quantized from its dequantized values, `conversions` says so)."""
        qtype = self.base.weights.qtype(hf)
        if qtype in BLOCK_SCHEMES or qtype in FLOAT_TYPES:
            return qtype
        cols = self.base.weights.shape(hf)[-1]
        return CONVERT_TO if len(self.base.weights.shape(hf)) == 2 and cols % BLOCK == 0 else "F32"

    def weight_report(self) -> list[dict]:
        """Per stored type of the file: tensors, their bytes in the file and in the package, and what they become
        (`kept`, or the format or dtype a conversion rule turns them into); the package's other tensors (the
        float32 norms a GGUF stores as F32 too) under their own type."""
        self.build()
        stored = {hf: name for name, hf, transform in self.base._sources()
                  if transform is None and hf in self.base.weights}
        kept = {self.base.checkpoint_name(n)[0]: s for n, s in self._schemes.items()}
        rows: dict[tuple[str, str], dict] = {}
        for hf, t in self.base.weights.tensors.items():
            if hf not in stored:
                continue
            qtype, shape = t.tensor_type.name, self.base.weights.shape(hf)
            scheme = kept.get(hf)
            if scheme is not None:
                size = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in scheme.param_shapes(*shape).values())
                into = "kept" if self._stored_as(hf) == qtype else self._stored_as(hf)
            else:
                size, into = int(np.prod(shape)) * 4, "kept" if qtype == "F32" else "F32"
            row = rows.setdefault((qtype, into), {"type": qtype, "into": into, "tensors": 0, "file_bytes": 0,
                                                  "package_bytes": 0})
            row["tensors"] += 1
            row["file_bytes"] += int(t.n_bytes)
            row["package_bytes"] += size
        return sorted(rows.values(), key=lambda r: -r["file_bytes"])

    def build(self):
        if self._module is None:
            self._schemes = {}
            self._module = self._swap(self.base.arch.Model(self.base.config), "")
            mark_activations(self._module, self.activations)
        return self._module

    def _swap(self, module, prefix: str):
        for name, value in list(vars(module).items()):
            if isinstance(value, (nn.Linear, nn.Embedding)):
                scheme = self._scheme_of(f"{prefix}{name}.weight", value)
                if scheme is not None:
                    cls = QuantizedLinear if isinstance(value, nn.Linear) else QuantizedEmbedding
                    setattr(module, name, cls(value, scheme))
                    self._schemes[f"{prefix}{name}.weight"] = scheme
            elif isinstance(value, nn.Module):
                self._swap(value, f"{prefix}{name}.")
        return module

    def quantized_names(self) -> dict[str, Scheme]:
        self.build()
        return dict(self._schemes)

    def params(self) -> Iterator[tuple[str, np.ndarray]]:
        schemes = self.quantized_names()
        for name, hf, transform in self.base._sources():
            if name in schemes:
                prefix = name[: -len(".weight")]
                scheme, qtype = schemes[name], self._stored_as(hf)
                block = BLOCK_SCHEMES.get(qtype)
                if block is None:  # F16 kept as halves (q0f16)
                    for suffix, arr in scheme.quantize(self.base.weights.read(hf)).items():
                        yield f"{prefix}.{suffix}", arr
                    continue
                if qtype != self.base.weights.qtype(hf):  # the conversion rule
                    import gguf

                    raw = gguf.quants.quantize(self.base.weights.read(hf), gguf.GGMLQuantizationType[qtype])
                else:
                    raw = self.base.weights.raw(hf)
                if scheme is block:  # kept as stored (K-quants always)
                    packed = scheme.from_blocks(raw)
                elif isinstance(scheme, (InterleavedQ5, InterleavedK)):  # the same bytes, 16 rows interleaved
                    packed = scheme.interleave(block.from_blocks(raw))
                else:  # moved into our group layout, value for value
                    packed = block.to_group(raw)
                    if isinstance(scheme, InterleavedScheme):
                        packed = scheme.interleave(packed, packed["q_scale"].shape[1] * BLOCK)
                for suffix, arr in packed.items():
                    yield f"{prefix}.{suffix}", arr
            else:
                arr = self.base.weights.read(hf)
                yield name, transformed(arr, transform)


def keep_blocks(model, groups: bool = False, interleave: bool = False, activations=None) -> GGUFModel:
    if not hasattr(model.weights, "raw"):
        raise DeployError("quantization 'gguf' keeps a GGUF file's block formats; the model was not loaded from a .gguf")
    return GGUFModel(model, groups, interleave, activations)
