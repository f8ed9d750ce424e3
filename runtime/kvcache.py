"""The KV cache on the device: per layer, keys and values of [context_window, kv_heads, head_dim],
or, for a sliding-window layer whose window is shorter than the context, a ring of `rows` rows
(window + prefill_chunk - 1: what any step's queries can see) holding position j at row j % rows.

`begin(n)` reserves n positions and returns the new total length; the compiled kv_copy kernel
writes each layer's new keys and values into the reserved rows; `view` gives kernels the first
`length` rows (the buffer is larger; kernels index rows they are told exist), or a ring whole.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from .vm import DTYPE_BYTES, DTensor

KV_META = ("pos", "seq", "slot", "pages", "last")  # kv.meta's tensors of a batched step (nn.Cache.META)


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


def paged_metadata(tables: list[list[int]], starts: list[int], counts: list[int], page_size: int) -> dict:
    """The int32 metadata of a batched step over a page pool (nn.Cache's kv.meta): sequence b, whose pages are
    tables[b], appends counts[b] tokens at positions starts[b] on. pos, seq, slot: per token its position,
    sequence and pool row; pages: the page tables [batch, pages_len] (padded with page 0, never read past a
    sequence's own positions); last: per sequence the token whose logits the step returns."""
    pos = np.concatenate([np.arange(s, s + c) for s, c in zip(starts, counts)]).astype(np.int32)
    seq = np.repeat(np.arange(len(counts)), counts).astype(np.int32)
    width = max(-(-(s + c) // page_size) for s, c in zip(starts, counts))
    pages = np.zeros((len(tables), width), np.int32)
    for b, t in enumerate(tables):
        pages[b, :min(width, len(t))] = t[:width]
    slot = (pages[seq, pos // page_size] * page_size + pos % page_size).astype(np.int32)
    return {"pos": pos, "seq": seq, "slot": slot, "pages": pages, "last": (np.cumsum(counts) - 1).astype(np.int32)}


class PoolFull(RuntimeError):
    pass


class PagedKVCache:
    """The page pool of batched steps (vLLM's PagedAttention layout): per layer, keys and values of
    [pages * page_size, kv_heads, head_dim]; a sequence holds a list of pages (its page table), taken from
    and given back to the pool. `plan` writes a step's metadata (paged_metadata) into device buffers sized
    for the package's bounds; the step function reads them through kv.pages / kv.meta.

    Prefix caching (vLLM's automatic prefix caching): a full page whose tokens are known is registered under
    a key that names every token up to its end (a SHA-256 chain over the pages of tokens), so a sequence
    whose prompt starts with the same tokens (a chat template's system prompt, the turns of a conversation)
    shares the page instead of computing it again. Pages are counted by the sequences that hold them; a
    registered page that no sequence holds stays cached (least recently used first to go) until the pool
    needs it. A sequence never writes a page it shares: it shares full pages only, and writes past them."""

    def __init__(self, device, layers: int, kv_heads: int, head_dim: int, dtype: str, pages: int, page_size: int,
                 sequences: int, chunk: int, context: int):
        self.device, self.pages, self.page_size, self.sequences = device, pages, page_size, sequences
        self.chunk, self.context = chunk, context
        self.widest = -(-context // page_size)
        rows = pages * page_size * kv_heads * head_dim * DTYPE_BYTES[dtype]
        self.k = [device.alloc(rows) for _ in range(layers)]
        self.v = [device.alloc(rows) for _ in range(layers)]
        self.shape = (pages * page_size, kv_heads, head_dim)
        self.dtype = dtype
        sizes = {"pos": chunk, "seq": chunk, "slot": chunk, "pages": sequences * self.widest, "last": sequences}
        self.buffers = {name: device.alloc(4 * n) for name, n in sizes.items()}
        self.free = list(range(pages - 1, -1, -1))  # pages holding nothing known, popped from the end
        self.refs = [0] * pages  # sequences holding each page
        self.cached: dict[bytes, int] = {}  # key -> registered page
        self.key_of: dict[int, bytes] = {}  # registered page -> key
        self.idle: OrderedDict[int, None] = OrderedDict()  # registered pages no sequence holds, oldest first
        self._shapes: dict[str, tuple] = {}

    @property
    def pages_in_use(self) -> int:
        return self.pages - len(self.free) - len(self.idle)

    @property
    def available(self) -> int:
        """Pages a sequence can take: free ones and cached ones no sequence holds."""
        return len(self.free) + len(self.idle)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def take(self, n: int) -> list[int]:
        if n > self.available:
            raise PoolFull(f"{n} pages asked of a pool with {self.available} available")
        out = []
        for _ in range(n):
            if self.free:
                p = self.free.pop()
            else:  # the least recently used cached page: forget what it holds
                p, _ = self.idle.popitem(last=False)
                del self.cached[self.key_of.pop(p)]
            self.refs[p] = 1
            out.append(p)
        return out

    def give(self, pages: list[int]) -> None:
        for p in reversed(pages):
            self.refs[p] -= 1
            if self.refs[p] == 0:
                if p in self.key_of:
                    self.idle[p] = None
                else:
                    self.free.append(p)

    def keys(self, ids: list[int], pages: int, after: bytes = b"") -> list[bytes]:
        """The keys of the first `pages` full pages of ids (the chain goes on from `after`, the key before)."""
        out, size = [], self.page_size
        for j in range(pages):
            after = hashlib.sha256(after + np.asarray(ids[j * size:(j + 1) * size], "<i4").tobytes()).digest()
            out.append(after)
        return out

    def share(self, keys: list[bytes]) -> list[int]:
        """The cached pages of the longest run of `keys`, now held once more (the caller's)."""
        out = []
        for key in keys:
            p = self.cached.get(key)
            if p is None:
                break
            if self.refs[p] == 0:
                del self.idle[p]
            self.refs[p] += 1
            out.append(p)
        return out

    def register(self, key: bytes, page: int) -> None:
        """`page`, full, holds the tokens `key` names (a page already under this key keeps it)."""
        if key not in self.cached and page not in self.key_of:
            self.cached[key], self.key_of[page] = page, key

    def plan(self, tables: list[list[int]], starts: list[int], counts: list[int]) -> None:
        if not 1 <= len(counts) <= self.sequences or not 1 <= sum(counts) <= self.chunk:
            raise ValueError(f"a step holds 1..{self.sequences} sequences and 1..{self.chunk} tokens, "
                             f"got {len(counts)} and {sum(counts)}")
        meta = paged_metadata(tables, starts, counts, self.page_size)
        if meta["pages"].shape[1] > self.widest or not all(s + c <= self.context for s, c in zip(starts, counts)):
            raise ValueError(f"a sequence of the step is longer than the context window of {self.context}")
        for name, a in meta.items():
            self.device.write(self.buffers[name], a)
            self._shapes[name] = a.shape

    def pages_shape(self) -> tuple[int, int]:
        """kv.pages: (sequences, page-table width) of the planned step."""
        return self._shapes["pages"]

    def meta(self, name: str) -> DTensor:
        return DTensor(self.buffers[name], self._shapes[name], "int32")

    def view(self, which: str, layer: int) -> DTensor:
        return DTensor((self.k if which == "k" else self.v)[layer], self.shape, self.dtype)
