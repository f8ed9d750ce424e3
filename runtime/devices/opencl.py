"""OpenCL backend (pyopencl), aimed at PoCL on CPUs and at any OpenCL 1.2 GPU.

Kernels are OpenCL C 1.2: `__kernel void NAME(__global T* b0, ..., int s0, ...)`. A launch runs
grid[i] * block[i] work-items per dimension in work-groups of `block`. One in-order queue per device,
so a download sees every earlier launch without extra events.

Platform choice: a GPU platform first, then PoCL >= 3.1 (Debian's, LLVM 15, faster half loads) before
older PoCL (pip's pocl-binary-distribution 3.0), then the newest version string.
"""
from __future__ import annotations

import hashlib
import re
import warnings

import numpy as np

from .base import Buffer, Device, DeviceError, Kernel, first_lines

INSTALL_HINT = ("pip install 'pyopencl[pocl]' (the deploycc[opencl] extra); for PoCL 3.1 also "
                "apt-get install pocl-opencl-icd ocl-icd-libopencl1")

_CONTEXTS: dict[tuple[int, int], object] = {}  # (platform ptr, device ptr) -> cl.Context, shared per process
_PROGRAMS: dict[tuple[int, str, tuple[str, ...]], object] = {}  # (context ptr, source sha256, options) -> built Program
_POCL = re.compile(r"PoCL\s+(\d+)\.(\d+)", re.I)


def _cl():
    try:
        import pyopencl as cl
    except ImportError as e:
        raise DeviceError(f"the OpenCL backend needs pyopencl ({e}): {INSTALL_HINT}") from None
    return cl


def _pocl_version(platform) -> tuple[int, int] | None:
    m = _POCL.search(platform.version)
    return (int(m[1]), int(m[2])) if m and "portable computing language" in platform.name.lower() else None


def _rank(cl, platform, devices) -> tuple:
    gpu = any(d.type & cl.device_type.GPU for d in devices)
    pocl = _pocl_version(platform)
    return (gpu, pocl is not None and pocl >= (3, 1), pocl or (0, 0))


def _platforms(cl) -> list[tuple[object, list]]:
    """(platform, devices) for every platform with at least one device, best first."""
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # no ICD loaded at all
        return []
    found = []
    for p in platforms:
        try:
            devs = p.get_devices()
        except cl.Error:
            continue
        if devs:
            found.append((p, devs))
    return sorted(found, key=lambda pd: _rank(cl, *pd), reverse=True)


def enumerate_devices() -> list[dict]:
    cl = _cl()
    out = []
    for i, (p, devs) in enumerate(_platforms(cl)):
        for j, d in enumerate(devs):
            out.append({"kind": "opencl", "name": d.name, "details": {
                "platform": p.name, "platform_version": p.version.strip(), "device_index": j,
                "device_version": d.version.strip(), "type": cl.device_type.to_string(d.type),
                "default": i == 0 and j == 0, **_limits(d)}})
    return out


def _limits(d) -> dict:
    return {"compute_units": d.max_compute_units, "max_work_group_size": d.max_work_group_size,
            "local_mem_size": d.local_mem_size, "max_mem_alloc_size": d.max_mem_alloc_size,
            "global_mem_size": d.global_mem_size, "has_fp16": "cl_khr_fp16" in d.extensions}


