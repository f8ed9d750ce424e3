"""The schema of a package, checked before any device is opened.

Every field of manifest.json and bytecode.json that the runtime reads is checked here for its type and
range, and every reference between them (kernel names and files, params, storages, registers, shape
variables) is resolved, so nothing later can index past a list, miss a key or meet a string where it
needs an int. What needs values — the memory plan, every launch at the bounds — is runtime/dryrun.py. This
file holds the field checks and manifest.json's; validate_bytecode.py holds bytecode.json's.

A violation is one PackageError naming the field, e.g. `manifest.json: bounds.prefill_chunk must be an
integer in 1..128, got 'x'; recompile the package`. Types are exact, as JSON gives them: true is not 1,
1.0 is not 1, and null is never a default. Standard library only (the runtime ships in packages).
"""
from __future__ import annotations

import re

from .errors import PackageError
from .kinds import KINDS
from .vm import DTYPE_BYTES, SHAPE_VARS

QUANTIZATIONS = ("q0f32", "q0f16", "q4f16_1", "q4f32_1", "q4f16_2", "q8f16_0", "gguf")
FUNCTIONS = ("prefill", "prefill_all", "decode", "step", "step_all", "step_one")  # what the engines call (runtime/
# batch.py: the steps; step_all, every token's logits, for a prompt's log probabilities; step_one, a step of one token,
# on the CUDA presets) ...
REQUIRED_FUNCTIONS = FUNCTIONS[:3]  # ... and what every package has (step: where kv_cache has a pool)
PAGED_FUNCTIONS = ("step", "step_all", "step_one")  # run on the page pool (an engine loaded with paged=True)
NUM_INPUTS = 2  # input_ids and the KV cache
BYTECODE_VERSION = 1
OPS = ("+", "*", "//", "%", "min", "max")  # runtime/symexpr.py

# Sane maxima: past these a field is damage, not a model. Kernels index with int32.
INT32_MAX = (1 << 31) - 1
MAX_CONTEXT = 1 << 22
MAX_VOCAB = 1 << 24
MAX_LAYERS = 1 << 12
MAX_HEADS = 1 << 12
MAX_HEAD_DIM = 1 << 14
MAX_BYTES = 1 << 40  # one buffer
MAX_TOTAL = 1 << 44  # all of them
MAX_ITEMS = 1 << 16  # entries of a list or an object (kernels, params, storages, registers, operands)
MAX_INSTRUCTIONS = 1 << 20
MAX_DIMS = 8
MAX_EXPR_DEPTH = 16
MAX_EXPR_NODES = 256
MAX_NAME = 512

# Target's integer fields and their ranges, defined here for both sides (targets/base.py imports them: the runtime
# cannot import the compiler)
TARGET_INTS = {"max_threads_per_block": (1, 4096), "threads_per_block": (1, 4096), "subgroup_size": (1, 128),
               "max_shared_memory": (1, 1 << 30), "max_storage_binding": (4, 1 << 48), "max_storage_buffers": (4, 1024),
               "max_buffer_size": (4, 1 << 48), "max_grid": (1, INT32_MAX), "row_tile_m": (1, 64), "row_tile_n": (1, 16),
               "memory_bytes": (0, 1 << 50), "vector_width": (1, 16), "num_threads": (0, 256)}
TARGET_BOOLS = ("fp16_arithmetic", "tiled_matmul", "workgroup_gemv", "fast_math", "integer_matmuls", "tensor_cores", "tf32_tiles",
                "dp4a")
