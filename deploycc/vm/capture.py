"""lower_native: the VM functions of a cpu-target package as C, one native call per step.

This is Relax's graph capture done ahead of time. The bytecode stays the source of truth (the
Python VM still runs it launch by launch for `bench --profile` and debugging); this pass reads it
and writes, per function, a C function that runs every kernel launch in order inside ONE parallel
region of the module's thread pool, with a barrier only where a launch reads or writes what an
earlier launch since the last barrier wrote (or writes what it read): Q, K and V projections of
one input run back to back without waiting.

What the C function cannot know statically stays in Python: the prologue (the leading shape
matches and `kv.begin`, which bind seq_len and total_len and check them against the planned
bounds) and the instructions that build the returned tensor (an alloc of a planned storage). The
C function takes the shape heap's values as an int array, in the order the manifest records.
Every other register is resolved at compile time: a weight, a planned storage, a KV-cache layer
or the input ids.
"""
from __future__ import annotations

import json

from ..runtime.kvcache import KV_META
from ..runtime.native import HEAP, LOWERED_FROM, NativeError, lowered_digests, step_split, step_weights
from ..targets.cstyle import ident


class NativeLoweringError(ValueError):
    pass


def _get(args: list, regs: dict) -> tuple:
    t = _value(args[0], regs)
    return t[1][args[1]["i"]] if t[0] == "tuple" else ("?",)


# Each builtin of the bytecode (runtime/vm.py BUILTIN_TABLE) as the C lowering treats it after a step's prologue: the
# value it gives its register, known statically (a function of the operands and the registers so far); "launch", a
# kernel launch written into the step; "checked at load", nothing (vm.match_shape: shapes inside the step follow from
# the plan, which the dry run checks when the package loads); "prologue", only in the prologue, which runs in Python
# (runtime/native.py PROLOGUE). tests/runtime/test_builtins.py holds the keys to the table.
LOWERING = {
    "vm.alloc": lambda args, regs: ("st", args[0]["i"]),
    "vm.move": lambda args, regs: regs.get(args[0]["r"], ("?",)),
    "kv.view": lambda args, regs: ("kv", args[1]["str"], args[2]["i"]),
    "kv.meta": lambda args, regs: ("meta", KV_META.index(args[1]["str"])),
    "vm.tuple": lambda args, regs: ("tuple", tuple(_value(a, regs) for a in args)),
    "vm.get": _get,
    "vm.launch": "launch",
    "vm.match_shape": "checked at load",
    "kv.begin": "prologue",
    "kv.pages": "prologue",
}


def lower_native(bytecode: dict, entries: dict) -> tuple[str, dict]:
    """(C source of the step functions, manifest section): `entries` are the manifest's kernel entries
    (their `args.buffers[i].written` says what each launch writes)."""
    weights = step_weights(bytecode)
    funcs, spec_out = [], {}
    for fname, spec in bytecode["functions"].items():
        text, info = _function(fname, spec, entries, weights)
        funcs.append(text)
        spec_out[fname] = info
    # the documents as bytecode.json and manifest.json give them to the loader (int keys become strings)
    digests = lowered_digests(json.loads(json.dumps(bytecode)), json.loads(json.dumps(entries)))
    head = ["/* What a step reads: weights, planned storages, KV-cache layers (k0, v0, k1, ...), the input ids, the",
            "   shape heap and a batched step's metadata (pos, seq, slot, pages, last). The engine fills one per loaded",
            "   package, so two engines never share pointers. */",
            "typedef struct { void* const* w; void* const* st; void* const* kv; void* in; const int* h;",
            "                 void* const* meta; } dcc_ctx;",
            "/* The kernel argument tables and bytecode functions the steps were compiled from (runtime/native.py) */",
            f"DCC_EXPORT const char {LOWERED_FROM}[] = {json.dumps(json.dumps(digests, sort_keys=True))};", ""]
    return "\n".join(head + funcs), {"weights": weights, "functions": spec_out}