class OpenCLDevice(Device):
    kind = "opencl"

    def __init__(self, platform: str | None = None, device: int = 0):
        cl = self._cl = _cl()
        found = _platforms(cl)
        if not found:
            raise DeviceError(f"no OpenCL platform with a device found: {INSTALL_HINT}")
        if platform is not None:
            names = [f"{p.name} ({p.version.strip()})" for p, _ in found]
            found = [(p, d) for p, d in found if platform.lower() in f"{p.name} {p.version} {p.vendor}".lower()]
            if not found:
                raise DeviceError(f"no OpenCL platform matches {platform!r}; found: {'; '.join(names)}")
        self.platform, devices = found[0]
        if not 0 <= device < len(devices):
            raise DeviceError(f"OpenCL platform {self.platform.name!r} has {len(devices)} device(s), no index {device}")
        self.cl_device = devices[device]
        key = (self.platform.int_ptr, self.cl_device.int_ptr)
        if key not in _CONTEXTS:
            _CONTEXTS[key] = cl.Context([self.cl_device])
        self.context = _CONTEXTS[key]
        self.queue = cl.CommandQueue(self.context, self.cl_device)
        pocl = _pocl_version(self.platform)
        self.name = f"{self.cl_device.name} ({f'PoCL {pocl[0]}.{pocl[1]}' if pocl else self.platform.name.strip()})"
        self.limits = _limits(self.cl_device)
        self.has_f16 = self.limits["has_fp16"]

    # -- memory ----------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        nbytes = self._check_alloc(nbytes)
        cl = self._cl
        size = max(4, -(-nbytes // 4) * 4)
        try:
            h = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size=size)
            cl.enqueue_fill_buffer(self.queue, h, np.zeros(1, np.uint32), 0, size)
        except cl.Error as e:
            raise DeviceError(f"OpenCL allocation of {nbytes} bytes failed: {first_lines(e, 1)}") from None
        return Buffer(h, nbytes, self)

    def upload(self, array: np.ndarray) -> Buffer:
        array = np.ascontiguousarray(array)
        if array.nbytes == 0:
            return self.alloc(0)
        cl = self._cl
        try:
            h = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=array)
        except cl.Error as e:
            raise DeviceError(f"OpenCL upload of {array.nbytes} bytes failed: {first_lines(e, 1)}") from None
        return Buffer(h, array.nbytes, self)

    def write(self, buf: Buffer, array: np.ndarray) -> None:
        array = self._host_bytes(buf, array)
        if array.nbytes:
            self._cl.enqueue_copy(self.queue, buf.handle, array, is_blocking=True)

    def download(self, buf: Buffer, shape, dtype) -> np.ndarray:
        n = self._read_size(buf, shape, dtype)
        out = np.empty(shape, dtype)
        if n:
            self._cl.enqueue_copy(self.queue, out, buf.handle, is_blocking=True)
        return out

    # -- kernels ---------------------------------------------------------------------------------------
    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        cl = self._cl
        options = dict(options or {})
        flags = ("-cl-fast-relaxed-math",) if options.pop("fast_math", False) else ()
        if options:
            raise DeviceError(f"unknown OpenCL build option(s): {', '.join(sorted(options))} (known: fast_math)")
        key = (self.context.int_ptr, hashlib.sha256(source.encode()).hexdigest(), flags)
        program = _PROGRAMS.get(key)
        if program is None:
            program = cl.Program(self.context, source)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                    program.build(options=list(flags))
            except cl.Error as e:
                try:
                    log = program.get_build_info(self.cl_device, cl.program_build_info.LOG)
                except cl.Error:
                    log = str(e)
                log = re.sub(r"\S*tempfile_\w+\.cl", "<source>", log)
                raise DeviceError(f"OpenCL build failed on {self.cl_device.name}: {first_lines(log)}") from None
            _PROGRAMS[key] = program
        kernels = {}
        for name in names:
            try:
                k = cl.Kernel(program, name)
            except cl.Error:
                raise DeviceError(f"OpenCL program has no kernel {name!r}") from None
            kernels[name] = Kernel(name, k, self, {"num_args": k.num_args})
        return kernels

    def launch(self, kernel: Kernel, args: list, grid, block) -> None:
        bufs, ints = self._split_args(kernel, args)
        grid, block = self._dims(kernel, grid, block)
        if len(args) != kernel.meta["num_args"]:
            raise DeviceError(f"{kernel.name} takes {kernel.meta['num_args']} arguments, got {len(args)}")
        if 0 in grid:
            return
        if block[0] * block[1] * block[2] > self.limits["max_work_group_size"]:
            raise DeviceError(f"{kernel.name}: work-group {block} exceeds max_work_group_size "
                              f"{self.limits['max_work_group_size']}")
        k = kernel.handle
        for i, b in enumerate(bufs):
            k.set_arg(i, b.handle)
        for j, v in enumerate(ints, len(bufs)):
            k.set_arg(j, np.int32(v))
        dims = 3 if grid[2] * block[2] > 1 else 2 if grid[1] * block[1] > 1 else 1
        gsize = tuple(g * b for g, b in zip(grid, block))[:dims]
        try:
            ev = self._cl.enqueue_nd_range_kernel(self.queue, k, gsize, block[:dims])
        except self._cl.Error as e:
            raise DeviceError(f"OpenCL launch of {kernel.name} (grid {grid}, block {block}) failed: "
                              f"{first_lines(e, 1)}") from None
        if self.events is not None:
            self.events.append((kernel.name, ev))

    def launcher(self, kernel: Kernel) -> _Site:
        return _Site(self, kernel)

    def synchronize(self) -> None:
        self.queue.finish()

    # -- profiling -------------------------------------------------------------------------------------
    events: list | None = None

    def start_profile(self) -> None:
        """From now on every launch is timed by the device (a profiling queue; events kept)."""
        self.synchronize()
        cl = self._cl
        self.queue = cl.CommandQueue(self.context, self.cl_device,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.events = []

    def take_profile(self) -> list[tuple[str, float]]:
        """(kernel name, device seconds) of the launches since the last call (waits for them)."""
        self.synchronize()
        out = [(name, (ev.profile.end - ev.profile.start) * 1e-9) for name, ev in self.events or []]
        self.events = [] if self.events is not None else None
        return out

    def gate(self):
        """Hold back the queue's next commands until the returned function is called: lets a caller time
        its own enqueueing with the device idle (host cost alone)."""
        cl = self._cl
        ev = cl.UserEvent(self.context)
        cl.enqueue_marker(self.queue, wait_for=[ev])
        return lambda: ev.set_status(cl.command_execution_status.COMPLETE)


class _Site:
    """One launch site with its own cl.Kernel, so its arguments stay bound between launches: a decode
    step sets only the scalars (total_len, ...) that changed and enqueues, the replay half of
    graph capture. The first launch goes through OpenCLDevice.launch and its checks."""

    __slots__ = ("device", "kernel", "handle", "bufs", "ints", "dims", "gsize", "lsize")

    def __init__(self, device: OpenCLDevice, kernel: Kernel):
        self.device, self.kernel = device, kernel
        cl = device._cl
        self.handle = cl.Kernel(kernel.handle.get_info(cl.kernel_info.PROGRAM), kernel.name)
        self.bufs: list | None = None
        self.ints: list = []
        self.dims = None

    def __call__(self, bufs: list, ints: list, grid, block) -> None:
        k, last = self.handle, self.bufs
        if last is None:
            self.device.launch(Kernel(self.kernel.name, k, self.device, self.kernel.meta), [*bufs, *ints], grid, block)
            self.bufs, self.ints = list(bufs), list(ints)
            return
        for i, b in enumerate(bufs):
            if b is not last[i]:
                k.set_arg(i, b.handle)
                last[i] = b
        n, prev = len(bufs), self.ints
        for j, v in enumerate(ints):
            if v != prev[j]:
                k.set_arg(n + j, np.int32(v))
                prev[j] = v
        key = (grid, block)
        if key != self.dims:
            g, b = self.device._dims(self.kernel, grid, block)
            d = 3 if g[2] * b[2] > 1 else 2 if g[1] * b[1] > 1 else 1
            self.dims, self.gsize, self.lsize = key, tuple(x * y for x, y in zip(g, b))[:d], b[:d]
        if 0 in self.gsize:
            return
        dev = self.device
        try:
            ev = dev._cl.enqueue_nd_range_kernel(dev.queue, k, self.gsize, self.lsize)
        except dev._cl.Error as e:
            raise DeviceError(f"OpenCL launch of {self.kernel.name} (grid {grid}, block {block}) failed: "
                              f"{first_lines(e, 1)}") from None
        if dev.events is not None:
            dev.events.append((self.kernel.name, ev))

