"""The reference session: a model's exported module run by the numpy reference interpreter.

It has the same contract as the runtime engine of later stages, so every compiled package can be
checked against it: `prefill(ids, all_logits)`, `decode(token)`, `reset()`, `truncate(n)`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import DeployError
from .export import export
from .interp import Interpreter
from .ir.module import IRModule
from .loaded import LoadedModel
from .op.attention import ContextOverflow, RefKVCache
from .transform.merge_matmuls import function_params

STAGES = ("exported", "legalized", "fused")  # stages the reference interpreter runs


def lower(mod: IRModule, stage: str, target=None) -> IRModule:
    from . import pipeline

    return pipeline.run(mod, target, stage)


class ReferenceSession:
    def __init__(self, model: LoadedModel, stage: str = "exported", context_window: int | None = None,
                 ops: dict | None = None, kv_cache: str = "float32"):
        """ops: op name -> numpy function run instead of the op's reference (Interpreter). kv_cache: the cache's
        element type (a package's manifest kv_cache.dtype: float16 rounds the keys and values as it does)."""
        self.model = model
        self.module = lower(export(model, context_window, kv_cache=kv_cache), stage)
        self.context_window = self.module.attrs["context_window"]
        dtypes = {n: p.dtype for n, p in model.build().named_parameters()}  # packed weights: uint32, float16
        typed = ((n, np.ascontiguousarray(a, dtype=dtypes[n])) for n, a in model.params())
        self.params = function_params(self.module, typed, "prefill")  # merged linears concatenated
        self.interp = Interpreter(self.module, ops=ops, keep_weights=True)
        cfg = model.config
        self.cache = RefKVCache(cfg.num_hidden_layers, self.context_window, cfg.num_key_value_heads, cfg.head_dim,
                                np.dtype(kv_cache))

    def _run(self, fn: str, ids: Sequence[int]) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int32).reshape(1, -1)
        if arr.size == 0:
            raise DeployError("prefill needs at least one token")
        try:
            return self.interp.run(fn, arr, self.cache, *self.params)
        except ContextOverflow as e:
            raise DeployError(str(e)) from None

    def prefill(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        logits = self._run("prefill_all" if all_logits else "prefill", ids)[0]
        return logits if all_logits else logits[-1]

    def decode(self, token_id: int) -> np.ndarray:
        return self._run("decode", [int(token_id)])[0, -1]

    def reset(self) -> None:
        self.cache.reset()

    def truncate(self, n: int) -> None:
        """Keep the first n cached positions (as the runtime engine's truncate)."""
        if not 0 <= n <= self.cache.length:
            raise DeployError(f"cannot keep {n} positions of a KV cache holding {self.cache.length}")
        self.cache.length = n


def reference_session(model: LoadedModel | str, stage: str = "exported", context_window: int | None = None,
                      quantization: str | None = None, head_quantization: str | None = None,
                      activations: int | dict | None = None, ops: dict | None = None,
                      kv_cache: str = "float32") -> ReferenceSession:
    """`activations`: the weights whose linears round their input (a package's manifest record, or bits for every
    weight the integer kernels take), as quantization.quantize takes it. `ops`, `kv_cache`: see ReferenceSession."""
    if isinstance(model, str):
        from .hub import load_model

        model = load_model(model)
    from .quantization import quantize

    # a GGUF's Q4_0/Q4_1/Q8_0 blocks take integer activations in our group schemes (the same values)
    quantized = quantize(model, quantization, head_quantization, groups=bool(activations), activations=activations)
    return ReferenceSession(quantized, stage, context_window, ops, kv_cache)