def _function(fname: str, spec: dict, entries: dict, weights: list[str]) -> tuple[str, dict]:
    ins = spec["instructions"]
    n_in = spec["num_inputs"]
    regs: dict[int, tuple] = {0: ("in",), 1: ("cache",)}
    if n_in != 2:
        raise NativeLoweringError(f"{fname}: expected the inputs (input_ids, cache), got {n_in}")
    for r, name in enumerate(spec["params"][n_in:], start=n_in):
        regs[r] = ("w", weights.index(name))
    for name, r in spec["constants"]:
        regs[r] = ("w", weights.index(name))
    try:
        prologue, epilogue = step_split(spec)
    except NativeError as e:
        raise NativeLoweringError(f"{fname}: {e}") from None
    heap = list(HEAP)
    body: list[str] = []
    pending_w: set = set()
    pending_r: set = set()
    ret = None
    for i in range(prologue, len(ins)):
        x = ins[i]
        if x["op"] == "ret":
            ret = x["args"][0].get("r")
            break
        fn, args, dst = x.get("fn"), x.get("args", []), x.get("dst")
        how = LOWERING.get(fn)
        if how == "launch":
            body += _launch(args, regs, entries, heap, pending_w, pending_r)
        elif callable(how):
            regs[dst] = how(args, regs)
        elif how != "checked at load":
            raise NativeLoweringError(f"{fname}: {fn} after the prologue has no native lowering")
    if ret is None:
        raise NativeLoweringError(f"{fname}: no ret")
    name = ident(fname)
    text = "\n".join([f"static void dcc_step_{name}(void* ctx, int tid, int nt) {{",
                      "  const dcc_ctx* c = (const dcc_ctx*)ctx;",
                      "  void* const* dcc_w = c->w; void* const* dcc_st = c->st; void* const* dcc_kv = c->kv;",
                      "  void* dcc_in = c->in; const int* h = c->h; void* const* dcc_meta = c->meta;",
                      "  (void)dcc_w; (void)dcc_st; (void)dcc_kv; (void)dcc_in; (void)h; (void)dcc_meta;"]
                     + body + ["}",
                     f"DCC_EXPORT void dcc_{name}(const dcc_ctx* c) {{ dcc_parallel(dcc_step_{name}, (void*)c); }}",
                     ""])
    return text, {"symbol": f"dcc_{name}", "prologue": prologue, "epilogue": epilogue, "heap": heap}


def _value(a: dict, regs: dict) -> tuple:
    if "r" in a:
        return regs.get(a["r"], ("?",))
    if "kv" in a:
        _, which, layer = a["kv"]
        return ("kv", which, layer)
    raise NativeLoweringError(f"operand {a} is not a tensor")


def _pointer(v: tuple) -> str:
    kind = v[0]
    if kind == "w":
        return f"dcc_w[{v[1]}]"
    if kind == "st":
        return f"dcc_st[{v[1]}]"
    if kind == "kv":
        return f"dcc_kv[{2 * v[2] + (0 if v[1] == 'k' else 1)}]"
    if kind == "in":
        return "dcc_in"
    if kind == "meta":
        return f"dcc_meta[{v[1]}]"
    raise NativeLoweringError(f"a launch argument is not a tensor the step can name ({v})")


def _launch(args: list, regs: dict, entries: dict, heap: list[str], pending_w: set, pending_r: set) -> list[str]:
    kname = args[0]["k"]
    sep = next(j for j, a in enumerate(args) if a.get("str") == "|")
    tensors = [_value(a, regs) for a in args[3:sep]]
    written = [b["written"] for b in entries[kname]["args"]["buffers"]]
    reads = {t for t, w in zip(tensors, written) if not w and t[0] != "w"}
    writes = {t for t, w in zip(tensors, written) if w}
    lines = []
    if (reads | writes) & pending_w or writes & pending_r:
        lines.append("  dcc_barrier();")
        pending_w.clear()
        pending_r.clear()
    pending_w |= writes
    pending_r |= reads
    groups = _expr(args[1]["s"], heap)
    call = [_pointer(t) for t in tensors] + [_expr(a["s"], heap) for a in args[sep + 1:]]
    lines += [f"  {{ const int G = {groups}; /* {kname} */",
              f"    if (G > 0) {ident(entries[kname]['entry'])}({', '.join(call)}, "
              f"dcc_share(G, tid, nt, 0), dcc_share(G, tid, nt, 1)); }}"]
    return lines


def _expr(j, heap: list[str]) -> str:
    """A bytecode symbolic expression as C over h[] (64-bit arithmetic; shape values are non-negative)."""
    if isinstance(j, bool):
        raise NativeLoweringError(f"bad symbolic expression {j!r}")
    if isinstance(j, int):
        return str(j)
    if isinstance(j, str):
        if j not in heap:
            raise NativeLoweringError(f"shape variable {j!r} is not one of {', '.join(heap)}")
        return f"h[{heap.index(j)}]"
    op, *xs = j
    parts = [f"(int64_t){_expr(x, heap)}" for x in xs]
    if op in ("+", "*"):
        return "(int)(" + f" {op} ".join(parts) + ")"
    if op == "//":
        return f"(int)({parts[0]} / {parts[1]})"
    if op == "%":
        return f"(int)({parts[0]} % {parts[1]})"
    if op in ("min", "max"):
        out = parts[0]
        for p in parts[1:]:
            out = f"{op}({out}, {p})"
        return f"(int)({out})"
    raise NativeLoweringError(f"bad symbolic expression {j!r}")
