"""OpenCL C 1.2. Without cl_khr_fp16 (PoCL), half is storage only: vload_half / vstore_half."""
from __future__ import annotations

from .cstyle import CStyleRenderer


class OpenCLRenderer(CStyleRenderer):
    preamble = ""


def render(kernels, target=None) -> str:
    return OpenCLRenderer().module(kernels)
