"""llama.cpp's block formats kept as stored (no re-quantization): Q4_0, Q4_1, Q8_0 (below), and the formats of
LAYOUTS (StoredScheme): Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.

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
from .base import QuantizedEmbedding, QuantizedLinear, Scheme, mark_activations
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


# ---- formats kept as their stored bytes: K-quants (super-blocks of 256), Q5_0/Q5_1, IQ4_NL/IQ4_XS --------

QK_K = 256
IQ4_GRID = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # IQ4_NL/IQ4_XS values


def _byte(buf: tir.Buffer, r, i) -> tir.V:
    """Byte `i` (an index expression) of row `r` of a uint32 buffer holding little-endian bytes."""
    return tir.bitwise("bitand", tir.bitwise("shr", buf[r, i // 4], tir.cast("uint32", tir.index((i % 4) * 8))), 255)


def _u32(x) -> tir.V:
    return tir.cast("uint32", tir.index(x))


def _bits(v: tir.V, shift, mask) -> tir.V:
    """(v >> shift) & mask, all uint32 (shift and mask may be index expressions)."""
    return tir.bitwise("bitand", tir.bitwise("shr", v, _u32(shift)), mask if isinstance(mask, int) else _u32(mask))


def _f(v: tir.V) -> tir.V:
    return tir.cast("float32", v)


def _grid(code: tir.V, lo: int = 0, hi: int = 16) -> tir.V:
    """IQ4_GRID[code] for a uint32 code < 16, as a float32 (a select tree: no table buffer)."""
    if hi - lo == 1:
        return tir.const(float(IQ4_GRID[lo]))
    mid = (lo + hi) // 2
    return tir.select(code.cmp("lt", tir.const(mid, "uint32")), _grid(code, lo, mid), _grid(code, mid, hi))


# type -> (values per block, block bytes, fields: (parameter, byte offset, bytes, "f16" | "bytes")); a bytes
# field becomes uint32 words (little-endian, the last word zero-padded: only IQ4_XS's 6 scale bytes are padded)
LAYOUTS = {
    "Q5_0": (32, 22, (("q_scale", 0, 2, "f16"), ("q_high", 2, 4, "bytes"), ("q_weight", 6, 16, "bytes"))),
    "Q5_1": (32, 24, (("q_scale", 0, 2, "f16"), ("q_min", 2, 2, "f16"), ("q_high", 4, 4, "bytes"),
                      ("q_weight", 8, 16, "bytes"))),
    "IQ4_NL": (32, 18, (("q_scale", 0, 2, "f16"), ("q_weight", 2, 16, "bytes"))),
    "Q2_K": (QK_K, 84, (("q_sub", 0, 16, "bytes"), ("q_weight", 16, 64, "bytes"), ("q_scale", 80, 2, "f16"),
                        ("q_min", 82, 2, "f16"))),
    "Q3_K": (QK_K, 110, (("q_high", 0, 32, "bytes"), ("q_weight", 32, 64, "bytes"), ("q_sub", 96, 12, "bytes"),
                         ("q_scale", 108, 2, "f16"))),
    "Q4_K": (QK_K, 144, (("q_scale", 0, 2, "f16"), ("q_min", 2, 2, "f16"), ("q_sub", 4, 12, "bytes"),
                         ("q_weight", 16, 128, "bytes"))),
    "Q5_K": (QK_K, 176, (("q_scale", 0, 2, "f16"), ("q_min", 2, 2, "f16"), ("q_sub", 4, 12, "bytes"),
                         ("q_high", 16, 32, "bytes"), ("q_weight", 48, 128, "bytes"))),
    "Q6_K": (QK_K, 210, (("q_weight", 0, 128, "bytes"), ("q_high", 128, 64, "bytes"), ("q_sub", 192, 16, "bytes"),
                         ("q_scale", 208, 2, "f16"))),
    "IQ4_XS": (QK_K, 136, (("q_scale", 0, 2, "f16"), ("q_sub", 2, 6, "bytes"), ("q_weight", 8, 128, "bytes"))),
}
PARAM_ORDER = ("q_weight", "q_high", "q_sub", "q_scale", "q_min")  # the packed parameters' order in a module


@dataclass(frozen=True)
class StoredScheme(Scheme):
    """A GGUF block format kept as its stored bytes (LAYOUTS), split into parameters the kernels load directly:
    `q_weight` (the low code bits), `q_high` (the high bits: Q5's fifth bit, Q3_K's mask, Q6_K's 2-bit pairs),
    `q_sub` (the packed sub-block scales, unpacked in the kernel), `q_scale` (f16 d) and `q_min` (f16 dmin or m).
    The values, per format (llama.cpp's ggml-quants.c; v the value's index in its block, s its sub-block):

        Q5_0    (q - 16) * d                 q = low nibble | bit v of qh << 4, blocks of 32
        Q5_1    q * d + m
        IQ4_NL  d * IQ4_GRID[nibble]
        Q2_K    (d * (sc & 15)) * q - dmin * (sc >> 4)      2-bit q, 16 sub-blocks of 16, sc one byte each
        Q3_K    (d * (sc6 - 32)) * (q2 - 4 * !hbit)         16 sub-blocks of 16, 6-bit scales packed in 12 bytes
        Q4_K    (d * sc6) * q - dmin * m6                   8 sub-blocks of 32, 6-bit scales and mins in 12 bytes
        Q5_K    as Q4_K with a fifth bit from qh
        Q6_K    (d * sc8) * (q6 - 32)                       16 sub-blocks of 16, int8 scales
        IQ4_XS  (d * (sc6 - 32)) * IQ4_GRID[nibble]         8 sub-blocks of 32

    The numpy reference is gguf-py's own `dequantize` of the bytes put back together (`to_blocks`); `value` does
    the same float32 arithmetic in the same order, so the dequantize program gives identical values."""

    qtype: str = "Q4_K"

    @property
    def block(self) -> int:
        return LAYOUTS[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        return LAYOUTS[self.qtype][1]

    def _fields(self):
        return sorted(LAYOUTS[self.qtype][2], key=lambda f: PARAM_ORDER.index(f[0]))

    @staticmethod
    def _words(nbytes: int) -> int:
        return -(-nbytes // 4)

    def integer_activations(self, rows: int, cols: int) -> bool:
        """Every stored format has integer kernels on the cpu target (targets/c_stored.py)."""
        return cols % self.block == 0 and cols <= 1 << 16

    def _blocks(self, cols: int) -> int:
        if cols % self.block:
            raise DeployError(f"{self.qtype} needs rows of whole {self.block}-value blocks, got {cols} columns")
        return cols // self.block

    def param_shapes(self, rows: int, cols: int):
        nb = self._blocks(cols)
        return {name: ((rows, nb), "float16") if kind == "f16" else ((rows, nb * self._words(size)), "uint32")
                for name, _, size, kind in self._fields()}

    def from_blocks(self, raw: np.ndarray) -> dict[str, np.ndarray]:
        """The stored bytes (uint8 [rows, blocks * block_bytes]) split into the packed parameters."""
        rows = raw.shape[0]
        b = np.ascontiguousarray(raw, np.uint8).reshape(rows, -1, self.block_bytes)
        out = {}
        for name, at, size, kind in self._fields():
            part = b[:, :, at:at + size]
            if kind == "f16":
                out[name] = np.ascontiguousarray(part).view(np.float16).reshape(rows, -1)
            else:
                pad = 4 * self._words(size) - size
                if pad:
                    part = np.concatenate([part, np.zeros((*part.shape[:2], pad), np.uint8)], axis=2)
                out[name] = np.ascontiguousarray(part).view("<u4").astype(np.uint32).reshape(rows, -1)
        return out

    def to_blocks(self, packed: dict[str, np.ndarray]) -> np.ndarray:
        rows = packed["q_weight"].shape[0]
        nb = packed["q_scale"].shape[1]
        out = np.zeros((rows, nb, self.block_bytes), np.uint8)
        for name, at, size, kind in self._fields():
            arr = packed[name].astype(np.float16 if kind == "f16" else "<u4")
            out[:, :, at:at + size] = np.ascontiguousarray(arr).view(np.uint8).reshape(rows, nb, -1)[:, :, :size]
        return out.reshape(rows, -1)

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """Float weights -> this format, where gguf-py can write it (Q5_0, Q5_1); the rest are imported
        from GGUF files as stored."""
        import gguf

        w = np.asarray(w, np.float32)
        self._blocks(w.shape[1])
        try:
            return self.from_blocks(gguf.quants.quantize(w, gguf.GGMLQuantizationType[self.qtype]))
        except NotImplementedError:
            raise DeployError(f"{self.qtype} tensors are imported from GGUF files as stored; quantizing to it "
                              f"is not supported") from None

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        """The numpy reference: gguf-py's dequantize of the reassembled blocks."""
        import gguf

        rows = packed["q_weight"].shape[0]
        w = gguf.quants.dequantize(self.to_blocks(packed), gguf.GGMLQuantizationType[self.qtype])
        return np.asarray(w, np.float32).reshape(rows, -1)[:, :cols]

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        buf = {name: b for (name, *_), b in zip(self._fields(), bufs)}
        blk, v = c // self.block, c % self.block
        words = {name: self._words(size) for name, _, size, kind in self._fields() if kind == "bytes"}

        def byte(name, i):
            return _byte(buf[name], r, blk * (4 * words[name]) + i)

        def half(name):
            return _f(buf[name][r, blk])

        return VALUES[self.qtype](byte, half, v, lambda: buf["q_high"][r, blk])


def _q5_0(byte, half, v, qh_word):
    q = tir.bitwise("bitor", _bits(byte("q_weight", v % 16), 4 * (v // 16), 15),
                    tir.bitwise("shl", _bits(qh_word(), v, 1), 4))
    return half("q_scale") * (_f(q) - 16.0)


def _q5_1(byte, half, v, qh_word):
    q = tir.bitwise("bitor", _bits(byte("q_weight", v % 16), 4 * (v // 16), 15),
                    tir.bitwise("shl", _bits(qh_word(), v, 1), 4))
    return half("q_scale") * _f(q) + half("q_min")


def _iq4_nl(byte, half, v, _):
    return half("q_scale") * _grid(_bits(byte("q_weight", v % 16), 4 * (v // 16), 15))


def _q2_k(byte, half, v, _):
    n, j, lane = v // 128, (v % 128) // 32, v % 32
    sc = byte("q_sub", v // 16)
    q = _bits(byte("q_weight", 32 * n + lane), 2 * j, 3)
    dl = half("q_scale") * _f(tir.bitwise("bitand", sc, 15))
    ml = half("q_min") * _f(tir.bitwise("shr", sc, 4))
    return dl * _f(q) - ml


def _q3_k(byte, half, v, _):
    n, j, lane = v // 128, (v % 128) // 32, v % 32
    s = v // 16
    low = _bits(byte("q_sub", s % 8), 4 * (s // 8), 15)
    high = _bits(byte("q_sub", 8 + s % 4), 2 * (s // 4), 3)
    scale = _f(tir.bitwise("bitor", low, tir.bitwise("shl", high, 4))) - 32.0
    q2 = _bits(byte("q_weight", 32 * n + lane), 2 * j, 3)
    hbit = _bits(byte("q_high", lane), 4 * n + j, 1)
    q = _f(q2) - _f(1 - hbit) * 4.0
    return (half("q_scale") * scale) * q


def _k_scale_min(byte, s):
    """Q4_K/Q5_K's 6-bit scale and min of sub-block s (ggml's get_scale_min_k4)."""
    h, k = s // 4, s % 4
    sb = lambda i: byte("q_sub", i)  # noqa: E731
    scale = tir.bitwise("bitor", tir.bitwise("bitand", sb(k + 8 * h), _u32(63 - 48 * h)),
                        tir.bitwise("bitand", tir.bitwise("shr", sb(k), 2), _u32(48 * h)))
    mins = tir.bitwise("bitor", _bits(sb(k + 4 + 4 * h), 4 * h, 63 - 48 * h),
                       tir.bitwise("bitand", tir.bitwise("shr", sb(k + 4), 2), _u32(48 * h)))
    return scale, mins


def _q4_k(byte, half, v, _):
    s = v // 32
    scale, mins = _k_scale_min(byte, s)
    q = _bits(byte("q_weight", (s // 2) * 32 + v % 32), 4 * (s % 2), 15)
    return (half("q_scale") * _f(scale)) * _f(q) - half("q_min") * _f(mins)


def _q5_k(byte, half, v, _):
    s = v // 32
    scale, mins = _k_scale_min(byte, s)
    q = tir.bitwise("bitor", _bits(byte("q_weight", (s // 2) * 32 + v % 32), 4 * (s % 2), 15),
                    tir.bitwise("shl", _bits(byte("q_high", v % 32), s, 1), 4))
    return (half("q_scale") * _f(scale)) * _f(q) - half("q_min") * _f(mins)


def _q6_k(byte, half, v, _):
    hv = v // 128
    lo = _bits(byte("q_weight", hv * 64 + v % 64), 4 * ((v % 128) // 64), 15)
    hi = _bits(byte("q_high", hv * 32 + v % 32), 2 * ((v % 128) // 32), 3)
    q = _f(tir.bitwise("bitor", lo, tir.bitwise("shl", hi, 4))) - 32.0
    b = byte("q_sub", v // 16)
    sc = _f(b) - _f(tir.bitwise("shr", b, 7)) * 256.0
    return (half("q_scale") * sc) * q


def _iq4_xs(byte, half, v, _):
    ib = v // 32
    low = _bits(byte("q_sub", 2 + ib // 2), 4 * (ib % 2), 15)
    high = _bits(byte("q_sub", ib // 4), 2 * (ib % 4), 3)
    scale = _f(tir.bitwise("bitor", low, tir.bitwise("shl", high, 4))) - 32.0
    code = _bits(byte("q_weight", 16 * ib + v % 16), 4 * ((v % 32) // 16), 15)
    return (half("q_scale") * scale) * _grid(code)


VALUES = {"Q5_0": _q5_0, "Q5_1": _q5_1, "IQ4_NL": _iq4_nl, "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k,
          "Q5_K": _q5_k, "Q6_K": _q6_k, "IQ4_XS": _iq4_xs}


@dataclass(frozen=True)
class InterleavedQ5(Scheme):
    """Q5_0 / Q5_1 blocks with 16 rows interleaved (a compile-time layout transform for the cpu target's AVX2 and
    AVX-512 kernels, as InterleavedScheme for the 4-bit formats): `q_weight` [N/16, K/32, 64] holds the low nibbles
    exactly as InterleavedScheme does (word 16 j + l: row 16 g + l, byte i: columns 32 b + 4 j + i in the low
    nibble and 32 b + 4 (j + 4) + i in the high one); `q_high` [N/16, K/32, 16] the fifth bits, byte 16 j + l of a
    block holding bit i for column 4 j + i and bit 4 + i for column 4 (j + 4) + i of row l; `q_scale` (and Q5_1's
    `q_min`) [N/16, K/32, 16]. The same bytes as the file (22 or 24 per 32 values), rearranged."""

    qtype: str = "Q5_0"
    lanes: int = 16

    def fits(self, rows: int, cols: int) -> bool:
        return rows % self.lanes == 0 and cols % BLOCK == 0

    def integer_activations(self, rows: int, cols: int) -> bool:
        return self.fits(rows, cols) and cols <= 1 << 16

    @property
    def plain_scheme(self) -> StoredScheme:
        return BLOCK_SCHEMES[self.qtype]

    def param_shapes(self, rows: int, cols: int):
        if not self.fits(rows, cols):
            raise ValueError(f"{self.name} interleaves rows in 16s: got [{rows}, {cols}]")
        g, nb, L = rows // self.lanes, cols // BLOCK, self.lanes
        shapes = {"q_weight": ((g, nb, 4 * L), "uint32"), "q_high": ((g, nb, L), "uint32"),
                  "q_scale": ((g, nb, L), "float16")}
        if self.qtype == "Q5_1":
            shapes["q_min"] = ((g, nb, L), "float16")
        return shapes

    def interleave(self, plain: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """StoredScheme's parameters of this format -> this layout."""
        qs = plain["q_weight"].astype("<u4").view(np.uint8)
        rows, L = qs.shape[0], self.lanes
        nb = plain["q_scale"].shape[1]
        g = rows // L
        qs = qs.reshape(g, L, nb, 16)  # byte p: value p (low nibble) and p + 16 (high nibble) of the block
        codes = np.concatenate([qs & 15, qs >> 4], axis=3)  # [g, l, b, 32] in value order
        hb = ((plain["q_high"].astype(np.uint64)[:, :, None] >> np.arange(32, dtype=np.uint64)) & 1).astype(np.uint8)
        hb = hb.reshape(g, L, nb, 32)
        c = codes.reshape(g, L, nb, 8, 4)  # quad j, byte i
        low = c[:, :, :, :4, :] | (c[:, :, :, 4:, :] << 4)  # [g, l, b, j, i]
        out = {"q_weight": np.ascontiguousarray(low.transpose(0, 2, 3, 1, 4)).view("<u4").reshape(g, nb, 4 * L)
               .astype(np.uint32)}
        h = hb.reshape(g, L, nb, 8, 4)
        bits = (h[:, :, :, :4, :] << np.arange(4, dtype=np.uint8)).sum(axis=4) | \
            (h[:, :, :, 4:, :] << np.arange(4, 8, dtype=np.uint8)).sum(axis=4)  # [g, l, b, j]
        out["q_high"] = np.ascontiguousarray(bits.astype(np.uint8).transpose(0, 2, 3, 1)).view("<u4") \
            .reshape(g, nb, L).astype(np.uint32)
        for k in ("q_scale", "q_min"):
            if k in plain:
                out[k] = np.ascontiguousarray(plain[k].reshape(g, L, nb).transpose(0, 2, 1))
        return out

    def plain(self, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This layout -> StoredScheme's parameters."""
        g, nb, _ = packed["q_weight"].shape
        L = self.lanes
        low = np.ascontiguousarray(packed["q_weight"]).astype("<u4").view(np.uint8).reshape(g, nb, 4, L, 4)
        codes = np.concatenate([low & 15, low >> 4], axis=2).transpose(0, 3, 1, 2, 4).reshape(g * L, nb, 32)
        hbytes = np.ascontiguousarray(packed["q_high"]).astype("<u4").view(np.uint8).reshape(g, nb, 4, L)
        bits = (hbytes[..., None] >> np.arange(8, dtype=np.uint8)) & 1  # [g, b, j, l, 8]
        hb = np.concatenate([bits[..., :4], bits[..., 4:]], axis=2)  # [g, b, 8 quads, l, 4]
        hb = hb.transpose(0, 3, 1, 2, 4).reshape(g * L, nb, 32).astype(np.uint64)
        qs = (codes[:, :, :16] | (codes[:, :, 16:] << 4)).astype(np.uint8)
        out = {"q_weight": np.ascontiguousarray(qs).view("<u4").reshape(g * L, nb * 4).astype(np.uint32),
               "q_high": (hb << np.arange(32, dtype=np.uint64)).sum(axis=2).astype(np.uint32)}
        for k in ("q_scale", "q_min"):
            if k in packed:
                out[k] = np.ascontiguousarray(packed[k].transpose(0, 2, 1).reshape(g * L, nb))
        return out

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        return self.plain_scheme.dequantize(self.plain(packed), cols)

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        L = self.lanes
        g, lane = r // L, r % L
        b = c // BLOCK
        quad = (c % BLOCK) // 4
        word = bufs[0][g, b, lane + (quad % 4) * L]
        low = _bits(word, (c % 4) * 8 + (quad // 4) * 4, 15)
        at = (quad % 4) * L + lane  # the byte of the fifth bits
        high = _bits(bufs[1][g, b, at // 4], (at % 4) * 8 + (c % 4) + 4 * (quad // 4), 1)
        q = _f(tir.bitwise("bitor", low, tir.bitwise("shl", high, 4)))
        d = _f(bufs[2][g, b, lane])
        if self.qtype == "Q5_0":
            return d * (q - 16.0)
        return d * q + _f(bufs[3][g, b, lane])


FLOAT_TYPES = ("F32", "F16", "BF16", "F64")  # kept as float: F16 as halves (q0f16), the others as float32
CONVERT_TO = "Q8_0"  # a quantized type without kernels here (IQ2_*, IQ3_*, IQ1_*, TQ*, MXFP4) is re-quantized to it

INTERLEAVED_Q5 = {q: InterleavedQ5(f"gguf_{q.lower()}x16", qtype=q) for q in ("Q5_0", "Q5_1")}

BLOCK_SCHEMES: dict[str, Scheme] = {
    **{q: GGUFBlockScheme(f"gguf_{q.lower()}", qtype=q) for q in ("Q4_0", "Q4_1", "Q8_0")},
    **{q: StoredScheme(f"gguf_{q.lower()}", qtype=q) for q in LAYOUTS},
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
            from . import QUANTIZATION

            return QUANTIZATION["q0f16"] if self.base.weights.qtype(hf) == "F16" else None
        if (self.interleave and isinstance(module, nn.Linear) and block.qtype in INTERLEAVED_Q5
                and INTERLEAVED_Q5[block.qtype].fits(module.out_features, module.in_features)):
            return INTERLEAVED_Q5[block.qtype]
        if not (self.groups and isinstance(block, GGUFBlockScheme)):
            return block
        from . import INTERLEAVED, QUANTIZATION

        name = block.group_scheme
        if (self.interleave and isinstance(module, nn.Linear) and name in INTERLEAVED
                and INTERLEAVED[name].fits(module.out_features, module.in_features)):
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
                elif isinstance(scheme, InterleavedQ5):  # the same bytes, 16 rows interleaved
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
