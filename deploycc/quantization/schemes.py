"""The named quantization schemes (presets' `quantization:`, compile --quantization) and the cpu target's
interleaved layouts of them: a leaf of the package, so the GGUF block schemes (gguf_blocks.py) and the package's
front (__init__.py) both read them."""
from __future__ import annotations

from .base import Scheme
from .group import GroupScheme, InterleavedScheme
from .none import NoQuantize, StoreHalf

QUANTIZATION: dict[str, Scheme] = {
    "q0f32": NoQuantize("q0f32"),
    "q0f16": StoreHalf("q0f16"),
    "q4f16_1": GroupScheme("q4f16_1", bits=4, scale_dtype="float16", symmetric=True),
    "q4f32_1": GroupScheme("q4f32_1", bits=4, scale_dtype="float32", symmetric=True),
    "q4f16_2": GroupScheme("q4f16_2", bits=4, scale_dtype="float16", symmetric=False),
    "q8f16_0": GroupScheme("q8f16_0", bits=8, scale_dtype="float16", symmetric=True),
}


# The cpu target's layout of the 4- and 8-bit schemes (rows interleaved in 16s), used where runtime/native.py's
# weight_interleave says the target's integer kernels read it (AVX2 and AVX-512).
INTERLEAVED: dict[str, Scheme] = {
    "q4f16_1": InterleavedScheme("q4f16_1x16", bits=4, scale_dtype="float16", symmetric=True),
    "q4f16_2": InterleavedScheme("q4f16_2x16", bits=4, scale_dtype="float16", symmetric=False),
    "q8f16_0": InterleavedScheme("q8f16_0x16", bits=8, scale_dtype="float16", symmetric=True),
}
