"""A minimal safetensors reader (header checked, data memory-mapped); no torch, no pickle."""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U32": np.uint32, "U8": np.uint8, "I8": np.int8,
          "I64": np.int64, "BF16": np.uint16}


class SafetensorsError(ValueError):
    pass


class SafetensorsReader:
    def __init__(self, path: Path):
        self.path = Path(path)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{self.path} is truncated (no header); recompile the package")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise SafetensorsError(f"{self.path} is truncated (header of {n} bytes); recompile the package")
            try:
                self.header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise SafetensorsError(f"{self.path} has a corrupted header; recompile the package") from None
        self.start = 8 + n
        self.size = size
        self._mm = None

    def read(self, name: str) -> np.ndarray:
        info = self.header.get(name)
        if not isinstance(info, dict):
            raise SafetensorsError(f"{self.path} lacks tensor {name}; recompile the package")
        dtype = DTYPES.get(info.get("dtype"))
        shape = tuple(info.get("shape", ()))
        begin, end = info.get("data_offsets", (0, 0))
        count = int(np.prod(shape, dtype=np.int64))
        if dtype is None or end - begin != count * np.dtype(dtype).itemsize or self.start + end > self.size:
            raise SafetensorsError(f"{self.path}: tensor {name} is truncated or corrupted; recompile the package")
        if self._mm is None:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=self.start + begin).reshape(shape)
