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
        codes = q.astype(np.uint32).reshape(rows, -1, self.per_word)
        shifts = (np.arange(self.per_word, dtype=np.uint32) * self.bits)
        words = np.bitwise_or.reduce(codes << shifts, axis=2).astype(np.uint32)
        return {"q_weight": words, **out}

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
