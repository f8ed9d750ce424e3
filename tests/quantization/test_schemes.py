"""Each scheme's numpy quantizer and dequantizer against a reference written here element by
element (exact, bit layout included), its error bound, and its dequantize tensor program against
the numpy dequantizer on the loop-level interpreter."""
import numpy as np
import pytest

from deploycc.errors import DeployError
from deploycc.ir.tir_interp import run_program
from deploycc.quantization import QUANTIZATION, get

GROUPED = ["q4f16_1", "q4f32_1", "q4f16_2", "q8f16_0"]


def reference(w: np.ndarray, bits: int, sdtype, symmetric: bool):
    """Group of 32 along the last axis, zero-padded; word j of a row holds codes 32/bits*j.. with
    the first code in the lowest bits."""
    rows, cols = w.shape
    groups = -(-cols // 32)
    per_word = 32 // bits
    words = np.zeros((rows, groups * 32 // per_word), np.uint32)
    scales = np.zeros((rows, groups), sdtype)
    mins = np.zeros((rows, groups), sdtype)
    for r in range(rows):
        for g in range(groups):
            vals = [float(w[r, c]) for c in range(32 * g, min(32 * g + 32, cols))]
            if symmetric:
                s = sdtype(max(abs(v) for v in vals) / (2 ** (bits - 1) - 1))
                m = 0.0
            else:
                s, m = sdtype((max(vals) - min(vals)) / (2 ** bits - 1)), sdtype(min(vals))
            scales[r, g], mins[r, g] = s, m
            for k in range(32):
                c = 32 * g + k
                v = float(w[r, c]) if c < cols else 0.0
                if symmetric:
                    q = 0 if float(s) == 0 else round(np.float32(v) / np.float32(s))
                    q = min(max(q + 2 ** (bits - 1), 0), 2 ** bits - 1)
                else:
                    q = 0 if float(s) == 0 else round(np.float32(np.float32(v) - np.float32(m)) / np.float32(s))
                    q = min(max(q, 0), 2 ** bits - 1)
                words[r, c // per_word] |= np.uint32(q) << np.uint32(bits * (c % per_word))
    return words, scales, mins


def sample(rows=5, cols=70, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    w[1, :32] = 0.0  # an all-zero group: scale 0 dequantizes to exact zeros
    w[2] += 0.3  # a group away from zero, for the asymmetric scheme
    return w


@pytest.mark.parametrize("name", GROUPED)
def test_packing_matches_reference(name):
    s = QUANTIZATION[name]
    w = sample()
    got = s.quantize(w)
    words, scales, mins = reference(w, s.bits, np.dtype(s.scale_dtype).type, s.symmetric)
    assert got["q_weight"].dtype == np.uint32 and got["q_scale"].dtype == np.dtype(s.scale_dtype)
    np.testing.assert_array_equal(got["q_scale"], scales)
    np.testing.assert_array_equal(got["q_weight"], words)
    if not s.symmetric:
        np.testing.assert_array_equal(got["q_min"], mins)
    assert set(got) == set(s.param_shapes(*w.shape))
    assert all(got[k].shape == shape for k, (shape, _) in s.param_shapes(*w.shape).items())


@pytest.mark.parametrize("name", GROUPED)
def test_error_bound(name):
    s = QUANTIZATION[name]
    w = sample(7, 96, seed=1)
    packed = s.quantize(w)
    deq = s.dequantize(packed, w.shape[1])
    assert deq.shape == w.shape
    step = np.repeat(packed["q_scale"].astype(np.float32), 32, axis=1)[:, :96]
    # half a step, plus float16 rounding of the stored minimum for the asymmetric scheme
    slack = 1e-6 + (np.abs(w).max() * 2.0 ** -10 if not s.symmetric else 0.0)
    assert np.all(np.abs(w - deq) <= step / 2 * (1 + 1e-3) + slack)
    np.testing.assert_array_equal(deq[1, :32], 0.0)


def test_q4f16_1_dequantize_by_hand():
    """One group: codes (q - 8) * scale, the first value in the lowest nibble of word 0."""
    s = QUANTIZATION["q4f16_1"]
    w = np.zeros((1, 32), np.float32)
    w[0, 0], w[0, 1], w[0, 9] = 0.7, -0.7, 0.2
    p = s.quantize(w)
    assert p["q_scale"][0, 0] == np.float16(0.1)
    assert p["q_weight"][0, 0] == (15 | (1 << 4) | (8 << 8) | (8 << 12) | (8 << 16) | (8 << 20) | (8 << 24) | (8 << 28))
    assert (p["q_weight"][0, 1] & 0xF0) == (10 << 4)  # 0.2 / 0.1 = 2, stored 10, at code 9 = word 1 nibble 1


def test_q0_schemes():
    w = sample()
    assert QUANTIZATION["q0f16"].quantize(w)["q_weight"].dtype == np.float16
    np.testing.assert_array_equal(QUANTIZATION["q0f16"].dequantize(QUANTIZATION["q0f16"].quantize(w), 70),
                                  w.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(QUANTIZATION["q0f32"].dequantize(QUANTIZATION["q0f32"].quantize(w), 70), w)


@pytest.mark.parametrize("name", GROUPED + ["q0f16"])
def test_program_matches_numpy_dequantizer(name):
    s = QUANTIZATION[name]
    w = sample(4, 40)
    packed = s.quantize(w)
    prog = s.program(*w.shape)
    bufs = [packed[k] for k in s.param_shapes(*w.shape)] + [np.zeros(w.shape, np.float32)]
    run_program(prog, bufs, [])
    np.testing.assert_array_equal(bufs[-1], s.dequantize(packed, 40))


def test_unknown_scheme():
    with pytest.raises(DeployError, match="supported: q0f32"):
        get("q3f16_9")
