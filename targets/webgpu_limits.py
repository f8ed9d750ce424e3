"""What a WebGPU package needs of an adapter, in WebGPU's limit names (GPUSupportedLimits, camelCase): the
package's manifest kernels.requires. The Python runtime (runtime/devices/webgpu.py: check_limits) and the
browser loader compare it with the adapter's limits before building anything, so a package too large for an
adapter is one line naming the limit rather than a validation error inside a dispatch. compile_model first
refuses a buffer larger than the target's max_buffer_size (`check`; chrome-webgpu's limits are the defaults every
WebGPU implementation guarantees).

Sizes are those the runtime allocates and binds: every planned storage, KV-cache buffer and weight is one buffer
(rounded up to 4 bytes) bound whole, except weights larger than max_storage_binding, which are bound in
split_plan's ranges.
"""
from __future__ import annotations

from deploycc.errors import DeployError
from deploycc.ir import subgroup
from deploycc.ir.tir import Alloc, walk

from .wgsl import ITEMSIZE, split_plan

WORKGROUP_ALIGN = 16  # WebGPU counts each workgroup variable as roundUp(16, its size)
# what shrinks a buffer of each kind (the names `allocations` gives them start with these)
HINTS = {"storage": "lower prefill_chunk (activations of a prefill step)",
         "KV cache": "lower --context-window (or kv_pool_tokens)",
         "weight": "choose a smaller --quantization, or a model whose largest tensor is smaller",
         "input": "lower prefill_chunk"}


def _round4(n: int) -> int:
    return max(4, -(-n // 4) * 4)


def allocations(storages: list[dict], kv: dict, bounds: dict) -> dict[str, int]:
    """The buffers the runtime allocates besides weights (runtime/engine.py, runtime/kvcache.py), name -> bytes,
    from the manifest's storages, kv_cache and bounds; the batched step's page pool where the package has one."""
    ctx, chunk = bounds["context_window"], bounds["prefill_chunk"]
    row = kv["kv_heads"] * kv["head_dim"] * ITEMSIZE[kv["dtype"]]
    out = {f"storage {i}": s["bytes"] for i, s in enumerate(storages)}
    rows = kv.get("rows") or [0] * kv["layers"]
    for layer, r in enumerate(rows):
        out[f"KV cache of layer {layer}"] = (r or ctx) * row
    if "pool" in kv:
        pool = kv["pool"]
        out["KV cache page pool of a layer"] = pool["pages"] * pool["page_size"] * row
        out["input metadata of a batched step"] = 4 * max(chunk, pool["sequences"] * -(-ctx // pool["page_size"]))
    out["input ids"] = 4 * chunk
    return out


def _requires(kernels, target, sizes: dict[str, int], bindings: dict[str, int]) -> dict[str, int]:
    """manifest kernels.requires of `kernels` for `target`; sizes, bindings: _buffers(...)."""
    plans = [split_plan(k, target.max_storage_binding) for k in kernels]
    threads = max(k.threads for k in kernels)
    return {"maxComputeInvocationsPerWorkgroup": threads, "maxComputeWorkgroupSizeX": threads,
            "maxComputeWorkgroupStorageSize": max(_shared_bytes(k) for k in kernels),
            "maxStorageBuffersPerShaderStage": max(len(k.buffers) + sum(parts - 1 for _, parts in plan.values())
                                                   for k, plan in zip(kernels, plans)),
            "maxStorageBufferBindingSize": max(bindings.values()), "maxBufferSize": max(sizes.values()),
            "maxComputeWorkgroupsPerDimension": target.max_grid}


def check(kernels, target, buffers: dict[str, int]) -> dict[str, int]:
    """The manifest's kernels.requires, or DeployError where a buffer exceeds the target's max_buffer_size: which one, and what
    shrinks it. The other limits hold by construction (schedules keep to max_threads_per_block and
    max_shared_memory, the renderer refuses more than max_storage_buffers bindings) or are the adapter's to
    judge: max_storage_binding is where weights are split, while activations and KV-cache layers are bound
    whole (tests force a small one to exercise splitting on adapters that bind far more)."""
    sizes, bindings = _buffers(kernels, target, buffers)
    name = max(sizes, key=sizes.get)
    if sizes[name] > target.max_buffer_size:
        hint = next(h for prefix, h in HINTS.items() if name.startswith(prefix))
        raise DeployError(f"{name} takes {sizes[name]} bytes, more than the target's max_buffer_size "
                          f"{target.max_buffer_size} (WebGPU's maxBufferSize); {hint}")
    return _requires(kernels, target, sizes, bindings)


def _buffers(kernels, target, buffers: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(bytes of each buffer, bytes of its largest binding), by name: `buffers` bound whole, and the weights, which
    are the kernels' constant-shape buffers (activations have symbolic shapes), bound whole or in ranges."""
    sizes = {name: _round4(n) for name, n in buffers.items()}
    bindings = dict(sizes)
    for k in kernels:
        plan = split_plan(k, target.max_storage_binding)
        for i, b in enumerate(k.buffers):
            if not all(d.is_const for d in b.shape):
                continue
            n = ITEMSIZE[b.dtype]
            for d in b.shape:
                n *= d.value
            name = f"weight {b.name} of kernel {k.name}"
            sizes[name] = _round4(n)
            bindings[name] = _round4(min(n, plan[i][0] * ITEMSIZE[b.dtype]) if i in plan else n)
    return sizes, bindings


def _shared_bytes(k) -> int:
    """Work-group memory of the kernel's largest variant: the one without subgroups, whose warp-level reductions are
    trees over work-group arrays as large as the subgroup variant's (ir/subgroup.py, wgsl.py subgroup_reduce)."""
    total = 0
    for st in walk(subgroup.lower(k).body):
        if isinstance(st, Alloc) and st.buffer.scope == "shared":
            n = ITEMSIZE.get(st.buffer.dtype, 4)
            for d in st.buffer.shape:
                n *= d.value
            total += -(-n // WORKGROUP_ALIGN) * WORKGROUP_ALIGN
    return total
