"""The KV cache on the device: per layer, keys and values of [context_window, kv_heads, head_dim].

`begin(n)` reserves n positions and returns the new total length; the compiled kv_copy kernel
writes each layer's new keys and values into the reserved rows; `view` gives kernels the first
`length` rows (the buffer is larger; kernels index rows they are told exist).
"""
from __future__ import annotations

from .vm import DTYPE_BYTES, DTensor


class ContextWindowFull(ValueError):
    pass


class KVCache:
    def __init__(self, device, layers: int, capacity: int, kv_heads: int, head_dim: int, dtype: str = "float32"):
        self.capacity, self.kv_heads, self.head_dim, self.dtype = capacity, kv_heads, head_dim, dtype
        nbytes = capacity * kv_heads * head_dim * DTYPE_BYTES[dtype]
        self.k = [device.alloc(nbytes) for _ in range(layers)]
        self.v = [device.alloc(nbytes) for _ in range(layers)]
        self.length = 0
        self.nbytes = 2 * layers * nbytes

    def begin(self, n: int) -> int:
        if self.length + n > self.capacity:
            raise ContextWindowFull(f"{self.length} cached + {n} new tokens exceed the context window of "
                                    f"{self.capacity}; start a new conversation (/reset) or compile with a larger "
                                    f"--context-window")
        self.length += n
        return self.length

    def view(self, which: str, layer: int) -> DTensor:
        buf = self.k[layer] if which == "k" else self.v[layer]
        return DTensor(buf, (self.length, self.kv_heads, self.head_dim), self.dtype)

    def reset(self) -> None:
        self.length = 0

    def truncate(self, n: int) -> None:
        """Keep the first n positions (a prompt that shares them is prefilled from n on); rows past n
        are overwritten by the next begin."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot keep {n} positions of a KV cache holding {self.length}")
        self.length = n
