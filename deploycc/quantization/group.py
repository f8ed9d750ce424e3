"""Group quantization (MLC-LLM's `group_quantization.py`): groups of 32 consecutive values along
the input (last) dimension share a scale; codes are packed little-end first into uint32 words.

    symmetric, b bits:  scale = max|w| / (2^(b-1) - 1);  q = clip(round(w / scale) + 2^(b-1), 0, 2^b - 1)
                        w ~ (q - 2^(b-1)) * scale        (q4: +-7 steps around 8; q8: +-127 around 128)
    asymmetric, 4 bits: scale = (max - min) / 15;  q = clip(round((w - min) / scale), 0, 15)
                        w ~ q * scale + min              (scale and min per group, q_min holds min)

The codes are computed with the scale (and min) as stored, rounded to their storage dtype, so the
dequantized error is at most half a step per value. A group whose values are all zero gets scale 0
and dequantizes to exactly 0. An input dimension that is not a multiple of 32 is padded with zeros
to whole groups (the packed tensors hold ceil(cols / 32) groups); the dequantize program only
produces the `cols` real columns, so padding never reaches the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import tir
from .base import Scheme

GROUP = 32


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes [rows, n] (n a multiple of 32 // bits) packed little end first into uint32 words [rows, n * bits / 32]."""
    per = 32 // bits
    shifts = np.arange(per, dtype=np.uint32) * bits
    c = np.asarray(codes, np.uint32).reshape(codes.shape[0], -1, per)
    return np.bitwise_or.reduce(c << shifts, axis=2).astype(np.uint32)


