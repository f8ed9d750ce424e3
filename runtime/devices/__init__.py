"""Device backends behind one interface: opencl (pyopencl), webgpu (wgpu-py), cuda (CuPy), cpu (native C
through ctypes), host (numpy).

Importing this package needs numpy only; a backend imports its binding when it is opened, and a
missing binding raises DeviceError naming the package to install.
"""
from __future__ import annotations

import importlib
import inspect
import os

from .base import Buffer, BufferRange, Device, DeviceError, Kernel, buffer_ranges

# kind -> (module, device class)
BACKENDS = {"opencl": ("opencl", "OpenCLDevice"), "webgpu": ("webgpu", "WebGPUDevice"),
            "cuda": ("cuda", "CUDADevice"), "cpu": ("cpu", "CPUDevice"),
            "host": ("host", "HostDevice")}
KINDS = tuple(BACKENDS)


def _backend(kind: str):
    if kind not in BACKENDS:
        raise DeviceError(f"unknown device kind {kind!r}; choose one of {', '.join(KINDS)}")
    return importlib.import_module(f".{BACKENDS[kind][0]}", __name__)


def open_device(kind: str, **opts) -> Device:
    """Open a device. opencl: platform=substring, device=index; webgpu: adapter=substring, backend=name;
    cuda: device=index, or emulate="forward" | "reverse" | "shuffle" (and seed=n) for the CUDA emulation on the CPU
    (runtime/devices/cuda_emu.py), which DEPLOYCC_CUDA_EMULATE=ORDER also selects; cpu: threads=n; host: none."""
    cls = getattr(_backend(kind), BACKENDS[kind][1])
    if kind == "cuda" and (opts.get("emulate") or os.environ.get("DEPLOYCC_CUDA_EMULATE")):
        from .cuda_emu import CUDAEmulator

        order = opts.pop("emulate", None) or os.environ["DEPLOYCC_CUDA_EMULATE"]
        cls, opts = CUDAEmulator, {"order": order, **opts}
    try:
        inspect.signature(cls).bind(**opts)
    except TypeError as e:
        raise DeviceError(f"bad options for the {kind} device: {e}") from None
    return cls(**opts)


def available() -> list[dict]:
    """Every OpenCL device, WebGPU adapter, CUDA GPU and the host, as {kind, name, details}; never raises.
    A backend that cannot be queried appears once with details["error"]."""
    found = []
    for kind in KINDS:
        try:
            found.extend(_backend(kind).enumerate_devices())
        except Exception as e:  # noqa: BLE001 - a broken driver must not break `deploycc devices`
            found.append({"kind": kind, "name": None, "details": {"error": str(e).splitlines()[0] if str(e) else type(e).__name__}})
    return found


__all__ = ["BACKENDS", "KINDS", "Buffer", "BufferRange",
           "buffer_ranges", "Device", "DeviceError", "Kernel", "available", "open_device"]
