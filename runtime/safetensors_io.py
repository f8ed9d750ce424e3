"""A minimal safetensors reader (header checked, data memory-mapped); no torch, no pickle.

The whole header is checked when the file is opened: every entry's dtype, shape and offsets of the
right type and inside the file, no name twice. So a damaged or hostile params file is a
SafetensorsError naming the file, never an exception from numpy, and nothing is read or allocated
beyond the header (at most MAX_HEADER bytes, the safetensors format's own limit).
"""
from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U32": np.uint32, "U8": np.uint8, "I8": np.int8,
          "I64": np.int64, "BF16": np.uint16}
MAX_HEADER = 100_000_000
MAX_NDIM = 8


class SafetensorsError(ValueError):
    pass


class DuplicateKey(ValueError):
    pass


def unique_keys(pairs: list) -> dict:
    """json object_pairs_hook: a name given twice is an error, not the last one silently winning (the
    package reader here and the checkpoint reader of deploycc.hub share it)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def shown(name: str) -> str:
    """A tensor name for a one-line message: as it is, or quoted with escapes where it has a newline or
    another unprintable character (a file can name tensors anything)."""
    return name if name.isprintable() else repr(name)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class SafetensorsReader:
    def __init__(self, path: Path):
        self.path = Path(path)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{self.path} is truncated (no header); recompile the package")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > MAX_HEADER:
                raise SafetensorsError(f"{self.path} is truncated (header of {n} bytes); recompile the package")
            try:
                header = json.loads(f.read(n), object_pairs_hook=unique_keys)
            except DuplicateKey as e:
                raise SafetensorsError(f"{self.path} names tensor {shown(e.args[0])} twice; recompile the package") from None
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise SafetensorsError(f"{self.path} has a corrupted header; recompile the package") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path} has a corrupted header (not a JSON object); recompile the package")
        self.start = 8 + n
        self.size = size
        self.entries = {name: self._entry(name, info) for name, info in header.items() if name != "__metadata__"}
        self.header = header
        self._mm = None

    def _entry(self, name: str, info) -> tuple[type, tuple[int, ...], int, int]:
        """(numpy dtype, shape, start, end) of one header entry, or a SafetensorsError."""
        bad = SafetensorsError(f"{self.path}: tensor {shown(name)} is truncated or corrupted; recompile the package")
        if not isinstance(info, dict):
            raise bad
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise bad
        if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(is_int(d) and d >= 0 for d in shape):
            raise bad
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets):
            raise bad
        begin, end = offsets
        count = math.prod(shape)  # Python integers: no int64 wrap-around that could make a huge shape look small
        if not 0 <= begin <= end or end - begin != count * np.dtype(DTYPES[dtype]).itemsize or self.start + end > self.size:
            raise bad
        return DTYPES[dtype], tuple(shape), begin, end

    def read(self, name: str) -> np.ndarray:
        entry = self.entries.get(name)
        if entry is None:
            raise SafetensorsError(f"{self.path} lacks tensor {shown(name)}; recompile the package")
        dtype, shape, begin, _ = entry
        if self._mm is None:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._mm, dtype=dtype, count=math.prod(shape), offset=self.start + begin).reshape(shape)