@dataclass(frozen=True)
class GroupScheme(Scheme):
    bits: int = 4
    scale_dtype: str = "float16"
    symmetric: bool = True
    group_size: int = GROUP

    @property
    def per_word(self) -> int:
        return 32 // self.bits

    @property
    def offset(self) -> int:  # the code of 0 in the symmetric schemes
        return 1 << (self.bits - 1)

    def integer_activations(self, rows: int, cols: int) -> bool:
        """The formats of schedule/qgemv.py FORMATS: 4-bit, or 8-bit symmetric, groups of 32 with float16 scales,
        whole groups, at most 65536 inputs."""
        return (self.group_size == GROUP and self.scale_dtype == "float16" and (self.bits == 4 or self.symmetric)
                and self.bits in (4, 8) and cols % GROUP == 0 and cols <= 1 << 16)

    def param_shapes(self, rows: int, cols: int):
        groups = _ceil(cols, self.group_size)
        shapes = {"q_weight": ((rows, groups * self.group_size // self.per_word), "uint32"),
                  "q_scale": ((rows, groups), self.scale_dtype)}
        if not self.symmetric:
            shapes["q_min"] = ((rows, groups), self.scale_dtype)
        return shapes

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        w = np.asarray(w, np.float32)
        rows, cols = w.shape
        groups = _ceil(cols, self.group_size)
        padded = np.zeros((rows, groups * self.group_size), np.float32)
        padded[:, :cols] = w
        g = padded.reshape(rows, groups, self.group_size)
        top = (1 << self.bits) - 1
        sd = np.dtype(self.scale_dtype)
        if self.symmetric:
            scale = (np.abs(g).max(axis=2) / (self.offset - 1)).astype(sd)
            s32 = scale.astype(np.float32)[..., None]
            step = np.divide(g, s32, out=np.zeros_like(g), where=s32 > 0)
            q = np.clip(np.round(step) + self.offset, 0, top)
            out = {"q_scale": scale}
        else:
            # Padding must not widen a group's range: take min/max over real columns only.
            real = np.zeros_like(padded, dtype=bool)
            real[:, :cols] = True
            real = real.reshape(g.shape)
            lo = np.where(real, g, np.inf).min(axis=2)
            hi = np.where(real, g, -np.inf).max(axis=2)
            scale = ((hi - lo) / top).astype(sd)
            low = lo.astype(sd)
            s32, m32 = scale.astype(np.float32)[..., None], low.astype(np.float32)[..., None]
            step = np.divide(g - m32, s32, out=np.zeros_like(g), where=s32 > 0)
            q = np.clip(np.round(step), 0, top)
            out = {"q_scale": scale, "q_min": low}
        return {"q_weight": pack_codes(q.reshape(rows, -1), self.bits), **out}

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        words = packed["q_weight"]
        rows = words.shape[0]
        shifts = (np.arange(self.per_word, dtype=np.uint32) * self.bits)
        codes = ((words[:, :, None] >> shifts) & ((1 << self.bits) - 1)).reshape(rows, -1).astype(np.float32)
        scale = np.repeat(packed["q_scale"].astype(np.float32), self.group_size, axis=1)
        if self.symmetric:
            w = (codes - self.offset) * scale
        else:
            w = codes * scale + np.repeat(packed["q_min"].astype(np.float32), self.group_size, axis=1)
        return w[:, :cols]

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        """The dequantized weight at row `r` (an index, or an int32 value for a gather), column `c`."""
        word = bufs[0][r, c // self.per_word]
        shift = tir.cast("uint32", tir.index((c % self.per_word) * self.bits))
        code = tir.cast("float32", tir.bitwise("bitand", tir.bitwise("shr", word, shift), (1 << self.bits) - 1))
        scale = tir.cast("float32", bufs[1][r, c // self.group_size])
        if self.symmetric:
            return (code - float(self.offset)) * scale
        return code * scale + tir.cast("float32", bufs[2][r, c // self.group_size])


LANES = 16  # outputs per interleaved group: one 512-bit register of int32 sums, one output per lane


def split_index(i, n: int):
    """(i // n, i % n) for n a power of two; i an index expression or a loaded value (a row gathered by a token id,
    an embedding's: the loop-level value ops have shifts and masks, not division)."""
    if isinstance(i, tir.V):
        return tir.bitwise("shr", i, n.bit_length() - 1), tir.bitwise("bitand", i, n - 1)
    return i // n, i % n


@dataclass(frozen=True)
class InterleavedScheme(GroupScheme):
    """A group scheme's weights (4-bit, or 8-bit symmetric) in the layout the cpu target's integer kernels read
    fastest (a compile-time layout transform, chosen by the target: runtime/native.weight_interleave).

    16 output rows are interleaved so that one SIMD lane holds one output. 4-bit: for rows 16*g .. 16*g+15 and
    group b, q_weight[g, b] is 64 words in which word 16*j + l holds, byte i, the codes of row 16*g + l at
    columns 32*b + 4*j + i (low nibble) and 32*b + 4*(j + 4) + i (high nibble), j < 4. 8-bit: 128 words, word
    16*j + l holding, byte i, row 16*g + l's value at column 32*b + 4*j + i, j < 8, as a signed byte (code - 128:
    GGUF Q8_0's own bytes). q_scale[g, b, l] (and q_min) are row 16*g + l's. A kernel loads 16 outputs' 4
    consecutive codes as one vector and multiplies them by 4 activations broadcast (`vpdpbusd`, `vpmaddubsw`,
    `vpmaddwd`), so the sums of a group never need a horizontal reduction. Rows must be a multiple of 16 and
    columns of 32."""

    lanes: int = LANES

    def fits(self, rows: int, cols: int) -> bool:
        """Whether a [rows, cols] weight can take this layout (else it keeps the plain one)."""
        return rows % self.lanes == 0 and cols % self.group_size == 0 and (self.bits == 4 or
                                                                            self.bits == 8 and self.symmetric)

    @property
    def words_per_row(self) -> int:
        """Words per row and group of 32: 4 (two quads of nibbles each) or 8 (one quad of bytes each)."""
        return self.bits

    def param_shapes(self, rows: int, cols: int):
        if not self.fits(rows, cols):
            raise ValueError(f"{self.name} interleaves {self.bits}-bit rows in {self.lanes}s and needs whole groups: "
                             f"got [{rows}, {cols}]")
        g, nb = rows // self.lanes, cols // self.group_size
        shapes = {"q_weight": ((g, nb, self.words_per_row * self.lanes), "uint32"),
                  "q_scale": ((g, nb, self.lanes), self.scale_dtype)}
        if not self.symmetric:
            shapes["q_min"] = ((g, nb, self.lanes), self.scale_dtype)
        return shapes

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        rows, cols = np.asarray(w).shape
        self.param_shapes(rows, cols)
        return self.interleave(super().quantize(w), cols)

    def interleave(self, packed: dict[str, np.ndarray], cols: int) -> dict[str, np.ndarray]:
        """The plain group layout (GroupScheme) -> this one."""
        words = packed["q_weight"]
        rows, L, nb = words.shape[0], self.lanes, cols // self.group_size
        if self.bits == 8:  # the codes' bytes, less 128: signed
            byte = (np.ascontiguousarray(words).astype("<u4").view(np.uint8) ^ 0x80).reshape(rows // L, L, nb, 8, 4)
        else:
            shifts = np.arange(8, dtype=np.uint32) * 4
            codes = ((words[:, :, None] >> shifts) & 15).astype(np.uint8).reshape(rows // L, L, nb, 8, 4)
            byte = codes[:, :, :, :4, :] | (codes[:, :, :, 4:, :] << 4)  # [g, l, b, j, i]
        byte = np.ascontiguousarray(byte.transpose(0, 2, 3, 1, 4))  # [g, b, j, l, i]
        out = {"q_weight": byte.view("<u4").reshape(rows // L, nb, self.words_per_row * L).astype(np.uint32)}
        for k in ("q_scale", "q_min"):
            if k in packed:
                out[k] = np.ascontiguousarray(packed[k].reshape(rows // L, L, nb).transpose(0, 2, 1))
        return out

    def plain(self, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This layout -> the plain group layout."""
        g, nb, _ = packed["q_weight"].shape
        L = self.lanes
        byte = np.ascontiguousarray(packed["q_weight"]).astype("<u4").view(np.uint8).reshape(g, nb, self.words_per_row, L, 4)
        codes = byte ^ 0x80 if self.bits == 8 else np.concatenate([byte & 15, byte >> 4], axis=2)  # [g, b, j(8), l, i]
        out = {"q_weight": pack_codes(codes.transpose(0, 3, 1, 2, 4).reshape(g * L, nb * 32), self.bits)}  # [row, col]
        for k in ("q_scale", "q_min"):
            if k in packed:
                out[k] = np.ascontiguousarray(packed[k].transpose(0, 2, 1).reshape(g * L, nb))
        return out

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        return super().dequantize(self.plain(packed), cols)

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        L = self.lanes
        g, lane = split_index(r, L)
        b = c // self.group_size
        quad = (c % self.group_size) // 4
        scale = tir.cast("float32", bufs[1][g, b, lane])
        if self.bits == 8:  # a signed byte
            word = bufs[0][g, b, lane + quad * L]
            byte = tir.bitwise("bitand", tir.bitwise("shr", word, tir.cast("uint32", tir.index((c % 4) * 8))), 255)
            return (tir.cast("float32", byte) - tir.cast("float32", tir.bitwise("shr", byte, 7)) * 256.0) * scale
        word = bufs[0][g, b, lane + (quad % 4) * L]
        shift = tir.cast("uint32", tir.index((c % 4) * 8 + (quad // 4) * 4))
        code = tir.cast("float32", tir.bitwise("bitand", tir.bitwise("shr", word, shift), 15))
        if self.symmetric:
            return (code - float(self.offset)) * scale
        return code * scale + tir.cast("float32", bufs[2][g, b, lane])
