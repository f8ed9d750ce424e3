"""torch <-> numpy at the boundary of Python functions in IR modules (pymodule.py's `call_py_func`, the graph
interpreter's calls into them): DLPack where the memory can be shared, a copy where it cannot. Imports torch."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


def to_numpy(x: Any) -> Any:
    """torch tensors (also inside tuples and lists) -> numpy arrays; other values unchanged.
    Shares memory (DLPack) for a contiguous CPU tensor, copies otherwise."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.dtype == torch.bfloat16:
            raise TypeError("bfloat16 tensors have no numpy form; convert with .float() first")
        return np.from_dlpack(t)
    if isinstance(x, (tuple, list)):
        return type(x)(to_numpy(v) for v in x)
    return x


def to_torch(x: Any) -> Any:
    """numpy arrays (also inside tuples and lists) -> torch tensors; other values unchanged.
    Shares memory (DLPack) for a writable array, copies a read-only one."""
    if isinstance(x, np.ndarray):
        if x.flags.writeable:
            try:
                return torch.from_dlpack(x)
            except (BufferError, RuntimeError, TypeError):
                pass
        return torch.from_numpy(np.array(x, copy=True))
    if isinstance(x, np.generic):
        return torch.from_numpy(np.asarray(x).copy())
    if isinstance(x, (tuple, list)):
        return type(x)(to_torch(v) for v in x)
    return x
