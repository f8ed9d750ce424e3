"""No quantization: q0f32 keeps the float32 modules; q0f16 stores Linear and Embedding weights as
float16 (`<name>.q_weight`, no scale) and computes in float32: its dequantize program is a cast,
fused into the consumer like any other, so targets without fp16 arithmetic only load halves."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import tir
from .base import Scheme


@dataclass(frozen=True)
class NoQuantize(Scheme):
    @property
    def swaps(self) -> bool:
        return False

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        return {"weight": np.asarray(w, np.float32)}

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        return packed["weight"]


@dataclass(frozen=True)
class StoreHalf(Scheme):
    def param_shapes(self, rows: int, cols: int):
        return {"q_weight": ((rows, cols), "float16")}

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        return {"q_weight": np.asarray(w, np.float32).astype(np.float16)}

    def dequantize(self, packed: dict[str, np.ndarray], cols: int) -> np.ndarray:
        return packed["q_weight"].astype(np.float32)

    def value(self, bufs: list[tir.Buffer], r, c) -> tir.V:
        return tir.cast("float32", bufs[0][r, c])
