"""WebGPU backend (wgpu-py), aimed at Mesa lavapipe on CPUs and at any Vulkan/Metal/D3D12 GPU.

Kernel ABI in WGSL: buffer i is `@group(0) @binding(i) var<storage, read_write|read> bI: array<T>;`
and, when the kernel has int scalars, binding N (= number of buffers) is `var<uniform> params: Params`
with `struct Params { s0: i32, s1: i32, ... }`. `launch` dispatches `grid` workgroups; the workgroup
size is written in the shader (`block` is checked against it when it is a literal).

The bind-group layout is read from the shader's declarations, because wgpu rejects a read_write
layout entry for a `read` binding and an "auto" layout drops bindings an entry point does not use.

Launches are batched: consecutive launches are encoded into one compute pass (wgpu inserts the
barriers between dispatches) and submitted on synchronize/download/write. Submitting per dispatch
costs 150-550 us on lavapipe against 25-40 us batched (FACTS.md). Each launch's Params go into a ring of uniform
memory at an offset of its own (a dynamic offset, aligned to min_uniform_buffer_offset_alignment), written with one
queue.write_buffer just before the batch is submitted (a write the queue orders after every earlier submission), so
a kernel's bind group depends on its buffers alone and is made once: a decode step, whose lengths change every step,
made a new uniform buffer and bind group for most of its launches before (2026-11-29). A batch that fills the ring is
submitted and the ring starts over.

shader-f16 is requested when the adapter has it (`has_f16`). `WebGPUDevice(f16=False)`, or the environment
variable DEPLOYCC_WEBGPU_F16=0 where f16 is not given, leaves it off, as on adapters that lack it (SwiftShader,
lavapipe through ANGLE): packages then run their kernels without f16 (`file_no_f16`, float16 read from packed
u32 words), which is how those kernels are tested on an adapter that has it. The `subgroup` feature likewise
(`has_subgroups`; `WebGPUDevice(subgroups=False)` or DEPLOYCC_WEBGPU_SUBGROUPS=0): without it packages run the
kernels whose warp-level reductions are shared-memory trees (`file_..._no_subgroups`, targets/wgsl.py).

Params live in a uniform buffer except on lavapipe (llvmpipe), where they are bound as a read-only storage
buffer: lavapipe 22.3 inlines a uniform that a loop bound or a branch reads into the shader and re-optimizes its NIR
at every dispatch whose values differ, for as long as that at least halves the shader's SSA values; a decode step's
lengths change at every token, so a kernel whose loops collapse at short contexts (the split attention's combine:
one trip at up to 256 keys) paid 10-12 ms of that a launch against 1-1.6 on the Zen 3 kind (the driver's own
code in `perf`, not the kernel's; docs/gpu.md, "lavapipe's inlined uniforms").
Nothing inlines a storage buffer's values. `WebGPUDevice(params="uniform")`, or DEPLOYCC_WEBGPU_PARAMS=uniform
where params is not given, keeps them uniform on every adapter; `params="storage"` binds them as storage on any.
A kernel whose storage bindings already reach the adapter's limit keeps its uniform.

A package states what it needs of the adapter in WebGPU's limit names (manifest kernels.requires, LIMITS);
`check_limits` refuses one that needs more than this device allows, naming the limit and the preset key.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections import OrderedDict

import numpy as np

from .base import Buffer, BufferRange, Device, DeviceError, Kernel

INSTALL_HINT = ("pip install wgpu (the deploycc[webgpu] extra); for a Vulkan adapter also "
                "apt-get install mesa-vulkan-drivers libvulkan1")
FEATURES = ("shader-f16", "subgroup")  # requested when the adapter has them
_TYPE_RANK = {"DiscreteGPU": 3, "IntegratedGPU": 2, "CPU": 1}
_BACKEND_RANK = {"Vulkan": 4, "Metal": 4, "D3D12": 3, "OpenGL": 1}
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_DECL = re.compile(r"((?:@\s*\w+\s*\(\s*\d+\s*\)\s*)+)var\s*<\s*(\w+)\s*(?:,\s*(\w+)\s*)?>")
_ATTR = re.compile(r"@\s*(group|binding)\s*\(\s*(\d+)\s*\)")
_ENTRY = re.compile(r"@\s*workgroup_size\s*\(([^)]*)\)\s*(?:@\s*\w+\s*)*fn\s+(\w+)")
_CACHE_SIZE = 1024
RING_BYTES = 1 << 18  # the Params ring: at 256-byte alignment (the spec's default) 1,024 launches a batch
F16_ENV = "DEPLOYCC_WEBGPU_F16"
SUBGROUPS_ENV = "DEPLOYCC_WEBGPU_SUBGROUPS"
PARAMS_ENV = "DEPLOYCC_WEBGPU_PARAMS"
# WGSL's `enable subgroups;` (Chrome's Tint requires it); wgpu's naga rejects it and takes the subgroup built-ins
# once the device has the feature, so it is removed before naga reads the source
_ENABLE_SUBGROUPS = re.compile(r"\benable\s+subgroups\s*;")
_UNIFORM = re.compile(r"var\s*<\s*uniform\s*>")  # the ABI's one uniform: Params
# WebGPU limit (GPUSupportedLimits, as in manifest kernels.requires) -> the target key that bounds it in a preset
LIMITS = {"maxComputeInvocationsPerWorkgroup": "max_threads_per_block", "maxComputeWorkgroupSizeX": "max_threads_per_block",
          "maxComputeWorkgroupStorageSize": "max_shared_memory", "maxStorageBuffersPerShaderStage": "max_storage_buffers",
          "maxStorageBufferBindingSize": "max_storage_binding", "maxBufferSize": "max_buffer_size",
          "maxComputeWorkgroupsPerDimension": "max_grid"}


def _ensure_runtime_dir() -> None:
    """Mesa prints `XDG_RUNTIME_DIR is invalid` on every adapter query without one."""
    d = os.environ.get("XDG_RUNTIME_DIR")
    if not d or not os.path.isdir(d):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="deploycc-xdg-")


def _wgpu():
    _ensure_runtime_dir()
    try:
        import wgpu
    except ImportError as e:
        raise DeviceError(f"the WebGPU backend needs wgpu ({e}): {INSTALL_HINT}") from None
    return wgpu


def _info(adapter) -> dict:
    info = getattr(adapter, "info", None)
    if info is None:  # wgpu < 0.20
        info = adapter.request_adapter_info()
    return dict(info)


def _adapters(wgpu) -> list:
    """Every adapter, best first: GPUs before CPUs, Vulkan/Metal before D3D12 before OpenGL."""
    enum = getattr(wgpu.gpu, "enumerate_adapters_sync", None) or wgpu.gpu.enumerate_adapters
    adapters = list(enum())

    def rank(a):
        i = _info(a)
        return (_TYPE_RANK.get(str(i.get("adapter_type")), 0), _BACKEND_RANK.get(str(i.get("backend_type")), 2))
    return sorted(adapters, key=rank, reverse=True)


def _norm_limits(limits) -> dict[str, int]:
    return {k.replace("-", "_"): v for k, v in dict(limits).items()}


def snake(limit: str) -> str:
    """maxStorageBufferBindingSize -> max_storage_buffer_binding_size (wgpu-py's spelling, after _norm_limits)."""
    return re.sub(r"([A-Z])", r"_\1", limit).lower()


def _wanted(given: bool | None, env: str, feature: str) -> bool:
    if given is not None:
        return given
    value = os.environ.get(env, "1").strip()
    if value not in ("0", "1"):
        raise DeviceError(f"{env} is {value!r}; set it to 0 (no {feature}) or 1 (use it where the adapter has it)")
    return value == "1"


def _params_space(given: str | None, name: str) -> str:
    """Where a kernel's Params are bound: "storage" on lavapipe (the module's docstring says why), else "uniform";
    `given`, else $DEPLOYCC_WEBGPU_PARAMS, overrides."""
    value = given if given is not None else os.environ.get(PARAMS_ENV, "").strip() or None
    if value is None:
        return "storage" if "llvmpipe" in name.lower() else "uniform"
    if value not in ("uniform", "storage"):
        where = PARAMS_ENV if given is None else "params"
        raise DeviceError(f"{where} is {value!r}; set it to uniform or storage (the default: storage on lavapipe, "
                          "uniform elsewhere)")
    return value


def enumerate_devices() -> list[dict]:
    wgpu = _wgpu()
    out = []
    for i, a in enumerate(_adapters(wgpu)):
        info, lim = _info(a), _norm_limits(a.limits)
        out.append({"kind": "webgpu", "name": info.get("device") or a.summary, "details": {
            "backend": info.get("backend_type"), "adapter_type": info.get("adapter_type"),
            "description": info.get("description"), "has_f16": "shader-f16" in a.features,
            "has_subgroups": "subgroup" in a.features or "subgroups" in a.features, "default": i == 0,
            **{k: lim.get(k) for k in ("max_storage_buffer_binding_size", "max_buffer_size",
                                       "max_compute_invocations_per_workgroup", "max_compute_workgroup_storage_size")}}})
    return out


def parse_bindings(source: str) -> list[tuple[int, str]]:
    """[(binding, layout buffer type)] of the group-0 declarations of a WGSL source, sorted by binding."""
    found = {}
    for attrs, space, access in _DECL.findall(_COMMENTS.sub("", source)):
        a = {k: int(v) for k, v in _ATTR.findall(attrs)}
        if "binding" not in a:
            continue
        if a.get("group", 0) != 0:
            raise DeviceError(f"WGSL binding {a['binding']} is in group {a['group']}; the ABI uses group 0 only")
        if space == "uniform":
            found[a["binding"]] = "uniform"
        elif space == "storage":
            found[a["binding"]] = "storage" if access == "read_write" else "read-only-storage"
        else:
            raise DeviceError(f"WGSL binding {a['binding']} has address space {space!r}; expected storage or uniform")
    return sorted(found.items())


def _workgroup_sizes(source: str) -> dict[str, tuple[int, int, int]]:
    sizes = {}
    for dims, name in _ENTRY.findall(_COMMENTS.sub("", source)):
        parts = [p.strip().rstrip("u").rstrip("i") for p in dims.split(",") if p.strip()]
        if parts and all(p.isdigit() for p in parts):
            sizes[name] = tuple(int(p) for p in parts) + (1,) * (3 - len(parts))
    return sizes


def _params_bytes(ints: list[int]) -> bytes:
    """Params as little-endian int32, padded to a multiple of 16 bytes (the uniform buffer size rule)."""
    data = np.asarray(ints, "<i4").tobytes()
    return data + bytes(-len(data) % 16 if data else 16)


def _error_text(e: Exception) -> str:
    """wgpu's multi-line error as one line: from the first line naming an error, else the innermost cause."""
    lines = [ln.strip(" │┌─^") for ln in str(e).splitlines()]
    lines = [ln for ln in lines if ln and ln.lower() not in ("validation error", "caused by:")
             and not re.fullmatch(r"In wgpu\w+", ln)]
    first = next((i for i, ln in enumerate(lines) if "error" in ln.lower()), 0)
    return " | ".join(lines[first:first + 3]) or type(e).__name__


class WebGPUDevice(Device):
    kind = "webgpu"

    def __init__(self, adapter: str | None = None, backend: str | None = None, f16: bool | None = None,
                 subgroups: bool | None = None, params: str | None = None):
        """f16: request shader-f16 where the adapter has it (None: unless DEPLOYCC_WEBGPU_F16=0); subgroups: the
        subgroup feature likewise (None: unless DEPLOYCC_WEBGPU_SUBGROUPS=0); params: "uniform" or "storage", the
        Params' binding (None: $DEPLOYCC_WEBGPU_PARAMS, else storage on lavapipe and uniform elsewhere)."""
        wgpu = self._wgpu = _wgpu()
        adapters = _adapters(wgpu)
        summary = [a.summary for a in adapters]
        if backend is not None:
            adapters = [a for a in adapters if str(_info(a).get("backend_type", "")).lower() == backend.lower()]
        if adapter is not None:
            adapters = [a for a in adapters if adapter.lower() in a.summary.lower()]
        if not adapters:
            why = f"matching adapter={adapter!r} backend={backend!r}; found: {'; '.join(summary)}" if summary else INSTALL_HINT
            raise DeviceError(f"no WebGPU adapter {why}")
        self.adapter = adapters[0]
        info = _info(self.adapter)
        self.name = f"{info.get('device') or self.adapter.summary} ({info.get('backend_type')})"
        # a bad DEPLOYCC_WEBGPU_F16 (or _SUBGROUPS) is an error on every adapter, with or without the feature
        wanted = {"shader-f16": _wanted(f16, F16_ENV, "shader-f16"), "subgroup": _wanted(subgroups, SUBGROUPS_ENV, "subgroups")}
        features = [f for f in FEATURES if f in self.adapter.features and wanted[f]]
        self.device = self._request(features)
        self.has_f16 = "shader-f16" in self.device.features
        self.has_subgroups = "subgroup" in self.device.features
        self.params = _params_space(params, self.name)
        self.limits = _norm_limits(self.device.limits)
        self.queue = self.device.queue
        self._storage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self._sync_buf = self.device.create_buffer(size=4, usage=self._storage)
        # source sha256 -> (shader module, bind-group layout, pipeline layout, bindings, the Params' binding type)
        self._modules: dict[str, tuple] = {}
        self._groups: OrderedDict[tuple, tuple] = OrderedDict()
        self._align = max(int(self.limits.get(f"min_{space}_buffer_offset_alignment", 256)) for space in ("uniform", "storage"))
        self._ring = self.device.create_buffer(size=RING_BYTES, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.STORAGE
                                               | wgpu.BufferUsage.COPY_DST)
        self._staged = bytearray()  # the Params of the launches encoded and not yet submitted, at their offsets
        self._encoder = self._pass = None
        self.pending = 0  # launches encoded and not yet submitted

    def _request(self, features):
        a = self.adapter
        wanted = dict(a.limits)
        compute = {k: v for k, v in wanted.items() if "buffer" in k or "compute" in k or "storage" in k}
        request = getattr(a, "request_device_sync", None) or a.request_device
        err = None
        for limits in (wanted, compute, None):  # the adapter's own limits; else the compute ones; else defaults
            try:
                return request(required_features=features, required_limits=limits)
            except Exception as e:  # noqa: BLE001 - wgpu raises several error types for refused limits
                err = e
        raise DeviceError(f"WebGPU device request failed on {self.name}: {_error_text(err)}")

    def check_limits(self, requires: dict[str, int]) -> None:
        """Refuse a package that needs more of a limit than this device allows (manifest kernels.requires)."""
        for limit, need in requires.items():
            have = self.limits.get(snake(limit))
            if have is not None and need > have:
                raise DeviceError(f"this package needs {limit} {need}, adapter {self.name} allows {have}; "
                                  f"compile for a preset with {LIMITS[limit]}: {have}")

    # -- memory ----------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        nbytes = self._check_alloc(nbytes)
        if nbytes > self.limits.get("max_buffer_size", nbytes):
            raise DeviceError(f"WebGPU buffer of {nbytes} bytes exceeds max_buffer_size {self.limits['max_buffer_size']}")
        try:  # WebGPU zero-fills new buffers
            h = self.device.create_buffer(size=max(4, -(-nbytes // 4) * 4), usage=self._storage)
        except self._wgpu.GPUError as e:
            raise DeviceError(f"WebGPU allocation of {nbytes} bytes failed: {_error_text(e)}") from None
        return Buffer(h, nbytes, self)

    def upload(self, array: np.ndarray) -> Buffer:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if data.nbytes == 0:
            return self.alloc(0)
        if data.nbytes > self.limits.get("max_buffer_size", data.nbytes):
            raise DeviceError(f"WebGPU buffer of {data.nbytes} bytes exceeds max_buffer_size {self.limits['max_buffer_size']}")
        padded = np.concatenate([data, np.zeros(-data.nbytes % 4, np.uint8)]) if data.nbytes % 4 else data
        try:
            h = self.device.create_buffer_with_data(data=padded, usage=self._storage)
        except self._wgpu.GPUError as e:
            raise DeviceError(f"WebGPU upload of {data.nbytes} bytes failed: {_error_text(e)}") from None
        return Buffer(h, data.nbytes, self)

    def write(self, buf: Buffer, array: np.ndarray) -> None:
        """Writes are rounded up to 4 bytes (zeros), inside the buffer's own padding when it is full-size."""
        data = self._host_bytes(buf, array).view(np.uint8).reshape(-1)
        if data.nbytes == 0:
            return
        if data.nbytes % 4:
            data = np.concatenate([data, np.zeros(-data.nbytes % 4, np.uint8)])
        self.flush()  # queue.write_buffer runs before any later submit: pending launches must go first
        self.queue.write_buffer(buf.handle, 0, data)

    def download(self, buf: Buffer, shape, dtype) -> np.ndarray:
        n = self._read_size(buf, shape, dtype)
        if n == 0:
            return np.empty(shape, dtype)
        self.flush()
        try:
            mem = self.queue.read_buffer(buf.handle, 0, -(-n // 4) * 4)
        except self._wgpu.GPUError as e:
            raise DeviceError(f"WebGPU download failed: {_error_text(e)}") from None
        return np.frombuffer(mem, np.uint8, n).view(dtype).reshape(shape).copy()

    # -- kernels ---------------------------------------------------------------------------------------
    def build(self, source: str, names: list[str], options: dict | None = None) -> dict[str, Kernel]:
        options = dict(options or {})
        options.pop("fast_math", None)  # WGSL has no fast-math switch
        if options:
            raise DeviceError(f"unknown WebGPU build option(s): {', '.join(sorted(options))} (known: fast_math)")
        if re.search(r"\benable\s+f16\s*;", source) and not self.has_f16:
            raise DeviceError(f"WGSL uses `enable f16;` but adapter {self.name} lacks shader-f16")
        if _ENABLE_SUBGROUPS.search(source):
            if not self.has_subgroups:
                raise DeviceError(f"WGSL uses `enable subgroups;` but adapter {self.name} lacks the subgroup feature")
            source = _ENABLE_SUBGROUPS.sub("", source)
        key = hashlib.sha256(source.encode()).hexdigest()
        if key not in self._modules:
            self._modules[key] = self._compile(source)
        module, bgl, layout, bindings, params_type = self._modules[key]
        sizes = _workgroup_sizes(source)
        storage = [b for b, t in bindings if t != "uniform"]
        uniform = [b for b, t in bindings if t == "uniform"]
        if storage != list(range(len(storage))) or uniform not in ([], [len(storage)]):
            raise DeviceError(f"WGSL bindings {bindings} do not follow the ABI: storage buffers 0..N-1, then "
                              "one uniform Params at N")
        kernels = {}
        for name in names:
            try:
                pipeline = self.device.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": name})
            except self._wgpu.GPUError as e:
                raise DeviceError(f"WGSL entry point {name!r} failed: {_error_text(e)}") from None
            kernels[name] = Kernel(name, pipeline, self, {
                "layout": bgl, "n_buffers": len(storage), "types": [t for _, t in bindings],
                "has_params": bool(uniform), "params_type": params_type if uniform else None,
                "workgroup_size": sizes.get(name)})
        return kernels

    def _compile(self, source: str) -> tuple:
        wgpu = self._wgpu
        bindings = parse_bindings(source)
        n_storage = sum(t != "uniform" for _, t in bindings)
        params = "uniform"
        if self.params == "storage" and n_storage < self.limits.get("max_storage_buffers_per_shader_stage", 8):
            params, source = "read-only-storage", _UNIFORM.sub("var<storage, read>", source)
        try:
            module = self.device.create_shader_module(code=source)
        except wgpu.GPUError as e:
            raise DeviceError(f"WGSL build failed on {self.name}: {_error_text(e)}") from None
        entries = [{"binding": b, "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": params if t == "uniform" else t, "has_dynamic_offset": t == "uniform"}}
                   for b, t in bindings]
        bgl = self.device.create_bind_group_layout(entries=entries)
        return module, bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]), bindings, params

    def _bind_group(self, kernel: Kernel, bufs: list, params: int):
        """The kernel's bind group over `bufs` and, with `params` bytes of Params, the ring (bound at a dynamic
        offset): made once for those buffers and kept (least recently used out past _CACHE_SIZE)."""
        # a storage binding's size is a multiple of 4: the last range of an f16 weight may end mid-word
        ranges = tuple((b.buffer.handle, b.offset, min(-(-b.size // 4) * 4, b.buffer.handle.size - b.offset))
                       if isinstance(b, BufferRange) else (b.handle, 0, b.handle.size) for b in bufs)
        key = (id(kernel.meta["layout"]), tuple((id(h), o, n) for h, o, n in ranges), params)
        hit = self._groups.get(key)
        if hit is not None:
            self._groups.move_to_end(key)
            return hit[0]
        handles = tuple(r[0] for r in ranges)
        types: dict[int, set[str]] = {}
        for h, t in zip(handles, kernel.meta["types"]):
            types.setdefault(id(h), set()).add(t)
        if any(len(ts) > 1 for ts in types.values()):  # wgpu would fail the whole batch at submit
            raise DeviceError(f"{kernel.name}: one buffer is bound both `read` and `read_write`; WebGPU forbids "
                              "that within a dispatch (declare both bindings read_write)")
        entries = [{"binding": i, "resource": {"buffer": h, "offset": o, "size": n}} for i, (h, o, n) in enumerate(ranges)]
        if params:
            entries.append({"binding": len(handles), "resource": {"buffer": self._ring, "offset": 0, "size": params}})
        try:
            group = self.device.create_bind_group(layout=kernel.meta["layout"], entries=entries)
        except self._wgpu.GPUError as e:
            raise DeviceError(f"{kernel.name}: WebGPU bind group failed: {_error_text(e)}") from None
        self._groups[key] = (group, handles)  # holding the handles keeps their ids from being reused
        if len(self._groups) > _CACHE_SIZE:
            self._groups.popitem(last=False)
        return group

    def _stage(self, params: bytes) -> int:
        """The ring offset of this launch's Params, staged for the batch's write (a full ring submits the batch)."""
        at = -(-len(self._staged) // self._align) * self._align
        if at + len(params) > RING_BYTES:
            self.flush()
            at = 0
        self._staged[len(self._staged):] = bytes(at - len(self._staged)) + params
        return at

    def launch(self, kernel: Kernel, args: list, grid, block) -> None:
        bufs, ints = self._split_args(kernel, args)
        grid, block = self._dims(kernel, grid, block)
        meta = kernel.meta
        if len(bufs) != meta["n_buffers"] or bool(ints) != meta["has_params"]:
            raise DeviceError(f"{kernel.name} declares {meta['n_buffers']} buffers and "
                              f"{'a' if meta['has_params'] else 'no'} Params uniform; got {len(bufs)} buffers, {len(ints)} ints")
        if meta["workgroup_size"] is not None and block != meta["workgroup_size"]:
            raise DeviceError(f"{kernel.name}: block {block} differs from the shader's @workgroup_size{meta['workgroup_size']}")
        if 0 in grid:
            return
        if max(grid) > self.limits.get("max_compute_workgroups_per_dimension", 65535):
            raise DeviceError(f"{kernel.name}: grid {grid} exceeds max_compute_workgroups_per_dimension "
                              f"{self.limits.get('max_compute_workgroups_per_dimension', 65535)}")
        params = _params_bytes(ints) if meta["has_params"] else b""
        offsets = [self._stage(params)] if params else []  # (before the pass is begun: a full ring submits)
        group = self._bind_group(kernel, bufs, len(params))
        if self._pass is None:
            self._encoder = self.device.create_command_encoder()
            self._pass = self._encoder.begin_compute_pass()
        self._pass.set_pipeline(kernel.handle)
        self._pass.set_bind_group(0, group, offsets)
        self._pass.dispatch_workgroups(*grid)
        self.pending += 1

    def flush(self) -> None:
        """Submit the launches encoded so far (does not wait for them)."""
        if self._pass is None:
            return
        cpass, encoder = self._pass, self._encoder
        self._pass = self._encoder = None
        self.pending = 0
        staged, self._staged = self._staged, bytearray()
        try:
            cpass.end()
            if staged:  # the batch's Params, before its commands (the queue runs the write first)
                self.queue.write_buffer(self._ring, 0, bytes(staged) + bytes(-len(staged) % 4))
            self.queue.submit([encoder.finish()])
        except self._wgpu.GPUError as e:
            raise DeviceError(f"WebGPU submit failed: {_error_text(e)}") from None

    def synchronize(self) -> None:
        # queue.on_submitted_work_done_sync raises TypeError in wgpu 0.32 (FACTS.md); a read waits for the queue
        self.flush()
        self.queue.read_buffer(self._sync_buf, 0, 4)
