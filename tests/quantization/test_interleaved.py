"""The cpu target's interleaved 4-bit layout (quantization/group.py InterleavedScheme): the same weights as
the plain group layout, moved. Exact: the codes, scales and minimums go back to the plain layout bit for
bit, and the layout's dequantize program (what the reference interpreter runs) gives exactly the plain
scheme's dequantized weights. Which packages use it: runtime/native.weight_interleave."""
import numpy as np
import pytest

from deploycc.ir.tir_interp import run_program
from deploycc.quantization import INTERLEAVED, QUANTIZATION, scheme_by_name
from deploycc.runtime import native


@pytest.mark.parametrize("name", sorted(INTERLEAVED))
def test_interleaved_layout_is_a_permutation_of_the_plain_one(name):
    plain, wide = QUANTIZATION[name], INTERLEAVED[name]
    assert scheme_by_name(wide.name) is wide
    rows, cols = 48, 96
    w = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    packed, want = wide.quantize(w), plain.quantize(w)
    assert {k: v.shape for k, v in packed.items()} == {k: s for k, (s, _) in wide.param_shapes(rows, cols).items()}
    back = wide.plain(packed)
    assert all(np.array_equal(back[k], want[k]) for k in want)
    np.testing.assert_array_equal(wide.dequantize(packed, cols), plain.dequantize(want, cols))
    prog = wide.program(rows, cols)
    arrays = [packed[k] for k in wide.param_shapes(rows, cols)] + [np.zeros((rows, cols), np.float32)]
    run_program(prog, arrays, [])
    np.testing.assert_array_equal(arrays[-1], plain.dequantize(want, cols))


def test_interleaved_layout_needs_rows_in_16s_and_whole_groups():
    with pytest.raises(ValueError, match="interleaves"):
        INTERLEAVED["q4f16_2"].param_shapes(56, 96)
    with pytest.raises(ValueError, match="interleaves"):
        INTERLEAVED["q4f16_2"].param_shapes(48, 100)


def test_avx2_and_avx512_packages_interleave():
    """The interleaved layout has kernels for AVX-512 VNNI (512-bit vpdpbusd) and AVX2 (vpmaddubsw, vpmaddwd);
    plain C reads the plain layout."""
    assert native.weight_interleave("x86-64-v3") and native.weight_interleave("x86-64-v4")
    assert not native.weight_interleave("generic")
    have = native.cpu_flags() or set()
    assert native.weight_interleave("native") == ("avx2" in have)


@pytest.mark.parametrize("name", sorted(INTERLEAVED))
def test_an_interleaved_embedding_gathers_the_plain_rows(name):
    """A tied embedding in the interleaved layout (its output head then runs the interleaved kernels): the take
    program gathers, for token ids past several groups of 16 rows, exactly the plain layout's dequantized rows,
    in the interpreter and compiled for this machine's cpu target."""
    from conftest import require_cc, require_device

    from deploycc import presets
    from deploycc.kernel_runner import KernelRunner
    from deploycc.schedule import schedule_program

    plain, wide = QUANTIZATION[name], INTERLEAVED[name]
    rows, cols = 64, 96
    w = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    packed = wide.quantize(w)
    ids = np.array([[0, 17, 63, 31, 16, 15]], np.int32)
    want = plain.dequantize(plain.quantize(w), cols)[ids]
    prog = wide.take_program(rows, cols, 2)
    arrays = [packed[k] for k in wide.param_shapes(rows, cols)] + [ids, np.zeros((*ids.shape, cols), np.float32)]
    run_program(prog, arrays, [])
    np.testing.assert_array_equal(arrays[-1], want)
    require_cc()
    target = presets.load("cpu").target
    out = np.zeros((*ids.shape, cols), np.float32)
    KernelRunner(require_device("cpu"), target)(schedule_program(prog, target), arrays[:-1] + [out], [])
    np.testing.assert_array_equal(out, want)



def test_a_head_scheme_takes_its_interleaved_layout_too():
    """The cpu packages' default, q4f16_2 with a q8f16_0 head: with the interleaved layouts, every linear whose rows
    come in 16s takes q4f16_2x16 and the embedding table and an untied lm_head q8f16_0x16 (the 8-bit interleaved
    kernels read them); rows not in 16s, and every weight without the layouts, keep the plain ones."""
    from deploycc import nn
    from deploycc.quantization.base import swap_modules

    def model():
        m = nn.Module()
        m.embed_tokens, m.lm_head = nn.Embedding(48, 64), nn.Linear(64, 48)
        m.up, m.odd, m.odd_head = nn.Linear(64, 32), nn.Linear(64, 40), nn.Embedding(40, 64)
        return m

    head = QUANTIZATION["q8f16_0"]
    wide = swap_modules(model(), QUANTIZATION["q4f16_2"], head, INTERLEAVED)
    assert {k: getattr(wide, k).scheme.name for k in ("embed_tokens", "lm_head", "up", "odd", "odd_head")} == {
        "embed_tokens": "q8f16_0x16", "lm_head": "q8f16_0x16", "up": "q4f16_2x16", "odd": "q4f16_2",
        "odd_head": "q8f16_0"}
    plain = swap_modules(model(), QUANTIZATION["q4f16_2"], head)
    assert {getattr(plain, k).scheme.name for k in ("embed_tokens", "lm_head", "up")} == {"q8f16_0", "q4f16_2"}
