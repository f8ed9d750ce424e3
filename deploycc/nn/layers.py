"""Layers with the parameter names and layouts of their PyTorch counterparts."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from . import op
from .core import Module, Parameter, Tensor


class ModuleList(Module):
    def __init__(self, modules: Iterable[Module]):
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self) -> Iterator[Module]:
        return iter(v for v in vars(self).values() if isinstance(v, Module))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getitem__(self, i: int) -> Module:
        return getattr(self, str(i))


class Linear(Module):
    """y = x @ weight.T + bias, weight [out_features, in_features] as in torch.nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype: str = "float32"):
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter((out_features, in_features), dtype)
        self.bias = Parameter((out_features,), dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return op.linear(x, self.weight, self.bias)


class Embedding(Module):
    def __init__(self, num: int, dim: int, dtype: str = "float32"):
        self.weight = Parameter((num, dim), dtype)

    def forward(self, ids: Tensor) -> Tensor:
        return op.take(self.weight, ids)


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float, dtype: str = "float32"):
        self.weight = Parameter((dim,), dtype)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return op.rms_norm(x, self.weight, self.eps)


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float, dtype: str = "float32"):
        self.weight = Parameter((dim,), dtype)
        self.bias = Parameter((dim,), dtype)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return op.layer_norm(x, self.weight, self.bias, self.eps)
