"""The device interface shared by every backend: buffers, kernel builds, launches.

A backend owns its binding (pyopencl, wgpu, cupy, numpy) and imports it lazily, so this module and
the package `__init__` import with numpy alone. Kernel ABI, identical for every kernel language:
buffer parameters first (b0..bN), then 32-bit int scalars (s0..sM); `launch` takes its args in the
same order, Buffers then Python ints.
"""
from __future__ import annotations

import abc
import math
from collections.abc import Sequence

import numpy as np

from ..kinds import KINDS

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class DeviceError(RuntimeError):
    """A device could not be opened, or an allocation, copy, build or launch failed (one-line message)."""


class Buffer:
    """Device memory: `handle` is the backend's object; `nbytes` the size asked for (may be 0)."""

    __slots__ = ("handle", "nbytes", "device")

    def __init__(self, handle, nbytes: int, device: Device):
        self.handle = handle
        self.nbytes = nbytes
        self.device = device

    def __repr__(self) -> str:
        return f"Buffer({self.device.kind}, {self.nbytes} bytes)"


class BufferRange:
    """Part of a buffer bound as its own argument (WebGPU: a binding with an offset and a size, for
    tensors larger than maxStorageBufferBindingSize)."""

    __slots__ = ("buffer", "offset", "size")

    def __init__(self, buffer: Buffer, offset: int, size: int):
        self.buffer, self.offset, self.size = buffer, offset, size

    def __repr__(self) -> str:
        return f"BufferRange({self.buffer!r}, offset={self.offset}, size={self.size})"


def buffer_ranges(buf: Buffer, chunk: int, parts: int) -> list[BufferRange]:
    """`buf` as `parts` consecutive ranges of `chunk` bytes (the last may be shorter)."""
    return [BufferRange(buf, p * chunk, min(chunk, buf.nbytes - p * chunk)) for p in range(parts)]


class Kernel:
    """A built entry point; `handle` is the backend's kernel/function/pipeline object."""

    __slots__ = ("name", "handle", "device", "meta")

    def __init__(self, name: str, handle, device: Device, meta: dict | None = None):
        self.name = name
        self.handle = handle
        self.device = device
        self.meta = meta or {}

    def __repr__(self) -> str:
        return f"Kernel({self.device.kind}, {self.name})"


def as_shape(shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)


def nbytes_of(shape, dtype) -> int:
    return math.prod(as_shape(shape)) * np.dtype(dtype).itemsize


def first_lines(text: str, n: int = 3, prefer: str = "error") -> str:
    """The first `n` lines of a compiler log worth showing, on one line: error lines if any, else any."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    hits = [ln for ln in lines if prefer in ln.lower()]
    return " | ".join((hits or lines)[:n]) or "(empty log)"


class Device(abc.ABC):
    kind: str = "abstract"
    name: str = ""

    # -- memory ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def alloc(self, nbytes: int) -> Buffer:
        """A new zero-filled buffer of `nbytes` bytes (at least 4 are allocated, so 0 is allowed)."""

    @abc.abstractmethod
    def upload(self, array: np.ndarray) -> Buffer:
        """A new buffer holding the bytes of `array` (C order)."""

    @abc.abstractmethod
    def write(self, buf: Buffer, array: np.ndarray) -> None:
        """Overwrite the start of `buf` with the bytes of `array`; ordered after every earlier launch."""

    @abc.abstractmethod
    def download(self, buf: Buffer, shape, dtype) -> np.ndarray:
        """A new host array read from the start of `buf`, after every earlier launch has finished."""

    # -- kernels ---------------------------------------------------------------------------------------
    @abc.abstractmethod
    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        """Compile `source` and return its entry points `names`. options: {"fast_math": bool}."""

    @abc.abstractmethod
    def launch(self, kernel: Kernel, args: list, grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
        """Enqueue `kernel` over `grid` work-groups of `block` work-items (asynchronous)."""

    def launcher(self, kernel: Kernel):
        """A launch site: `site(bufs, ints, grid, block)` for one place in the bytecode that launches
        `kernel` again and again. Backends that can keep a site's arguments bound (OpenCL) set only
        what changed since the site's last launch; the default is launch()."""
        return lambda bufs, ints, grid, block: self.launch(kernel, [*bufs, *ints], grid, block)

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait until every enqueued launch and copy has finished."""

    # -- shared checks ---------------------------------------------------------------------------------
    def _own(self, buf) -> Buffer:
        if not isinstance(buf, Buffer):
            raise DeviceError(f"expected a Buffer, got {type(buf).__name__}")
        if buf.device is not self:
            raise DeviceError(f"{buf!r} belongs to another device than {self.kind} device {self.name!r}")
        return buf

    def _host_bytes(self, buf: Buffer, array) -> np.ndarray:
        """`array` as a C-contiguous host array that fits in `buf`."""
        self._own(buf)
        array = np.ascontiguousarray(array)
        if array.nbytes > buf.nbytes:
            raise DeviceError(f"cannot write {array.nbytes} bytes into a buffer of {buf.nbytes} bytes")
        return array

    def _read_size(self, buf: Buffer, shape, dtype) -> int:
        self._own(buf)
        n = nbytes_of(shape, dtype)
        if n > buf.nbytes:
            raise DeviceError(f"cannot read {n} bytes ({as_shape(shape)} {np.dtype(dtype)}) "
                              f"from a buffer of {buf.nbytes} bytes")
        return n

    @staticmethod
    def _check_alloc(nbytes) -> int:
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
            raise DeviceError(f"buffer size must be an integer >= 0, got {nbytes!r}")
        return int(nbytes)

    def _split_args(self, kernel: Kernel, args: Sequence) -> tuple[list[Buffer], list[int]]:
        """Buffers first, then ints (the kernel ABI); ints must fit in int32."""
        if not isinstance(kernel, Kernel) or kernel.device is not self:
            raise DeviceError(f"expected a Kernel built on this {self.kind} device, got {kernel!r}")
        bufs: list[Buffer] = []
        ints: list[int] = []
        for i, a in enumerate(args):
            if isinstance(a, (Buffer, BufferRange)):
                if isinstance(a, BufferRange) and not getattr(KINDS.get(self.kind), "binding_ranges", False):
                    raise DeviceError(f"{kernel.name}: buffer ranges are a WebGPU binding feature")
                if ints:
                    raise DeviceError(f"{kernel.name}: argument {i} is a Buffer after an int; "
                                      "the ABI puts all buffers first, then int scalars")
                bufs.append(a if isinstance(a, BufferRange) else self._own(a))
            elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                if not INT32_MIN <= int(a) <= INT32_MAX:
                    raise DeviceError(f"{kernel.name}: int argument {i} = {int(a)} does not fit in int32")
                ints.append(int(a))
            else:
                raise DeviceError(f"{kernel.name}: argument {i} must be a Buffer or an int, got {type(a).__name__}")
        return bufs, ints

    @staticmethod
    def _dims(kernel: Kernel, grid, block) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        def three(v, what):
            v = tuple(int(x) for x in v)
            if not 1 <= len(v) <= 3 or any(x < 0 for x in v):
                raise DeviceError(f"{kernel.name}: {what} must be 1-3 non-negative ints, got {v}")
            return v + (1,) * (3 - len(v))
        g, b = three(grid, "grid"), three(block, "block")
        if any(x == 0 for x in b):
            raise DeviceError(f"{kernel.name}: block sizes must be >= 1, got {b}")
        return g, b

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.name!r}>"
