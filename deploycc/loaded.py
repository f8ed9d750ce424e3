"""A model ready to export, from any source (hub.py: checkpoints; gguf.py: GGUF files): its architecture module,
config and lazily opened weights, and the check of the config against the tensors present."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from .errors import DeployError


@dataclass
class LoadedModel:
    """A model ready to export: its architecture module, config, and lazily opened weights."""

    path: Path
    hf_config: dict
    arch: ModuleType
    config: object
    weights: object  # hub.Weights or gguf.GGUFWeights: names(), shape(name), read(name), `in`
    source: str = ""
    _module: object = field(default=None, repr=False)
    _wmap: dict | None = field(default=None, repr=False)

    @property
    def architecture(self) -> str:
        from .models import name

        return name(self.hf_config)

    def build(self):
        """The nn.Module of this model (built once)."""
        if self._module is None:
            self._module = self.arch.Model(self.config)
        return self._module

    def checkpoint_name(self, name: str) -> tuple[str, str | None]:
        """(the checkpoint tensor, its transform) of our parameter `name`: the architecture's weight_map (the
        identity where it is silent), under its CHECKPOINT_PREFIX (Gemma 3's multimodal files: language_model.)."""
        if self._wmap is None:
            self._wmap = self.arch.weight_map(self.config)
        hf_name, transform = self._wmap.get(name, (name, None))
        return checkpoint_prefix(self.arch) + hf_name, transform

    def _sources(self) -> Iterator[tuple[str, str, str | None]]:
        """(our name, checkpoint name, transform) for every parameter, in export order, each checked
        against the safetensors headers: present, and of the shape the config implies (stored layout)."""
        for name, p in self.build().named_parameters():
            hf_name, transform = self.checkpoint_name(name)
            if hf_name not in self.weights:
                raise DeployError(f"checkpoint {self.path} is missing tensor {hf_name} (needed for {name}); "
                                  f"is it a complete {self.architecture} checkpoint?")
            want = tuple(p.shape)[::-1] if transform == "transpose" else tuple(p.shape)
            if tuple(self.weights.shape(hf_name)) != want:
                raise DeployError(f"tensor {hf_name} has shape {list(self.weights.shape(hf_name))}, but the config "
                                  f"implies {list(want)}; config.json and the weights disagree")
            yield name, hf_name, transform

    def check(self) -> None:
        """Raise DeployError unless every parameter is in the checkpoint with the right shape (headers only)."""
        for _ in self._sources():
            pass

    def params(self) -> Iterator[tuple[str, np.ndarray]]:
        """(our name, array) for every parameter, in export order, checked against the model's shapes."""
        for name, hf_name, transform in self._sources():
            arr = self.weights.read(hf_name)
            yield name, transformed(arr, transform)


def checkpoint_prefix(arch: ModuleType) -> str:
    """What the architecture's checkpoints put before every tensor name (models' CHECKPOINT_PREFIX)."""
    return getattr(arch, "CHECKPOINT_PREFIX", "")


def transformed(arr: np.ndarray, transform: str | None) -> np.ndarray:
    """A checkpoint tensor as the model computes with it: weight_map's transforms ("transpose": Conv1D
    weights stored [in, out]; "plus_one": Gemma's RMSNorm weights, stored as w of x * (1 + w))."""
    if transform == "transpose":
        return arr.T
    if transform == "plus_one":
        return (np.asarray(arr, np.float32) + np.float32(1.0)).astype(np.float32)
    return arr



_LAYER_INDEX = r"(\d{1,9})\."


def check_config(where: str, arch: ModuleType, config, weights, fix: str, keys: dict[str, str] | None = None) -> None:
    """The config's sizes against the tensors present (names and shapes from the headers; nothing is
    read or allocated). The layer count comes first: the model is built with one module per layer, so
    a count of 10**9 must never reach `build`. `keys` renames config keys for messages (GGUF metadata)."""
    keys = keys or {}
    key, prefix = arch.LAYERS
    prefix = checkpoint_prefix(arch) + prefix
    pattern = re.compile(re.escape(prefix) + _LAYER_INDEX)
    layers = {int(m.group(1)) for n in weights.names() if (m := pattern.match(n))}
    n = config.num_hidden_layers
    if len(layers) != n or max(layers, default=-1) != n - 1:  # distinct indices >= 0: exactly 0..n-1 (no range(n) built)
        found = len(layers)
        gap = next((i for i, layer in enumerate(sorted(layers)) if i != layer), None)
        if gap is not None:
            raise DeployError(f"{where}: the checkpoint has no tensors for layer {gap} ({prefix}{gap}.*) but has "
                              f"some for layer {max(layers)}; the checkpoint is incomplete, re-download it")
        raise DeployError(f"{where}: {keys.get(key, key)} is {n}, but the checkpoint holds tensors of {found} layers "
                          f"({prefix}0..{found - 1}); {fix}" if found else
                          f"{where}: {keys.get(key, key)} is {n}, but the checkpoint holds no layer tensors ({prefix}N.*); "
                          f"is it a complete {arch.__name__.split('.')[-1]} checkpoint?")
    for what, size, tensor, axis in arch.shape_facts(config):
        tensor = checkpoint_prefix(arch) + tensor
        if tensor not in weights:
            continue  # reported as missing by LoadedModel.check
        shape = tuple(weights.shape(tensor))
        if len(shape) <= axis or shape[axis] != size:
            named = " * ".join(keys.get(k, k) for k in what.split(" * "))
            raise DeployError(f"{where}: {named} is {size}, but tensor {tensor} has shape {list(shape)}; {fix}")
