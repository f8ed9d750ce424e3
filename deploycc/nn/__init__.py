"""deploycc.nn: build models that read like their PyTorch originals and export them to IR."""
from . import op
from .core import Cache, Module, ObjectSpec, Parameter, Spec, Tensor, Tracer, const, kv_cache_spec, spec
from .layers import Embedding, LayerNorm, Linear, ModuleList, RMSNorm

__all__ = ["op", "Cache", "Module", "ObjectSpec", "Parameter", "Spec", "Tensor", "Tracer", "const",
           "kv_cache_spec", "spec", "Embedding", "LayerNorm", "Linear", "ModuleList", "RMSNorm"]