_ARCH = re.compile(r"(sm_\d{2,3}[a-z]?)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ISAS = ("native", "x86-64-v3", "x86-64-v4", "generic")  # a cpu package's instruction set (targets/base.py imports it)
_FLAG = re.compile(r"[a-z0-9_]{1,32}")


# ---- field checks ------------------------------------------------------------------------------

def fail(where: str, problem: str):
    raise PackageError(f"{where} {problem}; recompile the package")


def show(v) -> str:
    """A value for a one-line message: repr escapes newlines; long values are cut."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def need_dict(v, where: str, required=()) -> dict:
    if type(v) is not dict:
        fail(where, f"must be an object, got {show(v)}")
    if len(v) > MAX_ITEMS:
        fail(where, f"has {len(v)} entries, more than {MAX_ITEMS}")
    for k in required:
        if k not in v:
            fail(where, f"lacks {k!r}")
    return v


def need_list(v, where: str, lo: int = 0, hi: int = MAX_ITEMS) -> list:
    if type(v) is not list:
        fail(where, f"must be a list, got {show(v)}")
    if not lo <= len(v) <= hi:
        fail(where, f"must have {lo}..{hi} entries, has {len(v)}")
    return v


def need_int(v, where: str, lo: int = 0, hi: int = INT32_MAX) -> int:
    if type(v) is not int or not lo <= v <= hi:
        fail(where, f"must be an integer in {lo}..{hi}, got {show(v)}")
    return v


def need_bool(v, where: str) -> bool:
    if type(v) is not bool:
        fail(where, f"must be true or false, got {show(v)}")
    return v


def need_str(v, where: str, choices=None, pattern: re.Pattern | None = None, hi: int = MAX_NAME, lo: int = 1) -> str:
    if type(v) is not str or not lo <= len(v) <= hi:
        fail(where, f"must be a string of {lo}..{hi} characters, got {show(v)}")
    if choices is not None and v not in choices:
        fail(where, f"is {show(v)}; expected one of {', '.join(choices)}")
    if pattern is not None and not pattern.fullmatch(v):
        fail(where, f"is {show(v)}, not a valid name")
    return v


def nbytes(shape, dtype: str) -> int:
    n = DTYPE_BYTES[dtype]
    for d in shape:
        n *= d
    return n


# ---- symbolic expressions (runtime/symexpr.py) ----------------------------------------------------

def check_expr(e, where: str, names, depth: int = 0, budget: list | None = None) -> None:
    """int | name | [op, args...] with a known op, names from `names`, int32 constants, a positive constant
    divisor for // and % (so evaluation never divides by zero), bounded depth and size."""
    budget = [MAX_EXPR_NODES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_EXPR_DEPTH:
        fail(where, f"is a symbolic expression larger than {MAX_EXPR_NODES} nodes or deeper than {MAX_EXPR_DEPTH}")
    t = type(e)
    if t is int:
        if not -INT32_MAX <= e <= INT32_MAX:
            fail(where, f"has the constant {show(e)}, outside the int32 range")
    elif t is str:
        if e not in names:
            fail(where, f"uses the shape variable {show(e)}, which is not bound before it (bound: "
                        f"{', '.join(sorted(names)) or 'none'})")
    elif t is list and e and type(e[0]) is str and e[0] in OPS:
        args = e[1:]
        if e[0] in ("//", "%"):
            if len(args) != 2 or type(args[1]) is not int or args[1] <= 0:
                fail(where, f"has {show(e)}: {e[0]} needs two operands and a positive constant divisor")
        elif not args:
            fail(where, f"has {show(e)}: {e[0]} without operands")
        for a in args:
            check_expr(a, where, names, depth + 1, budget)
    else:
        fail(where, f"is not a symbolic expression (int, name or [op, ...] with op in {' '.join(OPS)}): {show(e)}")


def monotone(e) -> bool:
    """Non-decreasing in every variable (all of which are >= 0): so a size's largest value over the bounds is
    its value at their upper corner, which is where runtime/dryrun.py evaluates it."""
    if type(e) is int:
        return e >= 0
    if type(e) is str:
        return True
    op, *args = e
    return op in ("+", "*", "min", "max", "//") and all(monotone(a) for a in (args[:1] if op == "//" else args))


def names_in(e) -> set:
    if type(e) is str:
        return {e}
    return set().union(*(names_in(a) for a in e[1:])) if type(e) is list else set()


def affine(e) -> bool:
    """A constant plus constant multiples of variables: fixed everywhere by its values at a few corners."""
    if type(e) in (int, str):
        return True
    op, *args = e
    if op == "+":
        return all(affine(a) for a in args)
    variable = [a for a in args if type(a) is not int]
    return op == "*" and len(variable) <= 1 and all(affine(a) for a in variable)


# ---- manifest.json -------------------------------------------------------------------------------

M = "manifest.json:"


def check_manifest(m) -> None:
    """Every field of a manifest the runtime reads, and their agreement with each other."""
    need_dict(m, "manifest.json", ("format", "format_version", "model", "quantization", "preset", "target", "bounds",
                                   "kv_cache", "vocab_size", "storages", "memory", "kernels", "params", "files"))
    need_str(m["format"], f"{M} format", ("deploycc-package",))
    need_int(m["format_version"], f"{M} format_version", 1)
    model = need_dict(m["model"], f"{M} model", ("architecture", "source"))
    need_str(model["architecture"], f"{M} model.architecture")
    need_str(model["source"], f"{M} model.source", hi=4096)
    if "hf_config" in model:
        need_dict(model["hf_config"], f"{M} model.hf_config")
    need_str(m["quantization"], f"{M} quantization", QUANTIZATIONS)
    if "head_quantization" in m:
        need_str(m["head_quantization"], f"{M} head_quantization", QUANTIZATIONS)
    _check_target(m)
    _check_bounds(m)
    need_int(m["vocab_size"], f"{M} vocab_size", 1, MAX_VOCAB)
    files = need_dict(m["files"], f"{M} files")
    for rel in files:
        need_str(files[rel], f"{M} files[{show(rel)}]", hi=64)
    storages = need_list(m["storages"], f"{M} storages")
    for i, s in enumerate(storages):
        need_int(need_dict(s, f"{M} storages[{i}]", ("bytes",))["bytes"], f"{M} storages[{i}].bytes", 0, MAX_BYTES)
    _check_params(m)  # before the kernels: a cpu package's native weight table names params
    _check_kernels(m)
    _check_memory(m)


def _check_target(m: dict) -> None:
    preset = need_dict(m["preset"], f"{M} preset", ("name", "backend"))
    need_str(preset["name"], f"{M} preset.name")
    if "description" in preset and type(preset["description"]) is not str:
        fail(f"{M} preset.description", f"must be a string, got {show(preset['description'])}")
    target = need_dict(m["target"], f"{M} target", ("kind",))
    kind = need_str(target["kind"], f"{M} target.kind", tuple(KINDS))
    need_str(preset["backend"], f"{M} preset.backend", (kind,))
    for key, (lo, hi) in TARGET_INTS.items():
        if key in target:
            need_int(target[key], f"{M} target.{key}", lo, hi)
    for key in TARGET_BOOLS:
        if key in target:
            need_bool(target[key], f"{M} target.{key}")
    if "arch" in target:
        need_str(target["arch"], f"{M} target.arch", pattern=_ARCH, hi=16, lo=0)
    if KINDS[kind].isa:
        need_str(target.get("isa"), f"{M} target.isa", ISAS)


def _check_bounds(m: dict) -> None:
    b = need_dict(m["bounds"], f"{M} bounds", ("context_window", "prefill_chunk"))
    ctx = need_int(b["context_window"], f"{M} bounds.context_window", 1, MAX_CONTEXT)
    need_int(b["prefill_chunk"], f"{M} bounds.prefill_chunk", 1, ctx)
    kv = need_dict(m["kv_cache"], f"{M} kv_cache", ("layers", "kv_heads", "head_dim", "dtype"))
    need_int(kv["layers"], f"{M} kv_cache.layers", 1, MAX_LAYERS)
    need_int(kv["kv_heads"], f"{M} kv_cache.kv_heads", 1, MAX_HEADS)
    need_int(kv["head_dim"], f"{M} kv_cache.head_dim", 1, MAX_HEAD_DIM)
    need_str(kv["dtype"], f"{M} kv_cache.dtype", ("float32", "float16"))
    if "rows" in kv:  # sliding-window rings: each holds at least a step's rows, fewer than the context window
        rows = kv["rows"]
        if not isinstance(rows, list) or len(rows) != kv["layers"]:
            fail(f"{M} kv_cache.rows", f"must list the ring rows of each of the {kv['layers']} layers")
        for i, r in enumerate(rows):
            need_int(r, f"{M} kv_cache.rows[{i}]", 0, ctx)
            if r and not b["prefill_chunk"] <= r < ctx:
                fail(f"{M} kv_cache.rows[{i}]", f"is {r}; a ring holds at least a step's {b['prefill_chunk']} rows "
                                                f"and fewer than the context window's {ctx} (0: no ring)")
    if "pool" in kv:  # the page pool of batched steps
        pool = need_dict(kv["pool"], f"{M} kv_cache.pool", ("pages", "page_size", "sequences"))
        size = need_int(pool["page_size"], f"{M} kv_cache.pool.page_size", 1, MAX_CONTEXT)
        need_int(pool["pages"], f"{M} kv_cache.pool.pages", -(-ctx // size), MAX_CONTEXT)
        need_int(pool["sequences"], f"{M} kv_cache.pool.sequences", 1, b["prefill_chunk"])
        if nbytes((pool["pages"] * size, kv["kv_heads"], kv["head_dim"]), kv["dtype"]) > MAX_BYTES:
            fail(f"{M} kv_cache.pool", "needs more bytes per layer than any device has")
    if nbytes((ctx, kv["kv_heads"], kv["head_dim"]), kv["dtype"]) > MAX_BYTES or kv_bytes(m) > MAX_TOTAL:
        fail(f"{M} kv_cache", f"needs {kv_bytes(m)} bytes at a context window of {ctx}, more than any device has")


def kv_rows(m: dict, layer: int) -> int:
    """The rows layer `layer` keeps: its ring's, or the whole context window's."""
    rows = m["kv_cache"].get("rows")
    return (rows[layer] if rows else 0) or m["bounds"]["context_window"]


def kv_bytes(m: dict) -> int:
    """Keys and values of every layer: the whole context window, or a sliding-window layer's ring."""
    kv = m["kv_cache"]
    return 2 * sum(nbytes((kv_rows(m, i), kv["kv_heads"], kv["head_dim"]), kv["dtype"]) for i in range(kv["layers"]))


def _check_kernels(m: dict) -> None:
    k = need_dict(m["kernels"], f"{M} kernels", ("language", "entries"))
    kind = m["target"]["kind"]
    need_str(k["language"], f"{M} kernels.language", (KINDS[kind].language,))
    entries = need_dict(k["entries"], f"{M} kernels.entries")
    if not entries:
        fail(f"{M} kernels.entries", "is empty")
    max_threads = m["target"].get("max_threads_per_block", TARGET_INTS["max_threads_per_block"][1])
    for name, e in entries.items():
        where = f"{M} kernels.entries[{show(name)}]"
        need_str(name, where)
        need_dict(e, where, ("file", "entry", "threads", "args"))
        f = need_str(e["file"], f"{where}.file", hi=1024)
        if f not in m["files"] or not f.startswith("kernels/"):
            fail(f"{where}.file", f"is {show(f)}, not a file of the package's kernels/ listed in files")
        need_str(e["entry"], f"{where}.entry", pattern=_IDENT, hi=256)
        if e["entry"] != entry_name(name):  # else two names could run one function under two calling conventions
            fail(f"{where}.entry", f"is {show(e['entry'])}, but the kernel {show(name)} is compiled as "
                                   f"{show(entry_name(name))}")
        need_int(e["threads"], f"{where}.threads", 1, max_threads)
        n_buffers = _check_kernel_args(e["args"], f"{where}.args")
        if "macs_per_row" in e:  # a matmul's multiply-adds per row of activations (bench --roofline)
            need_int(e["macs_per_row"], f"{where}.macs_per_row", 1, 1 << 62)
        if "activation_bits" in e and e["activation_bits"] not in (8, 16):
            fail(f"{where}.activation_bits", f"must be 8 or 16, got {show(e['activation_bits'])}")
        if "split" in e:
            _check_split(e["split"], f"{where}.split", n_buffers, kind)
        # the variants for adapters without shader-f16 and with subgroups (targets/wgsl.py: packed_f16, subgroups)
        for key in ("file_no_f16", "file_subgroups", "file_no_f16_subgroups"):
            if key not in e:
                continue
            if not KINDS[kind].f16_variants:
                fail(f"{where}.{key}", "is a WebGPU kernel variant, but the package is for " + kind)
            if key == "file_no_f16_subgroups" and "file_no_f16" not in e:
                fail(f"{where}.{key}", "is the subgroup variant of file_no_f16, which the entry lacks")
            f = need_str(e[key], f"{where}.{key}", hi=1024)
            if f not in m["files"] or not f.startswith("kernels/") or not f.endswith(".wgsl"):
                fail(f"{where}.{key}", f"is {show(f)}, not a .wgsl file of the package's kernels/ listed in files")
    if "requires" in k:
        _check_requires(k["requires"], kind)
    for name, bits in need_dict(k.get("activations", {}), f"{M} kernels.activations").items():
        need_str(name, f"{M} kernels.activations")  # linears that round their input (cuda's dp4a: verify reads it)
        if bits not in (8, 16):
            fail(f"{M} kernels.activations[{show(name)}]", f"must be 8 or 16, got {show(bits)}")
    if KINDS[kind].native:
        _check_native(m, need_dict(k.get("native"), f"{M} kernels.native",
                                   ("library", "isa", "cpu_flags", "weights", "functions")))


def _check_requires(req, kind: str) -> None:
    """WebGPU limits the package needs, by their spec names (targets/webgpu_limits.py)."""
    from .devices.webgpu import LIMITS

    where = f"{M} kernels.requires"
    if not KINDS[kind].adapter_limits:
        fail(where, "states WebGPU limits, but the package is for " + kind)
    for name, v in need_dict(req, where).items():
        if name not in LIMITS:
            fail(where, f"has {show(name)}, not one of the WebGPU limits {', '.join(LIMITS)}")
        need_int(v, f"{where}.{name}", 0, MAX_BYTES)


def _check_native(m: dict, n: dict) -> None:
    """The shared object of a cpu package and what its step functions need (deploycc/vm/capture.py)."""
    where = f"{M} kernels.native"
    f = need_str(n["library"], f"{where}.library", hi=1024)
    if f not in m["files"] or not f.startswith("kernels/") or not f.endswith(".so"):
        fail(f"{where}.library", f"is {show(f)}, not a .so in the package's kernels/ listed in files")
    need_str(n["isa"], f"{where}.isa", ISAS)
    if "integer_activations" in n:
        need_bool(n["integer_activations"], f"{where}.integer_activations")
    if "weight_layout" in n:
        need_str(n["weight_layout"], f"{where}.weight_layout", ("plain", "interleaved16"))
    if n["isa"] != m["target"]["isa"]:
        fail(f"{where}.isa", f"is {show(n['isa'])}, but the target was compiled for {show(m['target']['isa'])}")
    for i, flag in enumerate(need_list(n["cpu_flags"], f"{where}.cpu_flags", hi=256)):
        need_str(flag, f"{where}.cpu_flags[{i}]", pattern=_FLAG, hi=32)
    names = {p["name"] for p in m["params"]}
    for i, w in enumerate(need_list(n["weights"], f"{where}.weights")):
        if need_str(w, f"{where}.weights[{i}]") not in names:
            fail(f"{where}.weights[{i}]", f"is {show(w)}, which is not in manifest.json params")
    fns = need_dict(n["functions"], f"{where}.functions", REQUIRED_FUNCTIONS)
    for fname in fns:
        if fname not in FUNCTIONS:
            fail(f"{where}.functions", f"has {show(fname)}, which the runtime never calls")
        w = f"{where}.functions.{fname}"
        fn = need_dict(fns[fname], w, ("symbol", "prologue", "epilogue", "heap"))
        need_str(fn["symbol"], f"{w}.symbol", (f"dcc_{fname}",))
        need_int(fn["prologue"], f"{w}.prologue", 0, MAX_INSTRUCTIONS)
        for i, x in enumerate(need_list(fn["epilogue"], f"{w}.epilogue")):
            need_int(x, f"{w}.epilogue[{i}]", fn["prologue"], MAX_INSTRUCTIONS)
        for i, h in enumerate(need_list(fn["heap"], f"{w}.heap", hi=len(SHAPE_VARS))):
            need_str(h, f"{w}.heap[{i}]", SHAPE_VARS)


def check_native_bytecode(m: dict, bc: dict) -> None:
    """The native section says exactly what the lowering derives from this bytecode (runtime/native.py: the
    weight table, the heap layout, what runs in Python before and after the native call), so a manifest
    edited to disagree cannot make the step functions read past a table or skip a shape check."""
    from .native import HEAP, NativeError, step_split, step_weights

    n = m["kernels"]["native"]
    w = f"{M} kernels.native"
    if n["weights"] != step_weights(bc):
        fail(f"{w}.weights", "is not the weight table of bytecode.json's functions")
    if set(n["functions"]) != set(bc["functions"]):
        fail(f"{w}.functions", "must name bytecode.json's functions")
    for fname, fn in n["functions"].items():
        if fn["heap"] != list(HEAP):
            fail(f"{w}.functions.{fname}.heap", f"must be {list(HEAP)}")
        try:
            split = step_split(bc["functions"][fname])
        except NativeError as e:
            fail(f"{w}.functions.{fname}", str(e))
        if fn["prologue"] != split[0]:
            fail(f"{w}.functions.{fname}.prologue", "disagrees with bytecode.json on what runs before the native call")
        if fn["epilogue"] != split[1]:
            fail(f"{w}.functions.{fname}.epilogue", "disagrees with bytecode.json on what builds the result")


# names a kernel's function must not take: the kernel languages' library functions and the cpu target's own
LIBRARY_NAMES = frozenset("""exp exp2 log log2 sqrt rsqrt sin cos tan tanh erf pow fabs abs floor ceil round fmin fmax
    min max select clamp mix sign fma dot free malloc memcpy memset printf abort exit""".split())


def entry_name(name: str) -> str:
    """The function a kernel is compiled as (the renderers name every kernel and step function with it): an
    identifier, suffixed with _ where it would be a library function's name or the cpu target's dcc_ prefix."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    out = out if out and not out[0].isdigit() else "_" + out
    return out + "_" if out in LIBRARY_NAMES or out.startswith("dcc_") else out


def _check_kernel_args(a, where: str) -> int:
    """The calling convention (deploycc/vm/lower.py: kernel_args); returns the number of buffers."""
    need_dict(a, where, ("scalars", "buffers", "groups"))
    scalars = need_list(a["scalars"], f"{where}.scalars", 0, 64)
    for i, s in enumerate(scalars):
        need_str(s, f"{where}.scalars[{i}]", pattern=_IDENT, hi=64)
    if len(set(scalars)) != len(scalars):
        fail(f"{where}.scalars", "names an argument twice")
    buffers = need_list(a["buffers"], f"{where}.buffers", 0, 64)
    for i, b in enumerate(buffers):
        w = f"{where}.buffers[{i}]"
        need_dict(b, w, ("shape", "dtype", "written"))
        for j, d in enumerate(need_list(b["shape"], f"{w}.shape", 0, MAX_DIMS)):
            check_expr(d, f"{w}.shape[{j}]", scalars)
            if not monotone(d):
                fail(f"{w}.shape[{j}]", f"is {show(d)}, not a size that grows with its arguments")
        need_str(b["dtype"], f"{w}.dtype", tuple(DTYPE_BYTES))
        need_bool(b["written"], f"{w}.written")
    check_expr(a["groups"], f"{where}.groups", scalars)
    return len(buffers)


def _check_split(split, where: str, n_buffers: int, kind: str) -> None:
    """WebGPU: buffer argument index -> [bytes per range, number of ranges]."""
    if not KINDS[kind].binding_ranges:
        fail(where, "is a WebGPU binding feature, but the package is for " + kind)
    for i, v in need_dict(split, where).items():
        if not (type(i) is str and i.isdigit() and int(i) < n_buffers):
            fail(where, f"has the key {show(i)}, not the index of one of the kernel's {n_buffers} buffers")
        need_list(v, f"{where}[{i}]", 2, 2)
        need_int(v[0], f"{where}[{i}][0]", 4, MAX_BYTES)
        need_int(v[1], f"{where}[{i}][1]", 1, 1 << 16)


def _check_params(m: dict) -> None:
    seen = set()
    for i, p in enumerate(need_list(m["params"], f"{M} params")):
        where = f"{M} params[{i}]"
        need_dict(p, where, ("name", "shape", "dtype", "file"))
        name = need_str(p["name"], f"{where}.name")
        if name in seen:
            fail(f"{where}.name", f"{show(name)} appears twice")
        seen.add(name)
        shape = need_list(p["shape"], f"{where}.shape", 0, MAX_DIMS)
        for j, d in enumerate(shape):
            need_int(d, f"{where}.shape[{j}]", 0, MAX_BYTES)
        dtype = need_str(p["dtype"], f"{where}.dtype", tuple(DTYPE_BYTES))
        if nbytes(shape, dtype) > MAX_BYTES:
            fail(where, f"is a tensor of {nbytes(shape, dtype)} bytes, more than any device has")
        f = need_str(p["file"], f"{where}.file", hi=1024)
        if f not in m["files"] or not f.endswith(".safetensors"):
            fail(f"{where}.file", f"is {show(f)}, not a .safetensors file listed in files")


def _check_memory(m: dict) -> None:
    """The memory summary must agree with what it summarises: a field changed alone shows here."""
    mem = need_dict(m["memory"], f"{M} memory", ("weights_bytes", "kv_cache_bytes", "activation_bytes"))
    want = {"weights_bytes": sum(nbytes(p["shape"], p["dtype"]) for p in m["params"]),
            "kv_cache_bytes": kv_bytes(m), "activation_bytes": sum(s["bytes"] for s in m["storages"])}
    for key, value in want.items():
        if mem[key] != value or type(mem[key]) is not int:
            fail(f"{M} memory.{key}", f"is {show(mem[key])}, but the package's "
                                      f"{'params' if key[0] == 'w' else 'KV cache' if key[0] == 'k' else 'storages'} "
                                      f"add up to {value}")
    if "unplanned_activation_bytes" in mem:
        for k, v in need_dict(mem["unplanned_activation_bytes"], f"{M} memory.unplanned_activation_bytes").items():
            if v is not None:
                need_int(v, f"{M} memory.unplanned_activation_bytes[{show(k)}]", 0, MAX_BYTES * MAX_ITEMS)
