"""The KV cache on the device: per layer, keys and values of [context_window, kv_heads, head_dim],
or, for a sliding-window layer whose window is shorter than the context, a ring of `rows` rows
(window + prefill_chunk - 1: what any step's queries can see) holding position j at row j % rows.

`begin(n)` reserves n positions and returns the new total length; the compiled kv_copy kernel
writes each layer's new keys and values into the reserved rows; `view` gives kernels the first
`length` rows (the buffer is larger; kernels index rows they are told exist), or a ring whole.
"""
from __future__ import annotations

from .vm import DTYPE_BYTES, DTensor


class ContextWindowFull(ValueError):
    pass


class KVCache:
    def __init__(self, device, layers: int, capacity: int, kv_heads: int, head_dim: int, dtype: str = "float32",
                 rows: list[int] | None = None, step: int = 0):
        """rows: per layer, the ring's rows (0: the whole context window); step: the most tokens a step may
        append where there are rings (the prefill chunk their size assumes)."""
        self.capacity, self.kv_heads, self.head_dim, self.dtype = capacity, kv_heads, head_dim, dtype
        self.rows = list(rows or [0] * layers)
        self.step = step if any(self.rows) else 0
        row_bytes = kv_heads * head_dim * DTYPE_BYTES[dtype]
        sizes = [(r or capacity) * row_bytes for r in self.rows]
        self.k = [device.alloc(b) for b in sizes]
        self.v = [device.alloc(b) for b in sizes]
        self.length = 0
        self.nbytes = 2 * sum(sizes)

    def begin(self, n: int) -> int:
        if self.step and n > self.step:
            raise ContextWindowFull(f"a step of {n} tokens exceeds the {self.step} the sliding-window rings of this "
                                    f"cache hold; prefill in chunks of {self.step}")
        if self.length + n > self.capacity:
            raise ContextWindowFull(f"{self.length} cached + {n} new tokens exceed the context window of "
                                    f"{self.capacity}; start a new conversation (/reset) or compile with a larger "
                                    f"--context-window")
        self.length += n
        return self.length

    def view(self, which: str, layer: int) -> DTensor:
        buf = self.k[layer] if which == "k" else self.v[layer]
        return DTensor(buf, (self.rows[layer] or self.length, self.kv_heads, self.head_dim), self.dtype)

    def keeps(self, n: int) -> bool:
        """Whether truncate(n) leaves a usable cache: a ring has overwritten positions that a window reaching
        back from n needs once more than `step` positions were written after n."""
        return 0 <= n <= self.length and (not self.step or self.length - n <= self.step)

    def reset(self) -> None:
        self.length = 0

    def truncate(self, n: int) -> None:
        """Keep the first n positions (a prompt that shares them is prefilled from n on); rows past n
        are overwritten by the next begin."""
        if not self.keeps(n):
            raise ValueError(f"cannot keep {n} positions of a KV cache holding {self.length}"
                             + (" whose sliding-window rings moved past them; reset it" if 0 <= n <= self.length else ""))
        self.length = n
