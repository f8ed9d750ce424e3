"""The VM runtime copied into every package; it imports nothing from the compiler.

    from deploycc.runtime import Engine
    eng = Engine.load("dist/pkg")
"""
from .engine import Engine

__all__ = ["Engine"]
