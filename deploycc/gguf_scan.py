"""A bounded structural check of a GGUF file, run before the `gguf` package's reader sees it.

The reader trusts the counts and lengths it reads: an array length of 2**40 makes it loop (creating a
numpy view per element) long past the end of the file, a string that is not UTF-8 fails deep inside
it, and a tensor may point outside the file. This walk reads the same header with `struct`, checks
every count and length against the bytes that remain, every type against the format's tables and
every string as UTF-8, and the tensors' shapes, types and data ranges against the file, so that the
reader only ever sees a well-formed file. It raises DeployError naming the file and what is wrong;
its work is linear in the header's size and it allocates nothing in proportion to a count.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 2 and 3, little-endian).
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from .errors import DeployError

# GGUF metadata value types -> bytes of a scalar (STRING 8 and ARRAY 9 are variable-sized).
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS
# The reader makes a numpy view per array element: a real tokenizer has about a million elements
# (tokens, scores, types, merges); far more means a damaged file that would eat gigabytes.
MAX_ARRAY_ELEMENTS = 1 << 22
MAX_KEY_BYTES = 1 << 16


class _Scan:
    def __init__(self, path: Path, buf):
        self.path, self.buf, self.pos, self.size = path, buf, 0, len(buf)
        self.elements = 0

    def fail(self, what: str) -> DeployError:
        return DeployError(f"{self.path} is not a readable GGUF file (truncated or corrupted?): {what} "
                           f"at byte {self.pos}; re-download or re-convert it")

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes; the offset where they start."""
        if n < 0 or n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes but {self.size - self.pos} remain")
        at, self.pos = self.pos, self.pos + n
        return at

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"the length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long (at most {limit})")
        at = self.take(n, what)
        try:
            return bytes(self.buf[at:at + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text") from None

    def value(self, vtype: int, what: str, in_array: bool = False) -> None:
        if vtype in SCALAR_BYTES:
            self.take(SCALAR_BYTES[vtype], what)
        elif vtype == STRING:
            self.string(what)
        elif vtype == ARRAY and not in_array:
            self.array(what)
        else:
            raise self.fail(f"{what} has {'nested array' if vtype == ARRAY else f'unknown value type {vtype}'}")

    def array(self, what: str) -> None:
        itype, n = self.u32(f"the element type of {what}"), self.u64(f"the length of {what}")
        self.elements += n
        if self.elements > MAX_ARRAY_ELEMENTS:
            raise self.fail(f"{what} brings the metadata arrays to {self.elements} elements "
                            f"(at most {MAX_ARRAY_ELEMENTS})")
        if itype in SCALAR_BYTES:
            self.take(n * SCALAR_BYTES[itype], what)  # one bounds check for the whole array
        elif itype == STRING:
            if n * 8 > self.size - self.pos:
                raise self.fail(f"{what} has {n} strings but {self.size - self.pos} bytes remain")
            for i in range(n):
                self.string(f"{what}[{i}]")
        else:
            self.value(itype, what, in_array=True)


def scan(path: Path) -> None:
    """Raise DeployError unless `path` is a structurally sound GGUF file (header only; data not read)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise DeployError(f"{path} is not a readable GGUF file (truncated or corrupted?): it is {size} bytes, "
                              f"shorter than a GGUF header; re-download or re-convert it")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _scan(_Scan(path, buf))


def _scan(s: _Scan) -> None:
    from gguf.constants import GGML_QUANT_SIZES

    if bytes(s.buf[:4]) != b"GGUF":
        raise s.fail("the magic number is not GGUF")
    s.take(4, "magic")
    version = s.u32("version")
    if version not in (2, 3):
        raise s.fail(f"version {version} is not 2 or 3 (big-endian files are not supported)")
    n_tensors, n_kv = s.u64("the tensor count"), s.u64("the metadata count")
    if n_kv * 13 > s.size - s.pos or n_tensors * 24 > s.size - s.pos:  # the smallest entry of each kind
        raise s.fail(f"{n_kv} metadata entries and {n_tensors} tensors cannot fit in {s.size} bytes")
    alignment, keys = 32, set()
    for _ in range(n_kv):
        key = s.string("a metadata key", MAX_KEY_BYTES)
        if key in keys:
            raise s.fail(f"metadata key {key!r} appears twice")
        keys.add(key)
        vtype = s.u32(f"the type of {key}")
        if key == "general.alignment":
            if vtype != 4:
                raise s.fail("general.alignment is not a uint32")
            alignment = struct.unpack_from("<I", s.buf, s.pos)[0] if s.size - s.pos >= 4 else 0
            if alignment == 0 or alignment & (alignment - 1):
                raise s.fail(f"general.alignment {alignment} is not a power of two")
        s.value(vtype, key)
    tensors, names = [], set()
    for _ in range(n_tensors):
        name = s.string("a tensor name", MAX_KEY_BYTES)
        if name in names:
            raise s.fail(f"tensor {name!r} appears twice")
        names.add(name)
        ndim = s.u32(f"the rank of {name}")
        if not 1 <= ndim <= MAX_DIMS:
            raise s.fail(f"tensor {name!r} has {ndim} dimensions (1 to {MAX_DIMS})")
        dims = [s.u64(f"a dimension of {name}") for _ in range(ndim)]
        qtype, offset = s.u32(f"the type of {name}"), s.u64(f"the data offset of {name}")
        if qtype not in {int(t) for t in GGML_QUANT_SIZES}:
            raise s.fail(f"tensor {name!r} has unknown type {qtype}")
        block, block_bytes = GGML_QUANT_SIZES[_qtype(qtype)]
        if min(dims) < 1 or dims[0] % block:
            raise s.fail(f"tensor {name!r} has shape {dims[::-1]}, not whole blocks of {block} along its rows")
        count = 1
        for d in dims:
            count *= d
        tensors.append((name, offset, count // block * block_bytes))
    data = s.pos + (-s.pos) % alignment
    for name, offset, nbytes in tensors:
        if offset % alignment or data + offset + nbytes > s.size:
            raise DeployError(f"{s.path} is not a readable GGUF file (truncated or corrupted?): tensor {name!r} needs "
                              f"bytes {data + offset}..{data + offset + nbytes} of a {s.size}-byte file"
                              f"{' (misaligned)' if offset % alignment else ''}; re-download or re-convert it")


def _qtype(value: int):
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType(value)
