"""GGUF block formats kept as their stored bytes (StoredScheme, one layout table: LAYOUTS): Q5_0, Q5_1, IQ4_NL,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS; and Q5_0 / Q5_1 (InterleavedQ5), Q4_K / Q5_K (InterleavedK) and Q6_K
(InterleavedQ6) with rows interleaved in 16s for the cpu target's kernels. gguf_blocks.py holds Q4_0 / Q4_1 / Q8_0,
the GGUF model and the conversion rule."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DeployError
from ..ir import tir
from .base import Scheme
from .group import InterleavedScheme, pack_codes, split_index

BLOCK = 32


# ---- formats kept as their stored bytes: K-quants (super-blocks of 256), Q5_0/Q5_1, IQ4_NL/IQ4_XS --------

QK_K = 256
IQ4_GRID = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # IQ4_NL/IQ4_XS values


def _byte(buf: tir.Buffer, r, i) -> tir.V:
    """Byte `i` (an index expression) of row `r` of a uint32 buffer holding little-endian bytes."""
    return tir.bitwise("bitand", tir.bitwise("shr", buf[r, i // 4], tir.cast("uint32", tir.index((i % 4) * 8))), 255)


def _u32(x) -> tir.V:
    return tir.cast("uint32", x if isinstance(x, tir.V) else tir.index(x))


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


def _low_codes(words: np.ndarray) -> np.ndarray:
    """The low nibbles of a 16-row layout (`q_weight` [N/16, K/32, 64], InterleavedScheme's) -> codes [N, K] in value
    order."""
    g, nb, _ = words.shape
    low = InterleavedScheme("low", bits=4, symmetric=True).plain(
        {"q_weight": words, "q_scale": np.zeros((g, nb, words.shape[2] // 4), np.float16)})
    codes = (low["q_weight"][:, :, None] >> np.arange(0, 32, 4, dtype=np.uint32)) & 15
    return codes.astype(np.uint8).reshape(low["q_weight"].shape[0], -1)


@dataclass(frozen=True)
class _Interleaved16(Scheme):
    """What the stored formats with 16 rows interleaved share (InterleavedQ5, InterleavedK): the rows come in 16s and
    the columns in whole blocks of `unit`; `plain` puts the file's layout back, so the reference is StoredScheme's."""

    qtype: str = "Q5_0"
    lanes: int = 16
    unit = BLOCK  # the columns' granularity: a block (Q5_0 / Q5_1) or a super-block (the K-quants)

    def fits(self, rows: int, cols: int) -> bool:
        return rows % self.lanes == 0 and cols % self.unit == 0

    def integer_activations(self, rows: int, cols: int) -> bool:
        return self.fits(rows, cols) and cols <= 1 << 16

    @property
    def plain_scheme(self) -> StoredScheme:
        return STORED[self.qtype]

    def plain(self, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        return self.plain_scheme.dequantize(self.plain(packed), cols)


@dataclass(frozen=True)
class InterleavedQ5(_Interleaved16):
    """Q5_0 / Q5_1 blocks with 16 rows interleaved (a compile-time layout transform for the cpu target's AVX2 and
    AVX-512 kernels, as InterleavedScheme for the 4-bit formats): `q_weight` [N/16, K/32, 64] holds the low nibbles
    exactly as InterleavedScheme does (word 16 j + l: row 16 g + l, byte i: columns 32 b + 4 j + i in the low
    nibble and 32 b + 4 (j + 4) + i in the high one); `q_high` [N/16, K/32, 16] the fifth bits, byte 16 j + l of a
    block holding bit i for column 4 j + i and bit 4 + i for column 4 (j + 4) + i of row l; `q_scale` (and Q5_1's
    `q_min`) [N/16, K/32, 16]. The same bytes as the file (22 or 24 per 32 values), rearranged."""

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
        qs = qs.reshape(rows, nb, 16)  # byte p: value p (low nibble) and p + 16 (high nibble) of the block
        codes = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(rows, nb * 32)  # in value order
        # the low nibbles, scales and minimums: exactly InterleavedScheme's layout of the same codes
        low = InterleavedScheme("low", bits=4, symmetric="q_min" not in plain)
        out = low.interleave({"q_weight": pack_codes(codes, 4), **{k: plain[k] for k in ("q_scale", "q_min")
                                                                    if k in plain}}, nb * BLOCK)
        hb = ((plain["q_high"].astype(np.uint64)[:, :, None] >> np.arange(32, dtype=np.uint64)) & 1).astype(np.uint8)
        h = hb.reshape(g, L, nb, 8, 4)  # quad j, byte i
        bits = (h[:, :, :, :4, :] << np.arange(4, dtype=np.uint8)).sum(axis=4) | \
            (h[:, :, :, 4:, :] << np.arange(4, 8, dtype=np.uint8)).sum(axis=4)  # [g, l, b, j]
        out["q_high"] = np.ascontiguousarray(bits.astype(np.uint8).transpose(0, 2, 3, 1)).view("<u4") \
            .reshape(g, nb, L).astype(np.uint32)
        return {k: out[k] for k in self.param_shapes(rows, nb * BLOCK)}

    def plain(self, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This layout -> StoredScheme's parameters."""
        g, nb, _ = packed["q_weight"].shape
        L = self.lanes
        low = InterleavedScheme("low", bits=4, symmetric="q_min" not in packed).plain(
            {k: v for k, v in packed.items() if k != "q_high"})  # codes packed in value order, scales per row
        codes = ((low["q_weight"][:, :, None] >> np.arange(0, 32, 4, dtype=np.uint32)) & 15).astype(np.uint8)
        codes = codes.reshape(g * L, nb, 32)
        hbytes = np.ascontiguousarray(packed["q_high"]).astype("<u4").view(np.uint8).reshape(g, nb, 4, L)
        bits = (hbytes[..., None] >> np.arange(8, dtype=np.uint8)) & 1  # [g, b, j, l, 8]
        hb = np.concatenate([bits[..., :4], bits[..., 4:]], axis=2)  # [g, b, 8 quads, l, 4]
        hb = hb.transpose(0, 3, 1, 2, 4).reshape(g * L, nb, 32).astype(np.uint64)
        qs = (codes[:, :, :16] | (codes[:, :, 16:] << 4)).astype(np.uint8)
        return {"q_weight": np.ascontiguousarray(qs).view("<u4").reshape(g * L, nb * 4).astype(np.uint32),
                "q_high": (hb << np.arange(32, dtype=np.uint64)).sum(axis=2).astype(np.uint32),
                **{k: low[k] for k in ("q_scale", "q_min") if k in low}}

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        L = self.lanes
        g, lane = split_index(r, L)
        lword, lbyte = split_index(lane, 4)
        b = c // BLOCK
        quad = (c % BLOCK) // 4
        word = bufs[0][g, b, lane + (quad % 4) * L]
        low = _bits(word, (c % 4) * 8 + (quad // 4) * 4, 15)
        # the fifth bits: byte (quad % 4) L + lane of the block's 16 words
        high = _bits(bufs[1][g, b, lword + (quad % 4) * (L // 4)], lbyte * 8 + ((c % 4) + 4 * (quad // 4)), 1)
        q = _f(tir.bitwise("bitor", low, tir.bitwise("shl", high, 4)))
        d = _f(bufs[2][g, b, lane])
        if self.qtype == "Q5_0":
            return d * (q - 16.0)
        return d * q + _f(bufs[3][g, b, lane])


@dataclass(frozen=True)
class InterleavedK(_Interleaved16):
    """Q4_K / Q5_K blocks with 16 rows interleaved, for the cpu target's kernels (targets/c_x16.py), the file's bytes
    rearranged (the package weighs what the file does). For rows 16 g .. 16 g + 15, `q_weight` [N/16, K/32, 64] holds
    the low nibbles as InterleavedScheme does, `q_high` (Q5_K) [N/16, K/32, 16] the fifth bits as InterleavedQ5 does;
    `q_sub` [N/16, K/256, 48] the super-block's 12 bytes of packed 6-bit scales and minimums as 12 planes of 16
    lanes (byte 16 p + l: row l's byte p), so a kernel unpacks the 8 sub-blocks' scales of 16 rows with a few vector
    operations per super-block instead of scalar work per sub-block and row; `q_scale` and `q_min` [N/16, K/256, 16]
    the rows' d and dmin. Value: (d * sc6) * q - dmin * m6, as StoredScheme's."""

    qtype: str = "Q4_K"
    unit = QK_K

    def param_shapes(self, rows: int, cols: int):
        if not self.fits(rows, cols):
            raise ValueError(f"{self.name} interleaves rows in 16s and needs whole super-blocks: got [{rows}, {cols}]")
        g, nb, ns, L = rows // self.lanes, cols // BLOCK, cols // QK_K, self.lanes
        shapes = {"q_weight": ((g, nb, 4 * L), "uint32")}
        if self.qtype == "Q5_K":
            shapes["q_high"] = ((g, nb, L), "uint32")
        shapes.update({"q_sub": ((g, ns, 3 * L), "uint32"), "q_scale": ((g, ns, L), "float16"),
                       "q_min": ((g, ns, L), "float16")})
        return shapes

    def _codes(self, plain: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
        """(codes [rows, cols] in value order, fifth bits [rows, cols] or None) of StoredScheme's parameters."""
        qs = plain["q_weight"].astype("<u4").view(np.uint8)
        rows, ns = qs.shape[0], plain["q_scale"].shape[1]
        qs = qs.reshape(rows, ns, 4, 32)  # chunk c: sub-block 2c in the low nibbles, 2c + 1 in the high ones
        codes = np.stack([qs & 15, qs >> 4], axis=3).reshape(rows, ns * QK_K)
        if self.qtype != "Q5_K":
            return codes, None
        qh = plain["q_high"].astype("<u4").view(np.uint8).reshape(rows, ns, 1, 32)  # bit s of byte i: value 32 s + i
        bits = (qh >> np.arange(8, dtype=np.uint8)[None, None, :, None]) & 1
        return codes, bits.reshape(rows, ns * QK_K)

    def interleave(self, plain: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """StoredScheme's parameters of this format -> this layout."""
        codes, fifth = self._codes(plain)
        rows, cols = codes.shape
        g, L, ns, nb = rows // self.lanes, self.lanes, cols // QK_K, cols // BLOCK
        if fifth is None:
            low = InterleavedScheme("low", bits=4, symmetric=True)
            out = {"q_weight": low.interleave({"q_weight": pack_codes(codes, 4)}, cols)["q_weight"]}
        else:  # as a Q5_0 tensor of the same codes: InterleavedQ5 puts the low nibbles and the fifth bits in place
            qs = (codes.reshape(rows, nb, 2, 16)[:, :, 0] | (codes.reshape(rows, nb, 2, 16)[:, :, 1] << 4))
            high = (fifth.reshape(rows, nb, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=2)
            x = INTERLEAVED_Q5["Q5_0"].interleave({
                "q_weight": np.ascontiguousarray(qs.astype(np.uint8)).view("<u4").reshape(rows, nb * 4).astype(np.uint32),
                "q_high": high.astype(np.uint32), "q_scale": np.zeros((rows, nb), np.float16)})
            out = {"q_weight": x["q_weight"], "q_high": x["q_high"]}
        sub = plain["q_sub"].astype("<u4").view(np.uint8).reshape(g, L, ns, 12)
        out["q_sub"] = np.ascontiguousarray(sub.transpose(0, 2, 3, 1)).view("<u4").reshape(g, ns, 3 * L).astype(np.uint32)
        for k in ("q_scale", "q_min"):
            out[k] = np.ascontiguousarray(plain[k].reshape(g, L, ns).transpose(0, 2, 1))
        return {k: out[k] for k in self.param_shapes(rows, cols)}

    def plain(self, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This layout -> StoredScheme's parameters."""
        g, nb, _ = packed["q_weight"].shape
        L, ns = self.lanes, nb // 8
        rows = g * L
        if self.qtype == "Q5_K":
            x = INTERLEAVED_Q5["Q5_0"].plain({"q_weight": packed["q_weight"], "q_high": packed["q_high"],
                                               "q_scale": np.zeros((g, nb, L), np.float16)})
            qs = x["q_weight"].astype("<u4").view(np.uint8).reshape(rows, nb, 16)
            codes = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(rows, ns * QK_K)
            fifth = ((x["q_high"][:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
            fifth = fifth.reshape(rows, ns, 8, 32)  # [row, super-block, sub-block s, byte i]
            qh = (fifth << np.arange(8, dtype=np.uint8)[None, None, :, None]).sum(axis=2).astype(np.uint8)
        else:
            codes = _low_codes(packed["q_weight"]).reshape(rows, ns * QK_K)
        c = codes.reshape(rows, ns, 4, 2, 32)
        qs = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).astype(np.uint8)
        out = {"q_weight": np.ascontiguousarray(qs).view("<u4").reshape(rows, ns * 32).astype(np.uint32)}
        if self.qtype == "Q5_K":
            out["q_high"] = np.ascontiguousarray(qh).view("<u4").reshape(rows, ns * 8).astype(np.uint32)
        sub = np.ascontiguousarray(packed["q_sub"]).astype("<u4").view(np.uint8).reshape(g, ns, 12, L)
        out["q_sub"] = np.ascontiguousarray(sub.transpose(0, 3, 1, 2)).view("<u4").reshape(rows, ns * 3).astype(np.uint32)
        for k in ("q_scale", "q_min"):
            out[k] = np.ascontiguousarray(packed[k].transpose(0, 2, 1).reshape(rows, ns))
        return out

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        L = self.lanes
        buf = dict(zip(self.param_shapes(L, QK_K), bufs))
        g, lane = split_index(r, L)
        lword, lbyte = split_index(lane, 4)
        b, sb = c // BLOCK, c // QK_K
        quad = (c % BLOCK) // 4
        q = _bits(buf["q_weight"][g, b, lane + (quad % 4) * L], (c % 4) * 8 + (quad // 4) * 4, 15)
        if "q_high" in buf:  # byte (quad % 4) L + lane of the block's 16 words
            high = _bits(buf["q_high"][g, b, lword + (quad % 4) * (L // 4)], lbyte * 8 + ((c % 4) + 4 * (quad // 4)),
                         1)
            q = tir.bitwise("bitor", q, tir.bitwise("shl", high, 4))

        def byte(_name, i):  # byte i of row r's 12, in plane i: byte 16 i + lane
            return _bits(buf["q_sub"][g, sb, lword + 4 * i], lbyte * 8, 255)

        scale, mins = _k_scale_min(byte, (c % QK_K) // BLOCK)
        return (_f(buf["q_scale"][g, sb, lane]) * _f(scale)) * _f(q) - _f(buf["q_min"][g, sb, lane]) * _f(mins)


@dataclass(frozen=True)
class InterleavedQ6(InterleavedK):
    """Q6_K blocks with 16 rows interleaved, for the cpu target's kernels (targets/c_x16.py), the file's bytes
    rearranged. For rows 16 g .. 16 g + 15: `q_weight` [N/16, K/32, 64] the low nibbles as InterleavedScheme holds
    them (word 16 j + l, byte i: row l's values 4 j + i and 4 (j + 4) + i of the block); `q_high` [N/16, K/32, 32]
    the top two bits, word 16 k + l, byte i, bits 2 m: value 4 (4 k + m) + i of row l, so a kernel takes quad j's
    from the byte its nibbles share; `q_sub` [N/16, K/256, 64] the int8 scales of the 16 sub-blocks of 16, byte
    16 s + l: row l's of sub-block s; `q_scale` [N/16, K/256, 16] the rows' d. Value: (d * sc8) * (q6 - 32)."""

    qtype: str = "Q6_K"

    def param_shapes(self, rows: int, cols: int):
        if not self.fits(rows, cols):
            raise ValueError(f"{self.name} interleaves rows in 16s and needs whole super-blocks: got [{rows}, {cols}]")
        g, nb, ns, L = rows // self.lanes, cols // BLOCK, cols // QK_K, self.lanes
        return {"q_weight": ((g, nb, 4 * L), "uint32"), "q_high": ((g, nb, 2 * L), "uint32"),
                "q_sub": ((g, ns, 4 * L), "uint32"), "q_scale": ((g, ns, L), "float16")}

    def interleave(self, plain: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """StoredScheme's parameters of Q6_K -> this layout."""
        rows, ns = plain["q_scale"].shape
        g, L, nb, cols = rows // self.lanes, self.lanes, ns * 8, ns * QK_K
        ql = plain["q_weight"].astype("<u4").view(np.uint8).reshape(rows, ns, 2, 2, 32)  # [row, sb, half, pair, i]
        qh = plain["q_high"].astype("<u4").view(np.uint8).reshape(rows, ns, 2, 32)  # [row, sb, half, i]
        # value 128 h + 32 q + i: ql[h, q % 2, i] nibble q // 2, qh[h, i] bits 2 q
        low = np.stack([ql[:, :, :, 0] & 15, ql[:, :, :, 1] & 15, ql[:, :, :, 0] >> 4, ql[:, :, :, 1] >> 4], axis=3)
        high = np.stack([(qh >> (2 * q)) & 3 for q in range(4)], axis=3)  # [row, sb, half, q, i]
        codes, tops = low.reshape(rows, cols), high.reshape(rows, cols)
        out = {"q_weight": InterleavedScheme("low", bits=4, symmetric=True).interleave(
            {"q_weight": pack_codes(codes, 4)}, cols)["q_weight"]}
        t = tops.reshape(g, L, nb, 2, 4, 4)  # [g, l, b, k, m, i]: value 4 (4 k + m) + i
        byte = (t << (2 * np.arange(4, dtype=np.uint8))[None, None, None, None, :, None]).sum(axis=4).astype(np.uint8)
        out["q_high"] = np.ascontiguousarray(byte.transpose(0, 2, 3, 1, 4)).view("<u4").reshape(g, nb, 2 * L) \
            .astype(np.uint32)
        sub = plain["q_sub"].astype("<u4").view(np.uint8).reshape(g, L, ns, 16)
        out["q_sub"] = np.ascontiguousarray(sub.transpose(0, 2, 3, 1)).view("<u4").reshape(g, ns, 4 * L).astype(np.uint32)
        out["q_scale"] = np.ascontiguousarray(plain["q_scale"].reshape(g, L, ns).transpose(0, 2, 1))
        return out

    def plain(self, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This layout -> StoredScheme's parameters of Q6_K."""
        g, nb, _ = packed["q_weight"].shape
        L, ns = self.lanes, nb // 8
        rows, cols = g * L, nb * BLOCK
        codes = _low_codes(packed["q_weight"]).reshape(rows, ns, 2, 4, 32)  # [row, sb, half, q, i]
        byte = np.ascontiguousarray(packed["q_high"]).astype("<u4").view(np.uint8).reshape(g, nb, 2, L, 4)
        tops = (byte[:, :, :, :, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, None, None, None, :, None]) & 3
        tops = tops.transpose(0, 3, 1, 2, 4, 5).reshape(rows, ns, 2, 4, 32)  # [row, sb, half, q, i]: as codes
        ql = np.stack([codes[:, :, :, 0] | (codes[:, :, :, 2] << 4), codes[:, :, :, 1] | (codes[:, :, :, 3] << 4)],
                      axis=3).astype(np.uint8)  # [row, sb, half, pair, i]
        qh = sum(tops[:, :, :, q].astype(np.uint8) << (2 * q) for q in range(4)).astype(np.uint8)
        sub = np.ascontiguousarray(packed["q_sub"]).astype("<u4").view(np.uint8).reshape(g, ns, 16, L)
        return {"q_weight": np.ascontiguousarray(ql).view("<u4").reshape(rows, cols // 8).astype(np.uint32),
                "q_high": np.ascontiguousarray(qh).view("<u4").reshape(rows, cols // 16).astype(np.uint32),
                "q_sub": np.ascontiguousarray(sub.transpose(0, 3, 1, 2)).view("<u4").reshape(rows, ns * 4).astype(np.uint32),
                "q_scale": np.ascontiguousarray(packed["q_scale"].transpose(0, 2, 1).reshape(rows, ns))}

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        L = self.lanes
        q_weight, q_high, q_sub, q_scale = bufs
        g, lane = split_index(r, L)
        lword, lbyte = split_index(lane, 4)
        b, sb = c // BLOCK, c // QK_K
        quad = (c % BLOCK) // 4
        low = _bits(q_weight[g, b, lane + (quad % 4) * L], (c % 4) * 8 + (quad // 4) * 4, 15)
        top = _bits(q_high[g, b, lane + (quad // 4) * L], (c % 4) * 8 + 2 * (quad % 4), 3)
        q = _f(tir.bitwise("bitor", low, tir.bitwise("shl", top, 4))) - 32.0
        # the sub-block's scale: byte 16 s + lane of the super-block's 16 words
        byte = _bits(q_sub[g, sb, lword + 4 * ((c % QK_K) // 16)], lbyte * 8, 255)
        sc = _f(byte) - _f(tir.bitwise("shr", byte, 7)) * 256.0
        return (_f(q_scale[g, sb, lane]) * sc) * q


STORED = {q: StoredScheme(f"gguf_{q.lower()}", qtype=q) for q in LAYOUTS}
INTERLEAVED_Q5 = {q: InterleavedQ5(f"gguf_{q.lower()}x16", qtype=q) for q in ("Q5_0", "Q5_1")}
INTERLEAVED_K = {**{q: InterleavedK(f"gguf_{q.lower()}x16", qtype=q) for q in ("Q4_K", "Q5_K")},
                 "Q6_K": InterleavedQ6("gguf_q6_kx16")}
