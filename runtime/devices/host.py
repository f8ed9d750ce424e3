"""Host "device": numpy byte arrays behind the buffer calls, so the VM's memory plan runs without a GPU.

Kernels on the host run through the compiler's reference interpreter, not through this interface,
so `build` and `launch` refuse.
"""
from __future__ import annotations

import platform

import numpy as np

from .base import Buffer, Device, DeviceError, Kernel


def enumerate_devices() -> list[dict]:
    return [{"kind": "host", "name": HostDevice.name, "details": {"machine": platform.machine(), "default": True}}]


class HostDevice(Device):
    kind = "host"
    name = f"numpy {np.__version__} ({platform.machine() or 'cpu'})"

    def __init__(self):
        self.limits: dict[str, int] = {}
        self.has_f16 = True

    def alloc(self, nbytes: int) -> Buffer:
        nbytes = self._check_alloc(nbytes)
        return Buffer(np.zeros(max(4, nbytes), np.uint8), nbytes, self)

    def upload(self, array: np.ndarray) -> Buffer:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        buf = self.alloc(data.nbytes)
        buf.handle[:data.nbytes] = data
        return buf

    def write(self, buf: Buffer, array: np.ndarray) -> None:
        data = self._host_bytes(buf, array).view(np.uint8).reshape(-1)
        buf.handle[:data.nbytes] = data

    def download(self, buf: Buffer, shape, dtype) -> np.ndarray:
        n = self._read_size(buf, shape, dtype)
        return buf.handle[:n].view(dtype).reshape(shape).copy()

    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        raise DeviceError("the host device runs no kernel source: host kernels go through the reference interpreter")

    def launch(self, kernel: Kernel, args: list, grid, block) -> None:
        raise DeviceError("the host device launches no kernels: host kernels go through the reference interpreter")

    def synchronize(self) -> None:
        pass
