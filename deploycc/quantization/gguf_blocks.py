"""llama.cpp's block formats kept as stored (no re-quantization): Q4_0, Q4_1, Q8_0, Q4_K, Q6_K.

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
from ..hub import transformed
from ..ir import tir
from .base import QuantizedEmbedding, QuantizedLinear, Scheme, mark_activations, plain_layout
from .group import InterleavedScheme, pack_codes

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


# ---- K-quants: super-blocks of 256 values ------------------------------------------------------

QK_K = 256


def _byte(buf: tir.Buffer, r, i) -> tir.V:
    """Byte `i` (an index expression) of row `r` of a uint32 buffer holding little-endian bytes."""
    return tir.bitwise("bitand", tir.bitwise("shr", buf[r, i // 4], tir.cast("uint32", tir.index((i % 4) * 8))), 255)


def _u32(x) -> tir.V:
    return tir.cast("uint32", tir.index(x))


def _words(b: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(b).view("<u4").astype(np.uint32).reshape(rows, -1)


@dataclass(frozen=True)
class KQuantScheme(Scheme):
    """Q4_K (144 bytes per 256 values: f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales and mins,
    128 bytes of nibbles; w = d*sc[s] * q - dmin*m[s]) and Q6_K (210 bytes: 128 bytes of low
    nibbles, 64 of high 2-bit pairs, 16 int8 sub-block scales, f16 d; w = d*sc[v//16] * (q - 32)).
    Parameters: `q_weight` (the nibbles as uint32), `q_high` (Q6_K's 2-bit pairs), `q_sub` (the
    packed sub-block scales as uint32, unpacked in the kernel), `q_scale` (d) and `q_min` (dmin)."""

    qtype: str = "Q4_K"

    @property
    def block_bytes(self) -> int:
        return 144 if self.qtype == "Q4_K" else 210

    def _blocks(self, cols: int) -> int:
        if cols % QK_K:
            raise DeployError(f"{self.qtype} needs rows of whole 256-value super-blocks, got {cols} columns")
        return cols // QK_K

    def param_shapes(self, rows: int, cols: int):
        nb = self._blocks(cols)
        if self.qtype == "Q4_K":
            return {"q_weight": ((rows, nb * 32), "uint32"), "q_sub": ((rows, nb * 3), "uint32"),
                    "q_scale": ((rows, nb), "float16"), "q_min": ((rows, nb), "float16")}
        return {"q_weight": ((rows, nb * 32), "uint32"), "q_high": ((rows, nb * 16), "uint32"),
                "q_sub": ((rows, nb * 4), "uint32"), "q_scale": ((rows, nb), "float16")}

    def from_blocks(self, raw: np.ndarray) -> dict[str, np.ndarray]:
        rows = raw.shape[0]
        b = np.ascontiguousarray(raw, np.uint8).reshape(rows, -1, self.block_bytes)
        half = lambda x: np.ascontiguousarray(x).view(np.float16).reshape(rows, -1)  # noqa: E731
        if self.qtype == "Q4_K":
            return {"q_weight": _words(b[:, :, 16:], rows), "q_sub": _words(b[:, :, 4:16], rows),
                    "q_scale": half(b[:, :, 0:2]), "q_min": half(b[:, :, 2:4])}
        return {"q_weight": _words(b[:, :, :128], rows), "q_high": _words(b[:, :, 128:192], rows),
                "q_sub": _words(b[:, :, 192:208], rows), "q_scale": half(b[:, :, 208:210])}

    def to_blocks(self, packed: dict[str, np.ndarray]) -> np.ndarray:
        rows = packed["q_weight"].shape[0]
        by = lambda k, n: packed[k].astype("<u4").view(np.uint8).reshape(rows, -1, n)  # noqa: E731
        hf = lambda k: packed[k].astype(np.float16).view(np.uint8).reshape(rows, -1, 2)  # noqa: E731
        if self.qtype == "Q4_K":
            parts = [hf("q_scale"), hf("q_min"), by("q_sub", 12), by("q_weight", 128)]
        else:
            parts = [by("q_weight", 128), by("q_high", 64), by("q_sub", 16), hf("q_scale")]
        return np.concatenate(parts, axis=2).reshape(rows, -1)

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        raise DeployError(f"{self.qtype} tensors are imported from GGUF files as stored; quantizing to it is not supported")

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        """The numpy reference (the same arithmetic as gguf.quants, written out per value)."""
        rows = packed["q_weight"].shape[0]
        raw = self.to_blocks(packed).reshape(rows, -1, self.block_bytes)
        v = np.arange(QK_K)
        if self.qtype == "Q4_K":
            d = raw[:, :, 0:2].copy().view(np.float16).astype(np.float32)
            dmin = raw[:, :, 2:4].copy().view(np.float16).astype(np.float32)
            sc, qs = raw[:, :, 4:16].astype(np.uint32), raw[:, :, 16:].astype(np.uint32)
            s = v // 32
            h, k = s // 4, s % 4
            scale = (sc[:, :, k + 8 * h] & (63 - 48 * h)) | ((sc[:, :, k] >> 2) & (48 * h))
            mins = ((sc[:, :, k + 4 + 4 * h] >> (4 * h)) & (63 - 48 * h)) | ((sc[:, :, k + 4] >> 2) & (48 * h))
            q = (qs[:, :, (s // 2) * 32 + v % 32] >> (4 * (s % 2))) & 15
            w = (d * scale.astype(np.float32)) * q.astype(np.float32) - dmin * mins.astype(np.float32)
        else:
            ql, qh = raw[:, :, :128].astype(np.int32), raw[:, :, 128:192].astype(np.int32)
            sc = raw[:, :, 192:208].copy().view(np.int8).astype(np.float32)
            d = raw[:, :, 208:210].copy().view(np.float16).astype(np.float32)
            hv = v // 128
            lo = (ql[:, :, hv * 64 + v % 64] >> (4 * ((v % 128) // 64))) & 15
            hi = (qh[:, :, hv * 32 + v % 32] >> (2 * ((v % 128) // 32))) & 3
            w = (d * sc[:, :, v // 16]) * ((lo | (hi << 4)) - 32).astype(np.float32)
        return w.reshape(rows, -1)[:, :cols]

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        blk, v = c // QK_K, c % QK_K
        if self.qtype == "Q4_K":
            qw, sub, d, dmin = bufs
            s = v // 32
            h, k = s // 4, s % 4
            sb = lambda i: _byte(sub, r, blk * 12 + i)  # noqa: E731
            scale = tir.bitwise("bitor", tir.bitwise("bitand", sb(k + 8 * h), _u32(63 - 48 * h)),
                                tir.bitwise("bitand", tir.bitwise("shr", sb(k), 2), _u32(48 * h)))
            mins = tir.bitwise("bitor",
                               tir.bitwise("bitand", tir.bitwise("shr", sb(k + 4 + 4 * h), _u32(4 * h)), _u32(63 - 48 * h)),
                               tir.bitwise("bitand", tir.bitwise("shr", sb(k + 4), 2), _u32(48 * h)))
            q = tir.bitwise("bitand", tir.bitwise("shr", _byte(qw, r, blk * 128 + (s // 2) * 32 + v % 32),
                                                  _u32(4 * (s % 2))), 15)
            ds = tir.cast("float32", d[r, blk]) * tir.cast("float32", scale)
            dm = tir.cast("float32", dmin[r, blk]) * tir.cast("float32", mins)
            return ds * tir.cast("float32", q) - dm
        qw, qh, sub, d = bufs
        hv = v // 128
        lo = tir.bitwise("bitand", tir.bitwise("shr", _byte(qw, r, blk * 128 + hv * 64 + v % 64),
                                               _u32(4 * ((v % 128) // 64))), 15)
        hi = tir.bitwise("bitand", tir.bitwise("shr", _byte(qh, r, blk * 64 + hv * 32 + v % 32),
                                               _u32(2 * ((v % 128) // 32))), 3)
        q = tir.cast("float32", tir.bitwise("bitor", lo, tir.bitwise("shl", hi, 4))) - 32.0
        b = _byte(sub, r, blk * 16 + v // 16)
        sc = tir.cast("float32", b) - tir.cast("float32", tir.bitwise("shr", b, 7)) * 256.0
        return (tir.cast("float32", d[r, blk]) * sc) * q


BLOCK_SCHEMES: dict[str, Scheme] = {
    **{q: GGUFBlockScheme(f"gguf_{q.lower()}", qtype=q) for q in ("Q4_0", "Q4_1", "Q8_0")},
    **{q: KQuantScheme(f"gguf_{q.lower()}", qtype=q) for q in ("Q4_K", "Q6_K")},
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
        block = BLOCK_SCHEMES.get(self.base.weights.qtype(hf))
        if not (self.groups and isinstance(block, GGUFBlockScheme)):
            return block
        from . import INTERLEAVED, QUANTIZATION

        name = block.group_scheme
        if (self.interleave and isinstance(module, nn.Linear) and name in INTERLEAVED
                and INTERLEAVED[name].fits(module.out_features, module.in_features)
                and not plain_layout(self.activations, ours[: -len(".weight")])):
            return INTERLEAVED[name]
        return QUANTIZATION[name]

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
                scheme, raw = schemes[name], self.base.weights.raw(hf)
                block = BLOCK_SCHEMES[self.base.weights.qtype(hf)]
                if scheme is block:  # kept as stored (K-quants always)
                    packed = scheme.from_blocks(raw)
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
