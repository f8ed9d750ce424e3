"""OpenCL C 1.2. Without cl_khr_fp16 (PoCL), half is storage only: vload_half / vstore_half."""
from __future__ import annotations

from .cstyle import CStyleRenderer


class OpenCLRenderer(CStyleRenderer):
    preamble = ""

    # PoCL has no cl_khr_fp16: half is a storage type, read with vload_half and written with vstore_half.
    def load(self, buf, indices) -> str:
        if buf.dtype == "float16" and buf.scope == "global":
            return f"vload_half({self.flat_index(buf, indices)}, {self.name(buf, buf.name)})"
        return super().load(buf, indices)

    def store(self, st) -> str:
        if st.buffer.dtype == "float16" and st.buffer.scope == "global":
            return (f"vstore_half({self.value(st.value)}, {self.flat_index(st.buffer, st.indices)}, "
                    f"{self.name(st.buffer, st.buffer.name)});")
        return super().store(st)

    def cast(self, dtype: str, inner: str) -> str:
        return f"(({'float' if dtype == 'float16' else self.ctype(dtype)})({inner}))"


def render(kernels, target=None) -> str:
    return OpenCLRenderer().module(kernels)
